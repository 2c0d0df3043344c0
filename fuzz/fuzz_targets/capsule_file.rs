//! Capsule file scanner and audit: never panic on any bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = psl_capsule::file::scan(data);
    let a = psl_capsule::audit_file(data, None);
    if a.ok() {
        // A clean audit implies the strict parser accepts the file.
        assert!(psl_capsule::CapsuleFile::parse(data).is_ok());
    }
});
