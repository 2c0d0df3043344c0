//! CapsuleDB's block and index encodings (what a db-block / db-index record's body holds):
//! decoding never panics, and a decoded v2 block (or v2 index) re-encodes to the same bytes
//! (a v1 block, without record hashes, re-encodes as v2).
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsuledb::{Block, Index};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = Block::decode(data) {
        if data.get(4) == Some(&2) {
            assert_eq!(b.encode(), data, "block v2 round trip");
        }
        assert_eq!(Block::decode(&b.encode()).as_ref(), Ok(&b), "re-encoded block decodes the same");
    }
    if let Ok(i) = Index::decode(data) {
        if data.get(4) == Some(&2) {
            assert_eq!(i.encode(), data, "index v2 round trip");
        }
    }
});
