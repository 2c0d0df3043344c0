//! The BIP32 key tree on secp256k1:
//!
//! ```text
//! owner master (m)  ──hardened child a──▶  application key (m/a')  ──child w──▶  writer key (m/a'/w)
//! ```
//!
//! The application key is a *hardened* child, so holding the application key reveals nothing
//! about the owner key or other applications. Writer keys are *non-hardened* children, so that
//! anyone holding the application extended public key (public key + chain code) derives every
//! writer's public key, and verifies any writer's record, without a directory of keys.
//!
//! Child key derivation (CKD) follows BIP32 (HMAC-SHA512 keyed with the chain code), except that
//! where BIP32 says to skip to the next index (IL >= n or a zero key, probability below 2^-127)
//! we return an error instead of silently deriving a different index. It is
//! implemented here over zeroizing buffers rather than taken from the `bip32` crate, whose
//! private-key type does not erase the libsecp256k1 secret on drop. The `bip32` crate is the test
//! oracle: the tests check our derivations against it.

use crate::secret::{overwrite, Secret32};
use crate::sign::{public_key_of, secret_is_valid, tweak_add_in_place, SigningKey, VerifyingKey, PUBLIC_KEY_LEN};
use crate::{sha256, CryptoError, DataKey, Hash256};
use aws_lc_rs::hmac;
use std::fmt;
use zeroize::Zeroizing;

/// Non-hardened child indices are `0 ..= WRITER_INDEX_MAX`.
pub const WRITER_INDEX_MAX: u32 = (1 << 31) - 1;
const HARDENED: u32 = 1 << 31;

/// An extended private key: a secret scalar and a chain code, each in its own heap buffer
/// ([`Secret32`]) that moves with the key without being copied and is zeroed on drop.
struct XPrv {
    secret: Secret32,
    chain_code: Secret32,
}

/// Splits an HMAC-SHA512 output into `(IL, IR)`, each copied straight into a [`Secret32`], then
/// overwrites the tag itself (aws-lc-rs's `hmac::Tag` is a plain `Copy` value on the stack).
fn split_tag(tag: &mut hmac::Tag, index: u32) -> Result<(Secret32, Secret32), CryptoError> {
    let i = tag.as_ref();
    if i.len() != 64 {
        return Err(CryptoError::Derivation { index, why: "HMAC output length" });
    }
    let mut il = Secret32::zero();
    let mut ir = Secret32::zero();
    il.bytes_mut().copy_from_slice(&i[..32]);
    ir.bytes_mut().copy_from_slice(&i[32..]);
    overwrite(tag, blank_tag());
    Ok((il, ir))
}

/// A public HMAC-SHA512 tag (of nothing, under the empty key) to overwrite secret ones with.
fn blank_tag() -> hmac::Tag {
    static BLANK: std::sync::OnceLock<hmac::Tag> = std::sync::OnceLock::new();
    *BLANK.get_or_init(|| hmac::sign(&hmac::Key::new(hmac::HMAC_SHA512, &[]), &[]))
}

impl XPrv {
    fn master(seed: &[u8]) -> Result<XPrv, CryptoError> {
        let key = hmac::Key::new(hmac::HMAC_SHA512, b"Bitcoin seed");
        let mut tag = hmac::sign(&key, seed);
        let (il, ir) = split_tag(&mut tag, 0)?;
        // The master secret is IL itself; it must be a valid non-zero scalar.
        if !secret_is_valid(il.bytes()) {
            return Err(CryptoError::Derivation { index: 0, why: "master key out of range" });
        }
        Ok(XPrv { secret: il, chain_code: ir })
    }

    fn public_key(&self) -> Result<secp256k1::PublicKey, CryptoError> {
        public_key_of(self.secret.bytes())
    }

