//! Idle epochs (docs/protocol/scl.md §6): an idle capsule's coordinator closes an epoch only
//! every `epoch_idle_ms`, and a `sync()` on any node (its epoch-wanted hint) or a write brings
//! the `epoch_ms` pace back at once. Here `epoch_ms` is 20 ms and `epoch_idle_ms` 60 s, so a
//! `sync()` bounded by 5 s can only return through the hint, and a write is linked only because
//! it counts as activity.

use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

const IDLE_MS: u64 = 60_000;

fn cluster() -> (Vec<Node>, Node) {
    let owner = OwnerKey::from_seed(&[47; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule(&owner, 3, "idle", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let opts = NodeOptions {
        node_id: 0x7000,
        writers: 0,
        coordinator: Some(psl_scl::CoordinatorConfig {
            epoch_ms: 20,
            epoch_idle_ms: IDLE_MS,
            eoe_timeout_ms: 200,
            ..Default::default()
        }),
        ..NodeOptions::default()
    };
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let coordinator = Node::start(keys, Arc::new(hub.endpoint("coordinator")), opts).unwrap();
    let nodes = (1..=2)
        .map(|id| {
            let opts = NodeOptions { node_id: id, writers: 2, ..NodeOptions::default() };
            let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
            let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint(format!("node{id}")));
            Node::start(keys, ep, opts).unwrap()
        })
        .collect();
    (nodes, coordinator)
}

/// Waits (at most `within`) until `node` has applied a SYNC above `epoch`; its epoch then.
fn epoch_above(node: &Node, epoch: u64, within: Duration) -> Option<u64> {
    let deadline = Instant::now() + within;
    loop {
        let e = node.epoch().unwrap();
        if e > epoch {
            return Some(e);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_idle_capsule_stops_closing_epochs_and_a_sync_or_a_write_brings_them_back() {
    let (nodes, coordinator) = cluster();
    // A coordinator starts busy: its first epoch comes at the busy pace.
    let first = epoch_above(&nodes[0], 0, Duration::from_secs(10)).expect("a first epoch");
    // Then nothing is written: after the epoch that follows the start's own records, the
    // epochs stop (at 20 ms they would be dozens a second).
    std::thread::sleep(Duration::from_millis(1_000));
    let settled = nodes[0].epoch().unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(nodes[0].epoch().unwrap(), settled, "an idle capsule closed epochs at the busy pace");
    assert!(settled >= first);

    // A sync() needs two SYNCs after the call: the node's epoch-wanted hint makes the idle
    // coordinator open them now, not in a minute.
    nodes[1].sync(Duration::from_secs(5)).expect("sync() on an idle capsule returns through its hint");
    let after_sync = nodes[1].epoch().unwrap();
    assert!(after_sync >= settled + 2, "epoch {after_sync} after a sync() from {settled}");

    // Idle again; then a write on one node: a SYNC comes at the busy pace and every node
    // applies it.
    std::thread::sleep(Duration::from_millis(1_000));
    let quiet = nodes[1].epoch().unwrap();
    nodes[0].put(b"k", b"v").unwrap();
    let linked = epoch_above(&nodes[1], quiet, Duration::from_secs(5)).expect("the write's epoch, at the busy pace");
    assert!(linked > quiet);
    assert_eq!(nodes[1].get(b"k").as_deref(), Some(&b"v"[..]));

    for n in nodes {
        n.shutdown();
    }
    coordinator.shutdown();
}
