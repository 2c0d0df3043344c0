//! The KV roles' side of the leader's key handout (front ends, KV coordinators, CapsuleDB):
//! name the writers this role will sign with, attest the leader (its report must bind its TLS
//! certificate key and be in the policy), offer a fresh channel key under this role's report
//! (binding it and the role's own TLS certificate key), and open the sealed keys (the data key
//! and those writers' keys and certificates, never the application key: [`crate::kvgrant`])
//! in memory. Nothing is written to disk: a role that restarts attests again.

use super::wire::{evidence, read_msg, unhex, unhex_n, write_msg, Msg};
use crate::attest::{bind_channel_key, AttestVerifier, Attester};
use crate::error::FaasError;
use crate::grant::Offer;
use crate::kvgrant::{open_kv_bundle, writers_within_bound, KvRoleKeys};
use crate::leader::KvRole;
use crate::tls::{self, TlsIdentity};
use psl_capsule::SignedMetadata;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One attempt: the KV capsule's data key and the keys of `writers` (this role's own) for
/// `role` `id`, from the leader at `leader`.
pub fn fetch_kv_keys(
    leader: SocketAddr,
    attester: &dyn Attester,
    leader_verifier: &dyn AttestVerifier,
    role: KvRole,
    id: u32,
    writers: &[u32],
    meta: &SignedMetadata,
) -> Result<KvRoleKeys, FaasError> {
    writers_within_bound(writers)?;
    let me = TlsIdentity::generate("psl-kv-role")?;
    let (mut s, leader_spki) = tls::connect(leader, &me)?;
    s.sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let my_nonce: [u8; 32] = rand::random();
    let hello = Msg::KvHello { role: role.name().into(), id, nonce: hex::encode(my_nonce), writers: writers.to_vec() };
    write_msg(&mut s, &hello)?;
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
        Msg::KvKeys { sealed } => open_kv_bundle(&channel, &unhex("sealed", &sealed)?, role, id, writers, meta),
        Msg::Refused { why } | Msg::Error { why } => Err(FaasError::Attestation { who, why }),
        m => Err(FaasError::Net(format!("expected KvKeys, got {}", m.name()))),
    }
}

