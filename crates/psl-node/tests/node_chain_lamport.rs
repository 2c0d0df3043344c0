//! A writer's chain never goes back in Lamport time, however its puts race its end-of-epoch
//! records. An EOE takes its time from the node's clock; an op stamped just before that tick
//! must be sealed before the EOE, or the record after the EOE carries an older time than the
//! EOE and every audit of the capsule reports the chain damaged ("monotonic check failed:
//! lamport time goes backwards along the chain", first seen in `psl chaos --byzantine` seed
//! 416 on an honest front end).

mod common;

use common::Observer;
use psl_capsule::{new_capsule, Kind, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn puts_racing_end_of_epoch_records_keep_the_chain_monotonic() {
    let owner = OwnerKey::from_seed(&[42; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule(&owner, 3, "chain-lamport", 0, Limits::default()).unwrap();
    let limits = meta.meta.policy.limits;
    let hub = InProcHub::new(FabricConfig::default()).unwrap();

    // An untrusted observer keeps every record on the fabric.
    let observer = Observer::start(&hub, limits);
    let seen = observer.seen.clone();

    // Epochs as short as the coordinator allows: an EOE from the node every couple of ms.
    let coordinator = common::start_coordinator(&hub, &meta, &app, 2);
    let opts = NodeOptions { node_id: 1, writers: 1, ..NodeOptions::default() };
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let node = Arc::new(Node::start(keys, Arc::new(hub.endpoint("node1")), opts).unwrap());

    // Three threads put as fast as the writer takes them, for two seconds.
    let until = Instant::now() + Duration::from_secs(2);
    let putters: Vec<_> = (0..3)
        .map(|t| {
            let node = node.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while Instant::now() < until {
                    node.put(format!("k{t}-{}", i % 64).as_bytes(), b"v").unwrap();
                    i += 1;
                }
                i
            })
        })
        .collect();
    let puts: u64 = putters.into_iter().map(|p| p.join().unwrap()).sum();
    node.sync(Duration::from_secs(30)).expect("sync completes");
    std::thread::sleep(Duration::from_millis(200));
    observer.stop();

    let writer = node.writers()[0];
    let mut chain: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    for r in seen.lock().iter().filter(|r| r.header().writer == writer) {
        let h = r.header();
        chain.insert(h.seq, (h.lamport, h.kind == Kind::Data));
    }
    let eoes = chain.values().filter(|(_, data)| !data).count();
    assert!(puts > 100 && eoes > 10, "the race was exercised: {puts} puts, {eoes} control records");
    let mut prev: Option<(u64, u64)> = None;
    for (seq, (lamport, _)) in &chain {
        if let Some((pseq, plamport)) = prev {
            if pseq + 1 == *seq {
                assert!(
                    *lamport >= plamport,
                    "writer {writer}: seq {seq} has Lamport time {lamport}, below seq {pseq}'s {plamport} \
                     ({puts} puts, {eoes} control records)"
                );
            }
        }
        prev = Some((*seq, *lamport));
    }
    if let Ok(node) = Arc::try_unwrap(node) {
        node.shutdown();
    }
    coordinator.shutdown();
}
