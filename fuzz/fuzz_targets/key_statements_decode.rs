//! Writer certificate and revocation decoder (a Cert record's body): any bytes decode to a
//! statement list or a typed error, never a panic; a decoded list re-encodes to exactly its
//! input, and checking its statements is total (a random statement never verifies under an
//! unrelated capsule's application key).
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsule::{KeyStatement, Revocation, WriterCert};
use std::sync::OnceLock;

fn meta() -> &'static psl_capsule::SignedMetadata {
    static M: OnceLock<psl_capsule::SignedMetadata> = OnceLock::new();
    M.get_or_init(|| {
        let owner = psl_crypto::OwnerKey::from_seed(&[1u8; 32]).expect("seed");
        psl_capsule::new_capsule_with(&owner, 1, "fuzz", 0, Default::default(), psl_capsule::WriterKeys::Certified)
            .expect("capsule")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = KeyStatement::decode_list(data) {
        assert_eq!(KeyStatement::encode_list(&list), data);
        for s in &list {
            assert!(s.check(meta().name(), &meta().meta.app.point()).is_err());
        }
    }
    if let Ok(c) = WriterCert::decode(data) {
        assert_eq!(c.encode(), data);
    }
    if let Ok(r) = Revocation::decode(data) {
        assert_eq!(r.encode(), data);
    }
});
