//! Rejections: a gap, an equivocation, a broken chain and a record of another capsule are each
//! their own error, and a refused batch writes nothing.

mod common;
use common::Fixture;
use psl_capsule::{file, CapsuleFile};
use psl_store::{DiskStore, StoreError};

fn empty_store(fx: &Fixture) -> (tempfile::TempDir, DiskStore) {
    let tmp = common::scratch();
    let s = DiskStore::create(tmp.path(), fx.meta.clone(), fx.key()).unwrap();
    (tmp, s)
}

#[test]
fn a_gap_is_refused() {
    let fx = Fixture::new(41);
    let mut a = fx.author(1);
    let recs = fx.verify(vec![a.write_ops([("a", Some("1"))]).unwrap(), a.write_ops([("b", Some("2"))]).unwrap()]);
    let (_t, mut s) = empty_store(&fx);
    match s.append(&recs[1..]) {
        Err(StoreError::Gap { writer: 1, expected: 0, got: 1 }) => {}
        other => panic!("expected a gap, got {other:?}"),
    }
    // Out of order within one batch is a gap too: the batch is taken in order.
    assert!(matches!(s.append(&[recs[1].clone(), recs[0].clone()]), Err(StoreError::Gap { .. })));
    assert_eq!(s.log_bytes(), 0);
    s.append(&recs).unwrap();
    assert_eq!(s.len(), 2);
}

#[test]
fn equivocation_is_refused_with_both_hashes() {
    let fx = Fixture::new(42);
    let mut honest = fx.author(2);
    let mut twin = fx.author(2); // same writer key, its own idea of the chain
    let a = fx.verify(vec![honest.write_ops([("k", Some("honest"))]).unwrap()]);
    let b = fx.verify(vec![twin.write_ops([("k", Some("forked"))]).unwrap()]);
    let (_t, mut s) = empty_store(&fx);
    s.append(&a).unwrap();
    match s.append(&b) {
        Err(e @ StoreError::Equivocation { .. }) => {
            let StoreError::Equivocation { writer, seq, stored, offered } = &e else { unreachable!() };
            assert_eq!((*writer, *seq, *stored, *offered), (2, 0, a[0].hash(), b[0].hash()));
            assert!(e.to_string().contains("equivocation"), "{e}");
        }
        other => panic!("expected equivocation, got {other:?}"),
    }

    // Within one batch: the first claim of the slot wins, the second is equivocation.
    let (_t2, mut s2) = empty_store(&fx);
    assert!(matches!(s2.append(&[a[0].clone(), b[0].clone()]), Err(StoreError::Equivocation { .. })));
    assert_eq!(s2.len(), 0, "a refused batch writes nothing");
    assert_eq!(s2.log_bytes(), 0);
}

#[test]
fn a_record_that_does_not_link_to_the_head_is_refused() {
    let fx = Fixture::new(43);
    let mut honest = fx.author(3);
    let mut twin = fx.author(3);
    let h = fx.verify(vec![honest.write_ops([("x", Some("1"))]).unwrap()]);
    let t = fx.verify(vec![twin.write_ops([("x", Some("2"))]).unwrap(), twin.write_ops([("y", Some("3"))]).unwrap()]);
    let (_t, mut s) = empty_store(&fx);
    s.append(&h).unwrap();
    match s.append(&t[1..]) {
        Err(StoreError::BrokenChain { writer: 3, seq: 1, expected_prev, got_prev }) => {
            assert_eq!((expected_prev, got_prev), (h[0].hash(), t[0].hash()));
        }
        other => panic!("expected a broken chain, got {other:?}"),
    }
}

#[test]
fn a_record_of_another_capsule_is_refused() {
    let fx = Fixture::new(44);
    let other = Fixture::new(45);
    let foreign = other.history(1, 0);
    let (_t, mut s) = empty_store(&fx);
    match s.append(&foreign[..1]) {
        Err(StoreError::WrongCapsule { expected, found }) => {
            assert_eq!((expected, found), (fx.meta.name(), other.meta.name()));
        }
        other => panic!("expected WrongCapsule, got {other:?}"),
    }
    // A good record first does not sneak through: the whole batch is refused.
    let mine = fx.history(1, 0);
    assert!(matches!(s.append(&[mine[0].clone(), foreign[1].clone()]), Err(StoreError::WrongCapsule { .. })));
    assert!(s.is_empty());

    // A whole file of another capsule.
    let f = CapsuleFile::parse(&file::encode(&other.meta, foreign.iter().map(|r| &**r))).unwrap();
    assert!(matches!(s.import(&f), Err(StoreError::WrongCapsule { .. })));
}

#[test]
fn an_import_with_a_forged_record_is_refused_whole() {
    let fx = Fixture::new(46);
    let recs = fx.history(2, 0);
    let mut bytes_of: Vec<Vec<u8>> = recs.iter().map(|r| r.bytes().to_vec()).collect();
    // Flip a signature byte: the record still decodes, so the file parses, but it does not verify.
    let last = bytes_of[4].len() - 1;
    bytes_of[4][last] ^= 0x01;
    let limits = fx.meta.meta.policy.limits;
    let records: Vec<psl_capsule::Record> =
        bytes_of.iter().map(|b| psl_capsule::Record::decode(b, &limits).unwrap()).collect();
    let f = CapsuleFile { metadata: fx.meta.clone(), records };
    let (_t, mut s) = empty_store(&fx);
    match s.import(&f) {
        Err(e @ StoreError::Rejected { index: 4, .. }) => {
            assert!(e.to_string().contains("record #4"), "{e}")
        }
        other => panic!("expected the forged record to be rejected, got {other:?}"),
    }
    assert!(s.is_empty(), "nothing of a refused import is written");
}

#[test]
fn a_store_holding_the_data_key_refuses_a_body_it_cannot_open() {
    let fx = Fixture::new(47);
    let wrong = Fixture::new(48);
    // Signed by the right writer key, sealed under the wrong data key: a public verifier
    // accepts it, a verifier with the data key does not.
    let mut a = psl_capsule::Author::with_keys(&fx.meta, fx.app.writer(1).unwrap(), wrong.app.data_key(), 1).unwrap();
    let rec = a.write_ops([("k", Some("v"))]).unwrap();
    let public = psl_capsule::Verifier::new(fx.meta.clone(), None).verify(rec).unwrap();
    let (_t, mut s) = empty_store(&fx);
    match s.append(std::slice::from_ref(&public)) {
        Err(e @ StoreError::Rejected { index: 0, .. }) => {
            assert!(e.to_string().contains("decrypt"), "{e}")
        }
        other => panic!("expected the body to be refused, got {other:?}"),
    }
    assert!(s.is_empty());
    let tmp = common::scratch();
    let mut keyless = DiskStore::create(tmp.path(), fx.meta.clone(), None).unwrap();
    assert_eq!(keyless.append(&[public]).unwrap().appended, 1);
}
