//! The pure LSM core: a memtable, level 0 (newest first, blocks may overlap) and sorted levels
//! of non-overlapping blocks. It does no I/O itself: blocks are loaded and saved through
//! [`Blocks`], which the record-backed [`crate::CapsuleDb`] implements (and tests may fake).

use crate::bloom::Bloom;
use crate::codec::{
    entry_len, Block, BlockRef, Index, BLOCK_BYTES_MAX, BLOCK_ENTRIES_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};
use crate::{Cell, Error, RecordHash, Version};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Sizes of the tree. Level `i >= 1` holds up to `fanout^i * l0_blocks_max * memtable_entries_max`
/// entries: each level `fanout` times the one above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The memtable freezes into a block when it holds more entries than this.
    pub memtable_entries_max: usize,
    /// Level 0 is merged into level 1 when it holds more blocks than this.
    pub l0_blocks_max: usize,
    /// Size ratio between consecutive levels.
    pub fanout: usize,
    /// Compaction output (levels 1 and deeper) is split into blocks of at most this many
    /// entries; a point read fetches one such block per level. Level-0 blocks are whole
    /// memtables.
    pub block_entries_max: usize,
    /// Decoded blocks kept in the LRU cache.
    pub cache_blocks_max: usize,
    /// Drop tombstones when compacting into the last level. Only safe when every key's writes
    /// reach the tree in version order (one writer, or an ordered replay): with SCL's
    /// independent writers a late put older than a dropped tombstone would come back to life,
    /// so the role keeps them (`false`, the default).
    pub drop_tombstones: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            memtable_entries_max: 4096,
            l0_blocks_max: 4,
            fanout: 10,
            block_entries_max: 256,
            cache_blocks_max: 1024,
            drop_tombstones: false,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), Error> {
        if self.memtable_entries_max == 0
            || self.l0_blocks_max == 0
            || self.fanout < 2
            || self.block_entries_max == 0
            || self.block_entries_max > BLOCK_ENTRIES_MAX
            || self.memtable_entries_max >= BLOCK_ENTRIES_MAX
        {
            return Err(Error::Invalid("config: sizes must be positive, fanout >= 2, blocks <= 65536 entries"));
        }
        Ok(())
    }

    /// Entry capacity of level `level >= 1`.
    pub fn level_capacity(&self, level: usize) -> usize {
        let mut cap = self.l0_blocks_max.saturating_mul(self.memtable_entries_max);
        for _ in 0..level {
            cap = cap.saturating_mul(self.fanout);
        }
        cap
    }
}

/// Where blocks live. `load` must return the block the reference names (verified);
/// `save` stores a block and returns the hash of the record holding it.
pub trait Blocks {
    fn load(&mut self, r: &BlockRef) -> Result<Arc<Block>, Error>;
    fn save(&mut self, b: &Block) -> Result<RecordHash, Error>;
}

/// The mutable tree: memtable plus the current index.
#[derive(Debug, Clone)]
pub struct Tree {
    config: Config,
    memtable: BTreeMap<Vec<u8>, Cell>,
    /// Highest Lamport time applied per writer since the last freeze (joins the index's
    /// frontier when the memtable becomes a block).
    pending_frontier: BTreeMap<u32, u64>,
    index: Index,
}

/// Checks a key and value against the codec limits.
pub fn check_kv(key: &[u8], value: Option<&[u8]>) -> Result<(), Error> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(Error::Invalid("key must be 1..=250 bytes"));
    }
    if value.is_some_and(|v| v.len() > VALUE_BYTES_MAX) {
        return Err(Error::Invalid("value over 1 MiB"));
    }
    Ok(())
}

impl Tree {
    pub fn new(config: Config) -> Result<Tree, Error> {
        Self::with_index(config, Index::default())
    }

