//! A KV role's decoder of the leader's grant (`psl_faas::kvgrant::parse_kv_bundle`): the data
//! key and its own writers' keys and certificates, opened from the leader's sealed bytes. No
//! bytes panic it, and whatever it accepts holds exactly the writers asked for.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsule::{new_capsule_with, Limits, SignedMetadata, WriterKeys};
use psl_faas::kvgrant::parse_kv_bundle;
use std::sync::OnceLock;

fn meta() -> &'static SignedMetadata {
    static META: OnceLock<SignedMetadata> = OnceLock::new();
    META.get_or_init(|| {
        let owner = psl_crypto::OwnerKey::from_seed(&[5; 32]).expect("seed");
        new_capsule_with(&owner, 1, "fuzz kv", 0, Limits::default(), WriterKeys::Certified).expect("capsule")
    })
}

fuzz_target!(|data: &[u8]| {
    // The writer list asked for is taken from the input's first bytes (up to 17 writers).
    let n = data.first().map_or(0, |b| (*b % 18) as usize);
    let writers: Vec<u32> = (0..n as u32).map(|a| (4 << 16) | a).collect();
    if let Ok(k) = parse_kv_bundle(data, &writers, meta()) {
        assert_eq!(k.writer_indices(), writers);
    }
});
