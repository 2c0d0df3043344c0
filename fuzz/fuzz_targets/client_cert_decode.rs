//! Client certificate decoder (the HTTPS API's `psl-credential` header): any bytes decode to a
//! certificate or a typed error, never a panic; a decoded certificate re-encodes to exactly its
//! input, and its check is total (a random certificate never verifies under an unrelated owner).
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsule::{ClientCert, Permissions};
use std::sync::OnceLock;

fn owner() -> &'static psl_crypto::OwnerPublicKey {
    static O: OnceLock<psl_crypto::OwnerPublicKey> = OnceLock::new();
    O.get_or_init(|| psl_crypto::OwnerKey::from_seed(&[1u8; 32]).expect("seed").public())
}

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ClientCert::decode(data) {
        assert_eq!(c.encode(), data);
        assert!(c.check(c.capsule, owner(), 0, Permissions::READ).is_err());
    }
});
