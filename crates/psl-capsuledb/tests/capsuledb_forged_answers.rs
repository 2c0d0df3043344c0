//! The miss path trusts only CapsuleDB's key: an answer or a frontier signed by anyone else
//! (here: a worker's key, which holds the data key too) is refused, and the get fails with a
//! clear error instead of returning the forged value. The genuine key is accepted (with the
//! record that wrote the value: `capsuledb_answer_proofs.rs`), but not for an answer older
//! than the frontier the worker evicted under.
mod common;

use psl_capsule::{new_capsule, Author, Body, Limits, Verifier};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeError, NodeKeys};
use psl_scl::dbwire::{AnswerBody, AnswerEntry, DbAnswer, DbHeads, DbMsg, Proof};
use psl_scl::Version;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn capsuledb_answers_and_heads_signed_by_another_key_are_refused() {
    let owner = OwnerKey::from_seed(&[22; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "capsuledb-forged", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();
    let opts = common::bounded_worker_opts(db_writer);
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    let worker_writer = keys.writers[0].0;
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("worker"));
    let worker = Arc::new(Node::start(keys, ep, opts).unwrap());
    let fake = hub.endpoint("fake-capsuledb");
    let capsule = worker.capsule();
    // A genuine record of another writer wrote "forged" (the name of the value in this test).
    let other = psl_scl::writer_index(5, 0, 0).unwrap();
    let rec = Author::new(&meta, &app, other)
        .unwrap()
        .write_ops([(b"other-key".to_vec(), Some(b"forged".to_vec()))])
        .unwrap();
    let lamport = {
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let Body::Data(ops) = &v.verify_open(rec.clone()).unwrap().body else { panic!("data") };
        ops[0].lamport
    };
    let written = Version { lamport, writer: other };

    // Answers every get it sees, signed with `signer`'s key, claiming the value "forged".
    let answer_all = |signer: u32, index_seq: u64, until: Instant| {
        let key = app.writer(signer).unwrap();
        while Instant::now() < until {
            let Ok(Some(m)) = fake.recv_timeout(Duration::from_millis(20)) else { continue };
            let Ok(DbMsg::Get(g)) = DbMsg::decode(&m) else { continue };
            let k = g.open(&app.data_key()).unwrap();
            let proof = Proof { version: written, deleted: false, record: 0 };
            let body = AnswerBody {
                records: vec![rec.bytes().to_vec()],
                entries: vec![AnswerEntry { key: k, found: Some(proof) }],
            };
            let a =
                DbAnswer::seal(capsule, db_writer, index_seq, vec![g.req_id], &body, &app.data_key(), [3; 16], &key);
            fake.publish(DbMsg::Answer(a).encode().into()).unwrap();
        }
    };

    let w = worker.clone();
    let reader = std::thread::spawn(move || w.try_get(b"some-key"));
    answer_all(worker_writer, 1, Instant::now() + Duration::from_millis(1200));
    let got = reader.join().unwrap();
    assert!(matches!(got, Err(NodeError::CapsuleDbTimeout(_))), "{got:?}");
    let st = worker.db_stats().unwrap();
    assert!(st.rejected.load(Ordering::Relaxed) >= 1);
    assert_eq!(st.answers.load(Ordering::Relaxed), 0);

    // A forged frontier does not make the worker evict anything.
    for i in 0..200u32 {
        worker.put(format!("k{i}").as_bytes(), b"v").unwrap();
    }
    let forged =
        DbHeads::sign(capsule, db_writer, 1, vec![(worker_writer, u64::MAX)], &app.writer(worker_writer).unwrap());
    fake.publish(DbMsg::Heads(forged).encode().into()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(worker.memtable().evicted(), 0, "a forged frontier caused evictions");

    // The genuine key: the frontier evicts, the answer is learned with its original version.
    let genuine =
        DbHeads::sign(capsule, db_writer, 1, vec![(worker_writer, u64::MAX)], &app.writer(db_writer).unwrap());
    fake.publish(DbMsg::Heads(genuine).encode().into()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while worker.memtable().evicted() == 0 {
        assert!(Instant::now() < deadline, "the genuine frontier was not applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    // An answer from before the index the worker evicted under may not know what was evicted:
    // refused (as a delayed answer would be).
    let w = worker.clone();
    let reader = std::thread::spawn(move || w.try_get(b"other-key"));
    answer_all(db_writer, 0, Instant::now() + Duration::from_millis(1200));
    assert!(matches!(reader.join().unwrap(), Err(NodeError::CapsuleDbTimeout(_))));
    let w = worker.clone();
    let reader = std::thread::spawn(move || w.try_get(b"other-key"));
    answer_all(db_writer, 1, Instant::now() + Duration::from_millis(600));
    assert_eq!(reader.join().unwrap().unwrap().as_deref(), Some(&b"forged"[..]), "genuine answers are used");
    assert_eq!(worker.entry(b"other-key").unwrap().version, written, "original version kept");
}
