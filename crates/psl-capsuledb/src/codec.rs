//! Block and index encodings: versioned, bounded, and total (garbage yields an error, never a
//! panic or an unbounded allocation).
//!
//! Block v2: `"PSLB" 02 | count u32 | count × (klen u16, key, lamport u64, writer u32,
//! record 32, tag u8 (0 = tombstone, 1 = value), [vlen u32, value])`, keys strictly increasing;
//! `record` is the hash of the data record that wrote the entry (all zero: unknown), which the
//! role carries in its answers as their proof. Version 1 (no record hash) still decodes, with
//! unknown records.
//!
//! Index v2: `"PSLI" 02 | seq u64 | has_prev u8 [prev 32] | levels u8 | per level: n u32 |
//! per block: hash 32, entries u32, min (klen u16, key), max (klen u16, key), bloom k u8,
//! bloom len u32, bloom bytes | frontier: n u32 | n × (writer u32, lamport u64)` (writers
//! strictly increasing). Level 0 is newest first and may overlap; deeper levels are sorted
//! and non-overlapping. The frontier says, per writer, the highest Lamport time up to which
//! every write of that writer is in the index's blocks. Version 1 (no frontier) still decodes.
//! All integers are little-endian.

use crate::bloom::Bloom;
use crate::{Cell, RecordHash, Version};

/// Longest key, in bytes (keys are at least 1 byte).
pub const KEY_BYTES_MAX: usize = 250;
/// Longest value, in bytes (1 MiB).
pub const VALUE_BYTES_MAX: usize = 1 << 20;
/// Most entries in one block.
pub const BLOCK_ENTRIES_MAX: usize = 1 << 16;
/// Soft bound on an encoded block's payload (well under a record's 8 MiB default limit).
pub const BLOCK_BYTES_MAX: usize = 4 << 20;
/// Most levels in an index (level 0 included).
pub const LEVELS_MAX: usize = 32;
/// Most blocks in one level of an index.
pub const BLOCKS_PER_LEVEL_MAX: usize = 1 << 20;
const BLOCK_MAGIC: &[u8; 4] = b"PSLB";
const INDEX_MAGIC: &[u8; 4] = b"PSLI";
const FORMAT_V1: u8 = 1;
const BLOCK_V2: u8 = 2;
const INDEX_V2: u8 = 2;
/// Most writers in an index's frontier.
pub const FRONTIER_WRITERS_MAX: usize = 1 << 16;

/// Why bytes are not a valid block or index (or a block breaks the format's rules).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The bytes end inside the named field.
    #[error("truncated at {0}")]
    Truncated(&'static str),
    /// The bytes do not start with the block's (`PSLB`) or index's (`PSLI`) magic.
    #[error("bad magic")]
    Magic,
    /// The format version byte is neither 1 nor 2.
    #[error("unsupported format version {0}")]
    Version(u8),
    /// A count or length is over its format limit.
    #[error("{field}: {len} over the limit {max}")]
    Limit {
        /// The field that is too large.
        field: &'static str,
        /// Its value.
        len: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// A field holds a value the format forbids (the message names the rule).
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// Bytes follow the end of the encoding.
    #[error("trailing bytes")]
    Trailing,
}

/// An immutable sorted run of entries (unique keys, strictly increasing).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Block {
    /// `(key, cell)` pairs, keys strictly increasing.
    pub entries: Vec<(Vec<u8>, Cell)>,
}

/// What an index knows about one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    /// Hash of the `db-block` record holding the block.
    pub hash: RecordHash,
    /// Number of entries in the block (1 to [`BLOCK_ENTRIES_MAX`]).
    pub entries: u32,
    /// The block's smallest key.
    pub min: Vec<u8>,
    /// The block's largest key.
    pub max: Vec<u8>,
    /// Filter over the block's keys.
    pub bloom: Bloom,
}

/// A snapshot of the tree's on-store part: level 0 newest first, then sorted levels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Index {
    /// Sequence number of the index, one more than the previous index's.
    pub seq: u64,
    /// Hash of the previous index record (`None` for the first).
    pub prev: Option<RecordHash>,
    /// The levels' blocks: level 0 newest first (may overlap), deeper levels sorted and disjoint.
    pub levels: Vec<Vec<BlockRef>>,
    /// Per writer: every write up to this Lamport time is in the blocks (see the module docs).
    pub frontier: std::collections::BTreeMap<u32, u64>,
}

