//! Rotation certificate decoder: any bytes decode to a certificate or a typed error, never a
//! panic; a decoded certificate re-encodes to exactly its input and its signature check is
//! total (a random certificate never verifies under an unrelated capsule's owner).
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsule::RotationCert;
use std::sync::OnceLock;

fn meta() -> &'static psl_capsule::SignedMetadata {
    static M: OnceLock<psl_capsule::SignedMetadata> = OnceLock::new();
    M.get_or_init(|| {
        let owner = psl_crypto::OwnerKey::from_seed(&[1u8; 32]).expect("seed");
        psl_capsule::new_capsule(&owner, 1, "fuzz", 0, Default::default()).expect("capsule")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = RotationCert::decode(data) {
        assert_eq!(c.encode(), data);
        assert!(c.check(meta()).is_err());
    }
});
