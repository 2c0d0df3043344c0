//! Records cross in order, exactly once, both directions at once, through tiny rings.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use psl_boundary::{Boundary, Consumer, Producer, SealedRecord};

const N: u64 = 20_000;
const WAIT: Duration = Duration::from_secs(30);

/// A record: direction tag, sequence number, and filler, as opaque bytes.
fn record(tag: u8, seq: u64) -> SealedRecord {
    let mut bytes = vec![tag; 24];
    bytes[..8].copy_from_slice(&seq.to_le_bytes());
    Arc::from(bytes)
}

fn seq_of(tag: u8, r: &SealedRecord) -> u64 {
    assert_eq!(r.len(), 24);
    assert!(r[8..].iter().all(|&b| b == tag), "record from the wrong direction or damaged");
    u64::from_le_bytes(r[..8].try_into().unwrap())
}

fn produce(mut tx: Producer, tag: u8) -> Producer {
    for seq in 0..N {
        // Alternate the non-blocking and the blocking push.
        let r = record(tag, seq);
        let r = match tx.push(r) {
            Ok(()) => continue,
            Err(full) => full.into_inner(),
        };
        tx.push_blocking(r, WAIT).expect("consumer stalled");
    }
    tx
}

fn consume(mut rx: Consumer, tag: u8, start_late: Duration) -> Consumer {
    thread::sleep(start_late);
    let mut next = 0u64;
    let mut batch = Vec::new();
    while next < N {
        batch.clear();
        if rx.pop_batch(&mut batch, 3) == 0 {
            batch.push(rx.wait_pop(WAIT).expect("producer stalled"));
        }
        for r in &batch {
            assert_eq!(seq_of(tag, r), next, "out of order or duplicated");
            next += 1;
        }
    }
    assert_eq!(rx.pop(), None, "more records than were pushed");
    rx
}

#[test]
fn both_directions_in_order_exactly_once_under_backpressure() {
    let (core, host) = Boundary::new(2);
    let monitor = core.monitor();

    // Four threads: each end on its own. The consumers start late, so both producers
    // certainly find their ring full and block.
    let core_out = thread::spawn(move || produce(core.outbound, 1));
    let host_out = thread::spawn(move || consume(host.outbound, 1, Duration::from_millis(20)));
    let host_in = thread::spawn(move || produce(host.inbound, 2));
    let core_in = thread::spawn(move || consume(core.inbound, 2, Duration::from_millis(20)));

    let core_out = core_out.join().unwrap();
    let host_out = host_out.join().unwrap();
    let host_in = host_in.join().unwrap();
    let core_in = core_in.join().unwrap();

    let stats = monitor.stats();
    for ring in [stats.outbound, stats.inbound] {
        assert_eq!(ring.capacity, 2);
        assert_eq!(ring.pushed, N);
        assert_eq!(ring.popped, N);
        assert_eq!(ring.in_flight, 0);
        assert!(ring.full_events >= 1, "backpressure was not exercised: {ring:?}");
    }
    assert_eq!(core_out.stats(), host_out.stats());
    assert_eq!(host_in.stats(), core_in.stats());
}

#[test]
fn one_slot_ring_ping_pong() {
    // Capacity 1: every record must be taken before the next fits.
    let (mut core, mut host) = Boundary::new(1);
    let t = thread::spawn(move || {
        for _ in 0..2_000 {
            let r = host.wait_pop(WAIT).expect("core stalled");
            host.push_blocking(r, WAIT).unwrap();
        }
        host
    });
    for seq in 0..2_000 {
        core.push_blocking(record(7, seq), WAIT).unwrap();
        let back = core.wait_pop(WAIT).expect("host stalled");
        assert_eq!(seq_of(7, &back), seq);
    }
    let host = t.join().unwrap();
    assert_eq!(host.stats().outbound.popped, 2_000);
    assert_eq!(core.stats().inbound.popped, 2_000);
}
