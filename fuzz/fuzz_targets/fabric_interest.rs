//! The router's interest frame (`psl_fabric::Interest::decode_frame`, read from every
//! endpoint that connects): decoding never panics, and whatever decodes encodes back to exactly
//! its bytes and can judge any message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_fabric::Interest;

fuzz_target!(|data: &[u8]| {
    if let Some(i) = Interest::decode_frame(data) {
        assert_eq!(i.encode_frame(), data);
        let _ = i.wants_message(data);
        let _ = i.wants_message(&data[data.len() / 2..]);
    }
});
