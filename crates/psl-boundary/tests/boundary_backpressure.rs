//! Full rings hand records back, blocking pushes time out, waits end when the peer is gone,
//! and the counters add up.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use psl_boundary::{BackoffPolicy, Boundary, SealedRecord};

fn rec(b: u8) -> SealedRecord {
    Arc::from(vec![b; 32])
}

#[test]
fn push_to_full_ring_returns_the_same_record() {
    let (mut core, mut host) = Boundary::new(3);
    for i in 0..3 {
        core.push(rec(i)).unwrap();
    }
    let extra = rec(9);
    let back = core.push(Arc::clone(&extra)).unwrap_err().into_inner();
    assert!(Arc::ptr_eq(&back, &extra), "not the record that was pushed");
    assert_eq!(format!("{:?}", core.push(rec(10)).unwrap_err()), "Full(..)");
    assert_eq!(core.stats().outbound.full_events, 2);
    // The other direction is independent.
    host.push(rec(1)).unwrap();
    assert_eq!(host.pop().unwrap()[0], 0);
    core.push(back).unwrap();
}

#[test]
fn blocking_push_times_out_when_nobody_pops() {
    let (mut core, _host) = Boundary::new(1);
    core.push(rec(1)).unwrap();
    let r = rec(2);
    let timeout = Duration::from_millis(40);
    let start = Instant::now();
    let back = core.push_blocking(Arc::clone(&r), timeout).unwrap_err().into_inner();
    let waited = start.elapsed();
    assert!(Arc::ptr_eq(&back, &r));
    assert!(waited >= timeout, "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(5), "overslept: {waited:?}");
    let s = core.stats().outbound;
    assert_eq!((s.pushed, s.popped, s.full_events, s.in_flight), (1, 0, 1, 1));
}

#[test]
fn blocking_push_succeeds_once_the_consumer_makes_room() {
    let (mut core, mut host) = Boundary::new(1);
    core.push(rec(1)).unwrap();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        let first = host.pop().unwrap();
        (first, host)
    });
    core.push_blocking(rec(2), Duration::from_secs(30)).unwrap();
    let (first, mut host) = t.join().unwrap();
    assert_eq!(first[0], 1);
    assert_eq!(host.wait_pop(Duration::from_secs(30)).unwrap()[0], 2);
    assert_eq!(core.stats().outbound.full_events, 1);
}

#[test]
fn wait_pop_times_out_on_an_empty_ring() {
    let (mut core, _host) = Boundary::new(4);
    // A short spin phase keeps this test fast; the timeout holds with any policy.
    core.inbound.set_backoff(BackoffPolicy { spin_polls: 16, ..BackoffPolicy::default() });
    let start = Instant::now();
    assert!(core.wait_pop(Duration::from_millis(25)).is_none());
    assert!(start.elapsed() >= Duration::from_millis(25));
    assert!(core.wait_pop(Duration::ZERO).is_none());
}

#[test]
fn counters_add_up() {
    let (mut core, mut host) = Boundary::new(4);
    let monitor = core.monitor();
    for i in 0..6 {
        let _ = core.push(rec(i)); // 4 fit, 2 are refused
    }
    let mut got = Vec::new();
    assert_eq!(host.pop_batch(&mut got, 3), 3);
    core.push(rec(6)).unwrap();
    host.push(rec(100)).unwrap();

    // Read from another thread, through the shareable monitor.
    let stats = thread::spawn(move || monitor.stats()).join().unwrap();
    let out = stats.outbound;
    assert_eq!((out.pushed, out.popped, out.full_events, out.in_flight), (5, 3, 2, 2));
    assert_eq!(out.pushed, out.popped + out.in_flight);
    let inn = stats.inbound;
    assert_eq!((inn.pushed, inn.popped, inn.full_events, inn.in_flight), (1, 0, 0, 1));
    assert_eq!(host.outbound.len(), 2);
    assert_eq!(core.inbound.len(), 1);
    assert_eq!(core.outbound.free_slots(), 2);
    assert_eq!(stats, host.stats());
    let order: Vec<u8> = got.iter().map(|r| r[0]).collect();
    assert_eq!(order, vec![0, 1, 2]);
}

#[test]
fn waits_end_early_when_the_peer_is_gone() {
    let (mut core, host) = Boundary::new(1);
    let left_behind = rec(5);
    core.push(Arc::clone(&left_behind)).unwrap();
    let monitor = core.monitor();
    drop(host);
    assert!(core.outbound.is_abandoned() && core.inbound.is_abandoned());

    let start = Instant::now();
    assert!(core.push_blocking(rec(6), Duration::from_secs(60)).is_err());
    assert!(core.wait_pop(Duration::from_secs(60)).is_none());
    assert!(start.elapsed() < Duration::from_secs(10));

    // The record still in the ring is dropped with the ring, not leaked.
    assert_eq!(Arc::strong_count(&left_behind), 2);
    drop(core);
    assert_eq!(Arc::strong_count(&left_behind), 1);
    assert_eq!(monitor.stats().outbound.in_flight, 1);
}

#[test]
fn records_pushed_before_the_producer_left_are_still_delivered() {
    let (mut core, mut host) = Boundary::new(4);
    core.push(rec(1)).unwrap();
    core.push(rec(2)).unwrap();
    drop(core);
    assert_eq!(host.wait_pop(Duration::from_secs(60)).unwrap()[0], 1);
    assert_eq!(host.wait_pop(Duration::from_secs(60)).unwrap()[0], 2);
    assert!(host.wait_pop(Duration::from_secs(60)).is_none());
}

#[test]
#[should_panic(expected = "at least one item")]
fn zero_capacity_is_refused() {
    let _ = Boundary::new(0);
}
