//! Each kind of bad record is refused with its own reason.

mod common;
use psl_capsule::{audit_file, file, Body, Draft, Link, Reason, Replica};
use psl_crypto::Hash256;

#[test]
fn record_signed_by_another_writers_key() {
    let fx = common::Fixture::new(10);
    // Claims writer 3 but is signed with writer 4's key.
    let imposter = Draft {
        writer: 3,
        key_gen: 0,
        seq: 0,
        lamport: 1,
        epoch: 0,
        prev: Hash256::ZERO,
        links: vec![],
        body: Body::Data(vec![psl_capsule::Op::put(1, "k", "v")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &fx.app.writer(4).unwrap(), &fx.app.data_key())
    .unwrap();
    let err = fx.verifier().verify(imposter).unwrap_err();
    assert_eq!(err.reason, Reason::Signature(3));
    assert_eq!(err.writer, Some(3));
    assert!(err.to_string().contains("signature check failed"), "{err}");
}

#[test]
fn record_encrypted_under_another_key() {
    let fx = common::Fixture::new(11);
    let other_app = fx.owner.app(12).unwrap();
    // The right signing key, the wrong data key.
    let rec = Draft {
        writer: 5,
        key_gen: 0,
        seq: 0,
        lamport: 1,
        epoch: 0,
        prev: Hash256::ZERO,
        links: vec![],
        body: Body::Data(vec![psl_capsule::Op::put(1, "k", "v")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &fx.app.writer(5).unwrap(), &other_app.data_key())
    .unwrap();
    // Public checks pass (a capsule server cannot tell)...
    assert!(fx.public_verifier().verify(rec.clone()).is_ok());
    // ...decryption does not.
    assert_eq!(fx.verifier().verify(rec).unwrap_err().reason, Reason::Decryption);
}

#[test]
fn record_replayed_from_another_capsule() {
    let a = common::Fixture::new(12);
    let b = common::Fixture::new(13);
    let rec = b.author(1).write_ops([("k", Some("v"))]).unwrap();
    let err = a.verifier().verify(rec.clone()).unwrap_err();
    assert!(matches!(err.reason, Reason::Capsule { .. }), "{err}");
    // Same owner and application, different capsule (label): still refused.
    let c = psl_capsule::new_capsule(&a.owner, 11, "another", 1, Default::default()).unwrap();
    let rec = psl_capsule::Author::new(&c, &a.app, 1).unwrap().write_ops([("k", Some("v"))]).unwrap();
    assert!(matches!(a.verifier().verify(rec).unwrap_err().reason, Reason::Capsule { .. }));
}

#[test]
fn two_records_for_one_slot_are_equivocation() {
    let fx = common::Fixture::new(14);
    let mut x = fx.author(2);
    let mut y = fx.author(2);
    let r1 = x.write_ops([("k", Some("one"))]).unwrap();
    let r2 = y.write_ops([("k", Some("two"))]).unwrap();
    let v = fx.verifier();
    let mut rep = Replica::new(fx.meta.name());
    rep.insert(v.verify(r1.clone()).unwrap()).unwrap();
    rep.insert(v.verify(r2.clone()).unwrap()).unwrap();
    let problems = rep.check();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].check(), "equivocation");
    let text = problems[0].to_string();
    assert!(text.contains(&r1.hash().to_hex()) && text.contains(&r2.hash().to_hex()), "{text}");
    // The same record twice, in any order, is one record.
    let mut again = Replica::new(fx.meta.name());
    again.insert(v.verify(r1.clone()).unwrap()).unwrap();
    assert!(!again.insert(v.verify(r1).unwrap()).unwrap());
    assert!(again.check().is_empty());
}

#[test]
fn truncated_file_is_refused() {
    let fx = common::Fixture::new(15);
    let bytes = file::encode(&fx.meta, &fx.small_history());
    let a = audit_file(&bytes[..bytes.len() - 40], None);
    assert!(a.problems.iter().any(|p| p.check == "truncation" || p.check == "framing"), "{:?}", a.problems);
    assert!(psl_capsule::CapsuleFile::parse(&bytes[..bytes.len() - 40]).is_err());
}

#[test]
fn chain_gaps_broken_prev_and_dangling_links() {
    let fx = common::Fixture::new(16);
    let recs = fx.small_history();
    let v = fx.verifier();
    let all: Vec<_> = recs.iter().map(|r| v.verify(r.clone()).unwrap()).collect();
    let mut full = Replica::new(fx.meta.name());
    for r in &all {
        full.insert(r.clone()).unwrap();
    }
    assert!(full.check().is_empty(), "{:?}", full.check());

    // Drop writer 1's seq 0: a gap.
    let mut gap = Replica::new(fx.meta.name());
    for r in all.iter().filter(|r| !(r.header().writer == 1 && r.header().seq == 0)) {
        gap.insert(r.clone()).unwrap();
    }
    assert!(gap.check().iter().any(|p| p.check() == "gap"));

    // Drop the SYNC: the epoch-1 records link a record this replica never received. That is
    // what a replica behind its peers shows (incompleteness), not a contradiction.
    let mut dangling = Replica::new(fx.meta.name());
    for r in all.iter().filter(|r| r.header().kind != psl_capsule::Kind::Sync) {
        dangling.insert(r.clone()).unwrap();
    }
    let missing: Vec<_> = dangling.check().into_iter().filter(|p| p.check() == "link-missing").collect();
    assert!(!missing.is_empty(), "{:?}", dangling.check());
    assert!(missing.iter().all(|p| p.is_incompleteness()));
    assert!(missing[0].to_string().contains("is not in the replica"), "{}", missing[0]);

    // A link that names a held record under the wrong (writer, seq) is a contradiction.
    let held = all.iter().find(|r| r.header().kind == psl_capsule::Kind::Sync).unwrap();
    let misnamed = Draft {
        writer: 8,
        key_gen: 0,
        seq: 0,
        lamport: 50,
        epoch: 0,
        prev: Hash256::ZERO,
        links: vec![Link { writer: held.header().writer, seq: held.header().seq + 50, hash: held.hash() }],
        body: Body::Data(vec![psl_capsule::Op::put(50, "m", "1")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &fx.app.writer(8).unwrap(), &fx.app.data_key())
    .unwrap();
    let mut wrong = full.clone();
    wrong.insert(v.verify(misnamed).unwrap()).unwrap();
    let link: Vec<_> = wrong.check().into_iter().filter(|p| p.check() == "link").collect();
    assert_eq!(link.len(), 1, "{:?}", wrong.check());
    assert!(!link[0].is_incompleteness());

    // A record whose prev points elsewhere.
    let mut a = fx.author(7);
    let r0 = a.write_ops([("a", Some("1"))]).unwrap();
    let bad = Draft {
        writer: 7,
        key_gen: 0,
        seq: 1,
        lamport: 5,
        epoch: 0,
        prev: Hash256([9; 32]),
        links: vec![],
        body: Body::Data(vec![psl_capsule::Op::put(5, "a", "2")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &fx.app.writer(7).unwrap(), &fx.app.data_key())
    .unwrap();
    let mut broken = Replica::new(fx.meta.name());
    broken.insert(v.verify(r0).unwrap()).unwrap();
    broken.insert(v.verify(bad).unwrap()).unwrap();
    assert!(broken.check().iter().any(|p| p.check() == "prev"));
}

#[test]
fn only_the_coordinator_may_sync_and_data_links_only_to_syncs() {
    let fx = common::Fixture::new(17);
    let mut w = fx.author(3);
    let fake_sync = w.write_sync(vec![]).unwrap();
    assert!(matches!(fx.verifier().verify(fake_sync).unwrap_err().reason, Reason::KindNotAllowed { .. }));
    let bad = Draft {
        writer: 3,
        key_gen: 0,
        seq: 0,
        lamport: 1,
        epoch: 0,
        prev: Hash256::ZERO,
        links: vec![Link { writer: 4, seq: 0, hash: Hash256([1; 32]) }],
        body: Body::Data(vec![psl_capsule::Op::put(1, "k", "v")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &fx.app.writer(3).unwrap(), &fx.app.data_key())
    .unwrap();
    assert!(matches!(fx.verifier().verify(bad).unwrap_err().reason, Reason::Structure(_)));
}

#[test]
fn over_limit_ops_are_refused_before_sealing() {
    let fx = common::Fixture::new(18);
    let mut a = fx.author(1);
    let long_key = "k".repeat(251);
    assert!(a.write_ops([(long_key.as_str(), Some("v"))]).is_err());
    let big = vec![0u8; (1 << 20) + 1];
    assert!(a.write_ops([("k", Some(big))]).is_err());
    assert!(a.write_ops(Vec::<(String, Option<String>)>::new()).is_err());
    // Nothing was consumed: the next good write is seq 0.
    assert_eq!(a.write_ops([("k", Some("v"))]).unwrap().header().seq, 0);
}
