//! The coordinator's own-chain log (`psl_node::chainlog`): any file contents parse into frames
//! or a typed error, never a panic; the frames lie inside the input, in order, and cover it
//! except for a torn last frame.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = psl_node::chainlog::parse(data) {
        let covered: usize = p.frames.iter().map(|f| 4 + f.len()).sum();
        assert_eq!(covered + p.torn_tail_bytes, data.len());
        assert!(p.frames.iter().all(|f| !f.is_empty() && f.len() <= psl_node::chainlog::FRAME_BYTES_MAX));
    }
});
