//! CapsuleDB's block and index encodings (what a db-block / db-index record's body holds):
//! decoding never panics, and a decoded block (or v2 index) re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsuledb::{Block, Index};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = Block::decode(data) {
        assert_eq!(b.encode(), data, "block round trip");
    }
    if let Ok(i) = Index::decode(data) {
        if data.get(4) == Some(&2) {
            assert_eq!(i.encode(), data, "index v2 round trip");
        }
    }
});
