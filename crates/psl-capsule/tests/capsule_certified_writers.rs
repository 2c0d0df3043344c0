//! Certified (hardened) writer keys: a leaked writer key forges nothing for another writer,
//! certificates may arrive after the records they cover, and one writer can be revoked.

use psl_capsule::certs::OPEN_ENDED;
use psl_capsule::{
    new_capsule_with, Author, Body, Draft, KeyStatement, Limits, Reason, Revocation, SignedMetadata, Verifier,
    WriterCert, WriterKeys,
};
use psl_crypto::{AppKey, OwnerKey};

const APP: u32 = 4;

fn capsule() -> (OwnerKey, AppKey, SignedMetadata) {
    let owner = OwnerKey::from_seed(&[21; 32]).unwrap();
    let app = owner.app(APP).unwrap();
    let meta = new_capsule_with(&owner, APP, "certified", 1, Limits::default(), WriterKeys::Certified).unwrap();
    (owner, app, meta)
}

fn reason(v: &Verifier, rec: psl_capsule::Record) -> Reason {
    v.verify(rec).expect_err("refused").reason
}

#[test]
fn a_writer_introduces_itself_and_a_server_learns_it_from_the_log() {
    let (_, app, meta) = capsule();
    let mut w = Author::new(&meta, &app, 7).unwrap();
    let cert_rec = w.write_own_cert().unwrap().unwrap();
    let data = w.write_ops([("k", Some("v"))]).unwrap();
    // A capsule server: no data key, learns the certificate from the Cert record alone.
    let server = Verifier::new(meta.clone(), None);
    assert!(matches!(reason(&server, data.clone()), Reason::Uncertified { writer: 7, key_gen: 0 }));
    server.verify(cert_rec.clone()).unwrap();
    assert_eq!(server.writer_certs().len(), 1);
    server.verify(data.clone()).unwrap();
    // A node with the data key opens the Cert record's clear body as well.
    let node = Verifier::new(meta.clone(), Some(app.data_key()));
    let opened = node.verify_open(cert_rec).unwrap();
    assert!(matches!(&opened.body, Body::Certs(l) if l.len() == 1));
    assert!(node.verify_open(data).is_ok());
}

#[test]
fn a_leaked_writer_key_forges_nothing_for_another_writer() {
    let (owner, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), Some(app.data_key()));
    for w in [1, 2] {
        v.install_statement(&KeyStatement::Cert(WriterCert::issue(&app, meta.name(), 0, w, 0).unwrap())).unwrap();
    }
    let leaked = app.writer_hardened(1).unwrap();
    // Signing as writer 2 with writer 1's key: the signature check fails under 2's certificate.
    let mut own = Author::with_certified_keys(
        &meta,
        app.writer_hardened(1).unwrap(),
        WriterCert::issue(&app, meta.name(), 0, 1, 0).unwrap(),
        app.data_key(),
    )
    .unwrap();
    let rec1 = own.write_ops([("a", Some("1"))]).unwrap();
    v.verify(rec1).unwrap();
    // A certificate made up by the thief (signed with the leaked writer key, as if it were the
    // application key) for writer 2 or for a made-up writer, and records signed with the leaked
    // key in those writers' names: refused, each with its reason.
    let forge = |target: u32, seq: u64, body: Body| {
        let lamport = seq + 1;
        let body = match body {
            Body::Data(_) => Body::Data(vec![psl_capsule::Op::put(lamport, "b", "2")]),
            b => b,
        };
        let prev = if seq == 0 { psl_crypto::Hash256::ZERO } else { psl_crypto::sha256(&[b"any"]) };
        Draft { writer: target, key_gen: 0, seq, lamport, epoch: 0, prev, links: vec![], body }
            .seal(meta.name(), &meta.meta.policy.limits, &leaked, &app.data_key())
            .unwrap()
    };
    for target in [2u32, 999] {
        let fake = WriterCert::sign_with(&leaked, meta.name(), 0, target, leaked.verifying_key(), 0, OPEN_ENDED);
        let why = reason(&v, forge(target, 0, Body::Certs(vec![KeyStatement::Cert(fake)])));
        assert!(matches!(why, Reason::Certificate(_)), "{target}: {why}");
        let why = reason(&v, forge(target, 1, Body::Data(vec![])));
        if target == 2 {
            assert!(matches!(why, Reason::Signature(2)), "{why}");
        } else {
            assert!(matches!(why, Reason::Uncertified { writer: 999, .. }), "{why}");
        }
    }
    // The application key of another application of the same owner signs nothing here either.
    let other = owner.app(APP + 1).unwrap();
    let foreign = WriterCert::issue(&other, meta.name(), 0, 3, 0).unwrap();
    assert!(v.install_statement(&KeyStatement::Cert(foreign)).is_err());
}

