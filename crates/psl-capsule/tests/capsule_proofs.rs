//! Membership proofs from a signed head, checked with public keys only.

mod common;
use psl_capsule::{Kind, MembershipProof, ProofError, Replica};

fn replica(fx: &common::Fixture) -> Replica {
    let v = fx.public_verifier();
    let mut r = Replica::new(fx.meta.name());
    for rec in fx.small_history() {
        r.insert(v.verify(rec).unwrap()).unwrap();
    }
    r
}

#[test]
fn every_record_has_a_proof_that_verifies() {
    let fx = common::Fixture::new(20);
    let r = replica(&fx);
    for rec in r.iter() {
        let p = MembershipProof::build(&fx.meta, &r, rec.hash(), None).unwrap();
        let bytes = p.encode();
        let back = MembershipProof::decode(&bytes).unwrap();
        let out = back.verify(Some(fx.meta.name())).unwrap();
        assert_eq!(out.target.hash, rec.hash());
    }
}

#[test]
fn proof_from_sync_reaches_earlier_records() {
    let fx = common::Fixture::new(21);
    let r = replica(&fx);
    let sync = r.latest_sync().unwrap().hash();
    let target = r.at(2, 0).next().unwrap().hash();
    let p = MembershipProof::build(&fx.meta, &r, target, Some(sync)).unwrap();
    let out = p.verify(Some(fx.meta.name())).unwrap();
    assert_eq!(out.head_kind, Kind::Sync);
    assert_eq!(out.target.writer, 2);
    assert_eq!(p.steps.len(), 3); // SYNC -> w2 seq1 -> w2 seq0
}

#[test]
fn altered_proofs_fail() {
    let fx = common::Fixture::new(22);
    let r = replica(&fx);
    let target = r.at(1, 0).next().unwrap().hash();
    let p = MembershipProof::build(&fx.meta, &r, target, None).unwrap();
    let bytes = p.encode();
    let mut failures = 0;
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        let ok =
            MembershipProof::decode(&b).and_then(|p| p.verify(Some(fx.meta.name()))).map(|o| o.target.hash == target);
        if !matches!(ok, Ok(true)) {
            failures += 1;
        }
    }
    assert_eq!(failures, bytes.len(), "every single flip must break the proof");
    // The proof is for this capsule only.
    let other = common::Fixture::new(23);
    assert!(matches!(p.verify(Some(other.meta.name())), Err(ProofError::Capsule { .. })));
}

#[test]
fn no_path_is_reported() {
    let fx = common::Fixture::new(24);
    let r = replica(&fx);
    let a = r.at(1, 0).next().unwrap().hash();
    let b = r.at(2, 1).next().unwrap().hash();
    assert!(matches!(MembershipProof::build(&fx.meta, &r, b, Some(a)), Err(ProofError::NoPath { .. })));
}
