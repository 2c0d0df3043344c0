//! Codec properties: round trips, and garbage (random or mutated) never panics.
use proptest::prelude::*;
use psl_capsuledb::{Block, BlockRef, Bloom, Index, Version};
use std::collections::BTreeMap;

fn block() -> impl Strategy<Value = Block> {
    proptest::collection::btree_map(
        proptest::collection::vec(any::<u8>(), 1..40),
        (
            any::<u64>(),
            any::<u32>(),
            any::<[u8; 32]>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
        ),
        0..40,
    )
    .prop_map(|m: BTreeMap<_, _>| Block {
        entries: m
            .into_iter()
            .map(|(k, (lamport, writer, record, v))| (k, (Version { lamport, writer, record }, v)))
            .collect(),
    })
}

fn index() -> impl Strategy<Value = Index> {
    (
        any::<u64>(),
        proptest::option::of(any::<[u8; 32]>()),
        proptest::collection::vec(0usize..4, 0..5),
        proptest::collection::btree_map(any::<u32>(), any::<u64>(), 0..6),
    )
        .prop_map(|(seq, prev, counts, frontier)| {
            let levels = counts
                .iter()
                .enumerate()
                .map(|(li, &n)| {
                    (0..n)
                        .map(|i| {
                            let min = format!("{li}-{i:02}a").into_bytes();
                            let max = format!("{li}-{i:02}z").into_bytes();
                            let bloom = Bloom::build(3, [min.as_slice(), max.as_slice()]);
                            BlockRef { hash: [i as u8; 32], entries: 2, min, max, bloom }
                        })
                        .collect()
                })
                .collect();
            Index { seq, prev, levels, frontier }
        })
}

proptest! {
    #[test]
    fn capsuledb_block_round_trip(b in block()) {
        let bytes = b.encode();
        prop_assert_eq!(bytes.len(), b.encoded_len());
        prop_assert_eq!(Block::decode(&bytes).unwrap(), b);
    }

    #[test]
    fn capsuledb_index_round_trip(i in index()) {
        prop_assert_eq!(Index::decode(&i.encode()).unwrap(), i);
    }

    #[test]
    fn capsuledb_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Block::decode(&bytes);
        let _ = Index::decode(&bytes);
        let mut b = b"PSLB\x01".to_vec();
        b.extend_from_slice(&bytes);
        let _ = Block::decode(&b);
        let mut i = b"PSLI\x02".to_vec();
        i.extend_from_slice(&bytes);
        let _ = Index::decode(&i);
    }

    #[test]
    fn capsuledb_mutated_encodings_never_panic(b in block(), i in index(), pos in any::<usize>(), x in 1u8..=255, cut in any::<usize>()) {
        for mut enc in [b.encode(), i.encode()] {
            let n = enc.len();
            enc[pos % n] ^= x;
            let _ = Block::decode(&enc);
            let _ = Index::decode(&enc);
            enc.truncate(cut % n);
            let _ = Block::decode(&enc);
            let _ = Index::decode(&enc);
        }
    }

    #[test]
    fn capsuledb_bloom_has_no_false_negatives(keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..30), 1..200)) {
        let bloom = Bloom::build(keys.len(), keys.iter().map(|k| k.as_slice()));
        for k in &keys {
            prop_assert!(bloom.may_contain(k));
        }
    }
}

#[test]
fn capsuledb_codec_rejects_unsorted_and_oversized() {
    let v = Version::new(1, 1);
    let unsorted = Block { entries: vec![(b"b".to_vec(), (v, None)), (b"a".to_vec(), (v, None))] };
    assert!(Block::decode(&unsorted.encode()).is_err());
    let long = Block { entries: vec![(vec![1; 251], (v, None))] };
    assert!(Block::decode(&long.encode()).is_err());
    let mut huge = b"PSLB\x01".to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Block::decode(&huge).is_err());
    let mut wrong_version = Block::default().encode();
    wrong_version[4] = 3;
    assert!(Block::decode(&wrong_version).is_err());
    // A v1 block (no record hashes) still decodes, its records unknown.
    let mut v1 = b"PSLB\x01".to_vec();
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&1u16.to_le_bytes());
    v1.push(b'k');
    v1.extend_from_slice(&7u64.to_le_bytes());
    v1.extend_from_slice(&3u32.to_le_bytes());
    v1.push(0);
    let b = Block::decode(&v1).unwrap();
    assert_eq!(b.entries, vec![(b"k".to_vec(), (Version::new(7, 3), None))]);
    assert!(!b.entries[0].1 .0.has_record());
}

#[test]
fn capsuledb_bloom_false_positive_rate_is_low() {
    let keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("key{i}").into_bytes()).collect();
    let bloom = Bloom::build(keys.len(), keys.iter().map(|k| k.as_slice()));
    let fp = (0..10_000).filter(|i| bloom.may_contain(format!("absent{i}").as_bytes())).count();
    assert!(fp < 300, "false positives: {fp}/10000");
}