impl Block {
    /// The cell for `key`, if the block holds it (binary search).
    pub fn get(&self, key: &[u8]) -> Option<&Cell> {
        self.entries.binary_search_by(|(k, _)| k.as_slice().cmp(key)).ok().map(|i| &self.entries[i].1)
    }

    /// Length in bytes of [`Block::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        9 + self.entries.iter().map(|(k, (_, v))| entry_len(k, v)).sum::<usize>()
    }

    /// Checks the format's rules on the value (what [`Block::decode`] enforces on bytes): at
    /// most [`BLOCK_ENTRIES_MAX`] entries, keys of 1 to [`KEY_BYTES_MAX`] bytes, strictly
    /// increasing, values of at most [`VALUE_BYTES_MAX`] bytes. A writer asserts it before a
    /// block leaves for a store.
    pub fn check_format(&self) -> Result<(), CodecError> {
        limit("entry count", self.entries.len(), BLOCK_ENTRIES_MAX)?;
        let mut last: Option<&[u8]> = None;
        for (k, (_, v)) in &self.entries {
            if k.is_empty() {
                return Err(CodecError::Invalid("empty key"));
            }
            limit("key", k.len(), KEY_BYTES_MAX)?;
            if let Some(v) = v {
                limit("value", v.len(), VALUE_BYTES_MAX)?;
            }
            if last.is_some_and(|l| l >= k.as_slice()) {
                return Err(CodecError::Invalid("key order (keys must strictly increase)"));
            }
            last = Some(k);
        }
        Ok(())
    }

    /// Encodes the block. Lengths that the format's fields cannot represent are a bug of the
    /// caller (they would misframe every later byte) and panic; a block that breaks the
    /// format's other rules still encodes (tests feed such bytes to [`Block::decode`]): see
    /// [`Block::check_format`].
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.entries.len() <= u32::MAX as usize, "block entry count does not fit its u32 field");
        let mut b = Vec::with_capacity(self.encoded_len());
        b.extend_from_slice(BLOCK_MAGIC);
        b.push(BLOCK_V2);
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (k, (ver, v)) in &self.entries {
            assert!(k.len() <= u16::MAX as usize, "block key length does not fit its u16 field");
            b.extend_from_slice(&(k.len() as u16).to_le_bytes());
            b.extend_from_slice(k);
            b.extend_from_slice(&ver.lamport.to_le_bytes());
            b.extend_from_slice(&ver.writer.to_le_bytes());
            b.extend_from_slice(&ver.record);
            match v {
                None => b.push(0),
                Some(v) => {
                    assert!(v.len() <= u32::MAX as usize, "block value length does not fit its u32 field");
                    b.push(1);
                    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    b.extend_from_slice(v);
                }
            }
        }
        debug_assert_eq!(b.len(), self.encoded_len(), "block encoding length");
        debug_assert!(
            self.check_format().is_err() || Block::decode(&b).as_ref() == Ok(self),
            "a well-formed block must decode to itself"
        );
        b
    }

    /// Decodes a block (format 1 or 2), checking every limit and the key order.
    pub fn decode(bytes: &[u8]) -> Result<Block, CodecError> {
        let mut r = Reader(bytes);
        if r.take(4, "magic")? != BLOCK_MAGIC {
            return Err(CodecError::Magic);
        }
        let format = r.u8("format")?;
        if format != FORMAT_V1 && format != BLOCK_V2 {
            return Err(CodecError::Version(format));
        }
        let n = r.u32("count")? as usize;
        limit("entry count", n, BLOCK_ENTRIES_MAX)?;
        // Every entry takes at least 16 bytes: bound the allocation by the input too.
        let mut entries = Vec::with_capacity(n.min(bytes.len() / 16));
        for _ in 0..n {
            let k = r.key()?;
            let lamport = r.u64("lamport")?;
            let writer = r.u32("writer")?;
            let mut record = [0u8; 32];
            if format == BLOCK_V2 {
                record.copy_from_slice(r.take(32, "record hash")?);
            }
            let v = match r.u8("tag")? {
                0 => None,
                1 => {
                    let len = r.u32("value length")? as usize;
                    limit("value", len, VALUE_BYTES_MAX)?;
                    Some(r.take(len, "value")?.to_vec())
                }
                _ => return Err(CodecError::Invalid("entry tag")),
            };
            if entries.last().is_some_and(|(last, _): &(Vec<u8>, Cell)| last.as_slice() >= k) {
                return Err(CodecError::Invalid("key order (keys must strictly increase)"));
            }
            entries.push((k.to_vec(), (Version { lamport, writer, record }, v)));
        }
        r.end()?;
        Ok(Block { entries })
    }
}

