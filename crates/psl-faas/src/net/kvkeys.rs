//! The KV roles' side of the leader's key handout (front ends, KV coordinators, CapsuleDB):
//! attest the leader (its report must bind its TLS certificate key and be in the policy),
//! offer a fresh channel key under this role's report (binding it and the role's own TLS
//! certificate key), and open the sealed KV keys in memory. Nothing is written to disk: a
//! role that restarts attests again.

use super::wire::{evidence, read_msg, unhex, unhex_n, write_msg, Msg};
use crate::attest::{bind_channel_key, AttestVerifier, Attester};
use crate::error::FaasError;
use crate::leader::{open_kv_bundle, KvRole, Offer};
use crate::tls::{self, TlsIdentity};
use psl_capsule::SignedMetadata;
use psl_crypto::AppKey;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One attempt: the KV capsule's application key for `role` `id`, from the leader at `leader`.
pub fn fetch_kv_keys(
    leader: SocketAddr,
    attester: &dyn Attester,
    leader_verifier: &dyn AttestVerifier,
    role: KvRole,
    id: u32,
    meta: &SignedMetadata,
) -> Result<AppKey, FaasError> {
    let me = TlsIdentity::generate("psl-kv-role")?;
    let (mut s, leader_spki) = tls::connect(leader, &me)?;
    s.sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let my_nonce: [u8; 32] = rand::random();
    write_msg(&mut s, &Msg::KvHello { role: role.name().into(), id, nonce: hex::encode(my_nonce) })?;
    let (backend, ev, nonce) = match read_msg(&mut s)? {
        Msg::LeaderChallenge { backend, evidence, nonce } => (backend, evidence, nonce),
        Msg::Refused { why } | Msg::Error { why } => {
            return Err(FaasError::Attestation { who: format!("KV {} {id}", role.name()), why })
        }
        m => return Err(FaasError::Net(format!("expected the leader's challenge, got {}", m.name()))),
    };
    leader_verifier
        .verify(&evidence(&backend, &ev)?, &my_nonce, &bind_channel_key(&leader_spki))
        .map_err(|e| FaasError::Attestation { who: "leader".into(), why: e.to_string() })?;
    let who = format!("KV {} {id}", role.name());
    let (channel, offer) = Offer::make(attester, id, &who, &unhex_n::<32>("nonce", &nonce)?, Some(me.spki_hash()))?;
    write_msg(&mut s, &Msg::offer(&offer))?;
    match read_msg(&mut s)? {
        Msg::KvKeys { sealed } => open_kv_bundle(&channel, &unhex("sealed", &sealed)?, role, id, meta),
        Msg::Refused { why } | Msg::Error { why } => Err(FaasError::Attestation { who, why }),
        m => Err(FaasError::Net(format!("expected KvKeys, got {}", m.name()))),
    }
}

