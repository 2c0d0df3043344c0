//! The pure LSM core: level 0 (newest first, blocks may overlap) and sorted levels of
//! non-overlapping blocks, as an [`Index`]; the choice of the next compaction ([`plan`]), the
//! merge of its inputs into new blocks ([`merge`]) and its installation into a newer index
//! ([`install`]); point reads through an index ([`get_in_index`]). It does no I/O itself:
//! blocks are loaded and saved through [`Blocks`], which the record-backed
//! [`crate::CapsuleDb`] implements (and tests may fake). The memtable and the thread that runs
//! compactions live in [`crate::db`].

use crate::bloom::{Bloom, KeyHash};
use crate::codec::{
    entry_len, Block, BlockRef, Index, BLOCK_BYTES_MAX, BLOCK_ENTRIES_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};
use crate::{Cell, Error, RecordHash};
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::sync::Arc;

/// Sizes of the tree. Level `i >= 1` holds up to `fanout^i * l0_blocks_max * memtable_entries_max`
/// entries: each level `fanout` times the one above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The memtable freezes into level 0 when it holds more entries than this.
    pub memtable_entries_max: usize,
    /// Level 0 is merged into level 1 when it holds more runs than this (a freeze writes one
    /// run: the memtable cut into blocks, see [`l0_runs`]) or more entries than this many full
    /// memtables. Level 0 stays bounded in blocks too: a freeze waits while level 0 holds
    /// `2 * l0_blocks_max` runs.
    pub l0_blocks_max: usize,
    /// Size ratio between consecutive levels.
    pub fanout: usize,
    /// Every block (frozen memtables and compaction output alike) holds at most this many
    /// entries; a point read fetches, verifies and decrypts one such block per level-0 run and
    /// per deeper level, at most.
    pub block_entries_max: usize,
    /// The read cache's budget, in blocks of `block_entries_max` entries: half of it (at least
    /// one block's worth of entries) holds whole decoded blocks, counted by their entries, and a
    /// quarter of its entries' worth holds single entries (`(block, key)` to the entry or its
    /// absence, see `docs/protocol/capsuledb.md` §3): hot keys are scattered over many blocks,
    /// and an entry costs a block's 1/`block_entries_max`th.
    pub cache_blocks_max: usize,
    /// Drop tombstones when compacting into the last level. Only safe when every key's writes
    /// reach the tree in version order (one writer, or an ordered replay): with SCL's
    /// independent writers a late put older than a dropped tombstone would come back to life,
    /// so the role keeps them (`false`, the default).
    pub drop_tombstones: bool,
}

impl Default for Config {
    fn default() -> Self {
        // Measured with `psl bench capsuledb` (docs/protocol/capsuledb.md §8): small blocks keep a
        // point read's fetch (read, hash, decrypt, decode) short; a large memtable and level 0
        // keep the write amplification, hence the records to seal and sign, low.
        Config {
            memtable_entries_max: 16_384,
            l0_blocks_max: 8,
            fanout: 10,
            block_entries_max: 64,
            cache_blocks_max: 4096,
            drop_tombstones: false,
        }
    }
}