#[test]
fn certificates_after_their_records_release_them() {
    let (_, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), None);
    let mut w = Author::new(&meta, &app, 9).unwrap();
    let cert_rec = w.write_own_cert().unwrap().unwrap();
    let recs: Vec<_> = (0..5).map(|i| w.write_ops([(format!("k{i}"), Some("v"))]).unwrap()).collect();
    // Reordered fabric: the data first. Each is held back, not lost.
    for r in &recs {
        let rej = v.verify(r.clone()).unwrap_err();
        assert!(rej.reason.wants_cert());
        assert!(v.hold(r.clone(), 100).is_empty());
    }
    assert_eq!(v.held_count(), 5);
    assert!(v.release_held().is_empty(), "nothing is released before the certificate");
    v.verify(cert_rec).unwrap();
    let released = v.release_held();
    assert_eq!(released.len(), 5);
    for r in released {
        v.verify(r).unwrap();
    }
    assert_eq!(v.held_count(), 0);
    // A writer whose certificate never comes: refused as uncertified after the wait.
    let mut stranger = Author::new(&meta, &app, 10).unwrap();
    let r = stranger.write_ops([("x", Some("y"))]).unwrap();
    assert!(v.hold(r, 1_000).is_empty());
    assert!(v.expire_held(1_000 + psl_capsule::verify::CERT_WAIT_MS - 1).is_empty());
    let refused = v.expire_held(1_000 + psl_capsule::verify::CERT_WAIT_MS);
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].reason.name(), "uncertified");
    assert_eq!(v.held_count(), 0);
}

#[test]
fn the_hold_is_bounded() {
    let (_, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), None);
    let mut w = Author::new(&meta, &app, 11).unwrap();
    let mut evicted = 0;
    for i in 0..psl_capsule::verify::HELD_PER_WRITER_MAX + 3 {
        let r = w.write_ops([(format!("k{i}"), Some("v"))]).unwrap();
        evicted += v.hold(r, 0).len();
    }
    assert_eq!(evicted, 3);
    assert_eq!(v.held_count(), psl_capsule::verify::HELD_PER_WRITER_MAX);
}

/// The attacker floods a receiver with large records of writers it has no certificate for
/// (anyone can make those: the hold-back runs before any signature check). The hold stays
/// within its byte bound, and an honest writer whose records arrived before its certificate
/// still gets them verified.
#[test]
fn adversary_a_flood_of_uncertified_large_records_stays_within_the_byte_bound() {
    use psl_capsule::verify::{HELD_BYTES_MAX, HELD_BYTES_PER_WRITER_MAX};
    let (_, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), None);
    // The honest writer's first record arrives before its certificate and is held.
    let mut honest = Author::new(&meta, &app, 30).unwrap();
    let honest_cert = honest.write_own_cert().unwrap().unwrap();
    let honest_data = honest.write_ops([("k", Some("v"))]).unwrap();
    assert!(v.verify_or_hold(honest_data.clone(), 0).unwrap().is_none(), "held for its certificate");
    // The flood: 96 records of ~1 MiB from 24 writers no certificate will ever cover.
    let big = vec![7u8; 1000 * 1024];
    let mut refused = 0;
    for w in 0..24u32 {
        let mut a = Author::new(&meta, &app, 100 + w).unwrap();
        for i in 0..4 {
            let r = a.write_ops([(format!("k{i}"), Some(big.as_slice()))]).unwrap();
            refused += v.verify_or_hold(r, 1).is_err() as usize;
            assert!(v.held_bytes() <= HELD_BYTES_MAX, "held {} bytes", v.held_bytes());
        }
    }
    assert!(refused > 0, "the flood outgrew the hold, so some of it was refused");
    assert!(v.held_bytes() <= HELD_BYTES_MAX);
    const { assert!(HELD_BYTES_PER_WRITER_MAX <= HELD_BYTES_MAX) };
    // Honest traffic still flows: its certificate releases its held record, which verifies.
    v.verify(honest_cert).unwrap();
    let released = v.release_held();
    assert!(released.iter().any(|r| r.hash() == honest_data.hash()), "the honest record was not displaced");
    for r in released {
        if r.header().writer == 30 {
            v.verify(r).unwrap();
        }
    }
    let next = honest.write_ops([("k2", Some("v2"))]).unwrap();
    assert!(v.verify_or_hold(next, 2).unwrap().is_some());
}

