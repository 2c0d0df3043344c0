//! The store's index checkpoint decoder: any bytes decode to a checkpoint or to nothing, never
//! a panic, and a decoded checkpoint re-encodes to exactly its input.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(again) = psl_store::index::checkpoint_roundtrip(data) {
        assert_eq!(again, data);
    }
});
