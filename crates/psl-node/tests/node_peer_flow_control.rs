//! Flow control toward peer nodes, over the in-process fabric: a writer node and a slow peer
//! (it takes each message off the fabric 100 µs late, as a node on a busy core would) whose
//! receive queue holds only 256 messages. The writer seals tiny records far faster than the
//! peer can take them, yet the peer's tagged heads hints pace the writer: its queue never
//! overflows, nothing is dropped or repaired, and the peer ends with every write. When the peer
//! goes silent (shut down) the writer waits one stall, then writes on without it.

use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, FabricError, FabricStats, InProcHub, Message};
use psl_node::flow::FlowOptions;
use psl_node::{Node, NodeKeys, NodeOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An endpoint that takes every message late.
struct Slow<F>(F, Duration);

impl<F: Fabric> Fabric for Slow<F> {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        self.0.publish(msg)
    }
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        let m = self.0.recv_timeout(timeout)?;
        if m.is_some() {
            std::thread::sleep(self.1);
        }
        Ok(m)
    }
    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        self.0.try_recv()
    }
    fn stats(&self) -> FabricStats {
        self.0.stats()
    }
}

const PUTS: usize = 6_000;

#[test]
fn a_slow_peers_hints_pace_a_writer_so_its_queue_never_drops_and_a_silent_peer_is_waited_for_one_stall() {
    let owner = OwnerKey::from_seed(&[43; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule(&owner, 3, "peer-flow", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig { queue_msgs_max: 256, ..FabricConfig::default() }).unwrap();

    let peer_opts = NodeOptions { node_id: 2, writers: 0, ..NodeOptions::default() }.shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &peer_opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(Slow(hub.endpoint("peer"), Duration::from_micros(100)));
    let peer = Node::start(keys, ep, peer_opts).unwrap();

    // One op per record: every put is a message for the peer.
    let opts = NodeOptions {
        node_id: 1,
        writers: 1,
        batch_ops_max: 1,
        flow: FlowOptions { window_ops: 512, window_records: 64, stall: Duration::from_millis(1_000) },
        ..NodeOptions::default()
    }
    .shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("writer"));
    let writer = Node::start(keys, ep, opts).unwrap();
    let w = writer.writers()[0];

    // The peer's first hints name the writer once it has applied a record of it.
    writer.put(b"first", b"v").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while peer.next_seq_of(w).unwrap() == 0 {
        assert!(Instant::now() < deadline, "the peer applies the first record");
        std::thread::sleep(Duration::from_millis(10));
    }

    for i in 0..PUTS {
        writer.put(format!("key-{i:05}").as_bytes(), b"value").unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while peer.memtable().len() < PUTS + 1 {
        assert!(Instant::now() < deadline, "the peer has {} of {} keys", peer.memtable().len(), PUTS + 1);
        std::thread::sleep(Duration::from_millis(20));
    }
    let waits = writer.metrics().flow_waits.load(Ordering::Relaxed);
    let dropped = (peer.fabric_stats().dropped_full, peer.inbound_dropped());
    let repairs = peer.metrics().repair_requests_sent.load(Ordering::Relaxed);
    eprintln!("flow waits {waits}, dropped at the peer {dropped:?}, repair requests {repairs}");
    assert!(waits > 0, "the writer waited for its slow peer");
    assert_eq!(dropped, (0, 0), "nothing dropped toward the peer");
    assert_eq!(repairs, 0, "nothing to repair");

    // The peer goes silent: the writer waits about one stall, then writes on without it.
    peer.shutdown();
    let waits_before = writer.metrics().flow_waits.load(Ordering::Relaxed);
    let t = Instant::now();
    for i in 0..2_000 {
        writer.put(format!("more-{i:05}").as_bytes(), b"value").unwrap();
    }
    let took = t.elapsed();
    eprintln!("2,000 puts with the peer gone took {took:?}");
    assert!(writer.metrics().flow_waits.load(Ordering::Relaxed) > waits_before, "it waited for the silent peer");
    assert!(took < Duration::from_secs(8), "then wrote on without it: {took:?}");
    writer.shutdown();
}
