//! A coordinator restarted while it is cut off from its peers (its endpoint drops everything
//! for longer than its rejoin period) must not sign its slots again. With its state directory
//! it waits to learn its chain back and continues after the newest seq it signed; without one
//! it re-signs from seq 0 and the node detects the equivocation. Regression test for
//! `psl chaos` seed 115 (a coordinator killed and restarted during a cut).

use psl_capsule::{new_capsule, Limits, SignedMetadata};
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, FabricError, FabricStats, InProcHub, Message};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::{CoordinatorConfig, NodeConfig, RejectReason};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An endpoint that can be cut off: while cut, it sends nothing and drops what it receives.
struct Gate<F> {
    inner: F,
    cut: Arc<AtomicBool>,
}

impl<F: Fabric> Fabric for Gate<F> {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        if self.cut.load(Ordering::Acquire) {
            return Ok(());
        }
        self.inner.publish(msg)
    }
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        let m = self.inner.recv_timeout(timeout)?;
        Ok(m.filter(|_| !self.cut.load(Ordering::Acquire)))
    }
    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        let m = self.inner.try_recv()?;
        Ok(m.filter(|_| !self.cut.load(Ordering::Acquire)))
    }
    fn stats(&self) -> FabricStats {
        self.inner.stats()
    }
}

struct Setup {
    meta: SignedMetadata,
    app: AppKey,
    hub: InProcHub,
}

fn setup() -> Setup {
    let owner = OwnerKey::from_seed(&[7; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule(&owner, 3, "coord-restart", 0, Limits::default()).unwrap();
    Setup { meta, app, hub: InProcHub::new(FabricConfig::default()).unwrap() }
}

fn coordinator(s: &Setup, name: &str, state: Option<&Path>, cut: Arc<AtomicBool>) -> Node {
    coordinator_with(s, name, state, cut, NodeConfig { rejoin_ms: 300, ..NodeConfig::default() })
}

fn coordinator_with(s: &Setup, name: &str, state: Option<&Path>, cut: Arc<AtomicBool>, core: NodeConfig) -> Node {
    let opts = NodeOptions {
        node_id: 0x7000,
        writers: 0,
        coordinator: Some(CoordinatorConfig { epoch_ms: 20, eoe_timeout_ms: 200, ..CoordinatorConfig::default() }),
        coordinator_state: state.map(Path::to_path_buf),
        core,
        ..NodeOptions::default()
    };
    let keys = NodeKeys::derive(&s.meta, &s.app, &opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(Gate { inner: s.hub.endpoint(name), cut });
    Node::start(keys, ep, opts).unwrap()
}

fn node(s: &Setup) -> Node {
    let opts = NodeOptions { node_id: 1, writers: 1, ..NodeOptions::default() };
    let keys = NodeKeys::derive(&s.meta, &s.app, &opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(s.hub.endpoint("node1"));
    Node::start(keys, ep, opts).unwrap()
}

/// Puts and syncs through a coordinator, restarts it, puts and syncs again. Returns the node's
/// equivocation rejections and whether the second sync completed.
fn restart_once(state: Option<&Path>) -> (u64, bool) {
    let s = setup();
    let n = node(&s);
    let c = coordinator(&s, "coord-a", state, Arc::new(AtomicBool::new(false)));
    for i in 0..50u32 {
        n.put(format!("k{i}").as_bytes(), b"before").unwrap();
    }
    n.sync(Duration::from_secs(20)).expect("sync through the first coordinator");
    // Let it sign a few more epochs' records, so the restart has slots to collide with.
    std::thread::sleep(Duration::from_millis(200));
    c.shutdown();
    // Restarted while cut off for twice its rejoin period, then healed.
    let cut = Arc::new(AtomicBool::new(true));
    let c = coordinator(&s, "coord-b", state, cut.clone());
    std::thread::sleep(Duration::from_millis(600));
    cut.store(false, Ordering::Release);
    for i in 0..50u32 {
        n.put(format!("k{i}").as_bytes(), b"after").unwrap();
    }
    let synced = n.sync(Duration::from_secs(if state.is_some() { 20 } else { 2 })).is_ok();
    std::thread::sleep(Duration::from_millis(200));
    let eq = n.metrics().rejected(RejectReason::Equivocation);
    c.shutdown();
    n.shutdown();
    (eq, synced)
}

#[test]
fn with_its_state_directory_a_restarted_coordinator_continues_its_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (equivocations, synced) = restart_once(Some(dir.path()));
    assert_eq!(equivocations, 0, "the restarted coordinator signed a seq it had signed before");
    assert!(synced, "the node's sync after the restart did not complete");
    assert!(dir.path().join("coordinator-chain").exists());
}

#[test]
fn without_one_it_re_signs_and_the_node_sees_the_equivocation() {
    // The scenario is real: the same restart without a state directory equivocates, and the
    // node's detector catches it (so the test above can fail).
    let (equivocations, _) = restart_once(None);
    assert!(equivocations > 0, "expected the node to detect the re-signed slots");
}

#[test]
fn a_restart_whose_repair_cache_lost_the_chain_head_still_continues_the_chain() {
    // The coordinator restarts without a state directory but with its peer up: it learns its
    // chain from the node within its rejoin period. Its repair cache holds one record, and the
    // node writes all along, so by the end of the rejoin the cache holds a data record, not
    // the chain's head. It must still resume after that head (before the fix it needed the head
    // in the cache, wrote on from seq 0, and the node saw the equivocation).
    let s = setup();
    let n = Arc::new(node(&s));
    let tiny = NodeConfig { rejoin_ms: 300, cache_bytes_max: 1, ..NodeConfig::default() };
    let c = coordinator_with(&s, "coord-a", None, Arc::new(AtomicBool::new(false)), tiny);
    for i in 0..50u32 {
        n.put(format!("k{i}").as_bytes(), b"before").unwrap();
    }
    n.sync(Duration::from_secs(20)).expect("sync through the first coordinator");
    std::thread::sleep(Duration::from_millis(200));
    c.shutdown();
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (n, writing) = (n.clone(), writing.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while writing.load(Ordering::Acquire) {
                n.put(format!("w{}", i % 64).as_bytes(), b"during").unwrap();
                i += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let c = coordinator_with(&s, "coord-b", None, Arc::new(AtomicBool::new(false)), tiny);
    std::thread::sleep(Duration::from_millis(700));
    writing.store(false, Ordering::Release);
    writer.join().unwrap();
    for i in 0..50u32 {
        n.put(format!("k{i}").as_bytes(), b"after").unwrap();
    }
    let synced = n.sync(Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(n.metrics().rejected(RejectReason::Equivocation), 0, "the restarted coordinator re-signed its seqs");
    synced.expect("the node's sync after the restart");
    c.shutdown();
}