/// A record that no certificate could make valid is refused at once, not held: another
/// capsule's, a SYNC from a writer that is not a coordinator, a broken chain start.
#[test]
fn adversary_records_no_certificate_could_save_are_not_held() {
    let (owner, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), None);
    let other = new_capsule_with(&owner, APP, "other", 2, Limits::default(), WriterKeys::Certified).unwrap();
    let mut foreign = Author::new(&other, &app, 40).unwrap();
    let r = foreign.write_ops([("k", Some("v"))]).unwrap();
    let rej = v.verify_or_hold(r, 0).unwrap_err();
    assert_eq!(rej.reason.name(), "capsule");
    let mut not_coordinator = Author::new(&meta, &app, 41).unwrap();
    let r = not_coordinator.write_sync(Vec::new()).unwrap();
    let rej = v.verify_or_hold(r, 0).unwrap_err();
    assert_eq!(rej.reason.name(), "kind");
    assert_eq!(v.held_count(), 0);
    assert_eq!(v.held_bytes(), 0);
}

#[test]
fn a_revoked_writer_is_refused_from_its_epoch_and_the_others_continue() {
    let (_, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), Some(app.data_key()));
    let mut bad = Author::new(&meta, &app, 1).unwrap();
    let mut good = Author::new(&meta, &app, 2).unwrap();
    let mut coord = Author::new(&meta, &app, meta.meta.policy.coordinator).unwrap();
    for a in [&mut bad, &mut good, &mut coord] {
        v.verify(a.write_own_cert().unwrap().unwrap()).unwrap();
    }
    let before = bad.write_ops([("k", Some("old"))]).unwrap();
    // The coordinator carries the leader's revocation of writer 1 from epoch 3.
    let revoke = Revocation::issue(&app, meta.name(), 0, 1, 3, psl_capsule::certs::ANY_SEQ).unwrap();
    v.verify(coord.write_certs(vec![KeyStatement::Revoke(revoke)]).unwrap()).unwrap();
    assert_eq!(v.revocations().len(), 1);
    v.verify(before).unwrap();
    for epoch in 1..=4 {
        let sync = coord.write_sync_epoch(epoch, vec![]).unwrap();
        bad.enter_epoch(sync.link(), epoch);
        good.enter_epoch(sync.link(), epoch);
        v.verify(sync).unwrap();
        let b = bad.write_ops([("k", Some(format!("e{epoch}")))]).unwrap();
        let g = good.write_ops([("k", Some(format!("e{epoch}")))]).unwrap();
        v.verify(g).unwrap();
        if epoch < 3 {
            v.verify(b).unwrap();
        } else {
            let why = reason(&v, b);
            assert!(matches!(why, Reason::Revoked { writer: 1, from_epoch: 3, .. }), "{why}");
        }
    }
    // A revocation that arrives before the certificate still holds.
    let v2 = Verifier::new(meta.clone(), None);
    v2.install_statement(&KeyStatement::Revoke(Revocation::issue(&app, meta.name(), 0, 5, 0, 0).unwrap())).unwrap();
    let mut late = Author::new(&meta, &app, 5).unwrap();
    let why = reason(&v2, late.write_own_cert().unwrap().unwrap());
    assert_eq!(why.name(), "revoked");
}

