//! Atomic batches (`Node::write_batch`): a reader on the writing node or on any other node
//! sees all of a batch's ops or none of them, whether it reads key by key or scans; a batch
//! that does not fit one record, or crosses its fence, writes nothing.

use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeError, NodeKeys, NodeOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

const KEYS: usize = 8;
const BATCHES: u64 = 400;

fn cluster(nodes: u32) -> (Vec<Arc<Node>>, Node) {
    let owner = OwnerKey::from_seed(&[43; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule(&owner, 3, "atomic", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let coordinator = common::start_coordinator(&hub, &meta, &app, 30);
    let mut out = Vec::new();
    for id in 1..=nodes {
        // Several writers, so a batch's keys belong to different writers' queues.
        let opts = NodeOptions { node_id: id, writers: 3, ..NodeOptions::default() };
        let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
        let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint(format!("node{id}")));
        out.push(Arc::new(Node::start(keys, ep, opts).unwrap()));
    }
    (out, coordinator)
}

fn key(i: usize) -> Vec<u8> {
    format!("acct/{i}").into_bytes()
}

fn gen_of(v: Option<std::sync::Arc<[u8]>>) -> u64 {
    v.map_or(0, |v| std::str::from_utf8(&v).unwrap().parse().unwrap())
}

/// Reads the batch's keys one by one in the order a batch applies them, and by a scan; each
/// batch writes a higher generation to every key, so a key read later than another can never
/// hold an older generation, and a scan must find one generation throughout.
fn check_reads(node: &Node, done: &AtomicBool, checks: &AtomicU64) {
    while !done.load(Ordering::Acquire) {
        let mut last = 0;
        for i in 0..KEYS {
            let g = gen_of(node.get(&key(i)));
            assert!(
                g >= last,
                "key {i} holds generation {g} after key {} held {last}: a batch was half applied",
                i - 1
            );
            last = g;
        }
        let (entries, _) = node.memtable().scan(b"acct/", None, KEYS + 1);
        let gens: Vec<u64> = entries.iter().map(|e| gen_of(e.entry.value.clone())).collect();
        if let Some(first) = gens.first() {
            assert!(gens.len() == KEYS && gens.iter().all(|g| g == first), "a scan saw generations {gens:?}");
        }
        checks.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn no_reader_on_any_node_sees_a_batch_half_applied() {
    let (nodes, coordinator) = cluster(2);
    let done = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = nodes
        .iter()
        .map(|n| {
            let (n, done, checks) = (n.clone(), done.clone(), checks.clone());
            std::thread::spawn(move || check_reads(&n, &done, &checks))
        })
        .collect();
    let writer = &nodes[0];
    for g in 1..=BATCHES {
        let value = g.to_string();
        let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
        let ops: Vec<(&[u8], Option<&[u8]>)> = keys.iter().map(|k| (k.as_slice(), Some(value.as_bytes()))).collect();
        let versions = writer.write_batch(&ops, u64::MAX).expect("the batch is written");
        assert_eq!(versions.len(), KEYS);
        assert!(versions.windows(2).all(|w| w[0].lamport < w[1].lamport), "one op after another: {versions:?}");
        // Plain writes between the batches, to the same writers' queues.
        writer.put(format!("noise/{g}").as_bytes(), b"x").unwrap();
    }
    for n in &nodes {
        n.sync(Duration::from_secs(30)).expect("sync completes");
    }
    done.store(true, Ordering::Release);
    for r in readers {
        r.join().expect("no reader saw a batch half applied");
    }
    assert!(checks.load(Ordering::Relaxed) > 0, "the readers ran");
    for n in &nodes {
        for i in 0..KEYS {
            assert_eq!(gen_of(n.get(&key(i))), BATCHES, "key {i}");
        }
        assert_eq!(n.metrics().rejected(psl_scl::RejectReason::Body), 0);
    }
    assert_eq!(coordinator.digest(), nodes[1].digest());
    assert_eq!(nodes[0].digest(), nodes[1].digest());
    for n in nodes {
        Arc::into_inner(n).expect("the readers have stopped").shutdown();
    }
    coordinator.shutdown();
}

#[test]
fn a_batch_that_does_not_fit_one_record_or_crosses_its_fence_writes_nothing() {
    let (nodes, coordinator) = cluster(1);
    let n = &nodes[0];
    // Nine values of a megabyte: over the default 8 MiB record.
    let big = vec![7u8; 1 << 20];
    let names: Vec<String> = (0..9).map(|i| format!("big/{i}")).collect();
    let too_big: Vec<(&[u8], Option<&[u8]>)> = names.iter().map(|k| (k.as_bytes(), Some(&big[..]))).collect();
    assert!(matches!(n.write_batch(&too_big, u64::MAX), Err(NodeError::BatchTooLarge { ops: 9, .. })));
    let keys: Vec<String> = (0..5000).map(|i| format!("many/{i}")).collect();
    let many: Vec<(&[u8], Option<&[u8]>)> = keys.iter().map(|k| (k.as_bytes(), Some(&b"v"[..]))).collect();
    assert!(matches!(n.write_batch(&many, u64::MAX), Err(NodeError::BatchTooLarge { ops: 5000, .. })));
    assert!(matches!(n.write_batch(&[(b"", Some(b"v"))], u64::MAX), Err(NodeError::EmptyKey)));
    // A fence the clock has passed: nothing applied, not even the ops below it.
    n.put(b"tick", b"1").unwrap();
    let fence = n.lamport() + 2;
    let fenced: Vec<(&[u8], Option<&[u8]>)> = vec![(b"f1", Some(b"1")), (b"f2", Some(b"2")), (b"f3", Some(b"3"))];
    assert!(matches!(n.write_batch(&fenced, fence), Err(NodeError::Fenced { .. })));
    for k in [&b"big/0"[..], b"big/8", b"many/0", b"f1", b"f2", b"f3"] {
        assert_eq!(n.get(k), None, "{}", String::from_utf8_lossy(k));
    }
    // A key written twice keeps its last op; a delete in a batch is a tombstone.
    n.put(b"gone", b"x").unwrap();
    let ops: Vec<(&[u8], Option<&[u8]>)> = vec![(b"twice", Some(b"1")), (b"gone", None), (b"twice", Some(b"2"))];
    n.write_batch(&ops, u64::MAX).unwrap();
    assert_eq!(n.get(b"twice").as_deref(), Some(&b"2"[..]));
    assert_eq!(n.get(b"gone"), None);
    n.sync(Duration::from_secs(30)).unwrap();
    assert_eq!(coordinator.digest(), n.digest());
    drop(nodes);
    coordinator.shutdown();
}