pub(crate) fn entry_len(k: &[u8], v: &Option<Vec<u8>>) -> usize {
    2 + k.len() + 13 + 32 + v.as_ref().map_or(0, |v| 4 + v.len())
}

impl BlockRef {
    /// Whether `key` lies within the block's `[min, max]` key range.
    pub fn overlaps_key(&self, key: &[u8]) -> bool {
        self.min.as_slice() <= key && key <= self.max.as_slice()
    }
}

impl Index {
    /// Encodes the index. Counts over what [`Index::decode`] accepts panic (the level count's
    /// u8 field would even wrap): the tree never builds such an index. In debug builds the
    /// bytes are decoded again and must give back the same index, so an index the tree could
    /// not reopen never reaches a store.
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.levels.len() <= LEVELS_MAX, "index level count over LEVELS_MAX");
        assert!(self.frontier.len() <= FRONTIER_WRITERS_MAX, "index frontier over FRONTIER_WRITERS_MAX");
        let mut b = Vec::new();
        b.extend_from_slice(INDEX_MAGIC);
        b.push(INDEX_V2);
        b.extend_from_slice(&self.seq.to_le_bytes());
        match &self.prev {
            None => b.push(0),
            Some(h) => {
                b.push(1);
                b.extend_from_slice(h);
            }
        }
        b.push(self.levels.len() as u8);
        for level in &self.levels {
            assert!(level.len() <= BLOCKS_PER_LEVEL_MAX, "index level over BLOCKS_PER_LEVEL_MAX blocks");
            b.extend_from_slice(&(level.len() as u32).to_le_bytes());
            for r in level {
                assert!(r.min.len() <= u16::MAX as usize && r.max.len() <= u16::MAX as usize, "index key length");
                b.extend_from_slice(&r.hash);
                b.extend_from_slice(&r.entries.to_le_bytes());
                for k in [&r.min, &r.max] {
                    b.extend_from_slice(&(k.len() as u16).to_le_bytes());
                    b.extend_from_slice(k);
                }
                b.push(r.bloom.k);
                b.extend_from_slice(&(r.bloom.bits.len() as u32).to_le_bytes());
                b.extend_from_slice(&r.bloom.bits);
            }
        }
        b.extend_from_slice(&(self.frontier.len() as u32).to_le_bytes());
        for (w, l) in &self.frontier {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&l.to_le_bytes());
        }
        debug_assert!(Index::decode(&b).as_ref() == Ok(self), "an encoded index must decode to itself");
        b
    }

    /// Decodes an index (format 1 or 2), checking every limit, each block's key range and
    /// filter, and the order of deeper levels and of the frontier.
    pub fn decode(bytes: &[u8]) -> Result<Index, CodecError> {
        let mut r = Reader(bytes);
        if r.take(4, "magic")? != INDEX_MAGIC {
            return Err(CodecError::Magic);
        }
        let v = r.u8("format")?;
        if v != FORMAT_V1 && v != INDEX_V2 {
            return Err(CodecError::Version(v));
        }
        let seq = r.u64("seq")?;
        let prev = match r.u8("has prev")? {
            0 => None,
            1 => {
                let mut h = [0u8; 32];
                h.copy_from_slice(r.take(32, "prev")?);
                Some(h)
            }
            _ => return Err(CodecError::Invalid("prev flag")),
        };
        let nl = r.u8("level count")? as usize;
        limit("level count", nl, LEVELS_MAX)?;
        let mut levels = Vec::with_capacity(nl);
        for li in 0..nl {
            let n = r.u32("block count")? as usize;
            limit("block count", n, BLOCKS_PER_LEVEL_MAX)?;
            let mut level: Vec<BlockRef> = Vec::with_capacity(n.min(bytes.len() / 48));
            for _ in 0..n {
                let mut hash = [0u8; 32];
                hash.copy_from_slice(r.take(32, "block hash")?);
                let entries = r.u32("entries")?;
                if entries == 0 || entries as usize > BLOCK_ENTRIES_MAX {
                    return Err(CodecError::Invalid("block entry count"));
                }
                let min = r.key()?.to_vec();
                let max = r.key()?.to_vec();
                if min > max {
                    return Err(CodecError::Invalid("block key range"));
                }
                let k = r.u8("bloom probes")?;
                let len = r.u32("bloom length")? as usize;
                limit("bloom", len, crate::bloom::BLOOM_BYTES_MAX)?;
                let bits = r.take(len, "bloom")?.to_vec();
                let bloom = Bloom::from_parts(k, bits).ok_or(CodecError::Invalid("bloom shape"))?;
                if li > 0 && level.last().is_some_and(|p| p.max >= min) {
                    return Err(CodecError::Invalid("level blocks overlap or are out of order"));
                }
                level.push(BlockRef { hash, entries, min, max, bloom });
            }
            levels.push(level);
        }
        let mut frontier = std::collections::BTreeMap::new();
        if v == INDEX_V2 {
            let n = r.u32("frontier count")? as usize;
            limit("frontier count", n, FRONTIER_WRITERS_MAX)?;
            for _ in 0..n {
                let w = r.u32("frontier writer")?;
                let l = r.u64("frontier lamport")?;
                if frontier.last_key_value().is_some_and(|(p, _)| *p >= w) {
                    return Err(CodecError::Invalid("frontier writers must strictly increase"));
                }
                frontier.insert(w, l);
            }
        }
        r.end()?;
        Ok(Index { seq, prev, levels, frontier })
    }
}