/// [`fetch_kv_keys`], retried with backoff (100 ms doubling to 5 s) until `patience` has
/// passed: the leader may still be starting. A refusal is final (attesting again would not
/// change the policy's answer).
#[allow(clippy::too_many_arguments)]
pub fn fetch_kv_keys_retrying(
    leader: SocketAddr,
    attester: &dyn Attester,
    leader_verifier: &dyn AttestVerifier,
    role: KvRole,
    id: u32,
    writers: &[u32],
    meta: &SignedMetadata,
    patience: Duration,
) -> Result<KvRoleKeys, FaasError> {
    let deadline = Instant::now() + patience;
    let mut wait = Duration::from_millis(100);
    loop {
        match fetch_kv_keys(leader, attester, leader_verifier, role, id, writers, meta) {
            Ok(k) => return Ok(k),
            Err(e @ (FaasError::Attestation { .. } | FaasError::KvRequest { .. } | FaasError::Malformed { .. })) => {
                return Err(e)
            }
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
    use crate::kvgrant::{kv_aad, parse_kv_bundle, KV_COORDINATOR_NODE_BASE};
    use crate::leader::Leader;
    use crate::net::leader::{serve_leader, HostAuth, LeaderConfig};
    use psl_capsule::{new_capsule_with, Limits, WriterCert, WriterKeys};
    use psl_crypto::{AppKey, OwnerKey};
    use psl_node::KeySource;
    use std::sync::Arc;

    fn good() -> Measurement {
        measure(&psl_crypto::sha256(&[b"kv keys test"]), b"config")
    }

    fn verifier(p: &Arc<SimPlatform>) -> SimVerifier {
        SimVerifier::new(p.public(), AttestPolicy { allowed: [good()].into() })
    }

    fn capsule() -> (OwnerKey, SignedMetadata, AppKey) {
        let owner = OwnerKey::generate();
        let meta = new_capsule_with(&owner, 3, "kv keys test", 1, Limits::default(), WriterKeys::Certified).unwrap();
        let app = owner.app(meta.meta.app_index).unwrap();
        (owner, meta, app)
    }

    /// Node `node`'s writers `0 .. n` in incarnation `inc`.
    fn node_writers(node: u32, inc: u32, n: u32) -> Vec<u32> {
        (0..n).map(|a| psl_scl::writer_index(node, inc, a).unwrap()).collect()
    }

    /// A leader serving the KV capsule's keys; its address, the capsule and the application key.
    fn leader() -> (SocketAddr, Arc<SimPlatform>, SignedMetadata, AppKey) {
        let p = SimPlatform::new();
        let (owner, meta, app) = capsule();
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

    /// An in-process leader holding the KV capsule's keys.
    fn local_leader() -> (Leader, Arc<SimPlatform>, SignedMetadata, AppKey) {
        let p = SimPlatform::new();
        let leader = Leader::new(Box::new(SimAttester::new(p.clone(), good())), Box::new(verifier(&p)));
        let (owner, meta, app) = capsule();
        leader.set_kv(&owner, &meta).unwrap();
        (leader, p, meta, app)
    }

    /// Challenge, attested offer and grant at an in-process leader: the channel and the
    /// leader's answer.
    fn ask(
        leader: &Leader,
        p: &Arc<SimPlatform>,
        role: KvRole,
        id: u32,
        writers: &[u32],
    ) -> (crate::channel::ChannelKey, Result<Vec<u8>, FaasError>) {
        let n = leader.kv_challenge(role, id);
        let (ch, offer) = Offer::make(&SimAttester::new(p.clone(), good()), id, "t", &n, Some([7; 32])).unwrap();
        let r = leader.grant_kv(&offer, role, id, writers);
        (ch, r)
    }

    /// The writers each role asks for in these tests: a front end (node 2, incarnation 5,
    /// four writers), a KV coordinator of rank 1 (its coordinator writer), CapsuleDB 2 (its
    /// role writer and a block writer).
    fn wanted(meta: &SignedMetadata, role: KvRole) -> Vec<u32> {
        match role {
            KvRole::FrontEnd => node_writers(2, 5, 4),
            KvRole::Coordinator => vec![meta.meta.policy.coordinator_at(1).unwrap()],
            KvRole::CapsuleDb => {
                vec![psl_scl::writer_index(2, 0, 15).unwrap(), psl_scl::writer_index(2, 7, 14).unwrap()]
            }
        }
    }

    fn id_of(role: KvRole) -> u32 {
        match role {
            KvRole::Coordinator => 1,
            _ => 2,
        }
    }

    #[test]
    fn an_attested_kv_role_gets_the_data_key_and_exactly_its_own_writers_in_memory() {
        let (addr, p, meta, app) = leader();
        let me = SimAttester::new(p.clone(), good());
        for role in [KvRole::FrontEnd, KvRole::Coordinator, KvRole::CapsuleDb] {
            let want = wanted(&meta, role);
            let got = fetch_kv_keys(addr, &me, &verifier(&p), role, id_of(role), &want, &meta).expect("granted");
            assert_eq!(got.data_key().expose_bytes(), app.data_key().expose_bytes());
            assert_eq!(got.writer_indices(), want, "{role:?}");
            for g in got.writers() {
                let (k, c) = psl_capsule::writer_credentials(&meta, &app, g.writer).unwrap();
                assert_eq!(g.key.verifying_key(), k.verifying_key());
                assert_eq!(Some(&g.cert), c.as_ref());
            }
        }
        // A receive-only role asks for no writer and gets the data key only.
        let got = fetch_kv_keys(addr, &me, &verifier(&p), KvRole::FrontEnd, 9, &[], &meta).expect("granted");
        assert!(got.writers().is_empty());
    }

    /// The attacker's view: a front end's opened bundle holds neither the application key's
    /// secret nor its chain code (with them it could derive every writer's key, certify new
    /// writers and sign revocations), nor any key but its own writers'.
    #[test]
    fn a_front_ends_bundle_does_not_hold_the_application_key() {
        let (leader, p, meta, app) = local_leader();
        let want = node_writers(4, 1, 2);
        let (ch, sealed) = ask(&leader, &p, KvRole::FrontEnd, 4, &want);
        let sealed = sealed.expect("attested");
        let plain = ch.open(&sealed, &kv_aad(KvRole::FrontEnd, 4, &meta.name().0 .0, &want)).unwrap();
        let secret = app.to_secret_bytes();
        assert!(!plain.windows(32).any(|w| w == &secret[..32]), "the bundle holds the application secret");
        assert!(!plain.windows(32).any(|w| w == &secret[32..]), "the bundle holds the application chain code");
        // Other writers' keys (another incarnation, another node, a coordinator) are not in it.
        let others = [
            psl_scl::writer_index(4, 2, 0).unwrap(),
            psl_scl::writer_index(5, 1, 0).unwrap(),
            meta.meta.policy.coordinator_at(0).unwrap(),
        ];
        for w in others {
            let k = app.writer_hardened(w).unwrap().expose_secret_bytes();
            assert!(!plain.windows(32).any(|x| x == &k[..]), "writer {w}'s key is in the bundle");
        }
        let keys = open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 4, &want, &meta).unwrap();
        assert_eq!(keys.writer_indices(), want);
    }

    /// A front end may ask only for its own node's writers; a coordinator only its rank's
    /// writer and its node's; CapsuleDB only its node's; none a server's, more than 16, or one
    /// twice. Each is refused with nothing sealed, at the leader and over the network.
    #[test]
    fn a_kv_role_asking_for_writers_not_its_own_is_refused() {
        let (local, p, meta, _) = local_leader();
        let leader = &local;
        let coord0 = meta.meta.policy.coordinator_at(0).unwrap();
        let coord1 = meta.meta.policy.coordinator_at(1).unwrap();
        let server = psl_capsule::server_writer(0).unwrap();
        let refused: Vec<(KvRole, u32, Vec<u32>)> = vec![
            // A front end: another node id's writer, a coordinator rank's, a server's, too many, twice.
            (
                KvRole::FrontEnd,
                4,
                vec![psl_scl::writer_index(4, 0, 0).unwrap(), psl_scl::writer_index(5, 0, 0).unwrap()],
            ),
            (KvRole::FrontEnd, 4, vec![coord0]),
            (KvRole::FrontEnd, 4, vec![server]),
            (KvRole::FrontEnd, 4, node_writers(4, 0, 16).into_iter().chain(node_writers(4, 1, 1)).collect()),
            (KvRole::FrontEnd, 4, vec![psl_scl::writer_index(4, 0, 0).unwrap(); 2]),
            // A front end claiming an id no node has.
            (KvRole::FrontEnd, 0, vec![0]),
            (KvRole::FrontEnd, 40_000, vec![]),
            // A coordinator: another rank's writer, a front end's, a rank the capsule lacks.
            (KvRole::Coordinator, 1, vec![coord0]),
            (KvRole::Coordinator, 1, vec![coord1, psl_scl::writer_index(4, 0, 0).unwrap()]),
            (KvRole::Coordinator, 9, vec![]),
            (KvRole::Coordinator, 1, vec![server]),
            // CapsuleDB: another node's writers, a coordinator's.
            (KvRole::CapsuleDb, 2, vec![psl_scl::writer_index(3, 0, 15).unwrap()]),
            (KvRole::CapsuleDb, 2, vec![coord0]),
        ];
        for (role, id, writers) in &refused {
            let (_, r) = ask(leader, &p, *role, *id, writers);
            let e = r.expect_err("refused");
            assert!(matches!(e, FaasError::KvRequest { .. }), "{role:?} {id} {writers:?}: {e}");
            assert!(leader.check_kv_request(*role, *id, writers).is_err());
        }
        // What each role may ask for.
        let allowed: Vec<(KvRole, u32, Vec<u32>)> = vec![
            (KvRole::FrontEnd, 4, node_writers(4, 4095, 16)),
            (KvRole::Coordinator, 1, vec![coord1]),
            (KvRole::Coordinator, 1, vec![coord1, psl_scl::writer_index(KV_COORDINATOR_NODE_BASE + 1, 0, 0).unwrap()]),
            (KvRole::CapsuleDb, 2, wanted(&meta, KvRole::CapsuleDb)),
        ];
        for (role, id, writers) in &allowed {
            let (ch, r) = ask(leader, &p, *role, *id, writers);
            let keys = open_kv_bundle(&ch, &r.expect("granted"), *role, *id, writers, &meta).unwrap();
            assert_eq!(&keys.writer_indices(), writers);
        }
        // Over the network the refusal is final and says why.
        let (addr, p, meta, _) = self::leader();
        let coord0 = meta.meta.policy.coordinator_at(0).unwrap();
        let me = SimAttester::new(p.clone(), good());
        let e = fetch_kv_keys_retrying(
            addr,
            &me,
            &verifier(&p),
            KvRole::FrontEnd,
            4,
            &[coord0],
            &meta,
            Duration::from_secs(30),
        )
        .expect_err("refused");
        assert!(e.to_string().contains("not its own"), "{e}");
    }

    /// With its keys a role can sign as its own writers only: another writer's key is not
    /// there, and a certificate it makes for a writer (signed with a key it holds) does not
    /// verify.
    #[test]
    fn a_kv_roles_keys_cannot_sign_for_a_writer_it_was_not_granted() {
        let (leader, p, meta, _) = local_leader();
        let want = node_writers(4, 0, 2);
        let (ch, sealed) = ask(&leader, &p, KvRole::FrontEnd, 4, &want);
        let keys = open_kv_bundle(&ch, &sealed.unwrap(), KvRole::FrontEnd, 4, &want, &meta).unwrap();
        let other = psl_scl::writer_index(5, 0, 0).unwrap();
        for w in [other, meta.meta.policy.coordinator_at(0).unwrap(), psl_scl::writer_index(4, 1, 0).unwrap()] {
            assert!(keys.writer_credentials(&meta, w).is_err(), "writer {w}");
            assert!(keys.author(&meta, w).is_err(), "writer {w}");
        }
        assert!(keys.author(&meta, want[0]).is_ok());
        // Certifying its own key as another writer, with the keys it holds.
        let g = &keys.writers()[0];
        let forged = WriterCert::sign_with(
            &g.key,
            meta.name(),
            0,
            other,
            g.key.verifying_key(),
            0,
            psl_capsule::certs::OPEN_ENDED,
        );
        assert!(forged.check(meta.name(), &meta.meta.app.point()).is_err());
        assert!(psl_capsule::Author::with_certified_keys(
            &meta,
            keys.credentials(want[0]).unwrap().0,
            forged,
            keys.data_key()
        )
        .is_err());
    }

    #[test]
    fn a_kv_role_running_code_the_policy_refuses_gets_nothing() {
        let (addr, p, meta, _) = leader();
        let rogue = SimAttester::new(p.clone(), measure(&psl_crypto::sha256(&[b"rogue"]), b"config"));
        let want = node_writers(1, 0, 1);
        let e = fetch_kv_keys(addr, &rogue, &verifier(&p), KvRole::FrontEnd, 1, &want, &meta).expect_err("refused");
        assert!(matches!(e, FaasError::Attestation { .. }), "{e}");
        // Another platform's reports (forged evidence) are refused too.
        let forged = SimAttester::new(SimPlatform::new(), good());
        let coord = [meta.meta.policy.coordinator_at(0).unwrap()];
        let e =
            fetch_kv_keys(addr, &forged, &verifier(&p), KvRole::Coordinator, 0, &coord, &meta).expect_err("refused");
        assert!(matches!(e, FaasError::Attestation { .. }), "{e}");
    }

    /// At the leader itself: an offer without a challenge, under a refused measurement, or
    /// binding another TLS key than the connection's yields an error and no sealed bytes.
    #[test]
    fn the_leader_seals_nothing_to_an_unattested_kv_role() {
        let (leader, p, meta, _) = local_leader();
        let spki = [7u8; 32];
        let w1 = node_writers(1, 0, 1);
        // No challenge issued.
        let (_, offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &[1; 32], Some(spki)).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::FrontEnd, 1, &w1).is_err());
        // A refused measurement.
        let n = leader.kv_challenge(KvRole::FrontEnd, 1);
        let rogue = SimAttester::new(p.clone(), measure(&psl_crypto::sha256(&[b"rogue"]), b"config"));
        let (_, offer) = Offer::make(&rogue, 1, "t", &n, Some(spki)).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::FrontEnd, 1, &w1).is_err());
        // A report made for another TLS key than the one the leader saw.
        let n = leader.kv_challenge(KvRole::CapsuleDb, 1);
        let (_, mut offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &n, Some(spki)).unwrap();
        offer.tls_spki = Some([8; 32]);
        assert!(leader.grant_kv(&offer, KvRole::CapsuleDb, 1, &w1).is_err());
        // The nonce is used once: the honest offer after a refusal needs a new challenge.
        let (_, offer) = Offer::make(&SimAttester::new(p.clone(), good()), 1, "t", &n, Some(spki)).unwrap();
        assert!(leader.grant_kv(&offer, KvRole::CapsuleDb, 1, &w1).is_err());
        // A bundle sealed for one role, id and writer list does not open as another's.
        let w4 = node_writers(4, 0, 2);
        let (ch, sealed) = ask(&leader, &p, KvRole::FrontEnd, 4, &w4);
        let sealed = sealed.expect("attested");
        assert!(open_kv_bundle(&ch, &sealed, KvRole::CapsuleDb, 4, &w4, &meta).is_err());
        assert!(open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 5, &w4, &meta).is_err());
        assert!(open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 4, &w4[..1], &meta).is_err());
        assert!(open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 4, &[w4[1], w4[0]], &meta).is_err());
        assert!(open_kv_bundle(&ch, &sealed, KvRole::FrontEnd, 4, &w4, &meta).is_ok());
    }

    #[test]
    fn a_leader_without_kv_keys_refuses() {
        let p = SimPlatform::new();
        let leader = Leader::new(Box::new(SimAttester::new(p.clone(), good())), Box::new(verifier(&p)));
        let (_, r) = ask(&leader, &p, KvRole::FrontEnd, 1, &[]);
        assert!(r.is_err());
        // Nor does one take a KV capsule that derives writer keys: any writer key with the
        // public chain code gives back the application key.
        let owner = OwnerKey::generate();
        let derived = new_capsule_with(&owner, 3, "derived", 1, Limits::default(), WriterKeys::Derived).unwrap();
        assert!(matches!(leader.set_kv(&owner, &derived), Err(FaasError::Config(_))));
        assert!(!leader.serves_kv());
    }

    /// A malformed bundle (cut anywhere, a byte changed anywhere, another capsule's) is a typed
    /// error, never a panic.
    #[test]
    fn a_malformed_kv_bundle_is_an_error_not_a_panic() {
        let (_, meta, app) = capsule();
        let want = node_writers(4, 0, 2);
        let good = crate::kvgrant::kv_bundle(&meta, &app, &want).unwrap();
        assert!(parse_kv_bundle(&good, &want, &meta).is_ok());
        for cut in 0..good.len() {
            assert!(parse_kv_bundle(&good[..cut], &want, &meta).is_err(), "cut at {cut}");
        }
        for i in 0..good.len() {
            let mut b = good.to_vec();
            b[i] ^= 0x40;
            // Flipping a bit of a signature's or key's byte must not yield a different grant.
            if let Ok(k) = parse_kv_bundle(&b, &want, &meta) {
                panic!("byte {i} changed and the bundle still opened to {k:?}");
            }
        }
        let mut long = good.to_vec();
        long.push(0);
        assert!(parse_kv_bundle(&long, &want, &meta).is_err());
        let (_, other, _) = capsule();
        assert!(parse_kv_bundle(&good, &want, &other).is_err());
        assert!(parse_kv_bundle(&[0xff; 4096], &want, &meta).is_err());
    }
}
