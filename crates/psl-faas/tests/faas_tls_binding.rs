//! The leader grants keys only to the party whose TLS certificate key the worker's report
//! binds: an offer that arrives on a connection with another certificate is refused.

use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_faas::attest::{binary_hash, measure};
use psl_faas::leader::Leader;
use psl_faas::tls::TlsIdentity;
use psl_faas::worker::Worker;
use psl_faas::{AttestPolicy, FaasError, JobId, SimAttester, SimPlatform, SimVerifier};
use psl_sandbox::SandboxLimits;

#[test]
fn faas_offer_on_another_tls_certificate_is_refused() {
    let platform = SimPlatform::new();
    let m = measure(&binary_hash(), b"tls-binding-test");
    let leader = Leader::new(
        Box::new(SimAttester::new(platform.clone(), m)),
        Box::new(SimVerifier::new(platform.public(), AttestPolicy { allowed: [m].into() })),
    );
    let owner = OwnerKey::generate();
    let meta = new_capsule(&owner, 7, "tls-binding", 0, Limits::default()).unwrap();
    leader.begin_job(JobId::random(), owner, meta, 0).unwrap();
    let worker = Worker::new(1, Box::new(SimAttester::new(platform.clone(), m)), SandboxLimits::default());
    let (mine, other) = (TlsIdentity::generate("w").unwrap(), TlsIdentity::generate("x").unwrap());

    // The report binds `mine`, the session shows `other`: refused, no grant.
    let mut o = worker.offer_for(&leader.challenge(1), Some(mine.spki_hash())).unwrap();
    o.tls_spki = Some(other.spki_hash());
    match leader.admit(vec![o], 1, 1) {
        Err(FaasError::TooFewWorkers { refused, .. }) => assert!(refused.contains("does not bind"), "{refused}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an offer from another TLS certificate was granted keys"),
    }
    // No TLS key in the session for a report that binds one: refused too.
    let mut o = worker.offer_for(&leader.challenge(1), Some(mine.spki_hash())).unwrap();
    o.tls_spki = None;
    assert!(leader.admit(vec![o], 1, 1).is_err());
    // The matching certificate: granted.
    let o = worker.offer_for(&leader.challenge(1), Some(mine.spki_hash())).unwrap();
    let (grants, refused) = leader.admit(vec![o], 1, 1).unwrap();
    assert_eq!(grants.len(), 1);
    assert!(refused.is_empty());
    leader.end_job();
}
