//! A tree of three routers with four endpoints: no faults, every message reaches every other
//! endpoint exactly once, in per-sender order.

mod common;

use std::time::Duration;

use common::{assert_exactly_once, endpoint, recv_n, recv_until_quiet, router, tag, wait_until};
use psl_fabric::Fabric;

#[test]
fn tree_of_three_routers_delivers_every_message_to_every_other_endpoint_once() {
    // The root runs a multi-thread runtime, the children the default current-thread one.
    let root = psl_fabric::Router::spawn(psl_fabric::RouterConfig { worker_threads: 2, ..common::router_config(None) })
        .expect("root starts");
    let left = router(Some(root.local_addr()));
    let right = router(Some(root.local_addr()));
    wait_until(Duration::from_secs(5), "both children connected to the root", || {
        root.stats().children() == 2 && left.stats().parent_connected() && right.stats().parent_connected()
    });
    let eps = [
        endpoint(root.local_addr(), "e0"),
        endpoint(left.local_addr(), "e1"),
        endpoint(right.local_addr(), "e2"),
        endpoint(right.local_addr(), "e3"),
    ];
    wait_until(Duration::from_secs(5), "every endpoint's link registered", || {
        root.stats().children() == 3 && left.stats().children() == 1 && right.stats().children() == 2
    });

    let per = 300u32;
    std::thread::scope(|s| {
        for (i, ep) in eps.iter().enumerate() {
            s.spawn(move || {
                for q in 0..per {
                    ep.publish(tag(i as u8, q, 16 + (q as usize % 300))).unwrap();
                }
            });
        }
    });
    let want = 3 * per as usize;
    for (i, ep) in eps.iter().enumerate() {
        let mut got = recv_n(ep, want, Duration::from_secs(10));
        got.extend(recv_until_quiet(ep, Duration::from_millis(150), Duration::from_secs(1)));
        let others: Vec<u8> = (0..4).filter(|s| *s != i as u8).collect();
        assert_exactly_once(&format!("e{i}"), &got, &others, per);
        let st = ep.stats();
        assert_eq!((st.sent, st.received, st.dropped_full, st.dropped_send_full), (per as u64, want as u64, 0, 0));
    }
    for (name, r) in [("root", &root), ("left", &left), ("right", &right)] {
        let t = r.stats().totals();
        assert_eq!(t.dropped_full, 0, "{name}: nothing dropped");
        assert_eq!(r.stats().link_errors, 0, "{name}: no link errors");
    }
    // The root saw each message once on the way in: e0's from e0, e1's from left, e2+e3's from right.
    assert_eq!(root.stats().totals().frames_in, 4 * per as u64);
}