/// [`fetch_kv_keys`], retried with backoff (100 ms doubling to 5 s) until `patience` has
/// passed: the leader may still be starting. A refusal is final (attesting again would not
/// change the policy's answer).
pub fn fetch_kv_keys_retrying(
    leader: SocketAddr,
    attester: &dyn Attester,
    leader_verifier: &dyn AttestVerifier,
    role: KvRole,
    id: u32,
    meta: &SignedMetadata,
    patience: Duration,
) -> Result<AppKey, FaasError> {
    let deadline = Instant::now() + patience;
    let mut wait = Duration::from_millis(100);
    loop {
        match fetch_kv_keys(leader, attester, leader_verifier, role, id, meta) {
            Ok(k) => return Ok(k),
            Err(e @ FaasError::Attestation { .. }) => return Err(e),
            Err(e) if Instant::now() + wait < deadline => {
                tracing::warn!(%leader, "KV keys from the leader: {e}; trying again in {} ms", wait.as_millis());
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::{measure, AttestPolicy, Measurement, SimAttester, SimPlatform, SimVerifier};
    use crate::net::leader::{serve_leader, HostAuth, LeaderConfig};
    use psl_capsule::{new_capsule_with, Limits, WriterKeys};
    use psl_crypto::OwnerKey;
    use std::sync::Arc;

    fn good() -> Measurement {
        measure(&psl_crypto::sha256(&[b"kv keys test"]), b"config")
    }

    fn verifier(p: &Arc<SimPlatform>) -> SimVerifier {
        SimVerifier::new(p.public(), AttestPolicy { allowed: [good()].into() })
    }

    /// A leader serving the KV capsule's keys; its address, the capsule and the application key.
    fn leader() -> (SocketAddr, Arc<SimPlatform>, SignedMetadata, AppKey) {
        let p = SimPlatform::new();
        let owner = OwnerKey::generate();
        let meta = new_capsule_with(&owner, 3, "kv keys test", 1, Limits::default(), WriterKeys::Certified).unwrap();
        let app = owner.app(meta.meta.app_index).unwrap();
        let cfg = LeaderConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            fabric: psl_fabric::FabricSpec::router("127.0.0.1:1".parse().unwrap()),
            host_auth: HostAuth::default(),
            admit_wait: Duration::from_secs(1),
            connections_max: 16,
            capsule_hosts: Vec::new(),
            coordinator_hosts: Vec::new(),
            kv: Some((owner, meta.clone())),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (att, ver) = (SimAttester::new(p.clone(), good()), verifier(&p));
        std::thread::spawn(move || serve_leader(cfg, Box::new(att), Box::new(ver), |a| tx.send(a).unwrap()));
        (rx.recv().unwrap(), p, meta, app)
    }

    #[test]
    fn an_attested_kv_role_gets_the_application_key_in_memory() {
        let (addr, p, meta, app) = leader();
        let me = SimAttester::new(p.clone(), good());
        for role in [KvRole::FrontEnd, KvRole::Coordinator, KvRole::CapsuleDb] {
            let got = fetch_kv_keys(addr, &me, &verifier(&p), role, 2, &meta).expect("granted");
            assert_eq!(got.public(), app.public());
            assert_eq!(got.data_key().expose_bytes(), app.data_key().expose_bytes());
        }
    }

    #[test]
    fn a_kv_role_running_code_the_policy_refuses_gets_nothing() {
        let (addr, p, meta, _) = leader();
        let rogue = SimAttester::new(p.clone(), measure(&psl_crypto::sha256(&[b"rogue"]), b"config"));
        let e = fetch_kv_keys(addr, &rogue, &verifier(&p), KvRole::FrontEnd, 1, &meta).expect_err("refused");
        assert!(matches!(e, FaasError::Attestation { .. }), "{e}");
        // Another platform's reports (forged evidence) are refused too.
        let forged = SimAttester::new(SimPlatform::new(), good());
        let e = fetch_kv_keys(addr, &forged, &verifier(&p), KvRole::Coordinator, 0, &meta).expect_err("refused");
        assert!(matches!(e, FaasError::Attestation { .. }), "{e}");
    }

    /// At the leader itself: an offer without a challenge, under a refused measurement, or
    /// binding another TLS key than the connection's yields an error and no sealed bytes.
    #[test]
    fn the_leader_seals_nothing_to_an_unattested_kv_role() {
        let p = SimPlatform::new();
        let leader = crate::leader::Leader::new(Box::new(SimAttester::new(p.clone(), good())), Box::new(verifier(&p)));
        let owner = OwnerKey::generate();
        let meta = new_capsule_with(&owner, 3, "kv keys test", 1, Limits::default(), WriterKeys::Certified).unwrap();
        leader.set_kv(&owner, &meta).unwrap();
        let spki = [7u8; 32];
        // No challenge issued.
        let (_, offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &[1; 32], Some(spki)).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::FrontEnd, 1).is_err());
        // A refused measurement.
        let n = leader.kv_challenge(KvRole::FrontEnd, 1);
        let rogue = SimAttester::new(p.clone(), measure(&psl_crypto::sha256(&[b"rogue"]), b"config"));
        let (_, offer) = Offer::make(&rogue, 1, "t", &n, Some(spki)).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::FrontEnd, 1).is_err());
        // A report made for another TLS key than the one the leader saw.
        let n = leader.kv_challenge(KvRole::CapsuleDb, 1);
        let (_, mut offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &n, Some(spki)).unwrap();
        offer.tls_spki = Some([8; 32]);
        assert!(leader.grant_kv(&offer, KvRole::CapsuleDb, 1).is_err());
        // The nonce is used once: the honest offer after a refusal needs a new challenge.
        let (_, offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &n, Some(spki)).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::CapsuleDb, 1).is_err());
        // A bundle sealed for one role and id does not open as another's.
        let n = leader.kv_challenge(KvRole::FrontEnd, 4);
        let (ch, offer) = Offer::make(&SimAttester::new(p.clone(), good()), 4, "t", &n, Some(spki)).unwrap();
        let sealed = leader.grant_kv(&offer, KvRole::FrontEnd, 4).expect("attested");
        assert!(open_kv_bundle(&ch, &sealed, KvRole::Coordinator, 4, &meta).is_err());
        assert!(open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 5, &meta).is_err());
        assert!(open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 4, &meta).is_ok());
    }

    #[test]
    fn a_leader_without_kv_keys_refuses() {
        let p = SimPlatform::new();
        let leader = crate::leader::Leader::new(Box::new(SimAttester::new(p.clone(), good())), Box::new(verifier(&p)));
        let n = leader.kv_challenge(KvRole::FrontEnd, 1);
        let (_, offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &n, Some([7; 32])).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::FrontEnd, 1).is_err());
    }
}