    pub fn with_index(config: Config, index: Index) -> Result<Tree, Error> {
        config.validate()?;
        Ok(Tree { config, memtable: BTreeMap::new(), pending_frontier: BTreeMap::new(), index })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Highest Lamport time per writer whose every write (in the writer's own order) is in a
    /// stored block: what the index covers, not counting the memtable.
    pub fn frontier(&self) -> &BTreeMap<u32, u64> {
        &self.index.frontier
    }

    pub fn memtable_len(&self) -> usize {
        self.memtable.len()
    }

    /// Applies a put (`Some`) or delete (`None`) at `version`. An older version than the one
    /// the memtable holds for the key is ignored. Writes of one key may arrive in any version
    /// order (SCL delivers writers independently): reads and compactions both keep the
    /// highest `(lamport, writer)` wherever it sits. Returns `true` when the index changed (a
    /// freeze, maybe followed by compactions), so the caller must persist the new index.
    pub fn apply(
        &mut self,
        blocks: &mut dyn Blocks,
        key: &[u8],
        version: Version,
        value: Option<Vec<u8>>,
    ) -> Result<bool, Error> {
        check_kv(key, value.as_deref())?;
        let f = self.pending_frontier.entry(version.writer).or_insert(0);
        *f = (*f).max(version.lamport);
        match self.memtable.get(key) {
            Some((v, _)) if *v > version => {}
            _ => {
                self.memtable.insert(key.to_vec(), (version, value));
            }
        }
        if self.memtable.len() > self.config.memtable_entries_max {
            self.flush(blocks)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Freezes the memtable into level 0 (if non-empty) and compacts as needed. Returns
    /// `true` when the index changed.
    pub fn flush(&mut self, blocks: &mut dyn Blocks) -> Result<bool, Error> {
        if self.memtable.is_empty() {
            return Ok(false);
        }
        for (w, l) in std::mem::take(&mut self.pending_frontier) {
            let f = self.index.frontier.entry(w).or_insert(0);
            *f = (*f).max(l);
        }
        let entries: Vec<(Vec<u8>, Cell)> = std::mem::take(&mut self.memtable).into_iter().collect();
        // The whole memtable becomes one level-0 block (split only at the codec's byte bound):
        // level 0 counts flushes. `block_entries_max` sizes the blocks compaction writes, which
        // point reads fetch one at a time.
        let refs = write_run(blocks, entries, BLOCK_ENTRIES_MAX)?;
        if self.index.levels.is_empty() {
            self.index.levels.push(Vec::new());
        }
        for r in refs.into_iter().rev() {
            self.index.levels[0].insert(0, r);
        }
        self.compact(blocks)?;
        self.index.seq += 1;
        Ok(true)
    }

    fn compact(&mut self, blocks: &mut dyn Blocks) -> Result<(), Error> {
        let mut level = 0;
        while level < self.index.levels.len() {
            let full = if level == 0 {
                self.index.levels[0].len() > self.config.l0_blocks_max
            } else {
                let n: usize = self.index.levels[level].iter().map(|r| r.entries as usize).sum();
                n > self.config.level_capacity(level)
            };
            if full {
                self.merge_down(blocks, level)?;
            }
            level += 1;
        }
        Ok(())
    }

    /// Merges every block of `level` with `level + 1` into a new `level + 1`.
    fn merge_down(&mut self, blocks: &mut dyn Blocks, level: usize) -> Result<(), Error> {
        let target = level + 1;
        if self.index.levels.len() <= target {
            self.index.levels.push(Vec::new());
        }
        let last = self.config.drop_tombstones && self.index.levels[target + 1..].iter().all(|l| l.is_empty());
        let mut merged: BTreeMap<Vec<u8>, Cell> = BTreeMap::new();
        // Sources newest first: on equal versions the newer source wins.
        let sources: Vec<BlockRef> =
            self.index.levels[level].iter().chain(self.index.levels[target].iter()).cloned().collect();
        for r in &sources {
            let b = blocks.load(r)?;
            for (k, cell) in &b.entries {
                match merged.get(k) {
                    Some((v, _)) if *v >= cell.0 => {}
                    _ => {
                        merged.insert(k.clone(), cell.clone());
                    }
                }
            }
        }
        let entries: Vec<(Vec<u8>, Cell)> = merged.into_iter().filter(|(_, (_, v))| !last || v.is_some()).collect();
        let refs = write_run(blocks, entries, self.config.block_entries_max)?;
        self.index.levels[level].clear();
        self.index.levels[target] = refs;
        Ok(())
    }

    /// Reads `key`: the newest version held by the memtable or the index.
    pub fn get(&self, blocks: &mut dyn Blocks, key: &[u8]) -> Result<Option<Cell>, Error> {
        let mem = self.memtable.get(key).cloned();
        Ok(newest(mem, get_in_index(&self.index, blocks, key)?))
    }
}

/// The newer of two cells by `(lamport, writer)`; on a tie the first.
fn newest(a: Option<Cell>, b: Option<Cell>) -> Option<Cell> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Reads `key` as of `index`: the newest version among every overlapping L0 block and the one
/// block per deeper level found by binary search on key ranges (the Bloom filter is asked
/// before a fetch). Every place is looked at: a write delivered late may sit in an older
/// block than an earlier-delivered write of a lower version, so the first hit is not enough.
pub fn get_in_index(index: &Index, blocks: &mut dyn Blocks, key: &[u8]) -> Result<Option<Cell>, Error> {
    let mut best: Option<Cell> = None;
    for (li, level) in index.levels.iter().enumerate() {
        let candidates: Vec<&BlockRef> = if li == 0 {
            level.iter().filter(|r| r.overlaps_key(key)).collect()
        } else {
            let i = level.partition_point(|r| r.max.as_slice() < key);
            level.get(i).filter(|r| r.overlaps_key(key)).into_iter().collect()
        };
        for r in candidates {
            if !r.bloom.may_contain(key) {
                continue;
            }
            if let Some(c) = blocks.load(r)?.get(key) {
                best = newest(best, Some(c.clone()));
            }
        }
    }
    Ok(best)
}

/// Splits sorted entries into blocks (by entry count and encoded size), saves them, and
/// returns their references in key order.
fn write_run(blocks: &mut dyn Blocks, entries: Vec<(Vec<u8>, Cell)>, per_block: usize) -> Result<Vec<BlockRef>, Error> {
    let mut refs = Vec::new();
    let mut cur = Block::default();
    let mut bytes = 0;
    for (k, c) in entries {
        let len = entry_len(&k, &c.1);
        if !cur.entries.is_empty() && (cur.entries.len() >= per_block || bytes + len > BLOCK_BYTES_MAX) {
            refs.push(save(blocks, std::mem::take(&mut cur))?);
            bytes = 0;
        }
        bytes += len;
        cur.entries.push((k, c));
    }
    if !cur.entries.is_empty() {
        refs.push(save(blocks, cur)?);
    }
    Ok(refs)
}

fn save(blocks: &mut dyn Blocks, b: Block) -> Result<BlockRef, Error> {
    let hash = blocks.save(&b)?;
    let bloom = Bloom::build(b.entries.len(), b.entries.iter().map(|(k, _)| k.as_slice()));
    let min = b.entries.first().map(|e| e.0.clone()).unwrap_or_default();
    let max = b.entries.last().map(|e| e.0.clone()).unwrap_or_default();
    Ok(BlockRef { hash, entries: b.entries.len() as u32, min, max, bloom })
}