    /// BIP32 CKDpriv: `k_child = k_parent + IL mod n`, computed in the child's own buffer.
    fn child(&self, index: u32) -> Result<XPrv, CryptoError> {
        let key = hmac::Key::new(hmac::HMAC_SHA512, &self.chain_code.bytes()[..]);
        let mut data = Zeroizing::new([0u8; 37]);
        if index & HARDENED != 0 {
            data[1..33].copy_from_slice(&self.secret.bytes()[..]);
        } else {
            data[..33].copy_from_slice(&self.public_key()?.serialize());
        }
        data[33..].copy_from_slice(&index.to_be_bytes());
        let mut tag = hmac::sign(&key, &data[..]);
        let (il, ir) = split_tag(&mut tag, index)?;
        let mut secret = self.secret.clone();
        if !tweak_add_in_place(secret.bytes_mut(), il.bytes()) {
            // Either case has probability below 2^-127; tell them apart only then.
            let why = if secp256k1::Scalar::from_be_bytes(*il.bytes()).is_err() {
                "IL is not below the curve order"
            } else {
                "derived key is zero"
            };
            return Err(CryptoError::Derivation { index, why });
        }
        Ok(XPrv { secret, chain_code: ir })
    }

    fn xpub(&self) -> Result<XPub, CryptoError> {
        Ok(XPub { pk: self.public_key()?, chain_code: *self.chain_code.bytes() })
    }

    fn signing_key(&self) -> Result<SigningKey, CryptoError> {
        SigningKey::from_secret(self.secret.clone())
    }
}

/// An extended public key: a point and a chain code.
#[derive(Clone, Copy, PartialEq, Eq)]
struct XPub {
    pk: secp256k1::PublicKey,
    chain_code: [u8; 32],
}

impl XPub {
    /// BIP32 CKDpub (non-hardened children only).
    fn child(&self, index: u32) -> Result<XPub, CryptoError> {
        if index & HARDENED != 0 {
            return Err(CryptoError::WriterIndex(index));
        }
        let key = hmac::Key::new(hmac::HMAC_SHA512, &self.chain_code);
        let mut data = [0u8; 37];
        data[..33].copy_from_slice(&self.pk.serialize());
        data[33..].copy_from_slice(&index.to_be_bytes());
        let mut tag = hmac::sign(&key, &data);
        let (il, ir) = split_tag(&mut tag, index)?;
        let tweak = secp256k1::Scalar::from_be_bytes(*il.bytes())
            .map_err(|_| CryptoError::Derivation { index, why: "IL is not below the curve order" })?;
        let pk = self
            .pk
            .add_exp_tweak(&tweak)
            .map_err(|_| CryptoError::Derivation { index, why: "derived point is infinity" })?;
        Ok(XPub { pk, chain_code: *ir.bytes() })
    }

    fn to_bytes(self) -> [u8; 65] {
        let mut out = [0u8; 65];
        out[..33].copy_from_slice(&self.pk.serialize());
        out[33..].copy_from_slice(&self.chain_code);
        out
    }

    fn from_bytes(b: &[u8]) -> Result<XPub, CryptoError> {
        if b.len() != 65 {
            return Err(CryptoError::MalformedPublicKey);
        }
        let pk = secp256k1::PublicKey::from_slice(&b[..33]).map_err(|_| CryptoError::MalformedPublicKey)?;
        let mut chain_code = [0u8; 32];
        chain_code.copy_from_slice(&b[33..]);
        Ok(XPub { pk, chain_code })
    }
}

/// The owner's master key: the root of one owner's capsules. Secret; erased on drop.
pub struct OwnerKey {
    xprv: XPrv,
}

const OWNER_FILE_MAGIC: &str = "psl-owner-key-v1";
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

impl OwnerKey {
    /// A new master key from 32 bytes of OS randomness.
    pub fn generate() -> OwnerKey {
        let mut seed = Zeroizing::new([0u8; 32]);
        loop {
            rand::fill(&mut seed[..]);
            if let Ok(k) = Self::from_seed(&seed[..]) {
                return k;
            }
        }
    }

    /// The BIP32 master key of `seed` (16 to 64 bytes).
    pub fn from_seed(seed: &[u8]) -> Result<OwnerKey, CryptoError> {
        if !(16..=64).contains(&seed.len()) {
            return Err(CryptoError::KeyFile(format!("seed must be 16 to 64 bytes, got {}", seed.len())));
        }
        Ok(OwnerKey { xprv: XPrv::master(seed)? })
    }

