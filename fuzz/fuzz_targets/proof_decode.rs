//! Membership proof decoder and checker: never panic on any bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = psl_capsule::MembershipProof::decode(data) {
        let _ = p.verify(None);
        assert_eq!(p.encode(), data);
    }
});
