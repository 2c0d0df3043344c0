//! A stolen CapsuleDB key signs answers, but an answer must carry the signed data record that
//! wrote each value it names: the front end verifies that record with its own verifier
//! (writer signature, certificate, revocation, key generation), finds the op for the asked key
//! in it and checks the op's `(lamport, writer)` against the answered version, and takes the
//! value from the record. So CapsuleDB's key alone can no longer make up a version or a value,
//! nor revive a revoked writer's writes; it can still withhold (answer a miss).
mod common;

use psl_capsule::{
    new_capsule, new_capsule_with, Author, Body, KeyStatement, Limits, Record, Revocation, SignedMetadata, Verifier,
    WriterCert, WriterKeys,
};
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, InProcEndpoint, InProcHub};
use psl_node::{Node, NodeError, NodeKeys, NodeOptions};
use psl_scl::dbwire::{AnswerBody, AnswerEntry, DbAnswer, DbMsg, DbScanAnswer, Proof, ScanBody};
use psl_scl::Version;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Setup {
    app: AppKey,
    meta: SignedMetadata,
    worker: Arc<Node>,
    fake: InProcEndpoint,
    db_writer: u32,
    /// CapsuleDB's genuine signing key (the stolen one).
    db_key: psl_crypto::SigningKey,
}

