//! Leader side of application key rotation (issue #4, item 3).
//!
//! [`rotate`] derives the next application key generation: a new *hardened* child
//! `m/app_index'` of the owner master key (so the new key reveals nothing about the retired one,
//! and the retired one nothing about it), its data key, and one writer key per writer index
//! (non-hardened grandchildren `m/app_index'/w`). It signs a [`RotationCert`] with the owner key
//! naming the new key's fingerprint and the rotation epoch.
//!
//! What the leader does with a [`Rotation`] (`Leader::prepare_rotation` and
//! `Leader::finish_rotation`; docs/protocol/faas.md §9):
//! 1. pick the rotation epoch with [`rotation_epoch`] a few epochs ahead of the coordinator's,
//!    and install the certificate (not yet the coordinator's key) in its coordinator node, which
//!    then holds its epoch clock below the rotation epoch;
//! 2. send each attested worker, sealed to its channel key, the certificate, the new data key
//!    and only its own writer keys ([`Rotation::writer_key`]); the worker installs them in its
//!    node (`psl_node::Node::install_rotation`); capsule hosts get the certificate;
//! 3. hand the coordinator its new key: it publishes the certificate in the log as a `Rotate`
//!    control record (the body of [`Rotation::control_body`]) and runs on into the new
//!    generation;
//! 4. keep the new application key in place of the retired one, which is erased.
//!
//! From the rotation epoch on, every node refuses records signed under the retired generation
//! (`retired-key`), while records of earlier epochs stay verifiable with the old public key.

use crate::error::FaasError;
use psl_capsule::certs::OPEN_ENDED;
use psl_capsule::{Body, ControlCode, KeyStatement, RotationCert, SignedMetadata, WriterCert, WriterKeys};
use psl_crypto::{AppKey, DataKey, OwnerKey, SigningKey};
use std::collections::BTreeMap;

/// Epochs between announcing a rotation and its taking effect, unless told otherwise: time for
/// every worker to receive its new keys before the first SYNC that needs them.
pub const ROTATION_MARGIN_EPOCHS: u64 = 4;

/// A derived key generation, ready to hand out. Secrets are erased on drop.
pub struct Rotation {
    /// The owner-signed rotation certificate of the new generation (public).
    pub cert: RotationCert,
    app: AppKey,
    writers: BTreeMap<u32, SigningKey>,
    /// In a capsule that certifies writers: each writer's certificate under the new generation
    /// (its hardened key, signed by the new application key).
    certs: BTreeMap<u32, WriterCert>,
}

impl std::fmt::Debug for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Rotation(key_gen={}, app_index={}, from_epoch={}, writers={})",
            self.cert.key_gen,
            self.cert.app_index,
            self.cert.from_epoch,
            self.writers.len()
        )
    }
}

impl Rotation {
    /// The new generation's application key (the leader keeps it for the job).
    pub fn app(&self) -> &AppKey {
        &self.app
    }

    /// The new application key, for the leader to keep in place of the retired one (the
    /// writer keys derived for the workers are erased).
    pub fn into_app(self) -> AppKey {
        self.app
    }

    /// The new data key.
    pub fn data_key(&self) -> DataKey {
        self.app.data_key()
    }

    /// Writer `w`'s signing key under the new generation (`None` for a writer not derived).
    pub fn writer_key(&self, w: u32) -> Option<&SigningKey> {
        self.writers.get(&w)
    }

    /// Writer `w`'s certificate under the new generation (a certified capsule).
    pub fn writer_cert(&self, w: u32) -> Option<&WriterCert> {
        self.certs.get(&w)
    }

    /// Every writer's certificate under the new generation (empty: derived writer keys).
    pub fn writer_certs(&self) -> Vec<KeyStatement> {
        self.certs.values().cloned().map(KeyStatement::Cert).collect()
    }

    /// The writer indices keys were derived for.
    pub fn writers(&self) -> impl Iterator<Item = u32> + '_ {
        self.writers.keys().copied()
    }

    /// The body of the `Rotate` control record that carries the certificate into the log.
    pub fn control_body(&self) -> Body {
        Body::Control { code: ControlCode::Rotate, payload: self.cert.encode() }
    }
}

