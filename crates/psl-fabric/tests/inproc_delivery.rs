//! In-process hub: delivery to every other endpoint exactly once, bounded queues.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{assert_exactly_once, recv_n, tag};
use psl_fabric::{Fabric, FabricConfig, FabricError, InProcHub};

#[test]
fn every_message_reaches_every_other_endpoint_exactly_once() {
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let n = 5u8;
    let per = 400u32;
    let eps: Vec<_> = (0..n).map(|i| hub.endpoint(format!("e{i}"))).collect();
    // Publish from every endpoint concurrently.
    std::thread::scope(|s| {
        for (i, ep) in eps.iter().enumerate() {
            s.spawn(move || {
                for q in 0..per {
                    ep.publish(tag(i as u8, q, 32)).unwrap();
                }
            });
        }
    });
    for (i, ep) in eps.iter().enumerate() {
        let want = (n as usize - 1) * per as usize;
        let got = recv_n(ep, want, Duration::from_secs(5));
        let others: Vec<u8> = (0..n).filter(|s| *s as usize != i).collect();
        assert_exactly_once(&format!("e{i}"), &got, &others, per);
        assert_eq!(ep.try_recv().unwrap(), None, "e{i}: nothing more (never its own messages)");
        let st = ep.stats();
        assert_eq!((st.sent, st.received, st.dropped_full), (per as u64, want as u64, 0));
    }
}

#[test]
fn full_queue_drops_and_counts() {
    let hub = InProcHub::new(FabricConfig { queue_msgs_max: 4, ..FabricConfig::default() }).unwrap();
    let a = hub.endpoint("a");
    let b = hub.endpoint("b");
    for q in 0..10 {
        a.publish(tag(0, q, 8)).unwrap();
    }
    let got = recv_n(&b, 10, Duration::from_millis(100));
    assert_eq!(got.len(), 4, "the first 4 fit");
    let st = b.stats();
    assert_eq!((st.received, st.dropped_full), (4, 6));
    assert_eq!(a.stats().sent, 10);
    // Room again after draining.
    a.publish(tag(0, 10, 8)).unwrap();
    assert!(b.recv_timeout(Duration::from_secs(1)).unwrap().is_some());
}

#[test]
fn byte_limit_drops_and_counts() {
    let hub = InProcHub::new(FabricConfig { queue_bytes_max: 1000, ..FabricConfig::default() }).unwrap();
    let a = hub.endpoint("a");
    let b = hub.endpoint("b");
    for q in 0..5 {
        a.publish(tag(0, q, 300)).unwrap();
    }
    assert_eq!((b.stats().received, b.stats().dropped_full), (3, 2));
}

#[test]
fn empty_and_oversize_messages_are_refused() {
    let hub = InProcHub::new(FabricConfig { frame_bytes_max: 100, ..FabricConfig::default() }).unwrap();
    let a = hub.endpoint("alpha");
    let b = hub.endpoint("b");
    let e = a.publish(Bytes::from(vec![1u8; 101])).unwrap_err();
    assert!(matches!(e, FabricError::TooLarge { len: 101, max: 100, .. }), "{e}");
    assert!(e.to_string().contains("alpha"), "the error names the endpoint: {e}");
    assert!(matches!(a.publish(Bytes::new()), Err(FabricError::Empty { .. })));
    a.publish(Bytes::from(vec![1u8; 100])).unwrap();
    assert_eq!(b.stats().received, 1);
}

#[test]
fn dropped_endpoint_detaches() {
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let a = hub.endpoint("a");
    let b = hub.endpoint("b");
    assert_eq!(hub.endpoints(), 2);
    drop(b);
    assert_eq!(hub.endpoints(), 1);
    a.publish(tag(0, 0, 8)).unwrap();
    let c = hub.endpoint("c");
    assert_eq!(c.try_recv().unwrap(), None, "a late joiner does not see earlier messages");
}

#[test]
fn invalid_config_is_refused() {
    let e = InProcHub::new(FabricConfig { queue_msgs_max: 0, ..FabricConfig::default() }).unwrap_err();
    assert_eq!(e.field, "queue_msgs_max");
}
