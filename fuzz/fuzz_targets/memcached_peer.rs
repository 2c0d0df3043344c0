//! SecureCached's peer channel (forwarded conditional commands and their outcomes) and the item
//! layout stored as KV values: decoding never panics, and whatever decodes re-encodes to bytes
//! that decode to the same thing.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_memcached::{item, peer};

fuzz_target!(|data: &[u8]| {
    if let Ok((key, op)) = peer::decode_request(data) {
        let mut again = Vec::new();
        peer::encode_request(key, &op, &mut again);
        let (k2, op2) = peer::decode_request(&again).expect("a re-encoded request decodes");
        assert_eq!(key, k2);
        assert_eq!(format!("{op:?}"), format!("{op2:?}"));
    }
    if let Ok(o) = peer::decode_outcome(data) {
        let mut again = Vec::new();
        peer::encode_outcome(&o, &mut again);
        assert_eq!(peer::decode_outcome(&again).expect("a re-encoded outcome decodes"), o);
    }
    let _ = item::decode(data);
});