    /// The owner's public key: what capsule metadata names as its owner.
    pub fn public(&self) -> OwnerPublicKey {
        OwnerPublicKey(VerifyingKey { pk: self.xprv.public_key().expect("valid secret by construction") })
    }

    /// Signs with the master key itself (the capsule metadata is signed this way).
    pub fn signing_key(&self) -> SigningKey {
        self.xprv.signing_key().expect("valid secret by construction")
    }

    /// The hardened application child `m/app_index'`.
    pub fn app(&self, app_index: u32) -> Result<AppKey, CryptoError> {
        if app_index > WRITER_INDEX_MAX {
            return Err(CryptoError::Derivation { index: app_index, why: "application index must be below 2^31" });
        }
        Ok(AppKey { xprv: self.xprv.child(app_index | HARDENED)?, app_index })
    }

    /// The key file's text. Holds the secret: write it with mode 0600.
    pub fn to_file_string(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(200));
        s.push_str(OWNER_FILE_MAGIC);
        s.push('\n');
        // Hex digits appended in place (no intermediate String holding the secret).
        for b in self.xprv.secret.bytes().iter().chain(self.xprv.chain_code.bytes()) {
            s.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
            s.push(char::from(HEX_DIGITS[usize::from(b & 0xf)]));
        }
        s.push('\n');
        s
    }

    /// Parses an owner key file (the text [`OwnerKey::to_file_string`] writes).
    pub fn from_file_string(text: &str) -> Result<OwnerKey, CryptoError> {
        let mut lines = text.lines();
        if lines.next().map(str::trim) != Some(OWNER_FILE_MAGIC) {
            return Err(CryptoError::KeyFile(format!("first line is not '{OWNER_FILE_MAGIC}'")));
        }
        let body = lines.next().map(str::trim).unwrap_or("");
        let mut raw = Zeroizing::new([0u8; 64]);
        hex::decode_to_slice(body, &mut raw[..])
            .map_err(|_| CryptoError::KeyFile("second line must be 128 hex digits".into()))?;
        let mut secret = Secret32::zero();
        let mut chain_code = Secret32::zero();
        secret.bytes_mut().copy_from_slice(&raw[..32]);
        chain_code.bytes_mut().copy_from_slice(&raw[32..]);
        if !secret_is_valid(secret.bytes()) {
            return Err(CryptoError::KeyFile("secret is not a valid scalar".into()));
        }
        Ok(OwnerKey { xprv: XPrv { secret, chain_code } })
    }
}

impl fmt::Debug for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerKey(pub={})", self.public())
    }
}

/// The owner's master public key (compressed point). Identifies the owner; verifies metadata.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OwnerPublicKey(pub VerifyingKey);

impl fmt::Display for OwnerPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An application key `m/a'`: derives writer signing keys and the application data key.
pub struct AppKey {
    xprv: XPrv,
    app_index: u32,
}

impl AppKey {
    /// The hardened child index of this application key under the owner's master key.
    pub fn app_index(&self) -> u32 {
        self.app_index
    }

    /// The application key's secret and chain code (64 bytes, wiped when dropped): what the
    /// FaaS leader seals to an attested KV role's channel key.
    pub fn to_secret_bytes(&self) -> Zeroizing<[u8; 64]> {
        let mut raw = Zeroizing::new([0u8; 64]);
        raw[..32].copy_from_slice(&self.xprv.secret.bytes()[..]);
        raw[32..].copy_from_slice(&self.xprv.chain_code.bytes()[..]);
        raw
    }

    /// An application key from [`AppKey::to_secret_bytes`] and its index (check its
    /// [`AppKey::public`] against the capsule's metadata).
    pub fn from_secret_bytes(raw: &[u8; 64], app_index: u32) -> Result<AppKey, CryptoError> {
        let mut secret = Secret32::zero();
        let mut chain_code = Secret32::zero();
        secret.bytes_mut().copy_from_slice(&raw[..32]);
        chain_code.bytes_mut().copy_from_slice(&raw[32..]);
        if !secret_is_valid(secret.bytes()) {
            return Err(CryptoError::KeyFile("application secret is not a valid scalar".into()));
        }
        Ok(AppKey { xprv: XPrv { secret, chain_code }, app_index })
    }

