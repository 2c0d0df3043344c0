//! Several nodes and a coordinator in one process over the in-process fabric: puts through
//! every node, then `sync()` everywhere, and every memtable is the same.

use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::sync::Arc;
use std::time::Duration;

mod common;

fn cluster(nodes: u32) -> (Vec<Node>, Node) {
    let owner = OwnerKey::from_seed(&[42; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule(&owner, 3, "inproc", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let coordinator = common::start_coordinator(&hub, &meta, &app, 30);
    let mut out = Vec::new();
    for id in 1..=nodes {
        let opts = NodeOptions { node_id: id, writers: 2, ..NodeOptions::default() };
        let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
        let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint(format!("node{id}")));
        out.push(Node::start(keys, ep, opts).unwrap());
    }
    (out, coordinator)
}

#[test]
fn puts_everywhere_then_sync_gives_identical_memtables() {
    let (nodes, coordinator) = cluster(3);
    // Keys owned by one node each (so the last put is the expected value), plus contended keys
    // written by every node.
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..3000u32 {
        let n = (i % 3) as usize;
        let key = format!("own{}-{}", n, i % 300);
        let val = format!("v{i}");
        nodes[n].put(key.as_bytes(), val.as_bytes()).unwrap();
        expected.insert(key, val);
        let c = format!("shared{}", i % 50);
        nodes[(i as usize * 7) % 3].put(c.as_bytes(), format!("s{i}").as_bytes()).unwrap();
    }
    nodes[0].delete(b"own0-0").unwrap();
    expected.remove("own0-0");
    for n in &nodes {
        n.sync(Duration::from_secs(30)).expect("sync completes");
    }
    let d0 = nodes[0].memtable().snapshot();
    for n in &nodes[1..] {
        assert_eq!(n.memtable().snapshot(), d0, "memtables differ after sync");
    }
    assert_eq!(coordinator.digest(), nodes[0].digest(), "the coordinator is a replica too");
    for (k, v) in &expected {
        assert_eq!(nodes[2].get(k.as_bytes()).as_deref(), Some(v.as_bytes()), "key {k}");
    }
    assert_eq!(nodes[1].get(b"own0-0"), None);
    for n in &nodes {
        let m = n.metrics();
        assert_eq!(m.rejected(psl_scl::RejectReason::Signature), 0);
        assert_eq!(m.rejected(psl_scl::RejectReason::Equivocation), 0);
    }
    for n in nodes {
        n.shutdown();
    }
    coordinator.shutdown();
}

#[test]
fn put_limits_are_enforced() {
    let (nodes, _c) = cluster(1);
    let n = &nodes[0];
    assert!(n.put(&[b'k'; 251], b"v").is_err());
    assert!(n.put(b"", b"v").is_err());
    assert!(n.put(b"k", &vec![0u8; (1 << 20) + 1]).is_err());
    assert!(n.put(b"k", b"v").is_ok());
}

#[test]
fn a_fenced_write_at_or_above_its_fence_writes_nothing_and_an_advanced_clock_outdates_it() {
    let (nodes, _c) = cluster(2);
    let (a, b) = (&nodes[0], &nodes[1]);
    let v = a.write_below(b"k", Some(b"1"), 1 << 20).unwrap();
    assert!(v.lamport < 1 << 20);
    assert_eq!(a.entry(b"k").unwrap().version, v);
    // The fence is below the next tick: refused, nothing applied or queued.
    let fence = a.lamport() + 1;
    assert!(matches!(a.write_below(b"k", Some(b"2"), fence), Err(psl_node::NodeError::Fenced { .. })));
    assert_eq!(a.get(b"k").as_deref(), Some(&b"1"[..]));
    // B moves its clock past the fence: its write is newer than anything A may write below it.
    b.advance_clock(1 << 20);
    let w = b.write_below(b"k", Some(b"3"), u64::MAX).unwrap();
    assert!(w.lamport > 1 << 20);
    let late = a.write_below(b"k", Some(b"late"), 1 << 20).unwrap();
    assert!(late < w);
    for n in [a, b] {
        n.sync(Duration::from_secs(30)).unwrap();
    }
    for n in [a, b] {
        assert_eq!(n.get(b"k").as_deref(), Some(&b"3"[..]), "the write after the fence wins everywhere");
    }
}
