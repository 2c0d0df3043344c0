//! `psl bench capsuledb`: reads through CapsuleDB, and CapsuleDB's LSM against fjall.
//!
//! Part 1 (the shape of the paper's Figure 9): on the in-process fabric, one worker writes
//! `keys` keys (100-byte values) and the CapsuleDB role stores them; then 1, 2, 4 and 8
//! concurrent readers ("lambdas") draw keys from a zipfian(0.99) distribution and `get` them
//! from (a) the writing worker, whose unbounded memtable holds every key (`get_cached`), and
//! (b) a second worker whose memtable is bounded to 64 keys, so that nearly every get is a
//! request to CapsuleDB over the fabric, answered with a signed, sealed message
//! (`get_uncached`).
//!
//! Part 2: CapsuleDB's LSM core alone (every block and index a signed, encrypted record in a
//! directory store, with fsync) against fjall (a pure-Rust LSM, its journal synced at the end)
//! on the same data: time to write every key, and time for single-threaded zipfian point
//! reads. `ratio_vs_lsm_write` and `ratio_vs_lsm_read` are CapsuleDB's time over fjall's.
//! Both sides get the same cache budget (CapsuleDB's estimated cache bytes). A diagnostic
//! case writes the same keys into CapsuleDB over an in-memory store
//! (`ratio_vs_lsm_write_memstore`): it separates the directory store's cost (a file and an
//! fsync per record) from the tree's, and is not a like-for-like comparison.

use super::zipf::Zipf;
use anyhow::{Context, Result};
use psl_capsule::{new_capsule, Author, Limits, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, DirStore, MemStore, Version};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 100;
const UNCACHED_BOUND: usize = 64;
const LAMBDAS: [usize; 4] = [1, 2, 4, 8];

fn key(i: u64) -> Vec<u8> {
    format!("user{i:012}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    let mut v = format!("{i:020}").into_bytes();
    v.resize(VALUE_BYTES, b'v');
    v
}

/// The tree's default configuration: the bench measures what a role gets.
fn lsm_config() -> Config {
    Config::default()
}

/// An estimate of the memory CapsuleDB's read cache holds when full, with this bench's keys
/// (16 bytes) and values: half of `cache_blocks_max` blocks' entries as decoded blocks (per entry:
/// two `Vec` headers, the key, the version, the value) and `cache_blocks_max * block_entries_max / 4`
/// single entries (per entry: the block hash and key as the map key, the cell, LRU links).
/// fjall gets the same cache budget.
fn cache_bytes(c: &Config) -> u64 {
    let entry = (2 * 24 + 16 + 16 + VALUE_BYTES) as u64;
    let row = (24 + 32 + 16 + 24 + 16 + VALUE_BYTES + 64) as u64;
    let blocks = (c.cache_blocks_max / 2).max(1) as u64 * c.block_entries_max as u64 * entry;
    let rows = (c.cache_blocks_max * c.block_entries_max / 4) as u64 * row;
    blocks + rows
}

/// Runs `threads` readers for `seconds`; returns gets per second.
fn read_rate(node: &Arc<Node>, keys: u64, threads: usize, seconds: f64, check: bool) -> Result<f64> {
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let node = node.clone();
            std::thread::spawn(move || -> Result<u64> {
                let mut z = Zipf::new(keys, 0.99, 0x5eed + t as u64);
                let mut n = 0u64;
                while Instant::now() < stop {
                    for _ in 0..16 {
                        let i = z.next_item();
                        let got = node.try_get(&key(i))?;
                        if check && got.as_deref() != Some(&value(i)[..]) {
                            anyhow::bail!("key {i}: wrong value read");
                        }
                        n += 1;
                    }
                }
                Ok(n)
            })
        })
        .collect();
    let start = Instant::now();
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64().max(seconds))
}