    /// The application public key: anyone holding it derives every writer's public key.
    pub fn public(&self) -> AppPublicKey {
        AppPublicKey { xpub: self.xprv.xpub().expect("valid secret by construction") }
    }

    /// The signing key of writer `w` (`m/a'/w`).
    pub fn writer(&self, w: u32) -> Result<SigningKey, CryptoError> {
        if w > WRITER_INDEX_MAX {
            return Err(CryptoError::WriterIndex(w));
        }
        self.xprv.child(w)?.signing_key()
    }

    /// The *hardened* signing key of writer `w` (`m/a'/w'`), the writer key of a capsule whose
    /// policy certifies writers. Derived from the application *secret*, so this key, even with
    /// the application extended public key, reveals nothing about the application key or any
    /// sibling writer; verifiers learn its public key only from a certificate the application key
    /// signs (`psl_capsule::WriterCert`).
    pub fn writer_hardened(&self, w: u32) -> Result<SigningKey, CryptoError> {
        if w > WRITER_INDEX_MAX {
            return Err(CryptoError::WriterIndex(w));
        }
        self.xprv.child(w | HARDENED)?.signing_key()
    }

    /// Signs with the application key itself: writer certificates and revocations, which
    /// verify under [`AppPublicKey::point`].
    pub fn signing_key(&self) -> SigningKey {
        self.xprv.signing_key().expect("valid secret by construction")
    }

    /// The symmetric key that seals record bodies, derived from the application secret with
    /// HKDF-SHA256 (so it changes whenever the application key does).
    pub fn data_key(&self) -> DataKey {
        let mut ikm = Zeroizing::new([0u8; 64]);
        ikm[..32].copy_from_slice(&self.xprv.secret.bytes()[..]);
        ikm[32..].copy_from_slice(&self.xprv.chain_code.bytes()[..]);
        DataKey::derive_from(&ikm[..], b"psl/data-key/v1")
    }
}

impl fmt::Debug for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AppKey(index={}, pub={})", self.app_index, self.public())
    }
}

/// The application's extended public key: 33-byte point and 32-byte chain code.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AppPublicKey {
    xpub: XPub,
}

impl AppPublicKey {
    /// Bytes of the encoded key: the 33-byte compressed point, then the 32-byte chain code.
    pub const LEN: usize = 65;

    /// The public key of writer `w`, derivable by anyone holding this key.
    pub fn writer(&self, w: u32) -> Result<VerifyingKey, CryptoError> {
        Ok(VerifyingKey { pk: self.xpub.child(w)?.pk })
    }

    /// The encoded key ([`AppPublicKey::LEN`] bytes).
    pub fn to_bytes(&self) -> [u8; 65] {
        self.xpub.to_bytes()
    }

    /// Decodes [`AppPublicKey::to_bytes`]; refuses a wrong length or a point not on the curve.
    pub fn from_bytes(b: &[u8]) -> Result<AppPublicKey, CryptoError> {
        Ok(AppPublicKey { xpub: XPub::from_bytes(b)? })
    }

    /// SHA-256 of the encoded key: what SYNC records carry to name the current key.
    pub fn fingerprint(&self) -> Hash256 {
        sha256(&[b"psl/app-key-fp/v1", &self.to_bytes()])
    }

    /// The application key's own point (the parent of every writer key).
    pub fn point(&self) -> VerifyingKey {
        VerifyingKey { pk: self.xpub.pk }
    }
}

impl fmt::Display for AppPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.to_bytes()))
    }
}

impl fmt::Debug for AppPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AppPublicKey({}…)", &hex::encode(&self.to_bytes()[..8]))
    }
}

// `XPrv` needs no `Drop` of its own: both `Secret32`s zero their bytes when dropped.
impl zeroize::ZeroizeOnDrop for OwnerKey {}
impl zeroize::ZeroizeOnDrop for AppKey {}

const _: () = assert!(PUBLIC_KEY_LEN == 33);

#[cfg(test)]
mod tests {
    use super::*;
    use bip32::{ChildNumber, ExtendedPrivateKey};

