//! Record decoder: any bytes decode to a record or a typed error, never a panic; a decoded
//! record re-encodes to exactly its input, and its body decoder is bounded too.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsule::{Body, Header, Kind, Limits, Record};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { record_bytes_max: 1 << 20, ..Limits::default() };
    if let Ok(r) = Record::decode(data, &limits) {
        assert_eq!(r.bytes(), data);
        let h = Header::decode(r.header_bytes(), &limits).expect("a decoded record's header decodes alone");
        assert_eq!(&h, r.header());
        assert_eq!(r.hash(), Record::decode(r.bytes(), &limits).unwrap().hash());
    }
    for kind in [Kind::Data, Kind::Sync, Kind::Control, Kind::DbBlock, Kind::DbIndex] {
        if let Ok(b) = Body::decode(kind, data, &limits) {
            if kind != Kind::DbBlock && kind != Kind::DbIndex {
                assert_eq!(Body::decode(kind, &b.encode(), &limits).as_ref(), Ok(&b));
            }
        }
    }
});
