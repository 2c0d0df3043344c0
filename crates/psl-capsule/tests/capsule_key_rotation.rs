//! Key generations in the verifier and the author: windows of epochs, retired keys, SYNC
//! fingerprints, per-generation data keys, and which certificates are installed.

mod common;
use psl_capsule::rotation::RotationError;
use psl_capsule::{Body, ControlCode, Draft, Link, Reason, RotationCert, DEFAULT_COORDINATOR};
use psl_crypto::Hash256;

const R: u64 = 10;

fn link() -> Link {
    Link { writer: DEFAULT_COORDINATOR, seq: 0, hash: Hash256([1; 32]) }
}

#[test]
fn generation_windows_retire_the_old_key_at_the_rotation_epoch() {
    let fx = common::Fixture::new(30);
    let v = fx.verifier();
    let cert = RotationCert::issue(&fx.owner, &fx.meta, 1, 21, R).unwrap();
    let new_app = fx.owner.app(21).unwrap();
    // Before the rotation is known, a generation-1 record is refused as unknown.
    let mut a1 = fx.author(3);
    a1.schedule_rotation(&cert, new_app.writer(3).unwrap(), new_app.data_key()).unwrap();
    a1.enter_epoch(link(), R);
    let gen1 = a1.write_ops([("k", Some("new"))]).unwrap();
    assert_eq!(gen1.header().key_gen, 1);
    assert_eq!(v.verify(gen1.clone()).unwrap_err().reason, Reason::KeyGeneration(1));

    assert!(v.install_rotation(&cert, Some(new_app.data_key())).unwrap());
    assert!(!v.install_rotation(&cert, Some(new_app.data_key())).unwrap(), "idempotent");
    assert_eq!(v.key_gen_newest(), 1);
    assert_eq!((v.key_gen_at(R - 1), v.key_gen_at(R), v.key_gen_at(u64::MAX)), (0, 1, 1));
    v.verify(gen1).unwrap();

    // Generation 0 before the rotation epoch stays valid (history); at or after it, retired.
    let mut a0 = fx.author(4);
    a0.enter_epoch(link(), R - 1);
    v.verify(a0.write_ops([("k", Some("old"))]).unwrap()).unwrap();
    a0.enter_epoch(link(), R);
    let late = a0.write_ops([("k", Some("retired"))]).unwrap();
    assert_eq!(late.header().key_gen, 0, "this author never got the new key");
    let want = Reason::RetiredKey { key_gen: 0, epoch: R, retired_from: R };
    assert_eq!(v.retired(late.header()), Some(want.clone()));
    let err = v.verify(late.clone()).unwrap_err();
    assert_eq!(err.reason, want);
    assert_eq!(err.reason.name(), "retired-key");
    // A server-style verifier (no data key) refuses it the same way.
    let public = fx.public_verifier();
    public.install_rotation(&cert, None).unwrap();
    assert_eq!(public.verify(late).unwrap_err().reason.name(), "retired-key");

    // A generation-1 record claiming an epoch before the rotation is not in force yet.
    let early = Draft {
        writer: 5,
        key_gen: 1,
        seq: 0,
        lamport: 1,
        epoch: R - 1,
        prev: Hash256::ZERO,
        links: vec![],
        body: Body::Data(vec![psl_capsule::Op::put(1, "k", "v")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &new_app.writer(5).unwrap(), &new_app.data_key())
    .unwrap();
    assert_eq!(v.verify(early).unwrap_err().reason, Reason::KeyGeneration(1));
    // Claiming generation 1 while signing with the retired key does not help.
    let claim = Draft {
        writer: 5,
        key_gen: 1,
        seq: 0,
        lamport: 1,
        epoch: R,
        prev: Hash256::ZERO,
        links: vec![],
        body: Body::Data(vec![psl_capsule::Op::put(1, "k", "v")]),
    }
    .seal(fx.meta.name(), &fx.meta.meta.policy.limits, &fx.app.writer(5).unwrap(), &fx.app.data_key())
    .unwrap();
    assert_eq!(v.verify(claim).unwrap_err().reason, Reason::Signature(5));
}

#[test]
fn sync_names_the_key_in_force_at_its_epoch() {
    let fx = common::Fixture::new(31);
    let v = fx.verifier();
    let cert = RotationCert::issue(&fx.owner, &fx.meta, 1, 22, R).unwrap();
    let new_app = fx.owner.app(22).unwrap();
    v.install_rotation(&cert, Some(new_app.data_key())).unwrap();
    let mut c = fx.author(DEFAULT_COORDINATOR);
    c.schedule_rotation(&cert, new_app.writer(DEFAULT_COORDINATOR).unwrap(), new_app.data_key()).unwrap();
    let before = c.write_sync_epoch(R - 1, vec![]).unwrap();
    let at = c.write_sync_epoch(R, vec![]).unwrap();
    assert_eq!((before.header().key_gen, at.header().key_gen), (0, 1));
    let ob = v.verify_open(before).unwrap();
    let oa = v.verify_open(at).unwrap();
    assert_eq!(ob.body, Body::Sync { app_key_fp: fx.meta.meta.app.fingerprint() });
    assert_eq!(oa.body, Body::Sync { app_key_fp: cert.app.fingerprint() });
    assert_eq!(v.app_key_fp(1), Some(cert.app.fingerprint()));
}

#[test]
fn data_key_comes_separately_and_must_match() {
    let fx = common::Fixture::new(32);
    let v = fx.verifier();
    let cert = RotationCert::issue(&fx.owner, &fx.meta, 1, 23, R).unwrap();
    let new_app = fx.owner.app(23).unwrap();
    // The wrong data key is refused; the certificate alone (from the log) installs the public
    // part: signatures verify, bodies do not open yet.
    assert_eq!(v.install_rotation(&cert, Some(fx.app.data_key())), Err(RotationError::DataKey));
    assert!(v.install_rotation(&cert, None).unwrap());
    let mut a = fx.author(6);
    a.schedule_rotation(&cert, new_app.writer(6).unwrap(), new_app.data_key()).unwrap();
    a.enter_epoch(link(), R);
    let rec = a.write_ops([("k", Some("v"))]).unwrap();
    assert_eq!(v.verify(rec.clone()).unwrap_err().reason, Reason::Decryption);
    // Then the leader hands over the data key.
    assert!(v.install_rotation(&cert, Some(new_app.data_key())).unwrap());
    v.verify(rec).unwrap();
}

#[test]
fn bad_rotations_are_refused() {
    let fx = common::Fixture::new(33);
    let v = fx.verifier();
    // Skipping a generation, reusing an index, going back in epochs, forging the owner.
    let gen2 = RotationCert::issue(&fx.owner, &fx.meta, 2, 24, R).unwrap();
    assert_eq!(v.install_rotation(&gen2, None), Err(RotationError::Generation { found: 2, newest: 0 }));
    let gen1 = RotationCert::issue(&fx.owner, &fx.meta, 1, 24, R).unwrap();
    v.install_rotation(&gen1, None).unwrap();
    let reuse = RotationCert::issue(&fx.owner, &fx.meta, 2, 24, R + 5).unwrap();
    assert_eq!(v.install_rotation(&reuse, None), Err(RotationError::AppIndex(24)));
    let back = RotationCert::issue(&fx.owner, &fx.meta, 2, 25, R).unwrap();
    assert_eq!(v.install_rotation(&back, None), Err(RotationError::Epoch { found: R, previous: R }));
    let other = RotationCert::issue(&fx.owner, &fx.meta, 1, 26, R + 1).unwrap();
    assert_eq!(v.install_rotation(&other, None), Err(RotationError::Conflict(1)));
    let mut forged = RotationCert::issue(&fx.owner, &fx.meta, 2, 27, R + 5).unwrap();
    forged.from_epoch += 1;
    assert_eq!(v.install_rotation(&forged, None), Err(RotationError::Signature));
    // A second rotation retires generation 1 in turn.
    let gen2 = RotationCert::issue(&fx.owner, &fx.meta, 2, 27, R + 5).unwrap();
    v.install_rotation(&gen2, None).unwrap();
    assert_eq!(v.rotation_certs(), vec![gen1, gen2]);
    assert_eq!(v.key_gen_at(R + 4), 1);
    assert_eq!(v.key_gen_at(R + 5), 2);
    // An author refuses keys that do not match the certificate or skip a generation.
    let mut a = fx.author(7);
    let g2 = fx.owner.app(27).unwrap();
    let g1 = fx.owner.app(24).unwrap();
    let c1 = v.rotation_certs()[0].clone();
    let c2 = v.rotation_certs()[1].clone();
    assert!(a.schedule_rotation(&c2, g2.writer(7).unwrap(), g2.data_key()).is_err());
    assert!(a.schedule_rotation(&c1, g1.writer(8).unwrap(), g1.data_key()).is_err());
    assert!(a.schedule_rotation(&c1, g1.writer(7).unwrap(), g2.data_key()).is_err());
    a.schedule_rotation(&c1, g1.writer(7).unwrap(), g1.data_key()).unwrap();
    // The Rotate control body carries the certificate.
    let body = Body::Control { code: ControlCode::Rotate, payload: c1.encode() };
    let rec = a.write_control(body.clone(), vec![]).unwrap();
    let opened = v.verify_open(rec).unwrap();
    assert_eq!(opened.body, body);
}

#[test]
fn a_rotated_capsule_file_audits_clean_with_its_certificates() {
    let fx = common::Fixture::new(34);
    let cert = RotationCert::issue(&fx.owner, &fx.meta, 1, 28, 2).unwrap();
    let new_app = fx.owner.app(28).unwrap();
    let mut c = fx.author(DEFAULT_COORDINATOR);
    c.schedule_rotation(&cert, new_app.writer(DEFAULT_COORDINATOR).unwrap(), new_app.data_key()).unwrap();
    let mut w = fx.author(3);
    w.schedule_rotation(&cert, new_app.writer(3).unwrap(), new_app.data_key()).unwrap();
    let mut recs = vec![w.write_ops([("a", Some("0"))]).unwrap()];
    let rotate = c.write_control(Body::Control { code: ControlCode::Rotate, payload: cert.encode() }, vec![]).unwrap();
    recs.push(rotate);
    let s1 = c.write_sync_epoch(1, vec![recs[0].link()]).unwrap();
    w.enter_epoch(s1.link(), 1);
    recs.push(s1);
    let r1 = w.write_ops([("b", Some("1"))]).unwrap();
    let s2 = c.write_sync_epoch(2, vec![r1.link()]).unwrap();
    assert_eq!(s2.header().key_gen, 1);
    w.enter_epoch(s2.link(), 2);
    recs.extend([r1, s2]);
    let r2 = w.write_ops([("c", Some("2"))]).unwrap();
    assert_eq!(r2.header().key_gen, 1);
    recs.push(r2);
    let bytes = psl_capsule::file::encode(&fx.meta, &recs);
    // Without the certificate the new generation's records are unknown...
    let plain = psl_capsule::audit_file(&bytes, None);
    assert_eq!(plain.problems.iter().filter(|p| p.check == "key-generation").count(), 2, "{:?}", plain.problems);
    // ...with it (public audit) or with the old data key (it reads the ROTATE record), clean.
    let public = psl_capsule::audit_file_rotated(&bytes, None, vec![(cert.clone(), None)]);
    assert!(public.ok(), "{:?}", public.problems);
    let keyed =
        psl_capsule::audit_file_rotated(&bytes, Some(fx.app.data_key()), vec![(cert, Some(new_app.data_key()))]);
    assert!(keyed.ok() && keyed.opened, "{:?}", keyed.problems);
    // The old data key alone finds the certificate in the log; the new bodies stay closed.
    let old_only = psl_capsule::audit_file(&bytes, Some(fx.app.data_key()));
    assert!(old_only.problems.iter().all(|p| p.check == "decryption"), "{:?}", old_only.problems);
    assert_eq!(old_only.problems.len(), 2);
}

mod props {
    use proptest::prelude::*;
    use psl_capsule::RotationCert;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn rotation_cert_round_trips_and_checks(seed in any::<[u8; 32]>(), key_gen in 1u32..1024, idx in 0u32..(1 << 31), from in any::<u64>()) {
            let owner = psl_crypto::OwnerKey::from_seed(&seed).unwrap();
            let meta = psl_capsule::new_capsule(&owner, 11, "props", 0, Default::default()).unwrap();
            prop_assume!(idx != 11);
            let cert = RotationCert::issue(&owner, &meta, key_gen, idx, from).unwrap();
            let enc = cert.encode();
            prop_assert_eq!(enc.len(), psl_capsule::ROTATION_CERT_LEN);
            let back = RotationCert::decode(&enc).unwrap();
            prop_assert_eq!(&back, &cert);
            prop_assert!(back.check(&meta).is_ok());
        }

        #[test]
        fn rotation_cert_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(c) = RotationCert::decode(&bytes) {
                prop_assert_eq!(c.encode(), bytes);
            }
        }
    }
}
