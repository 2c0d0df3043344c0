//! Flow control from CapsuleDB back to the writers, over the in-process fabric: a CapsuleDB
//! whose store is slow (every sync sleeps) acks only what its tree has caught up with, so a
//! writer that could outrun it by far waits for its acks instead: the writer never has more
//! than its window in flight, and CapsuleDB's small queues (fabric, boundary ring, channels)
//! never overflow, so nothing is dropped and nothing needs repair. When CapsuleDB stops acking
//! (shut down), the writer waits at most one stall and then goes on without it.
use psl_capsule::{new_capsule, Author, Limits, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore, RecordHash};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::flow::FlowOptions;
use psl_node::{Node, NodeKeys, NodeOptions};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A store whose every sync takes `sync_ms`: a CapsuleDB on a slow disk.
struct SlowStore {
    inner: Arc<MemStore>,
    sync_ms: u64,
}

impl BlockStore for SlowStore {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        self.inner.put(hash, bytes)
    }
    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        self.inner.get(hash)
    }
    fn sync(&self) -> std::io::Result<()> {
        std::thread::sleep(Duration::from_millis(self.sync_ms));
        Ok(())
    }
}

const PUTS: usize = 24_000;
const WINDOW_OPS: usize = 2_000;
const WINDOW_RECORDS: usize = 128;

#[test]
fn capsuledb_acks_pace_a_writer_so_its_small_queues_never_drop_and_a_silent_capsuledb_is_waited_for_one_stall() {
    let owner = OwnerKey::from_seed(&[23; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "capsuledb-flow", 0, Limits::default()).unwrap();
    // Small receive queues everywhere: a writer that ran ahead would overflow them at once.
    let hub = InProcHub::new(FabricConfig { queue_msgs_max: 256, ..FabricConfig::default() }).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();

    let role_opts = NodeOptions {
        node_id: 30_000,
        writers: 0,
        ring_items: 256,
        channel_msgs_max: 256,
        capsuledb_role: Some(4_096),
        ..NodeOptions::default()
    }
    .shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &role_opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("capsuledb"));
    let role_node = Node::start(keys, ep, role_opts).unwrap();
    let stores: Vec<Arc<dyn BlockStore>> = vec![Arc::new(SlowStore { inner: MemStore::new(), sync_ms: 15 })];
    // Small memtable: a freeze (two slow syncs) every 1,024 updates.
    let config = Config { memtable_entries_max: 1_024, block_entries_max: 1_024, ..Config::default() };
    let author = Author::new(&meta, &app, db_writer).unwrap();
    let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
    let db = CapsuleDb::create(config, stores, verifier, author).unwrap();
    let role_keys = RoleKeys { writer: db_writer, signing: app.writer(db_writer).unwrap(), data_key: app.data_key() };
    let role_opts = RoleOptions { ack_backlog_max: 1_024, apply_batch_max: 1_024, ..RoleOptions::default() };
    let role = Role::start(role_node, db, role_keys, Vec::new(), role_opts).unwrap();

    // The writer: small records (many messages), no servers, paced by CapsuleDB alone.
    let opts = NodeOptions {
        node_id: 1,
        writers: 1,
        batch_ops_max: 4,
        flush_delay: Duration::from_micros(50),
        capsuledb: Some(db_writer),
        flow: FlowOptions {
            window_ops: WINDOW_OPS,
            window_records: WINDOW_RECORDS,
            stall: Duration::from_millis(1_000),
        },
        ..NodeOptions::default()
    }
    .shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("worker"));
    let worker = Arc::new(Node::start(keys, ep, opts).unwrap());

    // Sample the writer's ops in flight all along.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (w, done, peak) = (worker.clone(), done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                peak.fetch_max(w.flow_unacked_records(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let t0 = Instant::now();
    for i in 0..PUTS {
        worker.put(format!("key-{i:06}").as_bytes(), b"value").unwrap();
    }
    let wrote = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    while role.stats().applied.load(Ordering::Relaxed) < PUTS as u64 {
        assert!(
            Instant::now() < deadline,
            "CapsuleDB applied {} of {PUTS}",
            role.stats().applied.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, Ordering::Release);
    sampler.join().unwrap();

    let m = worker.metrics();
    let waits = m.flow_waits.load(Ordering::Relaxed);
    let opened = m.flow_opened.load(Ordering::Relaxed);
    let peak = peak.load(Ordering::Relaxed);
    let rn = role.node();
    let (dropped_fabric, dropped_ring) = (rn.fabric_stats().dropped_full, rn.inbound_dropped());
    let repairs = rn.metrics().repair_requests_sent.load(Ordering::Relaxed);
    let (acks, held) = (role.stats().acks_sent.load(Ordering::Relaxed), role.stats().acks_held.load(Ordering::Relaxed));
    eprintln!(
        "wrote {PUTS} in {wrote:?}: flow waits {waits}, opened {opened}, peak records in flight {peak}; CapsuleDB acks {acks} \
         (held {held}), dropped {dropped_fabric} on the fabric and {dropped_ring} at the ring, {repairs} repair requests"
    );
    assert!(acks > 0, "CapsuleDB acked");
    assert!(waits > 0, "the writer waited for CapsuleDB");
    assert_eq!(opened, 0, "a live CapsuleDB never opens the window");
    assert!(peak <= WINDOW_RECORDS, "at most the window's records in flight: {peak}");
    assert_eq!((dropped_fabric, dropped_ring), (0, 0), "nothing dropped toward CapsuleDB");
    assert_eq!(repairs, 0, "nothing to repair");

    // CapsuleDB goes silent: the writer waits one stall, then writes on without it.
    // Timed from before the shutdown: its acks stopped moving when it caught up, so a slow
    // shutdown would otherwise use up the stall before the first put.
    let t1 = Instant::now();
    role.shutdown();
    let waits_before = m.flow_waits.load(Ordering::Relaxed);
    for i in 0..3 * WINDOW_OPS {
        worker.put(format!("more-{i:06}").as_bytes(), b"value").unwrap();
    }
    let took = t1.elapsed();
    eprintln!("shutting CapsuleDB down and {} more puts took {took:?}", 3 * WINDOW_OPS);
    assert!(m.flow_waits.load(Ordering::Relaxed) > waits_before, "the writer waited for the silent CapsuleDB first");
    assert!(took >= Duration::from_millis(500), "for most of a stall: {took:?}");
    assert!(took < Duration::from_secs(8), "then wrote on without it: {took:?}");
}