    type Oracle = ExtendedPrivateKey<secp256k1::SecretKey>;

    fn oracle_path(seed: &[u8], path: &[u32]) -> Oracle {
        let mut k = Oracle::new(seed).unwrap();
        for &i in path {
            k = k.derive_child(ChildNumber(i)).unwrap();
        }
        k
    }

    #[test]
    fn bip32_test_vector_1() {
        // BIP32 test vector 1: seed 000102...0f, chain m/0'/1 .
        let seed = hex::decode("000102030405060708090a0b0c0d0e0f").unwrap();
        let owner = OwnerKey::from_seed(&seed).unwrap();
        // m public key from the specification.
        assert_eq!(owner.public().to_string(), "0339a36013301597daef41fbe593a02cc513d0b55527ec2df1050e2e8ff49c85c2");
        let app = owner.app(0).unwrap();
        // m/0' public key from the specification.
        assert_eq!(
            hex::encode(&app.public().to_bytes()[..33]),
            "035a784662a4a20a65bf6aab9ae98a6c068a81c52e4b032c0fb5400c706cfccc56"
        );
        // m/0'/1 public key from the specification, by private and by public derivation.
        let want = "03501e454bf00751f24b1b489aa925215d66af2234e3891c3b21a52bedb3cd711c";
        assert_eq!(app.writer(1).unwrap().verifying_key().to_string(), want);
        assert_eq!(app.public().writer(1).unwrap().to_string(), want);
    }

    #[test]
    fn matches_bip32_crate_and_public_derivation() {
        for s in 0u8..8 {
            let seed = [s.wrapping_mul(37).wrapping_add(1); 32];
            let owner = OwnerKey::from_seed(&seed).unwrap();
            for a in [0u32, 1, 77, WRITER_INDEX_MAX] {
                let app = owner.app(a).unwrap();
                for w in [0u32, 3, 1000, WRITER_INDEX_MAX] {
                    let o = oracle_path(&seed, &[a | HARDENED, w]);
                    let vk = app.writer(w).unwrap().verifying_key();
                    assert_eq!(vk.to_bytes(), o.public_key().public_key().serialize());
                    assert_eq!(app.public().writer(w).unwrap(), vk);
                }
            }
        }
    }

    #[test]
    fn hardened_writer_index_refused() {
        let owner = OwnerKey::from_seed(&[1u8; 32]).unwrap();
        let app = owner.app(5).unwrap();
        assert!(app.writer(HARDENED).is_err());
        assert!(app.public().writer(HARDENED).is_err());
        assert!(owner.app(HARDENED).is_err());
    }

    /// BIP32's known weakness, and why certified capsules use hardened writers: from a
    /// non-hardened child's private key and the parent's extended public key, the parent's
    /// private key is `k_child - IL mod n`, where `IL` is computable from public data alone.
    /// Run against a hardened child, the same computation yields a key that is neither the
    /// application key nor able to sign for any sibling writer.
    #[test]
    fn parent_recovery_works_for_derived_writers_only() {
        let owner = OwnerKey::from_seed(&[9u8; 32]).unwrap();
        let app = owner.app(3).unwrap();
        let xpub = app.public();
        // What an attacker computes: IL from the public chain code and point, for index w.
        let recover = |leaked: &SigningKey, w: u32| -> Option<SigningKey> {
            let key = hmac::Key::new(hmac::HMAC_SHA512, &xpub.xpub.chain_code);
            let mut data = [0u8; 37];
            data[..33].copy_from_slice(&xpub.xpub.pk.serialize());
            data[33..].copy_from_slice(&w.to_be_bytes());
            let tag = hmac::sign(&key, &data);
            let mut il = [0u8; 32];
            il.copy_from_slice(&tag.as_ref()[..32]);
            let neg = secp256k1::SecretKey::from_secret_bytes(il).ok()?.negate();
            let tweak = secp256k1::Scalar::from_be_bytes(neg.to_secret_bytes()).ok()?;
            let child = secp256k1::SecretKey::from_secret_bytes(*leaked.expose_secret_bytes()).ok()?;
            SigningKey::from_bytes(&child.add_tweak(&tweak).ok()?.to_secret_bytes()).ok()
        };
        let w = 17;
        // Non-hardened: the leaked writer key yields the application key, and every sibling.
        let parent = recover(&app.writer(w).unwrap(), w).unwrap();
        assert_eq!(parent.verifying_key(), xpub.point(), "the known attack works on derived writers");
        // Hardened: whatever comes out is not the application key...
        let leaked = app.writer_hardened(w).unwrap();
        let guess = recover(&leaked, w).unwrap();
        assert_ne!(guess.verifying_key(), xpub.point());
        assert_ne!(guess.verifying_key(), app.signing_key().verifying_key());
        // ...and treating it as a parent (by public or private derivation) gives no sibling.
        let digest = crate::sha256(&[b"test message"]);
        for sib in [0u32, 16, 18, 1000] {
            let real = app.writer_hardened(sib).unwrap().verifying_key();
            let fake_parent = XPrv {
                secret: Secret32::copy_of(&guess.expose_secret_bytes()),
                chain_code: Secret32::copy_of(&xpub.xpub.chain_code),
            };
            for cand in [fake_parent.child(sib).unwrap(), fake_parent.child(sib | HARDENED).unwrap()] {
                let k = cand.signing_key().unwrap();
                assert_ne!(k.verifying_key(), real);
                assert!(real.verify(&digest, &k.sign(&digest)).is_err());
            }
            assert_ne!(leaked.verifying_key(), real, "hardened siblings differ");
        }
        assert!(app.writer_hardened(HARDENED).is_err());
    }