/// The rotation epoch `margin` epochs after `current` (in the same coordinator term).
pub fn rotation_epoch(current: u64, margin: u64) -> u64 {
    let term = current >> 32;
    let counter = (current & 0xffff_ffff).saturating_add(margin.max(1)).min(0xffff_ffff);
    (term << 32) | counter
}

/// Derives key generation `key_gen` (the newest known plus one) at hardened index `app_index`
/// (never used before by this capsule), taking effect at `from_epoch`, with signing keys for
/// `writers`. `owner` must be the capsule's owner.
pub fn rotate(
    owner: &OwnerKey,
    meta: &SignedMetadata,
    key_gen: u32,
    app_index: u32,
    from_epoch: u64,
    writers: &[u32],
) -> Result<Rotation, FaasError> {
    let cert = RotationCert::issue(owner, meta, key_gen, app_index, from_epoch)
        .map_err(|e| FaasError::Config(format!("key rotation: {e}")))?;
    let app = owner.app(app_index).map_err(|e| FaasError::Config(format!("key rotation: {e}")))?;
    let mut keys = BTreeMap::new();
    let mut certs = BTreeMap::new();
    let certified = meta.meta.policy.writer_keys == WriterKeys::Certified;
    for &w in writers {
        let bad = |e: String| FaasError::Config(format!("key rotation, writer {w}: {e}"));
        let k = meta.meta.policy.writer_keys.signing_key(&app, w).map_err(|e| bad(e.to_string()))?;
        if certified {
            // Valid from the rotation epoch: before it the writer signs under the old key.
            let c = WriterCert::sign(&app, meta.name(), key_gen, w, k.verifying_key(), from_epoch, OPEN_ENDED);
            certs.insert(w, c);
        }
        keys.insert(w, k);
    }
    tracing::info!(key_gen, app_index, from_epoch, writers = writers.len(), "application key rotated");
    Ok(Rotation { cert, app, writers: keys, certs })
}

/// A fresh hardened application index: random, below 2^31, and not in `used`.
pub fn fresh_app_index(used: &[u32]) -> u32 {
    loop {
        let i = rand::random::<u32>() & 0x7fff_ffff;
        if !used.contains(&i) {
            return i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{Author, Limits, Verifier};

    #[test]
    fn rotate_derives_hardened_keys_that_verify_and_retire_the_old() {
        let owner = OwnerKey::from_seed(&[9; 32]).unwrap();
        let meta = psl_capsule::new_capsule(&owner, 3, "rot", 0, Limits::default()).unwrap();
        let w = psl_scl::writer_index(1, 0, 0).unwrap();
        let idx = fresh_app_index(&[meta.meta.app_index]);
        let from = rotation_epoch(2, ROTATION_MARGIN_EPOCHS);
        assert_eq!(from, 6);
        let r = rotate(&owner, &meta, 1, idx, from, &[w]).unwrap();
        assert_eq!(r.cert.app, owner.app(idx).unwrap().public());
        assert_ne!(r.cert.app, meta.meta.app);
        assert_eq!(r.writer_key(w).unwrap().verifying_key(), r.cert.app.writer(w).unwrap());
        assert!(matches!(r.control_body(), Body::Control { code: ControlCode::Rotate, .. }));
        // A verifier that installs it accepts new-generation records and retires the old.
        let v = Verifier::new(meta.clone(), Some(owner.app(3).unwrap().data_key()));
        assert!(v.install_rotation(&r.cert, Some(r.data_key())).unwrap());
        let mut a = Author::new(&meta, &owner.app(3).unwrap(), w).unwrap();
        a.schedule_rotation(&r.cert, r.app().writer(w).unwrap(), r.data_key()).unwrap();
        let old = a.write_ops([("k", Some("v"))]).unwrap();
        assert_eq!(old.header().key_gen, 0);
        assert!(v.verify(old).is_ok());
        a.enter_epoch(psl_capsule::Link { writer: 0, seq: 0, hash: psl_crypto::Hash256::ZERO }, from);
        let new = a.write_body(Body::Control { code: ControlCode::Rts, payload: vec![] }).unwrap();
        assert_eq!(new.header().key_gen, 1);
        assert!(v.verify(new).is_ok());
        // The owner of another capsule cannot rotate this one.
        let thief = OwnerKey::from_seed(&[10; 32]).unwrap();
        assert!(rotate(&thief, &meta, 1, idx, from, &[w]).is_err());
    }
}
