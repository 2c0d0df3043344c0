//! End to end over the in-process fabric: a worker whose memtable is bounded to 1,000 keys
//! writes 100,000 keys; the CapsuleDB role (a receive-only SCL node) sees every write, freezes
//! and compacts them into signed, encrypted block records, and publishes its frontier; the
//! worker evicts what CapsuleDB holds and reads every key back through CapsuleDB.
use psl_capsule::{new_capsule, Author, Limits, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: usize = 100_000;
const BOUND: usize = 1_000;

fn value(i: usize) -> Vec<u8> {
    format!("value-{i:06}-{}", "x".repeat(i % 40)).into_bytes()
}

#[test]
fn capsuledb_worker_with_1000_key_memtable_reads_100000_keys_back() {
    let t0 = Instant::now();
    let owner = OwnerKey::from_seed(&[21; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "capsuledb-e2e", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();

    // CapsuleDB: a receive-only node journaling into the tree.
    let role_opts = NodeOptions {
        node_id: 30_000,
        writers: 0,
        memtable_keys_max: Some(4096),
        capsuledb_role: Some(65_536),
        ..NodeOptions::default()
    }
    .shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &role_opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("capsuledb"));
    let role_node = Node::start(keys, ep, role_opts).unwrap();
    let (s1, s2) = (MemStore::new(), MemStore::new());
    let stores: Vec<Arc<dyn BlockStore>> = vec![s1.clone(), s2.clone()];
    let config = Config { memtable_entries_max: 4096, block_entries_max: 4096, ..Config::default() };
    let author = Author::new(&meta, &app, db_writer).unwrap();
    let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
    let db = CapsuleDb::create(config, stores, verifier, author).unwrap();
    let role_keys = RoleKeys { writer: db_writer, signing: app.writer(db_writer).unwrap(), data_key: app.data_key() };
    let role = Role::start(role_node, db, role_keys, Vec::new(), RoleOptions::default()).unwrap();

    // The worker: memtable bound 1,000 keys, misses go to CapsuleDB.
    let opts = NodeOptions {
        node_id: 1,
        writers: 2,
        memtable_keys_max: Some(BOUND),
        capsuledb: Some(db_writer),
        db_get_timeout: Duration::from_secs(20),
        ..NodeOptions::default()
    }
    .shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("worker"));
    let worker = Arc::new(Node::start(keys, ep, opts).unwrap());

    for i in 0..KEYS {
        worker.put(format!("key-{i:06}").as_bytes(), &value(i)).unwrap();
    }
    // A key deleted after being written, and one overwritten: CapsuleDB must give the newest.
    worker.delete(b"key-000007").unwrap();
    worker.put(b"key-000008", b"overwritten").unwrap();
    let written = Instant::now();

    // Wait for CapsuleDB to hold everything in blocks and the worker to evict down to its bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    while role.stats().applied.load(Ordering::Relaxed) < KEYS as u64 + 2 || worker.memtable().held() > BOUND + BOUND / 4
    {
        assert!(
            Instant::now() < deadline,
            "CapsuleDB applied {} of {}, worker holds {} keys (evicted {})",
            role.stats().applied.load(Ordering::Relaxed),
            KEYS + 2,
            worker.memtable().held(),
            worker.memtable().evicted()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let settled = Instant::now();
    assert!(worker.memtable().evicted() >= (KEYS - 2 * BOUND) as u64);
    {
        let db = role.db().lock();
        assert!(db.index().levels.len() >= 2, "compactions ran: {} levels", db.index().levels.len());
        assert!(s1.len() > 10 && s2.len() == s1.len(), "blocks and indexes are records in both stores");
    }

    // Read everything back, 32 readers at once (as many lambdas would).
    let readers: Vec<_> = (0..32)
        .map(|r| {
            let w = worker.clone();
            std::thread::spawn(move || {
                let mut wrong = Vec::new();
                for i in (r..KEYS).step_by(32) {
                    let got = w.try_get(format!("key-{i:06}").as_bytes()).expect("CapsuleDB answers");
                    let want = match i {
                        7 => None,
                        8 => Some(b"overwritten".to_vec()),
                        _ => Some(value(i)),
                    };
                    if got.as_deref() != want.as_deref() {
                        wrong.push(i);
                    }
                }
                wrong
            })
        })
        .collect();
    let wrong: Vec<usize> = readers.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(wrong.is_empty(), "{} wrong reads, first {:?}", wrong.len(), &wrong[..wrong.len().min(10)]);
    // A key never written is a miss, answered as such.
    assert_eq!(worker.try_get(b"never-written").unwrap(), None);
    let st = worker.db_stats().unwrap();
    let answers = st.answers.load(Ordering::Relaxed);
    assert!(answers >= (KEYS - 2 * BOUND) as u64, "reads went through CapsuleDB: {answers} answers");
    assert_eq!(st.rejected.load(Ordering::Relaxed), 0);
    eprintln!(
        "write {:?}, settle {:?}, read {:?}; CapsuleDB answers {answers}, worker holds {} keys",
        written - t0,
        settled - written,
        settled.elapsed(),
        worker.memtable().held()
    );
    role.shutdown();
}
