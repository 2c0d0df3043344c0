//! Capsule servers' read protocol (`psl_server::read`): neither the request parser nor the
//! client's answer reader panics on any bytes, and the answer reader never returns more frames
//! or bigger frames than its bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_server::read::{decode_heads_entry, parse_request, read_answer, FRAME_BYTES_MAX, RANGE_RECORDS_MAX};

fuzz_target!(|data: &[u8]| {
    let _ = parse_request(&String::from_utf8_lossy(data));
    let mut r = data;
    if let Ok(Ok(frames)) = read_answer(&mut r) {
        assert!(frames.len() as u64 <= RANGE_RECORDS_MAX.max(1 << 16));
        for f in &frames {
            assert!(f.len() <= FRAME_BYTES_MAX);
            let _ = decode_heads_entry(f);
        }
    }
});