    #[test]
    fn key_file_round_trip_and_no_secret_in_debug() {
        let owner = OwnerKey::generate();
        let text = owner.to_file_string();
        let back = OwnerKey::from_file_string(&text).unwrap();
        assert_eq!(back.public(), owner.public());
        let secret_hex = text.lines().nth(1).unwrap()[..64].to_string();
        for dbg in [format!("{owner:?}"), format!("{:?}", owner.app(1).unwrap())] {
            assert!(!dbg.contains(&secret_hex[..16]), "{dbg}");
        }
        assert!(OwnerKey::from_file_string("nope\n00").is_err());
        assert!(OwnerKey::from_file_string("psl-owner-key-v1\nabc").is_err());
    }

    #[test]
    fn tree_keys_stay_in_place_and_erase() {
        use zeroize::Zeroize;
        let owner = OwnerKey::from_seed(&[3u8; 32]).unwrap();
        let at = owner.xprv.secret.bytes().as_ptr();
        let owners = Box::new(vec![owner]);
        assert_eq!(owners[0].xprv.secret.bytes().as_ptr(), at, "a move must not copy the master key");
        let app = owners[0].app(1).unwrap();
        let (s_at, c_at) = (app.xprv.secret.bytes().as_ptr(), app.xprv.chain_code.bytes().as_ptr());
        let mut apps = [app];
        let app = &mut apps[0];
        assert_eq!((app.xprv.secret.bytes().as_ptr(), app.xprv.chain_code.bytes().as_ptr()), (s_at, c_at));
        // What dropping an extended private key does, read while the key is alive.
        app.xprv.secret.zeroize();
        app.xprv.chain_code.zeroize();
        assert_eq!((app.xprv.secret.bytes(), app.xprv.chain_code.bytes()), (&[0u8; 32], &[0u8; 32]));
    }

    #[test]
    fn split_tag_overwrites_the_hmac_output() {
        let mut tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA512, b"chain code"), b"data");
        let want = tag.as_ref().to_vec();
        let (il, ir) = split_tag(&mut tag, 0).unwrap();
        assert_eq!((&il.bytes()[..], &ir.bytes()[..]), (&want[..32], &want[32..]));
        assert_eq!(tag.as_ref(), blank_tag().as_ref());
        assert_ne!(tag.as_ref(), &want[..]);
    }

    #[test]
    fn data_keys_differ_per_application() {
        let owner = OwnerKey::from_seed(&[2u8; 32]).unwrap();
        let a = owner.app(1).unwrap().data_key();
        let b = owner.app(2).unwrap().data_key();
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), owner.app(1).unwrap().data_key().fingerprint());
    }
}
