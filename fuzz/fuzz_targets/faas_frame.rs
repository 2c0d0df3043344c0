//! The FaaS roles' frames (`u32 LE length ‖ JSON`, bounded) and sealed programs, inputs and
//! results as an untrusted scheduler could alter them: neither decoder panics on any bytes,
//! and no altered sealed blob opens.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_crypto::{DataKey, OwnerKey};
use psl_faas::net::wire;
use psl_faas::program::{JobId, Payload, SealedProgram};
use std::sync::OnceLock;

fn key() -> &'static DataKey {
    static KEY: OnceLock<DataKey> = OnceLock::new();
    KEY.get_or_init(|| OwnerKey::generate().app(1).expect("app key").data_key())
}

fuzz_target!(|data: &[u8]| {
    let _ = wire::read_msg(&mut &data[..]);
    let blob = SealedProgram { bytes: data.to_vec() };
    let job = blob.job().unwrap_or(JobId([0; 16]));
    for kind in [Payload::Program, Payload::Input, Payload::Result] {
        // Only the data key's holder can seal: fuzzed bytes never open.
        assert!(blob.open(key(), job, kind, 1 << 20).is_err());
    }
});