fn setup(seed: u8, writer_keys: WriterKeys) -> Setup {
    let owner = OwnerKey::from_seed(&[seed; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = match writer_keys {
        WriterKeys::Derived => new_capsule(&owner, 1, "capsuledb-proofs", 0, Limits::default()).unwrap(),
        WriterKeys::Certified => {
            new_capsule_with(&owner, 1, "capsuledb-proofs", 0, Limits::default(), WriterKeys::Certified).unwrap()
        }
    };
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();
    let opts = common::bounded_worker_opts(db_writer);
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("worker"));
    let worker = Arc::new(Node::start(keys, ep, opts).unwrap());
    if writer_keys == WriterKeys::Certified {
        // CapsuleDB's key reaches a certified capsule's workers as a certificate.
        let cert = WriterCert::issue(&app, meta.name(), 0, db_writer, 0).unwrap();
        worker.add_statements(vec![KeyStatement::Cert(cert)], Duration::from_secs(5)).unwrap();
    }
    let fake = hub.endpoint("stolen-capsuledb-key");
    let db_key = match writer_keys {
        WriterKeys::Derived => app.writer(db_writer).unwrap(),
        WriterKeys::Certified => app.writer_hardened(db_writer).unwrap(),
    };
    Setup { app, meta, worker, fake, db_writer, db_key }
}

/// A data record of writer `w` putting `key = value`, and the op's version in it.
fn written(meta: &SignedMetadata, app: &AppKey, w: u32, key: &[u8], value: &[u8]) -> (Record, Version) {
    let mut author = Author::new(meta, app, w).unwrap();
    let v = Verifier::new(meta.clone(), Some(app.data_key()));
    if let Some(c) = author.write_own_cert() {
        v.verify(c.unwrap()).unwrap();
    }
    let rec = author.write_ops([(key.to_vec(), Some(value.to_vec()))]).unwrap();
    let opened = v.verify_open(rec.clone()).unwrap();
    let Body::Data(ops) = &opened.body else { panic!("a data record") };
    (rec, Version { lamport: ops[0].lamport, writer: w })
}

/// Answers every get it sees with `entry(key)`, signed with CapsuleDB's genuine key.
fn answer_all(s: &Setup, until: Instant, entry: &dyn Fn(Vec<u8>) -> (Vec<Vec<u8>>, AnswerEntry)) {
    let key = &s.db_key;
    let capsule = s.worker.capsule();
    while Instant::now() < until {
        let Ok(Some(m)) = s.fake.recv_timeout(Duration::from_millis(20)) else { continue };
        let Ok(DbMsg::Get(g)) = DbMsg::decode(&m) else { continue };
        let k = g.open(&s.app.data_key()).unwrap();
        let (records, e) = entry(k);
        let body = AnswerBody { records, entries: vec![e] };
        let a = DbAnswer::seal(capsule, s.db_writer, 1, vec![g.req_id], &body, &s.app.data_key(), [3; 16], key);
        s.fake.publish(DbMsg::Answer(a).encode().into()).unwrap();
    }
}

/// Runs `try_get(key)` while the stolen key answers with `entry`.
fn get_while_answering(
    s: &Setup,
    key: &'static [u8],
    entry: &dyn Fn(Vec<u8>) -> (Vec<Vec<u8>>, AnswerEntry),
) -> Result<Option<Vec<u8>>, NodeError> {
    let w = s.worker.clone();
    let reader = std::thread::spawn(move || w.try_get(key).map(|v| v.map(|v| v.to_vec())));
    answer_all(s, Instant::now() + Duration::from_millis(1200), entry);
    reader.join().unwrap()
}

#[test]
fn adversary_capsuledb_key_names_a_made_up_version_and_is_refused() {
    let s = setup(61, WriterKeys::Derived);
    let other = psl_scl::writer_index(7, 0, 0).unwrap();
    // A genuine record of another writer, wrote "honest" at `v`.
    let (rec, v) = written(&s.meta, &s.app, other, b"k", b"honest");
    let made_up = Version { lamport: v.lamport + 1000, writer: other };
    // 1. A made-up version of that writer, with its genuine record attached.
    let got = get_while_answering(&s, b"k", &|k| {
        (
            vec![rec.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: made_up, deleted: false, record: 0 }) },
        )
    });
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    // 2. The record's own version under a key the record never wrote.
    let got = get_while_answering(&s, b"other-key", &|k| {
        (
            vec![rec.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: v, deleted: false, record: 0 }) },
        )
    });
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    // 3. A tombstone claimed with a record that put a value.
    let got = get_while_answering(&s, b"k", &|k| {
        (
            vec![rec.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: v, deleted: true, record: 0 }) },
        )
    });
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    // 4. A record signed by CapsuleDB's own key: it writes no data.
    let (own, own_v) = written(&s.meta, &s.app, s.db_writer, b"k", b"forged");
    let got = get_while_answering(&s, b"k", &|k| {
        (
            vec![own.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: own_v, deleted: false, record: 0 }) },
        )
    });
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    assert!(s.worker.entry(b"k").is_none() && s.worker.entry(b"other-key").is_none(), "nothing reached the memtable");
    let st = s.worker.db_stats().unwrap();
    assert!(st.rejected.load(Ordering::Relaxed) >= 4);
    assert_eq!(st.answers.load(Ordering::Relaxed), 0);

    // The honest answer: the record and its own version. The value comes from the record.
    let got = get_while_answering(&s, b"k", &|k| {
        (
            vec![rec.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: v, deleted: false, record: 0 }) },
        )
    });
    assert_eq!(got.unwrap().as_deref(), Some(&b"honest"[..]));
    assert_eq!(s.worker.entry(b"k").unwrap().version, v, "original version kept");
}

