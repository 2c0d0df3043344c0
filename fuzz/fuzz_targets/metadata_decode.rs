//! Metadata decoder: never panics; what decodes re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsule::{Metadata, SignedMetadata};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Metadata::decode(data) {
        assert_eq!(m.encode(), data);
    }
    if let Ok(s) = SignedMetadata::decode(data) {
        assert_eq!(s.encode(), data);
    }
});
