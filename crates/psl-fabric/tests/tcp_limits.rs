//! Frame size limits on both sides of a link, and slow links that drop instead of stalling.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use common::{endpoint, recv_n, router_config, tag, tcp_config, untag, wait_until};
use psl_fabric::{Fabric, FabricError, Router, RouterConfig, TcpEndpoint};

#[test]
fn oversize_publish_is_refused() {
    let r = Router::spawn(router_config(None)).unwrap();
    let a = TcpEndpoint::connect(r.local_addr(), psl_fabric::TcpConfig { frame_bytes_max: 1024, ..tcp_config("a") })
        .unwrap();
    let e = a.publish(Bytes::from(vec![0u8; 1025])).unwrap_err();
    assert!(matches!(e, FabricError::TooLarge { len: 1025, max: 1024, .. }), "{e}");
    assert_eq!(a.stats().sent, 0);
}

#[test]
fn router_closes_a_link_announcing_an_oversize_frame() {
    let r = Router::spawn(RouterConfig { frame_bytes_max: 1024, ..router_config(None) }).unwrap();
    let good = endpoint(r.local_addr(), "good");
    let other = endpoint(r.local_addr(), "other");
    let mut raw = TcpStream::connect(r.local_addr()).unwrap();
    wait_until(Duration::from_secs(5), "three links", || r.stats().children() == 3);
    raw.write_all(&2048u32.to_le_bytes()).unwrap();
    raw.write_all(&[7u8; 100]).unwrap();
    // The router hangs up on the raw client (EOF or reset), bounded by the read timeout.
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match raw.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => continue, // heartbeats
        }
    }
    wait_until(Duration::from_secs(5), "link removed and counted", || {
        let s = r.stats();
        s.children() == 2 && s.closed.frames_refused == 1 && s.link_errors == 1
    });
    // Nothing of it was forwarded, and the router still serves the others.
    assert_eq!(other.try_recv().unwrap(), None);
    good.publish(tag(1, 0, 8)).unwrap();
    assert_eq!(recv_n(&other, 1, Duration::from_secs(5)).len(), 1);
}

#[test]
fn endpoint_refuses_oversize_frame_from_router_and_reconnects() {
    let r = Router::spawn(router_config(None)).unwrap();
    let big = endpoint(r.local_addr(), "big");
    let small =
        TcpEndpoint::connect(r.local_addr(), psl_fabric::TcpConfig { frame_bytes_max: 1024, ..tcp_config("small") })
            .unwrap();
    wait_until(Duration::from_secs(5), "two links", || r.stats().children() == 2);
    big.publish(Bytes::from(vec![1u8; 2000])).unwrap();
    wait_until(Duration::from_secs(5), "small refused the frame and reconnected", || {
        let s = small.stats();
        s.frames_refused == 1 && s.link_errors == 1 && s.connects == 2 && small.is_connected()
    });
    assert_eq!(small.stats().received, 0);
    wait_until(Duration::from_secs(5), "two links again", || r.stats().children() == 2);
    big.publish(tag(0, 1, 100)).unwrap();
    let got = recv_n(&small, 1, Duration::from_secs(5));
    assert_eq!(got.iter().map(|m| untag(m)).collect::<Vec<_>>(), [(0, 1)]);
}

#[test]
fn stalled_link_drops_and_counts_without_slowing_the_others() {
    // Long idle and write timeouts, so the stalled link stays up (it sends no heartbeats).
    let mut cfg = RouterConfig { link_queue_msgs_max: 64, ..router_config(None) };
    cfg.timing.idle_timeout = Duration::from_secs(60);
    cfg.timing.write_timeout = Duration::from_secs(60);
    let r = Router::spawn(cfg).unwrap();
    let sender = endpoint(r.local_addr(), "sender");
    let reader = endpoint(r.local_addr(), "reader");
    // A peer that connects and never reads: its socket buffers fill, then its link queue.
    let stalled = TcpStream::connect(r.local_addr()).unwrap();
    wait_until(Duration::from_secs(5), "three links", || r.stats().children() == 3);
    let stalled_peer = stalled.local_addr().unwrap();

    let chunk = 32u32;
    let chunks = 40u32; // 1280 messages of 64 KiB: ~80 MiB, far beyond the socket buffers
    for c in 0..chunks {
        for q in c * chunk..(c + 1) * chunk {
            sender.publish(tag(0, q, 64 << 10)).unwrap();
        }
        let got = recv_n(&reader, chunk as usize, Duration::from_secs(10));
        let seqs: Vec<u32> = got.iter().map(|m| untag(m).1).collect();
        assert_eq!(seqs, (c * chunk..(c + 1) * chunk).collect::<Vec<_>>(), "chunk {c}: the reader gets everything");
    }
    let s = r.stats();
    let stalled_link = s.links.iter().find(|l| l.peer == stalled_peer).expect("stalled link still up");
    assert!(stalled_link.totals.dropped_full > 0, "the stalled link dropped: {stalled_link:?}");
    let reader_link = s.links.iter().find(|l| l.peer != stalled_peer && l.totals.frames_in == 0).unwrap();
    assert_eq!(reader_link.totals.dropped_full, 0);
    assert_eq!(reader_link.totals.frames_out, (chunk * chunks) as u64);
    drop(stalled);
}

#[test]
fn links_over_links_max_are_refused() {
    let r = Router::spawn(RouterConfig { links_max: 1, ..router_config(None) }).unwrap();
    let _first = endpoint(r.local_addr(), "first");
    wait_until(Duration::from_secs(5), "one link", || r.stats().children() == 1);
    // The kernel completes the handshake; the router then hangs up.
    let mut second = TcpStream::connect(r.local_addr()).unwrap();
    second.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 8];
    assert!(matches!(second.read(&mut buf), Ok(0) | Err(_)), "the second connection is closed");
    let s = r.stats();
    assert_eq!((s.children(), s.refused_links_max, s.accepted), (1, 1, 1));
}

#[test]
fn heartbeats_keep_idle_links_up_and_silent_peers_are_cut_off() {
    let mut timing = common::timing();
    timing.heartbeat_interval = Duration::from_millis(50);
    timing.idle_timeout = Duration::from_millis(300);
    let r = Router::spawn(RouterConfig { timing: timing.clone(), ..router_config(None) }).unwrap();
    let a = TcpEndpoint::connect(r.local_addr(), psl_fabric::TcpConfig { timing, ..tcp_config("a") }).unwrap();
    let silent = TcpStream::connect(r.local_addr()).unwrap();
    wait_until(Duration::from_secs(5), "two links", || r.stats().children() == 2);
    let silent_peer = silent.local_addr().unwrap();
    wait_until(Duration::from_secs(5), "the silent peer cut off", || {
        r.stats().links.iter().all(|l| l.peer != silent_peer)
    });
    // Twice the idle timeout without a message: the endpoint's link is still the first one.
    std::thread::sleep(Duration::from_millis(600));
    assert!(a.is_connected());
    assert_eq!((a.stats().connects, a.stats().link_errors), (1, 0));
    assert_eq!(r.stats().children(), 1);
    assert_eq!(r.stats().link_errors, 1, "only the silent peer's link ended, by idle timeout");
}

#[test]
fn router_refuses_a_busy_address_and_names_it() {
    let r = Router::spawn(router_config(None)).unwrap();
    let e =
        Router::spawn(RouterConfig { listen: r.local_addr(), ..router_config(None) }).err().expect("address in use");
    assert!(e.to_string().contains(&r.local_addr().to_string()), "{e}");
}
