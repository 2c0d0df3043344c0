//! SCL wire messages (records, repair requests, heads hints, capsule servers' acks): decoding
//! never panics, and whatever decodes re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_scl::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        assert_eq!(m.encode(), data, "decode then encode is the identity");
        if let Msg::Ack(a) = &m {
            assert!(!a.entries.is_empty() && a.entries.len() <= psl_scl::wire::ACK_ENTRIES_MAX);
        }
    }
});
