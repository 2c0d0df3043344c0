//! Key delivery: the leader seals a worker's keys to the X25519 channel key the worker bound
//! into its attestation report, so only the attested party can open them. (In the multi-process
//! deployment this becomes a TLS channel whose certificate key is the bound key.)
//!
//! The worker keeps its channel key for the whole job (RESET drops it): a key rotation later
//! in the job is sealed to the same key, under its own associated data.

use crate::error::FaasError;
use aws_lc_rs::agreement::{self, EphemeralPrivateKey, PrivateKey, UnparsedPublicKey, X25519};
use psl_crypto::{sha256, DataKey, SALT_LEN};
use zeroize::Zeroizing;

/// A worker's one-job channel key: it opens the key bundle of the grant and of each key
/// rotation of that job. Erased on drop (RESET).
pub struct ChannelKey {
    private: PrivateKey,
    public: [u8; 32],
}

impl ChannelKey {
    /// A fresh X25519 key pair; `FaasError::Channel` if key generation fails.
    pub fn generate() -> Result<ChannelKey, FaasError> {
        let private =
            PrivateKey::generate(&X25519).map_err(|_| FaasError::Channel("X25519 key generation failed".into()))?;
        let pk = private.compute_public_key().map_err(|_| FaasError::Channel("X25519 public key".into()))?;
        let public: [u8; 32] =
            pk.as_ref().try_into().map_err(|_| FaasError::Channel("X25519 public key length".into()))?;
        Ok(ChannelKey { private, public })
    }

    /// The X25519 public key, which the worker's report binds and the leader seals to.
    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// Opens what [`seal_to`] sealed to this key.
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Result<Zeroizing<Vec<u8>>, FaasError> {
        if sealed.len() < 32 + SALT_LEN + psl_crypto::TAG_LEN {
            return Err(FaasError::Channel("sealed key bundle too short".into()));
        }
        let eph: [u8; 32] = sealed[..32].try_into().expect("32");
        let salt: [u8; SALT_LEN] = sealed[32..32 + SALT_LEN].try_into().expect("salt");
        let key = agreement::agree(
            &self.private,
            UnparsedPublicKey::new(&X25519, &eph),
            FaasError::Channel("X25519 agreement failed".into()),
            |shared| Ok(kdf(shared, &eph, &self.public)),
        )?;
        key.open(&salt, b"psl/keychan/v1", aad, &sealed[32 + SALT_LEN..])
            .map_err(|_| FaasError::Channel("key bundle does not open (altered, or sealed to another key)".into()))
    }
}

fn agree(
    private: EphemeralPrivateKey,
    peer: &[u8; 32],
    eph: &[u8; 32],
    recipient: &[u8; 32],
) -> Result<DataKey, FaasError> {
    agreement::agree_ephemeral(
        private,
        UnparsedPublicKey::new(&X25519, peer),
        FaasError::Channel("X25519 agreement failed".into()),
        |shared| Ok(kdf(shared, eph, recipient)),
    )
}

fn kdf(shared: &[u8], eph: &[u8; 32], recipient: &[u8; 32]) -> DataKey {
    let mut h = sha256(&[b"psl/keychan-key/v1", shared, eph, recipient]);
    let key = DataKey::from_bytes(&h.0);
    zeroize::Zeroize::zeroize(&mut h.0);
    key
}

/// Seals `plaintext` to `recipient` (an X25519 public key): `ephemeral public ‖ salt ‖ AES-GCM`.
pub fn seal_to(recipient: &[u8; 32], aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, FaasError> {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let private = EphemeralPrivateKey::generate(&X25519, &rng)
        .map_err(|_| FaasError::Channel("X25519 key generation failed".into()))?;
    let eph: [u8; 32] = private
        .compute_public_key()
        .map_err(|_| FaasError::Channel("X25519 public key".into()))?
        .as_ref()
        .try_into()
        .map_err(|_| FaasError::Channel("X25519 public key length".into()))?;
    let key = agree(private, recipient, &eph, recipient)?;
    let salt: [u8; SALT_LEN] = rand::random();
    let mut out = Vec::with_capacity(32 + SALT_LEN + plaintext.len() + psl_crypto::TAG_LEN);
    out.extend_from_slice(&eph);
    out.extend_from_slice(&salt);
    out.extend_from_slice(&key.seal(&salt, b"psl/keychan/v1", aad, plaintext));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_channel_key_opens() {
        let k = ChannelKey::generate().unwrap();
        let s = seal_to(&k.public(), b"aad", b"secret").unwrap();
        assert_eq!(&k.open(&s, b"aad").unwrap()[..], b"secret");
        let k2 = ChannelKey::generate().unwrap();
        assert!(k2.open(&s, b"aad").is_err());
        let k3 = ChannelKey::generate().unwrap();
        let s3 = seal_to(&k3.public(), b"aad", b"secret").unwrap();
        let mut t = s3.clone();
        t[40] ^= 1;
        assert!(k3.open(&t, b"aad").is_err());
    }
}