#[test]
fn adversary_capsuledb_answer_carrying_a_revoked_writers_record_is_refused() {
    let s = setup(62, WriterKeys::Certified);
    let thief = psl_scl::writer_index(9, 0, 0).unwrap();
    let cert = WriterCert::issue(&s.app, s.meta.name(), 0, thief, 0).unwrap();
    s.worker.add_statements(vec![KeyStatement::Cert(cert)], Duration::from_secs(5)).unwrap();
    let (r1, v1) = written(&s.meta, &s.app, thief, b"k1", b"before");
    let (r2, v2) = written(&s.meta, &s.app, thief, b"k2", b"after");
    // Before the revocation, the writer's record proves its value.
    let got = get_while_answering(&s, b"k1", &|k| {
        (
            vec![r1.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: v1, deleted: false, record: 0 }) },
        )
    });
    assert_eq!(got.unwrap().as_deref(), Some(&b"before"[..]));
    // Revoked (from epoch 0, any seq): its records prove nothing any more.
    let rev = Revocation::issue(&s.app, s.meta.name(), 0, thief, 0, psl_capsule::certs::ANY_SEQ).unwrap();
    s.worker.add_statements(vec![KeyStatement::Revoke(rev)], Duration::from_secs(5)).unwrap();
    let got = get_while_answering(&s, b"k2", &|k| {
        (
            vec![r2.bytes().to_vec()],
            AnswerEntry { key: k, found: Some(Proof { version: v2, deleted: false, record: 0 }) },
        )
    });
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    assert!(s.worker.entry(b"k2").is_none(), "the revoked writer's value never reached the memtable");
}

/// The honest path, gets and scans: a node that joined after the writes knows the keys only
/// through CapsuleDB, whose answers carry the writing records (one record carried once for
/// several keys); values and tombstones come out as written, with their original versions.
#[test]
fn capsuledb_answers_carry_their_records_end_to_end() {
    end_to_end(63, psl_capsuledb::role::RECORD_CACHE_BYTES_MAX_DEFAULT);
}

/// The same with no record kept in memory: every record comes back from the tree's store
/// (the bench's 1,000,000 keys outgrew the cache before the role kept records there).
#[test]
fn capsuledb_answers_take_records_from_the_store_past_the_cache() {
    end_to_end(66, 1);
}

fn end_to_end(seed: u8, record_cache_bytes_max: usize) {
    use psl_capsuledb::role::RoleOptions;
    let owner = OwnerKey::from_seed(&[seed; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "capsuledb-proofs-e2e", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();
    let role = common::start_role(
        &meta,
        &app,
        &hub,
        db_writer,
        RoleOptions { record_cache_bytes_max, ..RoleOptions::default() },
    );
    let node = |id: u32, name: &str| {
        let opts = NodeOptions {
            node_id: id,
            writers: 1,
            capsuledb: Some(db_writer),
            db_get_timeout: Duration::from_secs(20),
            ..NodeOptions::default()
        }
        .shared_cores();
        let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
        let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint(name));
        Arc::new(Node::start(keys, ep, opts).unwrap())
    };
    let a = node(1, "a");
    for i in 0..20 {
        a.put(format!("p/{i:02}").as_bytes(), format!("v{i}").as_bytes()).unwrap();
    }
    a.delete(b"p/05").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while role.stats().applied.load(Ordering::Relaxed) < 21 {
        assert!(Instant::now() < deadline, "CapsuleDB never applied the writes");
        std::thread::sleep(Duration::from_millis(10));
    }
    let b = node(2, "b");
    let scanned = b.scan(b"p/", None, 100).unwrap();
    let got: Vec<(Vec<u8>, Vec<u8>)> =
        scanned.iter().map(|(k, e)| (k.clone(), e.value.as_deref().unwrap().to_vec())).collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> =
        (0..20).filter(|i| *i != 5).map(|i| (format!("p/{i:02}").into_bytes(), format!("v{i}").into_bytes())).collect();
    assert_eq!(got, want, "the scan through CapsuleDB");
    for (k, e) in &scanned {
        assert_eq!(a.entry(k).unwrap().version, e.version, "original versions");
    }
    assert_eq!(b.try_get(b"p/07").unwrap().as_deref(), Some(&b"v7"[..]));
    assert_eq!(b.entry(b"p/07").unwrap().version, a.entry(b"p/07").unwrap().version);
    assert_eq!(b.try_get(b"p/05").unwrap(), None, "the tombstone, proven by the delete's record");
    assert_eq!(b.try_get(b"absent").unwrap(), None, "a miss carries no record");
    let st = b.db_stats().unwrap();
    assert_eq!(st.rejected.load(Ordering::Relaxed), 0, "honest answers all verify");
    assert_eq!(role.stats().unproven.load(Ordering::Relaxed), 0);
    role.shutdown();
}

/// A scan page is one answer: a single entry its record does not prove refuses the page (a
/// front end would otherwise show a made-up value, or miss a key the page skipped).
#[test]
fn adversary_capsuledb_scan_page_with_a_made_up_version_is_refused() {
    let s = setup(64, WriterKeys::Derived);
    let other = psl_scl::writer_index(7, 0, 0).unwrap();
    let (rec, v) = written(&s.meta, &s.app, other, b"p/a", b"honest");
    let answer_scans = |entries: Vec<(Vec<u8>, Proof)>| {
        let w = s.worker.clone();
        let reader = std::thread::spawn(move || w.scan(b"p/", None, 10));
        let until = Instant::now() + Duration::from_millis(1200);
        while Instant::now() < until {
            let Ok(Some(m)) = s.fake.recv_timeout(Duration::from_millis(20)) else { continue };
            let Ok(DbMsg::Scan(q)) = DbMsg::decode(&m) else { continue };
            let body = ScanBody { more: false, records: vec![rec.bytes().to_vec()], entries: entries.clone() };
            let a = DbScanAnswer::seal(
                s.worker.capsule(),
                s.db_writer,
                1,
                q.req_id,
                &body,
                &s.app.data_key(),
                [5; 16],
                &s.db_key,
            );
            s.fake.publish(DbMsg::ScanAnswer(a).encode().into()).unwrap();
        }
        reader.join().unwrap()
    };
    let made_up = Proof { version: Version { lamport: v.lamport + 7, writer: other }, deleted: false, record: 0 };
    let honest = Proof { version: v, deleted: false, record: 0 };
    let got = answer_scans(vec![(b"p/a".to_vec(), honest), (b"p/b".to_vec(), made_up)]);
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    let got = answer_scans(vec![(b"p/a".to_vec(), honest)]).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0.as_slice(), got[0].1.value.as_deref(), got[0].1.version),
        (&b"p/a"[..], Some(&b"honest"[..]), v)
    );
}

