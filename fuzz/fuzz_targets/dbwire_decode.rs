//! CapsuleDB's fabric messages (sealed get, signed sealed answer, signed heads) and the answer
//! body and scan body (v2: with the records that prove them): decoding never panics, and
//! whatever decodes re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_scl::dbwire::{AnswerBody, DbMsg, ScanBody};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = DbMsg::decode(data) {
        assert_eq!(m.encode(), data, "decode then encode is the identity");
    }
    if let Ok(b) = AnswerBody::decode(data) {
        assert_eq!(b.encode(), data, "answer body round trip");
        assert!(!b.entries.is_empty() && b.entries.len() <= psl_scl::dbwire::ANSWER_KEYS_MAX);
        assert!(b.entries.iter().filter_map(|e| e.found).all(|p| (p.record as usize) < b.records.len()));
    }
    if let Ok(b) = ScanBody::decode(data) {
        assert_eq!(b.encode(), data, "scan body round trip");
        assert!(b.entries.iter().all(|(_, p)| (p.record as usize) < b.records.len()));
    }
});
