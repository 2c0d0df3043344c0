//! `Author::write_bodies`: a batch sealed in chain order and signed on a pool's threads is the
//! same bytes as the bodies written one by one, and a failed batch changes nothing.

mod common;

use common::Fixture;
use psl_capsule::{Action, Author, Body, Limits, Op, Record, SealError, SignPool, DEFAULT_COORDINATOR};

/// Mixed bodies: blocks, indexes and data batches (stamped after `lamport`).
fn bodies(n: usize, lamport: u64) -> Vec<Body> {
    (0..n)
        .map(|i| match i % 3 {
            0 => Body::DbBlock(vec![i as u8; 100 + i]),
            1 => Body::DbIndex(vec![i as u8; 10]),
            _ => Body::Data(vec![Op {
                lamport: lamport + 10 * i as u64,
                key: format!("k{i}").into_bytes(),
                action: Action::Put(vec![7; i]),
            }]),
        })
        .collect()
}

/// Two identically built writers (same keys, same salt seed) with a short history: `pre`
/// records, then (if `sync`) an epoch entered so that the next record carries its link.
fn twins(fx: &Fixture, pre: usize, sync: bool) -> (Author, Author) {
    let mut coord = fx.author(DEFAULT_COORDINATOR).with_salt_seed(9);
    let make = || {
        let mut a = fx.author(4).with_salt_seed(77);
        for i in 0..pre {
            a.write_ops([(format!("pre{i}"), Some("v"))]).unwrap();
        }
        a
    };
    let (mut a, mut b) = (make(), make());
    if sync {
        let s = coord.write_sync(vec![]).unwrap();
        a.enter_epoch(s.link(), 1);
        b.enter_epoch(s.link(), 1);
    }
    (a, b)
}

fn state(a: &Author) -> (u64, u64, u64) {
    (a.next_seq(), a.lamport(), a.epoch())
}

#[test]
fn a_batch_is_byte_identical_to_writing_one_by_one() {
    let fx = Fixture::new(21);
    let v = fx.verifier();
    for threads in [1, 2, 3] {
        let pool = SignPool::new(threads).unwrap();
        for n in [1, 2, 17] {
            for (pre, sync) in [(0, false), (3, false), (2, true)] {
                let (mut one, mut batch) = twins(&fx, pre, sync);
                let want: Vec<Record> =
                    bodies(n, one.lamport() + 1).into_iter().map(|b| one.write_body(b).unwrap()).collect();
                let got = batch.write_bodies(bodies(n, batch.lamport() + 1), &pool).unwrap();
                let what = format!("{threads} threads, batch of {n}, {pre} records before, sync {sync}");
                assert_eq!(got.len(), n, "{what}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.bytes(), w.bytes(), "{what}");
                    assert_eq!(g.hash(), w.hash(), "{what}");
                    assert_eq!(g.header().seq, w.header().seq, "{what}");
                    assert_eq!(g.header().prev, w.header().prev, "{what}");
                    assert_eq!(g.header().links, w.header().links, "{what}");
                    assert!(v.verify_open(g.clone()).is_ok(), "{what}");
                }
                // A chain: dense seqs from `pre`, each `prev` the hash before it.
                for (i, pair) in got.windows(2).enumerate() {
                    assert_eq!(pair[1].header().prev, pair[0].hash(), "{what}");
                    assert_eq!(pair[1].header().seq, (pre + i + 1) as u64, "{what}");
                }
                assert_eq!(got[0].header().seq, pre as u64, "{what}");
                assert_eq!(!got[0].header().links.is_empty(), sync, "{what}: the epoch link goes first");
                // The writers are in the same state after: the next record is the same too.
                assert_eq!(state(&batch), state(&one), "{what}");
                let next = |a: &mut Author| a.write_body(Body::DbIndex(vec![1])).unwrap();
                assert_eq!(next(&mut batch), next(&mut one), "{what}");
            }
        }
    }
}

#[test]
fn a_failed_batch_changes_no_chain_state() {
    let limits = Limits { record_bytes_max: 4096, ..Limits::default() };
    let fx = Fixture::with_limits(22, limits);
    let pool = SignPool::new(2).unwrap();
    let sync = fx.author(DEFAULT_COORDINATOR).write_sync(vec![]).unwrap();
    let mut a = fx.author(5);
    a.write_body(Body::DbIndex(vec![0])).unwrap();
    let head = a.write_body(Body::DbIndex(vec![1])).unwrap();
    a.enter_epoch(sync.link(), 1);
    let before = state(&a);
    // The third body is over the record size limit.
    let bad = vec![Body::DbBlock(vec![1; 100]), Body::DbBlock(vec![2; 100]), Body::DbBlock(vec![3; 5000])];
    assert!(matches!(a.write_bodies(bad, &pool), Err(SealError::RecordSize { .. })));
    assert_eq!(state(&a), before);
    // The chain goes on from the last record returned, with the epoch link still due.
    let recs = a.write_bodies(vec![Body::DbBlock(vec![4; 100]), Body::DbBlock(vec![5; 100])], &pool).unwrap();
    assert_eq!((recs[0].header().seq, recs[0].header().prev), (2, head.hash()));
    assert_eq!(recs[0].header().links, vec![sync.link()]);
    assert!(recs[1].header().links.is_empty());
    let v = fx.verifier();
    assert!(recs.iter().all(|r| v.verify_open(r.clone()).is_ok()));
    // An empty batch writes nothing.
    let before = state(&a);
    assert!(a.write_bodies(Vec::new(), &pool).unwrap().is_empty());
    assert_eq!(state(&a), before);
}