fn limit(field: &'static str, len: usize, max: usize) -> Result<(), CodecError> {
    if len > max {
        return Err(CodecError::Limit { field, len: len as u64, max: max as u64 });
    }
    Ok(())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CodecError> {
        if self.0.len() < n {
            return Err(CodecError::Truncated(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, CodecError> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(w))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, CodecError> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(w))
    }
    fn key(&mut self) -> Result<&'a [u8], CodecError> {
        let mut w = [0u8; 2];
        w.copy_from_slice(self.take(2, "key length")?);
        let len = u16::from_le_bytes(w) as usize;
        if len == 0 {
            return Err(CodecError::Invalid("empty key"));
        }
        limit("key", len, KEY_BYTES_MAX)?;
        self.take(len, "key")
    }
    fn end(&self) -> Result<(), CodecError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Trailing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(v: Option<&[u8]>) -> Cell {
        (Version::new(1, 1), v.map(<[u8]>::to_vec))
    }

    #[test]
    fn check_format_names_each_rule_decode_enforces() {
        let ok = Block { entries: vec![(b"a".to_vec(), cell(Some(b"x"))), (b"b".to_vec(), cell(None))] };
        assert_eq!(ok.check_format(), Ok(()));
        assert_eq!(Block::decode(&ok.encode()).as_ref(), Ok(&ok));
        let cases = [
            (vec![(b"b".to_vec(), cell(None)), (b"a".to_vec(), cell(None))], "order"),
            (vec![(b"a".to_vec(), cell(None)), (b"a".to_vec(), cell(None))], "order"),
            (vec![(Vec::new(), cell(None))], "empty key"),
            (vec![(vec![1; KEY_BYTES_MAX + 1], cell(None))], "key"),
            (vec![(b"a".to_vec(), cell(Some(&vec![0; VALUE_BYTES_MAX + 1])))], "value"),
        ];
        for (entries, what) in cases {
            let b = Block { entries };
            let e = b.check_format().unwrap_err();
            assert!(e.to_string().contains(what), "{what}: {e}");
            // The same rule holds on the bytes: encode (unchecked) then decode refuses.
            assert!(Block::decode(&b.encode()).is_err(), "{what}");
        }
    }

    #[test]
    #[should_panic(expected = "u16 field")]
    fn a_block_key_its_length_field_cannot_hold_is_a_bug() {
        let _ = Block { entries: vec![(vec![1; u16::MAX as usize + 1], cell(None))] }.encode();
    }

    #[test]
    #[should_panic(expected = "LEVELS_MAX")]
    fn an_index_with_more_levels_than_decode_accepts_is_a_bug() {
        let _ = Index { levels: vec![Vec::new(); LEVELS_MAX + 1], ..Index::default() }.encode();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "decode to itself")]
    fn an_index_decode_would_refuse_is_caught_before_it_leaves() {
        let r = |min: &[u8], max: &[u8]| BlockRef {
            hash: [0; 32],
            entries: 1,
            min: min.to_vec(),
            max: max.to_vec(),
            bloom: Bloom::build(1, [min]),
        };
        // Level 1 must be sorted and non-overlapping.
        let _ = Index { levels: vec![Vec::new(), vec![r(b"m", b"z"), r(b"a", b"c")]], ..Index::default() }.encode();
    }
}