impl Config {
    /// Checks the sizes: all positive, `fanout >= 2`, blocks of at most [`BLOCK_ENTRIES_MAX`]
    /// entries and a memtable of fewer; [`Error::Invalid`] otherwise.
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
/// `save` stores a block and returns the hash of the record holding it, `save_many` a batch of
/// them. Shared by readers and the compaction thread, hence `&self`.
pub trait Blocks {
    /// The block `r` names, verified.
    fn load(&self, r: &BlockRef) -> Result<Arc<Block>, Error>;
    /// Like `load`, for a compaction's inputs: read once, so an implementation may keep them
    /// out of its cache of blocks for point reads.
    fn load_once(&self, r: &BlockRef) -> Result<Arc<Block>, Error> {
        self.load(r)
    }
    /// Stores `b` in a new record; returns the record's hash.
    fn save(&self, b: &Block) -> Result<RecordHash, Error>;
    /// Stores each of `blocks` in a new record, in order; the records' hashes in the same order.
    /// The record-backed store seals the batch in chain order and signs it on several threads
    /// (the records are the same bytes as saved one by one); by default, [`Blocks::save`] per
    /// block.
    fn save_many(&self, blocks: &[Block]) -> Result<Vec<RecordHash>, Error> {
        blocks.iter().map(|b| self.save(b)).collect()
    }
    /// The entry for `key` in the block `r` names (blocks are immutable, so an implementation
    /// may cache the answer per `(block, key)`).
    fn get_entry(&self, r: &BlockRef, key: &[u8]) -> Result<Option<Cell>, Error> {
        Ok(self.load(r)?.get(key).cloned())
    }
}

/// Full blocks a run (a freeze's or a compaction's output) is saved in at once, in blocks:
/// one [`Blocks::save_many`] call, whose records are signed in parallel. A merge holds this
/// many output blocks at most, and polls its `stop` after each batch.
pub const SAVE_BATCH_BLOCKS: usize = 16;

/// A batch is saved early once its blocks' entries take this many bytes (encoded), so that
/// batches of large blocks (up to [`BLOCK_BYTES_MAX`] each) stay this small in memory.
pub const SAVE_BATCH_BYTES_MAX: usize = BLOCK_BYTES_MAX;

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

/// A compaction: every block of level `level` listed in `upper` merges with the whole of level
/// `level + 1` (`lower`) into a new `level + 1`.
#[derive(Debug, Clone)]
pub struct Job {
    /// The level compacted down.
    pub level: usize,
    /// The blocks of `level` that merge.
    pub upper: Vec<BlockRef>,
    /// Every block of `level + 1` (empty if that level does not exist yet).
    pub lower: Vec<BlockRef>,
    /// Tombstones are dropped (the target is the last level and `drop_tombstones` is set).
    pub drop_tombstones: bool,
}

/// How full `level` is: above 1.0 it must be compacted (level 0 counts blocks, deeper levels
/// entries).
pub fn fullness(config: &Config, index: &Index, level: usize) -> f64 {
    let Some(l) = index.levels.get(level) else { return 0.0 };
    if level == 0 {
        // Runs (about one per freeze) against `l0_blocks_max`, and entries against that many
        // full memtables: small idle-time freezes count as runs (each costs a read a lookup
        // and a merge an input), full ones by their entries.
        let runs = l0_runs(l).count() as f64 / config.l0_blocks_max as f64;
        let n: usize = l.iter().map(|r| r.entries as usize).sum();
        let entries = n as f64 / config.l0_blocks_max.saturating_mul(config.memtable_entries_max) as f64;
        runs.max(entries)
    } else {
        let n: usize = l.iter().map(|r| r.entries as usize).sum();
        n as f64 / config.level_capacity(level) as f64
    }
}

/// The next compaction the index needs, if any: the fullest level over its bound (ties go to
/// the upper level). Picking by fullness (not always level 0 first) keeps a deeper level from
/// growing without bound while new level-0 blocks keep arriving.
pub fn plan(config: &Config, index: &Index) -> Option<Job> {
    let mut best: Option<(usize, f64)> = None;
    for level in 0..index.levels.len() {
        let f = fullness(config, index, level);
        if f > 1.0 && best.is_none_or(|(_, b)| f > b) {
            best = Some((level, f));
        }
    }
    let (level, _) = best?;
    let lower = index.levels.get(level + 1).cloned().unwrap_or_default();
    let last = index.levels.get(level + 2..).is_none_or(|ls| ls.iter().all(|l| l.is_empty()));
    Some(Job { level, upper: index.levels[level].clone(), lower, drop_tombstones: config.drop_tombstones && last })
}

/// Level 0 as sorted runs, newest first: maximal stretches of consecutive blocks in strictly
/// ascending, non-overlapping key order. A freeze writes its memtable as one such stretch (its
/// blocks in key order, in front of level 0); two stretches of different freezes may happen to
/// join into one run, which is still sorted and non-overlapping, so reads (one block per run by
/// binary search) and merges (one input per run) stay correct either way: both compare
/// versions, never positions.
pub fn l0_runs(level0: &[BlockRef]) -> impl Iterator<Item = &[BlockRef]> {
    let mut rest = level0;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 1;
        while n < rest.len() && rest[n - 1].max < rest[n].min {
            n += 1;
        }
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

/// [`l0_runs`] as ranges of positions in `level0`, for readers to compute once per index (finding
/// the runs walks every level-0 block).
pub fn l0_run_ranges(level0: &[BlockRef]) -> Vec<std::ops::Range<usize>> {
    let mut start = 0;
    l0_runs(level0)
        .map(|run| {
            let r = start..start + run.len();
            start = r.end;
            r
        })
        .collect()
}

/// One sorted input of a merge: blocks in key order, fetched one at a time.
struct Run<'a> {
    refs: &'a [BlockRef],
    next_block: usize,
    block: Option<Arc<Block>>,
    pos: usize,
}

impl<'a> Run<'a> {
    fn new(refs: &'a [BlockRef]) -> Run<'a> {
        Run { refs, next_block: 0, block: None, pos: 0 }
    }

    /// The current entry, fetching the next block when the current one is used up.
    fn head(&mut self, blocks: &dyn Blocks) -> Result<Option<&(Vec<u8>, Cell)>, Error> {
        loop {
            if let Some(b) = &self.block {
                if self.pos < b.entries.len() {
                    break;
                }
            }
            let Some(r) = self.refs.get(self.next_block) else { return Ok(None) };
            self.block = Some(blocks.load_once(r)?);
            self.next_block += 1;
            self.pos = 0;
        }
        Ok(self.block.as_ref().and_then(|b| b.entries.get(self.pos)))
    }
}

/// Runs `job`: a k-way merge of its inputs (each level-0 run, see [`l0_runs`], since runs may
/// overlap; a deeper level is one run), keeping per key the highest `(lamport, writer)`
/// whatever run it sits in (on a tie, the newer run), written out in blocks of at most
/// `block_entries_max` entries. Streams: holds one block per run and the output blocks not
/// saved yet (up to [`SAVE_BATCH_BLOCKS`] full ones and the one being filled). `stop` is polled
/// after each batch of output blocks saved; when it returns `true` the merge is abandoned
/// (`Ok(None)`; the blocks written so far are unreferenced garbage).
pub fn merge(
    config: &Config,
    blocks: &dyn Blocks,
    job: &Job,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Vec<BlockRef>>, Error> {
    // Newest first: level-0 runs in index order (newest first), then the lower level.
    let mut runs: Vec<Run> =
        if job.level == 0 { l0_runs(&job.upper).map(Run::new).collect() } else { vec![Run::new(&job.upper)] };
    runs.push(Run::new(&job.lower));
    let mut out = RunWriter::new(config.block_entries_max);
    loop {
        // The smallest head key, and the newest cell for it.
        let mut best: Option<(Vec<u8>, Cell)> = None;
        for run in runs.iter_mut() {
            let Some((k, c)) = run.head(blocks)? else { continue };
            let replace = match &best {
                None => true,
                Some((bk, bc)) => k < bk || (k == bk && c.0 > bc.0),
            };
            if replace {
                best = Some((k.clone(), c.clone()));
            }
        }
        let Some((key, cell)) = best else { break };
        for run in runs.iter_mut() {
            if run.head(blocks)?.is_some_and(|(k, _)| *k == key) {
                run.pos += 1;
            }
        }
        if job.drop_tombstones && cell.1.is_none() {
            continue;
        }
        if out.push(blocks, key, cell)? && stop() {
            return Ok(None);
        }
    }
    Ok(Some(out.finish(blocks)?))
}

/// Replaces `job`'s inputs in `index` by `output`: the listed blocks leave level `job.level`
/// (level-0 blocks frozen since the job was planned stay, in front), `output` becomes level
/// `job.level + 1`. Fails if the lower level changed since the job was planned (only one
/// compaction runs at a time, so it cannot).
pub fn install(index: &mut Index, job: &Job, output: Vec<BlockRef>) -> Result<(), Error> {
    let target = job.level + 1;
    let lower_now = index.levels.get(target).map(|l| l.as_slice()).unwrap_or(&[]);
    if lower_now != job.lower.as_slice() {
        return Err(Error::Invalid("compaction target changed while it ran"));
    }
    let gone: HashSet<RecordHash> = job.upper.iter().map(|r| r.hash).collect();
    let level = index.levels.get_mut(job.level).ok_or(Error::Invalid("compaction level vanished"))?;
    let before = level.len();
    level.retain(|r| !gone.contains(&r.hash));
    if before - level.len() != gone.len() {
        return Err(Error::Invalid("compaction input vanished"));
    }
    while index.levels.len() <= target {
        index.levels.push(Vec::new());
    }
    index.levels[target] = output;
    Ok(())
}

/// Freezes sorted, unique entries into a level-0 run: blocks of at most `block_entries_max`
/// entries (and the codec's byte bound), so that a point read in level 0 fetches one block of
/// the usual size, not a whole memtable. Returns their references in key order.
pub fn freeze(config: &Config, blocks: &dyn Blocks, entries: &[(Vec<u8>, Cell)]) -> Result<Vec<BlockRef>, Error> {
    let mut w = RunWriter::new(config.block_entries_max);
    for (k, c) in entries {
        w.push(blocks, k.clone(), c.clone())?;
    }
    w.finish(blocks)
}

/// The newer of two cells by `(lamport, writer)`; on a tie the first.
pub fn newest(a: Option<Cell>, b: Option<Cell>) -> Option<Cell> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Reads `key` as of `index`: the newest version among the one block per level-0 run and per
/// deeper level found by binary search on key ranges (the Bloom filter is asked before a
/// fetch). Every place is looked at: a write delivered late may sit in an older
/// block than an earlier-delivered write of a lower version, so the first hit is not enough.
pub fn get_in_index(index: &Index, blocks: &dyn Blocks, key: &[u8]) -> Result<Option<Cell>, Error> {
    let l0 = index.levels.first().map(|l| l0_run_ranges(l)).unwrap_or_default();
    get_in_index_with_runs(index, &l0, blocks, key)
}

/// [`get_in_index`] with level 0's runs already found ([`l0_run_ranges`] of this index).
pub fn get_in_index_with_runs(
    index: &Index,
    l0: &[std::ops::Range<usize>],
    blocks: &dyn Blocks,
    key: &[u8],
) -> Result<Option<Cell>, Error> {
    let mut best: Option<Cell> = None;
    let h = KeyHash::of(key);
    let mut look = |r: &BlockRef| -> Result<(), Error> {
        if r.overlaps_key(key) && r.bloom.may_contain_hashed(h) {
            if let Some(c) = blocks.get_entry(r, key)? {
                if best.as_ref().is_none_or(|x| c.0 > x.0) {
                    best = Some(c);
                }
            }
        }
        Ok(())
    };
    let mut in_run = |run: &[BlockRef]| -> Result<(), Error> {
        let i = run.partition_point(|r| r.max.as_slice() < key);
        run.get(i).into_iter().try_for_each(&mut look)
    };
    for (li, level) in index.levels.iter().enumerate() {
        if li == 0 {
            for r in l0 {
                in_run(level.get(r.clone()).ok_or(Error::Invalid("level-0 runs do not match the index"))?)?;
            }
        } else {
            in_run(level)?;
        }
    }
    Ok(best)
}

/// Whether `key` is one a scan for `prefix` above `after` wants.
pub fn scan_wants(key: &[u8], prefix: &[u8], after: Option<&[u8]>) -> bool {
    key.starts_with(prefix) && after.is_none_or(|a| key > a)
}

/// The first `n` keys (with their cells, tombstones included) of each sorted run of `index`
/// that start with `prefix` and sort above `after`, merged: per key the newest cell. Since
/// every run contributes its first `n` such keys, the first `n` keys of the result are exactly
/// the index's first `n` (a key among those is among the first `n` of every run holding it).
/// Blocks are read with [`Blocks::load_once`] (a scan must not push point reads' blocks out).
pub fn scan_in_index(
    index: &Index,
    l0: &[std::ops::Range<usize>],
    blocks: &dyn Blocks,
    prefix: &[u8],
    after: Option<&[u8]>,
    n: usize,
) -> Result<BTreeMap<Vec<u8>, Cell>, Error> {
    let mut out: BTreeMap<Vec<u8>, Cell> = BTreeMap::new();
    let mut in_run = |run: &[BlockRef]| -> Result<(), Error> {
        let start = run.partition_point(|r| r.max.as_slice() < prefix || after.is_some_and(|a| r.max.as_slice() <= a));
        let mut taken = 0;
        for r in &run[start..] {
            if taken >= n || (r.min.as_slice() > prefix && !r.min.starts_with(prefix)) {
                break;
            }
            let b = blocks.load_once(r)?;
            for (k, c) in &b.entries {
                if taken >= n || (k.as_slice() > prefix && !k.starts_with(prefix)) {
                    break;
                }
                if !scan_wants(k, prefix, after) {
                    continue;
                }
                taken += 1;
                match out.get_mut(k) {
                    Some(x) if c.0 > x.0 => *x = c.clone(),
                    Some(_) => {}
                    None => {
                        out.insert(k.clone(), c.clone());
                    }
                }
            }
        }
        Ok(())
    };
    for (li, level) in index.levels.iter().enumerate() {
        if li == 0 {
            for r in l0 {
                in_run(level.get(r.clone()).ok_or(Error::Invalid("level-0 runs do not match the index"))?)?;
            }
        } else {
            in_run(level)?;
        }
    }
    // Only the first `n` keys are exact.
    while out.len() > n {
        out.pop_last();
    }
    Ok(out)
}

/// Cuts a sorted stream of entries into blocks (by entry count and encoded size) and saves
/// the full ones in batches ([`SAVE_BATCH_BLOCKS`], [`Blocks::save_many`]); their references
/// keep the blocks' order.
struct RunWriter {
    per_block: usize,
    cur: Block,
    bytes: usize,
    /// Full blocks not saved yet, in order, and the bytes of their entries.
    full: Vec<Block>,
    full_bytes: usize,
    refs: Vec<BlockRef>,
}

impl RunWriter {
    fn new(per_block: usize) -> RunWriter {
        RunWriter { per_block, cur: Block::default(), bytes: 0, full: Vec::new(), full_bytes: 0, refs: Vec::new() }
    }

    /// Adds an entry; `true` when a batch of blocks was saved.
    fn push(&mut self, blocks: &dyn Blocks, k: Vec<u8>, c: Cell) -> Result<bool, Error> {
        let len = entry_len(&k, &c.1);
        let mut saved = false;
        if !self.cur.entries.is_empty()
            && (self.cur.entries.len() >= self.per_block || self.bytes + len > BLOCK_BYTES_MAX)
        {
            self.full.push(std::mem::take(&mut self.cur));
            self.full_bytes += self.bytes;
            self.bytes = 0;
            if self.full.len() >= SAVE_BATCH_BLOCKS || self.full_bytes >= SAVE_BATCH_BYTES_MAX {
                self.save_full(blocks)?;
                saved = true;
            }
        }
        self.bytes += len;
        self.cur.entries.push((k, c));
        Ok(saved)
    }

    /// Saves the full blocks held, as one batch.
    fn save_full(&mut self, blocks: &dyn Blocks) -> Result<(), Error> {
        if self.full.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.full);
        self.full_bytes = 0;
        let hashes = blocks.save_many(&batch)?;
        if hashes.len() != batch.len() {
            return Err(Error::Invalid("a batch of blocks saved did not give one hash per block"));
        }
        self.refs.extend(batch.into_iter().zip(hashes).map(|(b, hash)| block_ref(hash, b)));
        Ok(())
    }

    fn finish(mut self, blocks: &dyn Blocks) -> Result<Vec<BlockRef>, Error> {
        if !self.cur.entries.is_empty() {
            self.full.push(std::mem::take(&mut self.cur));
        }
        self.save_full(blocks)?;
        Ok(self.refs)
    }
}

/// The index's reference to `b`, saved in the record `hash`.
fn block_ref(hash: RecordHash, b: Block) -> BlockRef {
    let bloom = Bloom::build(b.entries.len(), b.entries.iter().map(|(k, _)| k.as_slice()));
    let min = b.entries.first().map(|e| e.0.clone()).unwrap_or_default();
    let max = b.entries.last().map(|e| e.0.clone()).unwrap_or_default();
    BlockRef { hash, entries: b.entries.len() as u32, min, max, bloom }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(min: &[u8], max: &[u8]) -> BlockRef {
        BlockRef { hash: [0; 32], entries: 1, min: min.to_vec(), max: max.to_vec(), bloom: Bloom::build(1, [min]) }
    }

    /// Blocks in memory, numbered in the order saved; remembers the size of each batch.
    #[derive(Default)]
    struct Batches {
        saved: std::sync::Mutex<Vec<Block>>,
        batches: std::sync::Mutex<Vec<usize>>,
        batched: bool,
    }

    impl Blocks for Batches {
        fn load(&self, r: &BlockRef) -> Result<Arc<Block>, Error> {
            let i = u64::from_le_bytes(r.hash[..8].try_into().unwrap()) as usize;
            Ok(Arc::new(self.saved.lock().unwrap()[i].clone()))
        }
        fn save(&self, b: &Block) -> Result<RecordHash, Error> {
            let mut saved = self.saved.lock().unwrap();
            let mut h = [0u8; 32];
            h[..8].copy_from_slice(&(saved.len() as u64).to_le_bytes());
            saved.push(b.clone());
            Ok(h)
        }
        fn save_many(&self, blocks: &[Block]) -> Result<Vec<RecordHash>, Error> {
            if !self.batched {
                return blocks.iter().map(|b| self.save(b)).collect();
            }
            self.batches.lock().unwrap().push(blocks.len());
            blocks.iter().map(|b| self.save(b)).collect()
        }
    }

    fn entries(n: usize) -> Vec<(Vec<u8>, Cell)> {
        (0..n)
            .map(|i| (format!("k{i:04}").into_bytes(), (crate::Version::new(i as u64 + 1, 1), Some(vec![1]))))
            .collect()
    }

    #[test]
    fn a_run_is_saved_in_batches_keeping_block_order() {
        let config = Config { block_entries_max: 3, ..Config::default() };
        for (n, want) in [(1, vec![1]), (3, vec![1]), (4, vec![2]), (48, vec![16]), (100, vec![16, 16, 2])] {
            let es = entries(n);
            let (batched, plain) = (Batches { batched: true, ..Batches::default() }, Batches::default());
            let refs = freeze(&config, &batched, &es).unwrap();
            assert_eq!(*batched.batches.lock().unwrap(), want, "{n} entries");
            // The same references as saving block by block, in key order, each naming its block.
            assert_eq!(refs, freeze(&config, &plain, &es).unwrap(), "{n} entries");
            let back: Vec<(Vec<u8>, Cell)> =
                refs.iter().flat_map(|r| batched.load(r).unwrap().entries.clone()).collect();
            assert_eq!(back, es);
            assert!(refs.iter().all(|r| r.entries as usize <= 3));
        }
    }

    #[test]
    fn level_zero_splits_into_ascending_non_overlapping_runs() {
        // Newest run first: [a-c][d-f] from one freeze, then [b-e] (overlaps), then
        // [a-a][c-c][x-z].
        let l0 = vec![r(b"a", b"c"), r(b"d", b"f"), r(b"b", b"e"), r(b"a", b"a"), r(b"c", b"c"), r(b"x", b"z")];
        let runs: Vec<usize> = l0_runs(&l0).map(|run| run.len()).collect();
        assert_eq!(runs, vec![2, 1, 3]);
        assert_eq!(l0_run_ranges(&l0), vec![0..2, 2..3, 3..6]);
        // A block whose min equals the previous max starts a new run (ranges must not touch).
        let touching = vec![r(b"a", b"c"), r(b"c", b"d")];
        assert_eq!(l0_run_ranges(&touching), vec![0..1, 1..2]);
        assert!(l0_runs(&[]).next().is_none());
    }
}