/// A leaked key cannot dodge a revocation by backdating: its records may claim an epoch before
/// the revocation's, but the seq bound refuses whatever it appends to the chain.
#[test]
fn a_revoked_writer_cannot_backdate_past_the_seq_bound() {
    let (_, app, meta) = capsule();
    let v = Verifier::new(meta.clone(), None);
    let mut w = Author::new(&meta, &app, 4).unwrap();
    v.verify(w.write_own_cert().unwrap().unwrap()).unwrap();
    let kept: Vec<_> = (0..3).map(|i| w.write_ops([(format!("k{i}"), Some("v"))]).unwrap()).collect();
    // Revoked from epoch 5 and from seq 4 (the next after what the leader knows of).
    let r = Revocation::issue(&app, meta.name(), 0, 4, 5, 4).unwrap();
    v.install_statement(&KeyStatement::Revoke(r)).unwrap();
    for rec in kept {
        v.verify(rec).unwrap();
    }
    // The thief continues the chain at epoch 0 (before 5): refused by its seq.
    let why = reason(&v, w.write_ops([("k", Some("stolen"))]).unwrap());
    assert!(matches!(why, Reason::Revoked { seq: 4, from_seq: 4, epoch: 0, .. }), "{why}");
    // A second revocation that refuses nothing more is not news; one that does is kept.
    let weaker = Revocation::issue(&app, meta.name(), 0, 4, 9, 9).unwrap();
    assert!(!v.install_statement(&KeyStatement::Revoke(weaker)).unwrap());
    let sooner = Revocation::issue(&app, meta.name(), 0, 4, 2, psl_capsule::certs::ANY_SEQ).unwrap();
    assert!(v.install_statement(&KeyStatement::Revoke(sooner)).unwrap());
    assert_eq!(v.revocations().len(), 2);
}

#[test]
fn derived_capsules_keep_verifying_and_refuse_cert_records() {
    let owner = OwnerKey::from_seed(&[22; 32]).unwrap();
    let app = owner.app(APP).unwrap();
    let meta = psl_capsule::new_capsule(&owner, APP, "derived", 1, Limits::default()).unwrap();
    assert_eq!(meta.meta.policy.writer_keys, WriterKeys::Derived);
    let v = Verifier::new(meta.clone(), Some(app.data_key()));
    let mut w = Author::new(&meta, &app, 3).unwrap();
    assert!(w.write_own_cert().is_none());
    v.verify(w.write_ops([("k", Some("v"))]).unwrap()).unwrap();
    let cert = WriterCert::issue(&app, meta.name(), 0, 3, 0).unwrap();
    let r = w.write_certs(vec![KeyStatement::Cert(cert.clone())]).unwrap();
    assert_eq!(reason(&v, r).name(), "structure");
    assert!(v.install_statement(&KeyStatement::Cert(cert)).is_err());
}

/// A writer revoked from a seq it had already reached: an honest writer applied the record at
/// that seq before it learnt the revocation and links to it; every store drops the record
/// since. A file without it verifies (the link is counted, not a problem), but a link to an
/// absent record no revocation refuses is still one: withholding that is not excused.
#[test]
fn a_link_to_a_record_a_revocation_refuses_may_be_missing_from_a_file() {
    let (_, app, meta) = capsule();
    // The file a server exports: the raced record (writer 1's third) dropped, the honest
    // writer's EOE linking to it kept, the revocation (from `from_seq`) carried by the coordinator.
    let file = |from_seq: u64| {
        let mut bad = Author::new(&meta, &app, 1).unwrap();
        let mut good = Author::new(&meta, &app, 2).unwrap();
        let mut coord = Author::new(&meta, &app, meta.meta.policy.coordinator).unwrap();
        let mut recs: Vec<_> = [&mut bad, &mut good, &mut coord].map(|a| a.write_own_cert().unwrap().unwrap()).into();
        recs.push(bad.write_ops([("k", Some("kept"))]).unwrap());
        let raced = bad.write_ops([("k", Some("raced"))]).unwrap();
        assert_eq!(raced.header().seq, 2);
        let eoe = Body::Control { code: psl_capsule::ControlCode::Eoe, payload: vec![] };
        recs.push(good.write_control(eoe, vec![raced.link()]).unwrap());
        let revoke = Revocation::issue(&app, meta.name(), 0, 1, 9, from_seq).unwrap();
        recs.push(coord.write_certs(vec![KeyStatement::Revoke(revoke)]).unwrap());
        psl_capsule::file::encode(&meta, recs.iter())
    };
    // Revoked from the raced record's seq: its absence is what the revocation asks for.
    let a = psl_capsule::audit_file(&file(2), Some(app.data_key()));
    assert!(a.ok(), "{:?}", a.problems);
    assert_eq!(a.links_to_revoked, 1);
    // Revoked from the seq after it: the raced record is valid, and withholding it is a problem.
    let a = psl_capsule::audit_file(&file(3), Some(app.data_key()));
    assert_eq!(a.links_to_revoked, 0);
    assert_eq!(a.problems.iter().map(|p| p.check).collect::<Vec<_>>(), ["link-missing"], "{:?}", a.problems);
}
