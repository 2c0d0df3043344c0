//! A revocation found in the log refuses the records it covers, even those stored before it
//! (a server stores a leaked key's records until it learns the revocation): a store opened
//! again does not load them, and an append after it refuses them.

use psl_capsule::{new_capsule_with, Author, KeyStatement, Limits, Revocation, WriterKeys};
use psl_crypto::OwnerKey;
use psl_store::{DiskStore, OrphanCause, StoreError};

#[test]
fn adversary_records_stored_before_a_later_revocation_are_not_loaded_on_open() {
    let owner = OwnerKey::from_seed(&[51; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule_with(&owner, 3, "store-revocation", 0, Limits::default(), WriterKeys::Certified).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut store = DiskStore::create(tmp.path(), meta.clone(), None).unwrap();
    let v = psl_capsule::Verifier::new(meta.clone(), None);
    let leaked = 0x10011;
    let mut thief = Author::new(&meta, &app, leaked).unwrap();
    let mut honest = Author::new(&meta, &app, 0x10012).unwrap();
    // The leaked key's chain: its certificate, two records before the leak, two after.
    let mut recs = vec![v.verify(thief.write_own_cert().unwrap().unwrap()).unwrap()];
    for i in 0..4 {
        recs.push(v.verify(thief.write_ops([(format!("k{i}"), Some("v"))]).unwrap()).unwrap());
    }
    store.append(&recs).unwrap();
    // Then an honest writer's Cert record carrying the revocation from seq 3.
    let rev = Revocation::issue(&app, meta.name(), 0, leaked, u64::MAX, 3).unwrap();
    let honest_cert = v.verify(honest.write_own_cert().unwrap().unwrap()).unwrap();
    let carrier = v.verify(honest.write_certs(vec![KeyStatement::Revoke(rev)]).unwrap()).unwrap();
    store.append(&[honest_cert, carrier]).unwrap();
    // Stored and verified before the revocation was known; an append now refuses it.
    let late = v.verify(thief.write_ops([("late", Some("x"))]).unwrap());
    assert!(late.is_err(), "the verifier refuses the revoked writer now");
    drop(store);

    let (store, report) = DiskStore::open(tmp.path(), None).unwrap();
    let head = store.heads().get(&leaked).copied().expect("the leaked writer's records before seq 3 stay");
    assert_eq!(head.seq, 2, "records from seq 3 on were loaded");
    let cut: Vec<(u64, &OrphanCause)> =
        report.revoked.iter().filter(|o| o.writer == leaked).map(|o| (o.seq, &o.cause)).collect();
    assert_eq!(cut.len(), 2, "{cut:?}");
    assert!(matches!(cut[0], (3, OrphanCause::Revoked { from_seq: 3, .. })), "{cut:?}");
    assert!(report.revoked.iter().all(|o| o.to_string().contains("revoked") || o.to_string().contains("ends before")));
    assert!(!report.is_damaged(), "records valid when stored are not damage: {report}");
    let check = store.check().unwrap();
    assert!(check.is_clean(), "the live check agrees with the open: {:?}", check.problems());
    assert!(store.get(&recs[4].hash()).unwrap().is_none());
    assert!(store.get(&recs[2].hash()).unwrap().is_some());
    // An append of the revoked record again (from a repair, say) is refused.
    let mut store = store;
    match store.append(&recs[4..]) {
        Err(StoreError::Rejected { .. }) => {}
        other => panic!("expected a rejection, got {other:?}"),
    }
}