/// The record hash is part of an entry's version: freezes and compactions keep it, and the
/// newest version (with its record) wins a merge.
#[test]
fn capsuledb_record_hashes_survive_freezes_and_compactions() {
    use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore, Version as DbVersion};
    let owner = OwnerKey::from_seed(&[65; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "capsuledb-record-hashes", 0, Limits::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 14).unwrap();
    let stores: Vec<Arc<dyn BlockStore>> = vec![MemStore::new()];
    let config =
        Config { memtable_entries_max: 8, l0_blocks_max: 2, fanout: 2, block_entries_max: 4, ..Config::default() };
    let mut db = CapsuleDb::create(
        config,
        stores,
        Verifier::new(meta.clone(), Some(app.data_key())),
        Author::new(&meta, &app, db_writer).unwrap(),
    )
    .unwrap();
    let rec = |i: u64, round: u64| {
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&i.to_le_bytes());
        h[8..16].copy_from_slice(&round.to_le_bytes());
        h
    };
    for round in 0..3u64 {
        for i in 0..60u64 {
            let v = DbVersion { lamport: round * 100 + i + 1, writer: 1, record: rec(i, round) };
            db.apply(format!("k{i:03}").as_bytes(), v, (round < 2 || i % 2 == 0).then(|| vec![round as u8])).unwrap();
        }
    }
    db.flush().unwrap();
    assert!(db.stats().compactions > 0, "the test compacted");
    db.clear_cache();
    for i in 0..60u64 {
        let (v, val) = db.get_cell(format!("k{i:03}").as_bytes()).unwrap().unwrap();
        assert_eq!(v.record, rec(i, 2), "key {i}: the newest write's record");
        assert_eq!(val.is_none(), i % 2 == 1);
    }
}
