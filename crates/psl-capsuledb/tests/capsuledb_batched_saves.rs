//! Blocks saved in batches (`Blocks::save_many`: sealed in chain order, signed on several
//! threads): the tree reads back every key, before and after a restart, and the records form
//! one dense, verifying hash chain per writer.
mod common;

use common::*;
use psl_capsule::{new_capsule_with, Author, Body, KeyStatement, Kind, Limits, Record, Verifier, WriterKeys};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore, RecordHash, Version};
use psl_crypto::OwnerKey;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A store remembering every record put, in order.
struct Recording {
    inner: Arc<MemStore>,
    puts: Mutex<Vec<RecordHash>>,
}

impl BlockStore for Recording {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        self.puts.lock().unwrap().push(hash);
        self.inner.put(hash, bytes)
    }
    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        self.inner.get(hash)
    }
}

fn recording(inner: &Arc<MemStore>) -> Arc<Recording> {
    Arc::new(Recording { inner: inner.clone(), puts: Mutex::new(Vec::new()) })
}

/// A freeze cuts 300 entries into 75 blocks: several batches of `SAVE_BATCH_BLOCKS` and a
/// short last one; compactions write longer runs still.
fn config() -> Config {
    Config {
        memtable_entries_max: 300,
        l0_blocks_max: 2,
        fanout: 2,
        block_entries_max: 4,
        cache_blocks_max: 4,
        drop_tombstones: false,
    }
}

fn key(k: u64) -> Vec<u8> {
    format!("key-{k:05}").into_bytes()
}

/// Writes `n` versions over 1500 keys (later ones overwrite); the model of what was written.
fn fill(db: &mut CapsuleDb, n: u64, writer: u32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = BTreeMap::new();
    for l in 1..=n {
        let k = key(l * 7919 % 1500);
        let v = format!("value-{l}").into_bytes();
        db.put(&k, Version::new(l, writer), v.clone()).unwrap();
        model.insert(k, v);
    }
    db.flush().unwrap();
    db.wait_compactions().unwrap();
    model
}

/// Every record put, decoded and verified (signature, decryption), per writer in seq order;
/// checks each writer's chain is dense from `first_seq` and hash-linked.
fn chains(store: &Recording, v: &Verifier) -> BTreeMap<u32, Vec<Record>> {
    let mut by_writer: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
    for h in store.puts.lock().unwrap().iter() {
        let rec = Record::decode(&store.inner.raw(h).unwrap(), &Limits::default()).unwrap();
        assert_eq!(rec.hash().0, *h);
        v.verify_open(rec.clone()).unwrap();
        by_writer.entry(rec.header().writer).or_default().push(rec);
    }
    for recs in by_writer.values_mut() {
        recs.sort_by_key(|r| r.header().seq);
        for pair in recs.windows(2) {
            assert_eq!(pair[1].header().seq, pair[0].header().seq + 1, "a dense chain");
            assert_eq!(pair[1].header().prev, pair[0].hash(), "a hash-linked chain");
        }
    }
    by_writer
}

fn check_reads(db: &mut CapsuleDb, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (k, v) in model {
        assert_eq!(db.get(k).unwrap().as_ref(), Some(v), "key {}", String::from_utf8_lossy(k));
    }
}

#[test]
fn capsuledb_batched_block_writes_read_back_and_verify() {
    for background in [false, true] {
        let mem = MemStore::new();
        let store = recording(&mem);
        let mut db =
            CapsuleDb::create(config(), vec![store.clone() as Arc<dyn BlockStore>], verifier(), author(1)).unwrap();
        if background {
            db.start_compactor().unwrap();
        }
        let model = fill(&mut db, 3000, 1);
        let s = db.stats();
        assert!(s.compactions >= 2, "compactions: {}", s.compactions);
        assert_eq!(s.rejected_copies, 0);
        check_reads(&mut db, &model);
        // Every record put is one of the writer's chain, in chain order within each batch.
        let puts = store.puts.lock().unwrap().len() as u64;
        assert_eq!(s.records_written, puts);
        let chains = chains(&store, &verifier());
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[&1].len() as u64, puts);
        assert_eq!(chains[&1][0].header().seq, 0);
        // From storage alone, through a new writer's incarnation that continues the chain.
        let newest = db.newest_index();
        drop(db);
        let mut back = reopen(config(), &[&mem], newest, 7);
        back.clear_cache();
        check_reads(&mut back, &model);
        assert_eq!(back.stats().rejected_copies, 0);
    }
}

#[test]
fn capsuledb_batched_saves_open_a_fresh_certified_chain_with_its_certificate() {
    let owner = OwnerKey::from_seed(&[41; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule_with(&owner, 1, "capsuledb-batches", 0, Limits::default(), WriterKeys::Certified).unwrap();
    let verifier = || Verifier::new(meta.clone(), Some(app.data_key()));
    let mem = MemStore::new();
    let store = recording(&mem);
    let stores = || vec![store.clone() as Arc<dyn BlockStore>];
    let first = Author::new(&meta, &app, 1).unwrap().with_salt_seed(1);
    let first_cert = first.cert().unwrap().clone();
    let mut db = CapsuleDb::create(config(), stores(), verifier(), first).unwrap();
    let mut model = fill(&mut db, 200, 1);
    let newest = db.newest_index();
    drop(db);
    // A second writer, whose first records are a batch of blocks: its certificate goes first.
    let v = verifier();
    v.install_statement(&KeyStatement::Cert(first_cert)).unwrap();
    let second = Author::new(&meta, &app, 2).unwrap().with_salt_seed(2);
    let mut db = CapsuleDb::open(config(), stores(), v, second, newest).unwrap();
    model.extend(fill(&mut db, 1000, 2));
    check_reads(&mut db, &model);
    db.clear_cache();
    check_reads(&mut db, &model);
    let v = verifier();
    for w in [1, 2] {
        let cert = Author::new(&meta, &app, w).unwrap().cert().unwrap().clone();
        v.install_statement(&KeyStatement::Cert(cert)).unwrap();
    }
    let chains = chains(&store, &v);
    let second = &chains[&2];
    assert_eq!(second[0].header().seq, 0);
    assert_eq!(second[0].header().kind, Kind::Cert);
    assert!(matches!(v.verify_open(second[0].clone()).unwrap().into_inner().body, Body::Certs(_)));
    assert_eq!(second.iter().filter(|r| r.header().kind == Kind::Cert).count(), 1);
    assert!(second.iter().skip(1).all(|r| matches!(r.header().kind, Kind::DbBlock | Kind::DbIndex)));
    assert_eq!(second[1].header().kind, Kind::DbBlock, "the first batch of blocks follows the certificate");
}
