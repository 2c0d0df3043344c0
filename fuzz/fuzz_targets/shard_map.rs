//! The shard map (`psl_scl::shard`): decoding never panics, whatever decodes passes the map's
//! rules, routes every point, and encodes back to exactly its input (the encoding is
//! canonical).
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_scl::shard::ShardMap;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ShardMap::decode(data) {
        assert!(m.check().is_ok());
        assert_eq!(m.encode(), data);
        for p in [0, u64::MAX, u64::MAX / 2, data.len() as u64] {
            assert!((m.shard_of_point(p) as usize) < m.shards.len());
        }
    }
});