fn part_fabric(keys: u64, seconds: f64, progress: bool) -> Result<Map<String, Value>> {
    let owner = OwnerKey::from_seed(&[44; 32])?;
    let app = owner.app(1)?;
    let meta = new_capsule(&owner, 1, "bench-capsuledb", 0, Limits::default())?;
    let hub = InProcHub::new(FabricConfig::default())?;
    let db_writer = psl_scl::writer_index(30_000, 0, 15).context("writer index")?;

    let role_opts = NodeOptions {
        node_id: 30_000,
        writers: 0,
        memtable_keys_max: Some(4096),
        capsuledb_role: Some(65_536),
        ..NodeOptions::default()
    }
    .shared_cores();
    let k = NodeKeys::derive(&meta, &app, &role_opts)?;
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("capsuledb"));
    let role_node = Node::start(k, ep, role_opts)?;
    let stores: Vec<Arc<dyn BlockStore>> = vec![MemStore::new()];
    let db = CapsuleDb::create(
        lsm_config(),
        stores,
        Verifier::new(meta.clone(), Some(app.data_key())),
        Author::new(&meta, &app, db_writer)?,
    )?;
    let rk = RoleKeys { writer: db_writer, signing: app.writer(db_writer)?, data_key: app.data_key() };
    let role = Role::start(role_node, db, rk, Vec::new(), RoleOptions::default())?;

    let start = |id: u32, writers: usize, bound: Option<usize>| -> Result<Arc<Node>> {
        let opts = NodeOptions {
            node_id: id,
            writers,
            memtable_keys_max: bound,
            capsuledb: Some(db_writer),
            db_get_timeout: Duration::from_secs(30),
            ..NodeOptions::default()
        }
        .shared_cores();
        let k = NodeKeys::derive(&meta, &app, &opts)?;
        let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint(format!("node{id}")));
        Ok(Arc::new(Node::start(k, ep, opts)?))
    };
    let cached = start(1, 2, None)?;
    let uncached = start(2, 0, Some(UNCACHED_BOUND))?;

    let pb = super::progress(keys, "capsuledb: load");
    if !progress {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let t = Instant::now();
    for i in 0..keys {
        cached.put(&key(i), &value(i))?;
        if i % 4096 == 0 {
            pb.set_position(i);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while role.stats().applied.load(Ordering::Relaxed) < keys
        || uncached.memtable().held() > 2 * UNCACHED_BOUND
        || cached.memtable().held() < keys as usize
    {
        if Instant::now() > deadline {
            anyhow::bail!(
                "load did not settle: CapsuleDB applied {}, bounded worker holds {}",
                role.stats().applied.load(Ordering::Relaxed),
                uncached.memtable().held()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    pb.finish_and_clear();
    let load_s = t.elapsed().as_secs_f64();

    let mut out = Map::new();
    for l in LAMBDAS {
        let c = read_rate(&cached, keys, l, seconds, true)?;
        let u = read_rate(&uncached, keys, l, seconds, true)?;
        if progress {
            eprintln!("lambdas {l}: get cached {c:.0}/s, uncached {u:.0}/s");
        }
        out.insert(format!("get_cached_per_s_l{l}"), json!(c.round()));
        out.insert(format!("get_uncached_per_s_l{l}"), json!(u.round()));
    }
    let st = uncached.db_stats().context("db stats")?;
    out.insert("load_s".into(), json!(load_s));
    out.insert("uncached_memtable_keys_max".into(), json!(UNCACHED_BOUND));
    out.insert("uncached_answers".into(), json!(st.answers.load(Ordering::Relaxed)));
    out.insert("uncached_timeouts".into(), json!(st.timeouts.load(Ordering::Relaxed)));
    {
        let db = role.db().lock();
        out.insert("capsuledb_levels".into(), json!(db.index().levels.len()));
        out.insert("capsuledb_records_written".into(), json!(db.stats().records_written));
    }
    role.shutdown();
    Ok(out)
}

/// Writes every key into a new CapsuleDB over `stores` with the background compactor; returns
/// the time until every write is in a durable block named by a durable index (compactions
/// may still run: fjall's figure stops at the same point, journal synced, compactions not
/// awaited), the time until the compactor is idle, and the database.
fn cdb_write_all(
    meta: &psl_capsule::SignedMetadata,
    app: &psl_crypto::AppKey,
    stores: Vec<Arc<dyn BlockStore>>,
    keys: u64,
) -> Result<(f64, f64, CapsuleDb)> {
    let mut db = CapsuleDb::create(
        lsm_config(),
        stores,
        Verifier::new(meta.clone(), Some(app.data_key())),
        Author::new(meta, app, 1 << 16)?,
    )?;
    // Compactions in the background, as in the role (and as fjall does them).
    db.start_compactor()?;
    let t = Instant::now();
    for i in 0..keys {
        // A scrambled order, as writes from many lambdas arrive.
        let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % keys;
        db.put(&key(k), Version::new(i + 1, 1), value(k))?;
    }
    db.flush()?;
    let write = t.elapsed().as_secs_f64();
    db.wait_compactions()?;
    Ok((write, t.elapsed().as_secs_f64(), db))
}

fn part_lsm(keys: u64, progress: bool) -> Result<Map<String, Value>> {
    let owner = OwnerKey::from_seed(&[45; 32])?;
    let app = owner.app(1)?;
    let meta = new_capsule(&owner, 1, "bench-capsuledb-lsm", 0, Limits::default())?;
    let dir = tempfile::tempdir()?;
    let reads = keys.clamp(1, 200_000);

    // Diagnostic, not a like-for-like case: the same writes into CapsuleDB over an in-memory
    // store (sealed, signed, compacted, but no file and no fsync), to separate the directory
    // store's cost from the tree's. Reported as `ratio_vs_lsm_write_memstore`.
    let (mem_write, mem_settled, mem_db) =
        cdb_write_all(&meta, &app, vec![MemStore::new() as Arc<dyn BlockStore>], keys)?;
    drop(mem_db);

    // CapsuleDB: every block and index sealed, signed, written to a directory with fsync.
    let store = DirStore::open(&dir.path().join("capsuledb"))?;
    let (cdb_write, cdb_settled, mut db) =
        cdb_write_all(&meta, &app, vec![store.clone() as Arc<dyn BlockStore>], keys)?;
    let written = db.stats().records_written;
    db.clear_cache();
    let mut z = Zipf::new(keys, 0.99, 7);
    let t = Instant::now();
    for _ in 0..reads {
        let i = z.next_item();
        // Keys the scrambled order missed (it is not a permutation for every size) read as absent.
        let _ = db.get(&key(i))?;
    }
    let cdb_read = t.elapsed().as_secs_f64();
    let s = db.stats();
    drop(db);
    if progress {
        eprintln!("capsuledb: write {cdb_write:.2} s (settled {cdb_settled:.2} s), {reads} reads {cdb_read:.2} s");
    }

    // fjall on the same data.
    let ks = fjall::Config::new(dir.path().join("fjall")).cache_size(cache_bytes(&lsm_config())).open()?;
    let part = ks.open_partition("bench", fjall::PartitionCreateOptions::default())?;
    let t = Instant::now();
    for i in 0..keys {
        let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % keys;
        part.insert(key(k), value(k))?;
    }
    ks.persist(fjall::PersistMode::SyncAll)?;
    let fj_write = t.elapsed().as_secs_f64();
    let mut z = Zipf::new(keys, 0.99, 7);
    let t = Instant::now();
    for _ in 0..reads {
        let i = z.next_item();
        let _ = part.get(key(i))?;
    }
    let fj_read = t.elapsed().as_secs_f64();
    if progress {
        eprintln!("fjall: write {fj_write:.2} s, {reads} reads {fj_read:.2} s");
    }

    let mut out = Map::new();
    out.insert("ratio_vs_lsm_write".into(), json!(cdb_write / fj_write));
    out.insert("ratio_vs_lsm_read".into(), json!(cdb_read / fj_read));
    // CapsuleDB's write time including the wait for its background compactions (fjall's
    // time cannot include its own: an upper bound on the ratio).
    out.insert("ratio_vs_lsm_write_settled".into(), json!(cdb_settled / fj_write));
    out.insert("capsuledb_write_s".into(), json!(cdb_write));
    out.insert("ratio_vs_lsm_write_memstore".into(), json!(mem_write / fj_write));
    out.insert("ratio_vs_lsm_write_memstore_settled".into(), json!(mem_settled / fj_write));
    out.insert("capsuledb_write_settled_s".into(), json!(cdb_settled));
    out.insert("fjall_write_s".into(), json!(fj_write));
    out.insert("capsuledb_compactions".into(), json!(s.compactions));
    out.insert("capsuledb_write_stalls".into(), json!(s.write_stalls));
    out.insert("capsuledb_write_per_s".into(), json!((keys as f64 / cdb_write).round()));
    out.insert("fjall_write_per_s".into(), json!((keys as f64 / fj_write).round()));
    out.insert("capsuledb_read_per_s".into(), json!((reads as f64 / cdb_read).round()));
    out.insert("fjall_read_per_s".into(), json!((reads as f64 / fj_read).round()));
    out.insert("lsm_reads".into(), json!(reads));
    out.insert("capsuledb_records_written".into(), json!(written));
    out.insert("capsuledb_block_fetches".into(), json!(s.block_fetches));
    out.insert("capsuledb_cache_hits".into(), json!(s.cache_hits));
    Ok(out)
}

pub fn run(seconds: f64, keys: u64, progress: bool) -> Result<Value> {
    let keys = keys.max(1000);
    let mut out = Map::new();
    out.insert("bench".into(), json!("capsuledb"));
    out.insert("keys".into(), json!(keys));
    out.insert("value_bytes".into(), json!(VALUE_BYTES));
    out.insert("zipf_theta".into(), json!(0.99));
    out.insert("seconds_per_case".into(), json!(seconds));
    let c = lsm_config();
    out.insert(
        "lsm_config".into(),
        json!({"memtable_entries_max": c.memtable_entries_max, "l0_blocks_max": c.l0_blocks_max, "fanout": c.fanout, "block_entries_max": c.block_entries_max, "cache_blocks_max": c.cache_blocks_max, "capsuledb_cache_bytes_est": cache_bytes(&c), "fjall_cache_bytes": cache_bytes(&c)}),
    );
    out.extend(part_lsm(keys, progress)?);
    out.extend(part_fabric(keys, seconds, progress)?);
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}
