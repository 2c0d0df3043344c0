//! SHA-256 digests.

use std::fmt;

/// A SHA-256 digest. Printed as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash256(pub [u8; 32]);

impl Hash256 {
    /// All zero bytes: "no hash" (a chain's first record links to it).
    pub const ZERO: Hash256 = Hash256([0; 32]);

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether this is [`Hash256::ZERO`].
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits (either case).
    pub fn from_hex(s: &str) -> Option<Hash256> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out).ok()?;
        Some(Hash256(out))
    }

    /// The first 8 hex digits, for logs and tables.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

impl fmt::Display for Hash256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash256({})", self.short())
    }
}

/// SHA-256 over the concatenation of `parts`.
pub fn sha256(parts: &[&[u8]]) -> Hash256 {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    let d = ctx.finish();
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    Hash256(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // FIPS 180-2 "abc".
        assert_eq!(sha256(&[b"a", b"bc"]).to_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn hex_round_trip() {
        let h = sha256(&[b"x"]);
        assert_eq!(Hash256::from_hex(&h.to_hex()), Some(h));
        assert_eq!(Hash256::from_hex("zz"), None);
    }
}
