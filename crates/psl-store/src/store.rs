//! [`DiskStore`]: a durable replica of one capsule in one directory.

use crate::error::StoreError;
use crate::frame::{encode_frame, scan, scan_from, Event, FrameFault, LogReader, FRAME_HEADER_LEN, MIN_RECORD_LEN};
use crate::fsutil::{read_exact_at, replace_atomic, sync_dir, write_all_at, write_new_atomic};
use crate::index::{Checkpoint, Entry, Index, IndexConfig, Loc, Orphan, Placement};
use crate::report::{AppendOutcome, CheckReport, LostRecord, OpenReport, RepairReport};
use psl_capsule::meta::META_BYTES_MAX;
use psl_capsule::{CapsuleName, Head, Kind, Record, Replica, SignedMetadata, Verified, Verifier};
use psl_crypto::{DataKey, Hash256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The signed metadata, written once at creation.
pub const METADATA_FILE: &str = "metadata.bin";
/// The capsule's application key rotation certificates (generations 1.., each
/// `psl_capsule::ROTATION_CERT_LEN` bytes, in order), so that records of a rotated key verify
/// again when the store is opened. Absent: never rotated.
pub const ROTATIONS_FILE: &str = "rotations.bin";
const ROTATIONS_TMP: &str = "rotations.bin.tmp";

/// Installs the certificates of `dir`'s rotations file (if any) in `verifier`.
fn load_rotations(dir: &Path, verifier: &Verifier) -> Result<(), StoreError> {
    let path = dir.join(ROTATIONS_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(&path, "reading", None, e)),
    };
    let bad = |why: String| StoreError::Rotation { path: path.clone(), why };
    if bytes.len() % psl_capsule::ROTATION_CERT_LEN != 0 {
        return Err(bad(format!("{} bytes is not a whole number of certificates", bytes.len())));
    }
    for c in bytes.chunks(psl_capsule::ROTATION_CERT_LEN) {
        let cert = psl_capsule::RotationCert::decode(c).map_err(|e| bad(e.to_string()))?;
        verifier.install_rotation(&cert, None).map_err(|e| bad(format!("generation {}: {e}", cert.key_gen)))?;
    }
    Ok(())
}
/// The append-only record log.
pub const LOG_FILE: &str = "records.log";
/// The directory of a writable store's spilled index (see [`crate::index`]): derived from
/// the log, rebuilt from it whenever it cannot be trusted.
pub const INDEX_DIR: &str = "index";

/// How a writable store's open treats the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OpenVerify {
    /// Re-verify every frame and rebuild the index from the log (the default; see the crate
    /// documentation's recovery rules).
    #[default]
    Full,
    /// If the index has an intact checkpoint for a prefix of the log, take that prefix as it
    /// describes it: walk its frames and check their CRCs and count, re-verify its certificate
    /// records (so the verifier knows every writer again), and re-verify only what follows.
    /// Anything that does not match falls back to [`OpenVerify::Full`]. A checkpoint is only
    /// ever written for a prefix that loaded without damage, orphans, duplicates or records a
    /// revocation cut, so what `Full` would report about that prefix is nothing, unless its
    /// bytes were changed since with their CRCs fixed up: reads re-verify every record, and
    /// [`DiskStore::check`] re-verifies everything.
    FromCheckpoint,
}

/// How a writable store keeps its index and what its open re-verifies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// What the index keeps in memory, and how often it checkpoints.
    pub index: IndexConfig,
    /// What an open re-verifies.
    pub verify: OpenVerify,
}
const METADATA_TMP: &str = "metadata.bin.tmp";
const REPAIR_TMP: &str = "records.log.repair";

/// Reads and checks (owner signature included) the metadata of the store in `dir`.
pub fn read_metadata(dir: impl AsRef<Path>) -> Result<SignedMetadata, StoreError> {
    let dir = dir.as_ref();
    let path = dir.join(METADATA_FILE);
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotAStore { path: dir.to_path_buf() }),
        Err(e) => return Err(StoreError::io(path, "opening", None, e)),
    };
    // Bound the read before allocating: the encoding is a u16 length, the metadata, a signature.
    let max = (2 + META_BYTES_MAX + 64) as u64;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(&mut f, max + 1), &mut bytes)
        .map_err(|e| StoreError::io(&path, "reading", Some(0), e))?;
    if bytes.len() as u64 > max {
        let source = psl_capsule::DecodeError::Limit { field: "metadata file", len: bytes.len() as u64, max };
        return Err(StoreError::Metadata { path, source: source.into() });
    }
    SignedMetadata::decode(&bytes).map_err(|source| StoreError::Metadata { path, source })
}

fn check_data_key(dir: &Path, meta: &SignedMetadata, key: Option<&DataKey>) -> Result<(), StoreError> {
    match key {
        Some(k) if k.fingerprint() != meta.meta.policy.data_key_fp => {
            Err(StoreError::WrongDataKey { path: dir.join(METADATA_FILE) })
        }
        _ => Ok(()),
    }
}

/// A durable replica of one capsule: `metadata.bin` and `records.log` in one directory.
///
/// Only one `DiskStore` may have a directory open for writing at a time: a writable store
/// holds an exclusive lock on the directory's `LOCK` file. A read-only one holds a shared lock
/// when it can (so that no writer opens the store while it is read: its view stays the log's
/// state), or, when a running writer (a capsule server) holds the store, reads the log as it
/// was at open and says so ([`DiskStore::held_by_writer`]).
pub struct DiskStore {
    dir: PathBuf,
    log_path: PathBuf,
    file: File,
    verifier: Arc<Verifier>,
    index: Index,
    /// End of the valid log: where the next frame goes.
    end: u64,
    /// Bytes of the log the index describes: `end` for a writable store; for a read-only one,
    /// the length read at open (a torn tail included). A check reads exactly these bytes.
    scanned: u64,
    /// A read-only store whose directory another process held for writing at open.
    live_writer: bool,
    /// Frame positions in the log (damaged ones included).
    frames: u64,
    read_only: bool,
    /// Exclusive lock on `LOCK` in the directory, held while a writable store is open, so that
    /// two processes never append to one log.
    _lock: Option<File>,
    /// Why appends are refused until a repair (unreadable regions in the log).
    damaged: Option<String>,
    /// Why appends are refused until a reopen (a failed fsync or rollback).
    poisoned: Option<String>,
    /// Whether the log loaded without damage, orphans, duplicates or revocation cuts: only
    /// then do index checkpoints get written (a checkpointed prefix must open as `Full` would).
    clean: bool,
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        // A checkpoint at close, so that the next open re-verifies nothing it need not.
        if self.checkpointable() {
            let name = self.name();
            if let Err(e) = self.index.checkpoint(name, self.end, self.frames) {
                tracing::warn!(dir = %self.dir.display(), "could not checkpoint the index at close: {e}");
            }
        }
    }
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DiskStore({}, {} records of {:?}, {} bytes)", self.dir.display(), self.len(), self.name(), self.end)
    }
}

impl DiskStore {
    /// Creates a store for the capsule `meta` in `dir` (created if missing). Fails if `dir`
    /// already holds a store. `data_key`, if given, must be the capsule's; with it, every
    /// verification also decrypts and checks the body.
    pub fn create(
        dir: impl AsRef<Path>,
        meta: SignedMetadata,
        data_key: Option<DataKey>,
    ) -> Result<DiskStore, StoreError> {
        Self::create_with(dir, meta, data_key, StoreOptions::default())
    }

    /// [`DiskStore::create`] with options (the index's bounds).
    pub fn create_with(
        dir: impl AsRef<Path>,
        meta: SignedMetadata,
        data_key: Option<DataKey>,
        opts: StoreOptions,
    ) -> Result<DiskStore, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, "creating the store directory", None, e))?;
        let meta_path = dir.join(METADATA_FILE);
        let log_path = dir.join(LOG_FILE);
        if meta_path.exists() {
            return Err(StoreError::AlreadyExists { path: meta_path });
        }
        match fs::metadata(&log_path) {
            Ok(m) if m.len() > 0 => return Err(StoreError::AlreadyExists { path: log_path }),
            _ => {}
        }
        check_data_key(&dir, &meta, data_key.as_ref())?;
        let lock = lock_dir(&dir)?;
        // The log first, so that metadata.bin, which marks a store, never exists without a log.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&log_path)
            .map_err(|e| StoreError::io(&log_path, "creating", None, e))?;
        file.sync_all().map_err(|e| StoreError::io(&log_path, "fsync", None, e))?;
        let index_dir = dir.join(INDEX_DIR);
        let index = Index::spilled(&index_dir, opts.index)
            .map_err(|e| StoreError::io(&index_dir, "creating the index", None, e))?;
        write_new_atomic(&dir, &meta_path, &dir.join(METADATA_TMP), &meta.encode())
            .map_err(|e| StoreError::io(&meta_path, "writing (temp file, fsync, rename, directory fsync)", None, e))?;
        Ok(DiskStore {
            dir,
            log_path,
            file,
            verifier: Arc::new(Verifier::new(meta, data_key)),
            index,
            end: 0,
            scanned: 0,
            live_writer: false,
            frames: 0,
            read_only: false,
            _lock: Some(lock),
            damaged: None,
            poisoned: None,
            clean: true,
        })
    }

    /// Opens the store in `dir`, re-verifying every record of the log. A torn tail is cut off
    /// (and the file fsync'd); damaged frames are skipped and reported. See the crate
    /// documentation for the recovery rules.
    pub fn open(dir: impl AsRef<Path>, data_key: Option<DataKey>) -> Result<(DiskStore, OpenReport), StoreError> {
        Self::open_with(dir.as_ref(), data_key, false, StoreOptions::default())
    }

    /// [`DiskStore::open`] with options: the index's bounds, and whether an intact index
    /// checkpoint spares re-verifying the prefix it describes ([`OpenVerify`]).
    pub fn open_with_options(
        dir: impl AsRef<Path>,
        data_key: Option<DataKey>,
        opts: StoreOptions,
    ) -> Result<(DiskStore, OpenReport), StoreError> {
        Self::open_with(dir.as_ref(), data_key, false, opts)
    }

    /// Like [`DiskStore::open`], but changes nothing on disk: a torn tail is reported and left
    /// in place, and appends are refused. If a running writer holds the store (a capsule
    /// server), the view is the log as it was read here: what the writer appends later is not
    /// in it, and a torn tail may be the frame it was writing at that moment
    /// ([`DiskStore::held_by_writer`]). Otherwise the store holds a shared lock on the
    /// directory until dropped, so no writer opens it meanwhile.
    pub fn open_readonly(
        dir: impl AsRef<Path>,
        data_key: Option<DataKey>,
    ) -> Result<(DiskStore, OpenReport), StoreError> {
        Self::open_with(dir.as_ref(), data_key, true, StoreOptions::default())
    }

    fn open_with(
        dir: &Path,
        data_key: Option<DataKey>,
        read_only: bool,
        opts: StoreOptions,
    ) -> Result<(DiskStore, OpenReport), StoreError> {
        let meta = read_metadata(dir)?;
        check_data_key(dir, &meta, data_key.as_ref())?;
        let verifier = Verifier::new(meta, data_key);
        load_rotations(dir, &verifier)?;
        let (lock, live_writer) = if read_only { lock_dir_shared(dir)? } else { (Some(lock_dir(dir)?), false) };
        let log_path = dir.join(LOG_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&log_path)
            .map_err(|e| StoreError::io(&log_path, "opening", None, e))?;
        // A read-only open changes nothing on disk, so its index stays in memory.
        let index_dir = dir.join(INDEX_DIR);
        let resumed = match (read_only, opts.verify) {
            (false, OpenVerify::FromCheckpoint) => match resume(&file, &index_dir, opts.index, &verifier) {
                Ok(r) => r,
                Err(why) => {
                    tracing::warn!(dir = %index_dir.display(), "index checkpoint not used, re-verifying the whole log: {why}");
                    None
                }
            },
            _ => None,
        };
        let (idx, start) = match resumed {
            Some(r) => r,
            None if read_only => (Index::default(), (0, 0)),
            None => (
                Index::spilled(&index_dir, opts.index)
                    .map_err(|e| StoreError::io(&index_dir, "creating the index", None, e))?,
                (0, 0),
            ),
        };
        let (mut index, mut report, scanned) = load(&file, &log_path, &verifier, idx, start)?;
        let mut end = scanned;
        if let Some(t) = &mut report.torn_tail {
            end = t.offset;
            if !read_only {
                file.set_len(t.offset)
                    .map_err(|e| StoreError::io(&log_path, "truncating the torn tail", Some(t.offset), e))?;
                t.truncated = true;
                tracing::info!(path = %log_path.display(), offset = t.offset, bytes = t.bytes, "truncated a torn tail");
            }
        }
        if !read_only {
            // What was loaded may still sit in the page cache only (a crash of the process, not
            // of the machine): make it durable before anyone relies on it.
            // (The directory entry was made durable by `create` or `repair`.)
            file.sync_all().map_err(|e| StoreError::io(&log_path, "fsync", None, e))?;
        }
        if report.is_damaged() {
            tracing::warn!(path = %log_path.display(), "{report}");
        }
        let damaged = report.unreadable.first().map(|u| {
            format!(
                "{} region(s) of the log have no trustworthy framing, the first at offset {}",
                report.unreadable.len(),
                u.offset
            )
        });
        let clean = !report.is_damaged() && report.revoked.is_empty() && report.duplicate_frames == 0;
        if !read_only && clean {
            index
                .checkpoint(verifier.name(), end, report.frames)
                .map_err(|e| StoreError::io(&index_dir, "checkpointing the index", None, e))?;
        }
        let store = DiskStore {
            dir: dir.to_path_buf(),
            log_path,
            file,
            verifier: Arc::new(verifier),
            index,
            end,
            scanned: if read_only { scanned } else { end },
            live_writer,
            frames: report.frames,
            read_only,
            _lock: lock,
            damaged,
            poisoned: None,
            clean,
        };
        Ok((store, report))
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of the capsule the store holds.
    pub fn name(&self) -> CapsuleName {
        self.verifier.name()
    }

    /// The capsule's signed metadata (what `metadata.bin` holds).
    pub fn metadata(&self) -> &SignedMetadata {
        self.verifier.metadata()
    }

    /// The verifier every record is checked with, on open and on every read.
    /// The verifier itself, to share: a server checking incoming records with the store's own
    /// verifier means every certificate either learns is known to both.
    pub fn shared_verifier(&self) -> Arc<Verifier> {
        self.verifier.clone()
    }

    /// The verifier every record is checked with, on open and on every read (borrowed; see
    /// [`DiskStore::shared_verifier`] to share it).
    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// An application key rotation: installs the owner-signed certificate in the store's
    /// verifier (public part only) and makes it durable in `rotations.bin` before returning,
    /// so that the new generation's records verify now and after a restart. `Ok(false)`: the
    /// store already had it.
    pub fn install_rotation(&mut self, cert: &psl_capsule::RotationCert) -> Result<bool, StoreError> {
        let path = self.dir.join(ROTATIONS_FILE);
        if self.read_only {
            return Err(StoreError::ReadOnly { path });
        }
        let fresh = self
            .verifier
            .install_rotation(cert, None)
            .map_err(|e| StoreError::Rotation { path: path.clone(), why: e.to_string() })?;
        if fresh {
            let bytes: Vec<u8> = self.verifier.rotation_certs().iter().flat_map(|c| c.encode()).collect();
            replace_atomic(&self.dir, &path, &self.dir.join(ROTATIONS_TMP), &bytes)
                .map_err(|e| StoreError::io(&path, "writing (temp file, fsync, rename, directory fsync)", None, e))?;
        }
        Ok(fresh)
    }

    /// Records loaded (each extends its writer's chain).
    pub fn len(&self) -> usize {
        self.index.len() as usize
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// Bytes of valid log.
    pub fn log_bytes(&self) -> u64 {
        self.end
    }

    /// Read-only stores: whether another process (a running capsule server) held the store
    /// for writing when it was opened. The store is then a view of the log at open.
    pub fn held_by_writer(&self) -> bool {
        self.live_writer
    }

    /// Frame positions in the log, damaged frames included.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Whether the store holds the record with `hash` (an unreadable index file is an error).
    pub fn contains(&self, hash: &Hash256) -> Result<bool, StoreError> {
        Ok(self.index.lookup(hash).map_err(|e| self.index_error("looking up a hash", e))?.is_some())
    }

    fn index_error(&self, what: &'static str, e: io::Error) -> StoreError {
        StoreError::io(self.dir.join(INDEX_DIR), what, None, e)
    }

    fn checkpointable(&self) -> bool {
        !self.read_only && self.clean && self.poisoned.is_none() && self.damaged.is_none() && self.index.is_spilled()
    }

    /// Each writer's newest record.
    pub fn heads(&self) -> BTreeMap<u32, Head> {
        self.index.heads()
    }

    /// The next seq writer `writer` may append (0 for a writer with no records).
    pub fn next_seq(&self, writer: u32) -> u64 {
        self.index.chain(writer).map(|c| c.next_seq()).unwrap_or(0)
    }

    /// Writer `writer`'s chain: the hash of each stored record, by seq (empty if none). The
    /// whole chain, in memory: for tools and tests; a server takes [`DiskStore::chain_tail`].
    pub fn chain_hashes(&self, writer: u32) -> Result<Vec<Hash256>, StoreError> {
        let es = self.index.entries(writer, 0, u64::MAX).map_err(|e| self.index_error("reading a chain", e))?;
        Ok(es.into_iter().map(|e| e.hash).collect())
    }

    /// The newest `n` hashes of writer `writer`'s chain, oldest first, and the chain's length
    /// (its next seq): what a server's orderer keeps of a chain at start.
    pub fn chain_tail(&self, writer: u32, n: usize) -> Result<(u64, Vec<Hash256>), StoreError> {
        let len = self.next_seq(writer);
        let es = self
            .index
            .entries(writer, len.saturating_sub(n as u64), len)
            .map_err(|e| self.index_error("reading a chain", e))?;
        Ok((len, es.into_iter().map(|e| e.hash).collect()))
    }

    /// Whether appends are accepted, and if not, why.
    pub fn writable(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.log_path.clone() });
        }
        if let Some(reason) = &self.poisoned {
            return Err(StoreError::Poisoned { path: self.log_path.clone(), reason: reason.clone() });
        }
        if let Some(reason) = &self.damaged {
            return Err(StoreError::Damaged { path: self.log_path.clone(), reason: reason.clone() });
        }
        Ok(())
    }

    /// Appends a batch as one group commit: every record is checked first (capsule, size,
    /// chain extension taking the earlier records of the batch into account), then all new
    /// frames are written with one write and made durable with one `fsync`. Records the store
    /// already holds (same hash) are skipped. If any record is refused, nothing is written.
    /// Records are taken in the order given: a batch must itself be in chain order per writer.
    /// Signatures are not checked again (a [`Verified`] record has passed a verifier); if this
    /// store holds the data key, each new record's body is opened, as `open` will do later.
    /// If the write fails, the log is cut back to where it was.
    pub fn append(&mut self, recs: &[Verified<Record>]) -> Result<AppendOutcome, StoreError> {
        self.writable()?;
        let (plan, duplicates) = self.plan_append(recs)?;
        if plan.is_empty() {
            return Ok(AppendOutcome { appended: 0, duplicates, bytes: 0 });
        }

        // Invariants before writing: the file ends where the index says, and the index is sound.
        let on_disk = self.file.metadata().map_err(|e| StoreError::io(&self.log_path, "stat", None, e))?.len();
        if on_disk != self.end {
            let reason =
                format!("the log is {on_disk} bytes but the store wrote {} (changed by someone else?)", self.end);
            self.damaged = Some(reason.clone());
            return Err(StoreError::Damaged { path: self.log_path.clone(), reason });
        }
        debug_assert!(self.index.consistent(), "index inconsistent before append");

        let total: usize = plan.iter().map(|r| FRAME_HEADER_LEN as usize + r.bytes().len()).sum();
        let mut buf = Vec::with_capacity(total);
        let mut locs = Vec::with_capacity(plan.len());
        for r in &plan {
            locs.push(Loc { offset: self.end + buf.len() as u64, len: r.bytes().len() as u32 });
            encode_frame(r.bytes(), &mut buf);
        }
        debug_assert_eq!(buf.len(), total);

        let start = self.end;
        if let Err(e) = write_all_at(&self.file, &buf, start) {
            self.roll_back(start);
            return Err(StoreError::io(&self.log_path, "appending frames", Some(start), e));
        }
        if let Err(e) = self.file.sync_data() {
            // After a failed fsync the kernel may have dropped the dirty pages: nothing about the
            // file can be trusted until it is reopened and re-verified.
            self.roll_back(start);
            self.poisoned = Some(format!("fsync after appending at offset {start} failed: {e}"));
            return Err(StoreError::io(&self.log_path, "fsync of appended frames", Some(start), e));
        }
        for (r, loc) in plan.iter().zip(locs) {
            self.index.push(r, loc);
        }
        self.end += buf.len() as u64;
        self.scanned = self.end;
        self.frames += plan.len() as u64;
        debug_assert!(self.index.consistent(), "index inconsistent after append");
        if let Err(e) = self.maintain_index() {
            // The records are durable and indexed in memory; what was not written out stays in
            // memory and is written by the next append (a full disk passes), and the last
            // checkpoint stays the one an open trusts.
            tracing::warn!(dir = %self.dir.display(), "writing the index after appending at offset {start} failed: {e}");
        }
        Ok(AppendOutcome { appended: plan.len(), duplicates, bytes: buf.len() as u64 })
    }

    /// Keeps the spilled index within its memory bounds and checkpoints it when due.
    fn maintain_index(&mut self) -> io::Result<()> {
        if self.index.wants_flush() {
            self.index.flush()?;
        }
        if self.checkpointable() && self.index.checkpoint_due() {
            let name = self.name();
            self.index.checkpoint(name, self.end, self.frames)?;
        }
        Ok(())
    }

    /// The records of `recs` to append, in order, and how many the store (or the batch) already
    /// holds; refuses the whole batch at the first record that does not extend its chain.
    fn plan_append<'r>(&self, recs: &'r [Verified<Record>]) -> Result<(Vec<&'r Verified<Record>>, usize), StoreError> {
        let name = self.name();
        let max = self.metadata().meta.policy.limits.record_bytes_max;
        let mut plan: Vec<&'r Verified<Record>> = Vec::new();
        let mut pending: HashMap<u32, Vec<Hash256>> = HashMap::new();
        let mut seen: HashSet<Hash256> = HashSet::new();
        let mut duplicates = 0;
        for (index, r) in recs.iter().enumerate() {
            let h = r.header();
            let hash = r.hash();
            if h.capsule != name {
                return Err(StoreError::WrongCapsule { expected: name, found: h.capsule });
            }
            if r.bytes().len() > max as usize {
                return Err(StoreError::RecordTooLarge { hash, len: r.bytes().len(), max });
            }
            // Verified earlier, possibly before a revocation this store's verifier knows now.
            if let Err(reason) = self.verifier.recheck(h) {
                let source =
                    psl_capsule::Rejected { hash: Some(hash), writer: Some(h.writer), seq: Some(h.seq), reason };
                return Err(StoreError::Rejected { index, source: Box::new(source) });
            }
            if seen.contains(&hash) {
                duplicates += 1;
                continue;
            }
            let (stored_len, stored_head) =
                self.index.chain(h.writer).map(|c| (c.next_seq(), c.head_hash())).unwrap_or((0, Hash256::ZERO));
            let batch: &[Hash256] = pending.get(&h.writer).map(|v| &v[..]).unwrap_or(&[]);
            let next = stored_len + batch.len() as u64;
            if h.seq < next {
                // The hash fixes writer and seq: the record is stored iff its slot holds it.
                let stored = if h.seq < stored_len {
                    self.index
                        .hash_at(h.writer, h.seq)
                        .map_err(|e| self.index_error("reading a chain", e))?
                        .unwrap_or(Hash256::ZERO)
                } else {
                    batch[(h.seq - stored_len) as usize]
                };
                if stored == hash {
                    duplicates += 1;
                    continue;
                }
                return Err(StoreError::Equivocation { writer: h.writer, seq: h.seq, stored, offered: hash });
            }
            if h.seq > next {
                return Err(StoreError::Gap { writer: h.writer, expected: next, got: h.seq });
            }
            let head = batch.last().copied().unwrap_or(stored_head);
            if h.prev != head {
                return Err(StoreError::BrokenChain {
                    writer: h.writer,
                    seq: h.seq,
                    expected_prev: head,
                    got_prev: h.prev,
                });
            }
            if self.verifier.can_open() {
                // `r` may have passed a verifier without the data key; `open` would then find
                // a body that does not decrypt, so check it now (decryption only, no signature).
                self.verifier.open(r).map_err(|source| StoreError::Rejected { index, source: Box::new(source) })?;
            }
            pending.entry(h.writer).or_default().push(hash);
            seen.insert(hash);
            plan.push(r);
        }
        Ok((plan, duplicates))
    }

    /// Cuts the log back to `end` after a failed append; poisons the store if that fails too.
    fn roll_back(&mut self, end: u64) {
        if let Err(e) = self.file.set_len(end).and_then(|_| self.file.sync_data()) {
            self.poisoned = Some(format!("rolling back a failed append to offset {end} failed: {e}"));
        }
    }

    /// The record with `hash`, read back from disk and re-verified (CRC, decoding, hash,
    /// verifier). Damage on disk is an error, never bad bytes.
    pub fn get(&self, hash: &Hash256) -> Result<Option<Verified<Record>>, StoreError> {
        match self.index.lookup(hash).map_err(|e| self.index_error("looking up a hash", e))? {
            Some((_, _, loc)) => self.read_at(*hash, loc).map(Some),
            None => Ok(None),
        }
    }

    fn read_at(&self, hash: Hash256, loc: Loc) -> Result<Verified<Record>, StoreError> {
        // The location comes from an index file, which is on disk: bound it before allocating.
        let max = self.metadata().meta.policy.limits.record_bytes_max;
        if loc.len < MIN_RECORD_LEN || loc.len > max {
            let fault = FrameFault::Length { len: loc.len, min: MIN_RECORD_LEN, max };
            return Err(StoreError::ReadBack { path: self.log_path.clone(), offset: loc.offset, hash, fault });
        }
        let mut buf = vec![0u8; FRAME_HEADER_LEN as usize + loc.len as usize];
        read_exact_at(&self.file, &mut buf, loc.offset)
            .map_err(|e| StoreError::io(&self.log_path, "reading a frame", Some(loc.offset), e))?;
        let fail = |fault| StoreError::ReadBack { path: self.log_path.clone(), offset: loc.offset, hash, fault };
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let stored = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
        if len != loc.len {
            return Err(fail(FrameFault::LengthChanged { indexed: loc.len, found: len }));
        }
        let bytes = &buf[FRAME_HEADER_LEN as usize..];
        let computed = crc32fast::hash(bytes);
        if computed != stored {
            return Err(fail(FrameFault::Crc { stored, computed }));
        }
        let rec =
            Record::decode(bytes, &self.metadata().meta.policy.limits).map_err(|e| fail(FrameFault::Decode(e)))?;
        if rec.hash() != hash {
            return Err(fail(FrameFault::WrongRecord { found: rec.hash() }));
        }
        self.verifier.verify(rec).map_err(|r| fail(FrameFault::Verify(Box::new(r))))
    }

    /// Writer `writer`'s records with seq in `from_seq..to_seq` (half-open, clamped to the
    /// chain), read back and re-verified.
    pub fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, StoreError> {
        let es = self.index.entries(writer, from_seq, to_seq).map_err(|e| self.index_error("reading a chain", e))?;
        es.iter().map(|e| self.read_at(e.hash, e.loc)).collect()
    }

    /// Every record in chain order (writer, then seq), read back and re-verified one by one
    /// (the index is read a chunk of entries at a time).
    pub fn iter_chain_order(&self) -> impl Iterator<Item = Result<Verified<Record>, StoreError>> + '_ {
        self.index.writers().flat_map(move |w| {
            self.index.walk(w).map(move |e| match e {
                Ok((_, e)) => self.read_at(e.hash, e.loc),
                Err(e) => Err(self.index_error("reading a chain", e)),
            })
        })
    }

    /// Every record in chain order, read back and re-verified.
    pub fn records_in_chain_order(&self) -> Result<Vec<Verified<Record>>, StoreError> {
        self.iter_chain_order().collect()
    }

    /// An in-memory replica of everything the store holds (read back and re-verified).
    pub fn to_replica(&self) -> Result<Replica, StoreError> {
        let mut r = Replica::new(self.name());
        for rec in self.iter_chain_order() {
            r.insert(rec?).expect("the store only holds records of its own capsule");
        }
        Ok(r)
    }

    /// The SYNC record with the highest epoch, read back and re-verified.
    pub fn latest_sync(&self) -> Result<Option<Verified<Record>>, StoreError> {
        match self.index.latest_sync {
            Some((_, _, h)) => self.get(&h),
            None => Ok(None),
        }
    }

    /// Re-reads and re-verifies every frame of the log the store's index describes, end to
    /// end, checks the chains and links of everything that verified (`Replica::check`), and
    /// compares the result with the in-memory index. Changes nothing. Errors only when the log
    /// cannot be read at all. See [`CheckView`].
    pub fn check(&self) -> Result<CheckReport, StoreError> {
        self.check_view().check()
    }

    /// A consistent view of the store to check, possibly after releasing the store (a server
    /// takes it under its store lock and checks without holding it, so appends go on): the
    /// log's file (the same file, even if a repair later replaces it), the length the index
    /// describes, a copy of the index and the verifier. Costs a copy of the index.
    pub fn check_view(&self) -> CheckView {
        CheckView {
            file: self.file.try_clone().ok(),
            log_path: self.log_path.clone(),
            scanned: self.scanned,
            index: self.index.clone(),
            verifier: self.verifier.clone(),
            live_writer: self.live_writer,
        }
    }

    /// Rewrites the log from what can be recovered: every record that verifies, found by a
    /// resynchronising scan (so records behind an unreadable region are kept), connected into
    /// chains from seq 0, written in chain order. Damaged frames, unreadable regions, orphans
    /// that still cannot be connected and a torn tail are dropped. The old log is kept as a
    /// hard link `records.log.damaged-<n>` (named in the report); the new one replaces it
    /// atomically (temp file, fsync, rename, directory fsync). Clears the damaged state.
    pub fn repair(&mut self) -> Result<RepairReport, StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.log_path.clone() });
        }
        if let Some(reason) = &self.poisoned {
            return Err(StoreError::Poisoned { path: self.log_path.clone(), reason: reason.clone() });
        }
        let path = self.log_path.clone();
        let bytes_before = self.file.metadata().map_err(|e| StoreError::io(&path, "stat", None, e))?.len();

        // 1. Every verified record, by slot.
        let mut slots: BTreeMap<(u32, u64), Vec<Cand>> = BTreeMap::new();
        let mut positions = 0u64;
        let mut reader = LogReader::new(&self.file, bytes_before);
        scan(&mut reader, &self.verifier, |ev| {
            positions += 1;
            if let Event::Good { offset, len, record, .. } = ev {
                let h = record.header();
                slots.entry((h.writer, h.seq)).or_default().push(Cand {
                    prev: h.prev,
                    hash: record.hash(),
                    loc: Loc { offset, len },
                });
            }
        })
        .map_err(|e| StoreError::io(&path, "reading", None, e))?;

        // 2. Chains from seq 0, first candidate in file order that links to the head.
        let keep = connect_chains(&slots);

        // 3. The new log.
        let tmp = self.dir.join(REPAIR_TMP);
        let bytes_after = self.write_repaired(&keep, &tmp)?;

        // 4. Keep the old log, swap in the new one.
        let backup = self.backup_path();
        if fs::hard_link(&path, &backup).is_err() {
            fs::copy(&path, &backup).map_err(|e| StoreError::io(&backup, "copying the old log", None, e))?;
            File::open(&backup).and_then(|f| f.sync_all()).map_err(|e| StoreError::io(&backup, "fsync", None, e))?;
        }
        // The index checkpoint describes the old log: gone before the log is replaced.
        self.index.drop_checkpoint().map_err(|e| self.index_error("removing the index checkpoint", e))?;
        // Until the reload below succeeds, the handle and index describe the old file.
        self.poisoned = Some("a repair was interrupted after replacing the log".into());
        fs::rename(&tmp, &path).map_err(|e| StoreError::io(&tmp, "renaming over records.log", None, e))?;
        sync_dir(&self.dir).map_err(|e| StoreError::io(&self.dir, "fsync of the directory", None, e))?;

        // 5. Reload from the new log.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| StoreError::io(&path, "opening", None, e))?;
        let index_dir = self.dir.join(INDEX_DIR);
        let fresh = self.index.fresh_like().map_err(|e| StoreError::io(&index_dir, "creating the index", None, e))?;
        let (index, report, _) = load(&file, &path, &self.verifier, fresh, (0, 0))?;
        debug_assert!(report.is_clean(), "a repaired log loads clean: {report}");
        self.clean = report.revoked.is_empty() && !report.is_damaged() && report.duplicate_frames == 0;
        self.file = file;
        self.index = index;
        self.end = bytes_after;
        self.scanned = bytes_after;
        self.frames = report.frames;
        self.damaged = None;
        self.poisoned = None;
        tracing::info!(path = %path.display(), backup = %backup.display(), kept = keep.len(), "repaired the log");
        Ok(RepairReport {
            backup,
            kept: keep.len(),
            dropped: positions.saturating_sub(keep.len() as u64),
            bytes_before,
            bytes_after,
        })
    }

    /// Writes the frames `keep` names, read back and CRC-checked, into `tmp`, and fsyncs it.
    /// Returns its length.
    fn write_repaired(&self, keep: &[(Hash256, Loc)], tmp: &Path) -> Result<u64, StoreError> {
        let path = &self.log_path;
        let io_tmp = |what, e| StoreError::io(tmp, what, None, e);
        let out = File::create(tmp).map_err(|e| io_tmp("creating", e))?;
        let mut w = BufWriter::new(out);
        let mut bytes_after = 0u64;
        for (hash, loc) in keep {
            let mut frame = vec![0u8; FRAME_HEADER_LEN as usize + loc.len as usize];
            read_exact_at(&self.file, &mut frame, loc.offset)
                .map_err(|e| StoreError::io(path, "reading a frame", Some(loc.offset), e))?;
            let stored = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let computed = crc32fast::hash(&frame[FRAME_HEADER_LEN as usize..]);
            if stored != computed {
                return Err(StoreError::ReadBack {
                    path: path.clone(),
                    offset: loc.offset,
                    hash: *hash,
                    fault: FrameFault::Crc { stored, computed },
                });
            }
            w.write_all(&frame).map_err(|e| io_tmp("writing", e))?;
            bytes_after += frame.len() as u64;
        }
        let out = w.into_inner().map_err(|e| io_tmp("writing", e.into_error()))?;
        out.sync_all().map_err(|e| io_tmp("fsync", e))?;
        Ok(bytes_after)
    }

    fn backup_path(&self) -> PathBuf {
        (0u32..)
            .map(|n| self.dir.join(format!("{LOG_FILE}.damaged-{n}")))
            .find(|p| !p.exists())
            .expect("some backup name is free")
    }
}

/// A verified record a repair found: what it links to, its hash, where it is.
struct Cand {
    prev: Hash256,
    hash: Hash256,
    loc: Loc,
}

/// Chains from seq 0: per slot, the first candidate in file order that links to the head so far.
fn connect_chains(slots: &BTreeMap<(u32, u64), Vec<Cand>>) -> Vec<(Hash256, Loc)> {
    let mut keep: Vec<(Hash256, Loc)> = Vec::new();
    let mut cur: Option<(u32, u64, Hash256)> = None;
    for (&(w, s), cands) in slots {
        let (cw, next, head) = match cur {
            Some(c) if c.0 == w => c,
            _ => (w, 0, Hash256::ZERO),
        };
        cur = Some((cw, next, head));
        if s != next {
            continue;
        }
        if let Some(c) = cands.iter().find(|c| c.prev == head) {
            keep.push((c.hash, c.loc));
            cur = Some((w, next + 1, c.hash));
        }
    }
    keep
}

fn orphan(index: u64, offset: u64, rec: &Record, cause: crate::index::OrphanCause) -> Orphan {
    let h = rec.header();
    Orphan { index, offset, writer: h.writer, seq: h.seq, hash: rec.hash(), cause }
}

/// Scans `file` and builds the index the way `open` does: records are loaded in file order,
/// each only if it extends its writer's chain.
/// Also returns the length of the log scanned.
fn load(
    file: &File,
    path: &Path,
    verifier: &Verifier,
    mut idx: Index,
    (start, start_frames): (u64, u64),
) -> Result<(Index, OpenReport, u64), StoreError> {
    let len = file.metadata().map_err(|e| StoreError::io(path, "stat", None, e))?.len();
    let index_dir = path.with_file_name(INDEX_DIR);
    let mut reader = LogReader::new(file, len);
    let mut report = OpenReport { from_checkpoint_bytes: start, ..OpenReport::default() };
    let mut fault: Option<io::Error> = None;
    report.frames = scan_from(&mut reader, start, start_frames, verifier, |ev| match ev {
        Event::Good { index, offset, len, record } => match idx.place(&record) {
            Ok(Placement::Extends) => {
                idx.push(&record, Loc { offset, len });
                if idx.wants_flush() {
                    if let Err(e) = idx.flush() {
                        fault.get_or_insert(e);
                    }
                }
            }
            Ok(Placement::Duplicate) => report.duplicate_frames += 1,
            Ok(Placement::Orphan(cause)) => report.orphaned.push(orphan(index, offset, &record, cause)),
            Err(e) => {
                fault.get_or_insert(e);
            }
        },
        Event::Damaged(d) => match revoked_frame(&d) {
            Some(o) => report.revoked.push(o),
            None => report.damaged.push(d),
        },
        Event::Unreadable(u) => report.unreadable.push(u),
        Event::Torn(t) => {
            report.torn_tail_bytes = t.bytes;
            report.torn_tail = Some(t);
        }
    })
    .map_err(|e| StoreError::io(path, "reading", None, e))?;
    if let Some(e) = fault {
        return Err(StoreError::io(&index_dir, "building the index", None, e));
    }
    drop_revoked(&mut reader, &mut idx, &mut report, verifier).map_err(|e| StoreError::io(path, "reading", None, e))?;
    idx.flush().map_err(|e| StoreError::io(&index_dir, "building the index", None, e))?;
    report.records = idx.len() as usize;
    Ok((idx, report, len))
}

/// [`OpenVerify::FromCheckpoint`]: the index resumed from its checkpoint, and where the scan of
/// the rest of the log starts (byte, frame number); `Ok(None)` without a checkpoint, `Err`
/// (why) when it cannot be used.
#[allow(clippy::type_complexity)]
fn resume(
    file: &File,
    index_dir: &Path,
    cfg: IndexConfig,
    verifier: &Verifier,
) -> Result<Option<(Index, (u64, u64))>, String> {
    let Some(ck) = Checkpoint::read(index_dir) else { return Ok(None) };
    if ck.capsule != verifier.name() {
        return Err(format!("the checkpoint names capsule {}", ck.capsule));
    }
    let len = file.metadata().map_err(|e| format!("stat of the log: {e}"))?.len();
    if len < ck.log_end {
        return Err(format!("the log is {len} bytes, shorter than the {} the checkpoint describes", ck.log_end));
    }
    let limits = verifier.metadata().meta.policy.limits;
    // Every frame of the prefix where the checkpoint says, each with its CRC.
    let mut r = LogReader::new(file, ck.log_end);
    let (mut pos, mut frames) = (0u64, 0u64);
    while pos < ck.log_end {
        if ck.log_end - pos < FRAME_HEADER_LEN {
            return Err(format!("a partial frame header at offset {pos}"));
        }
        let hdr = r.get(pos, FRAME_HEADER_LEN).map_err(|e| format!("reading offset {pos}: {e}"))?;
        let flen = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let stored = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
        if flen < MIN_RECORD_LEN || flen > limits.record_bytes_max || pos + FRAME_HEADER_LEN + flen as u64 > ck.log_end
        {
            return Err(format!("the frame at offset {pos} has a bad length {flen}"));
        }
        let body = r.get(pos + FRAME_HEADER_LEN, flen as u64).map_err(|e| format!("reading offset {pos}: {e}"))?;
        if crc32fast::hash(body) != stored {
            return Err(format!("the frame at offset {pos} fails its CRC"));
        }
        pos += FRAME_HEADER_LEN + flen as u64;
        frames += 1;
    }
    if frames != ck.frames {
        return Err(format!("the prefix holds {frames} frames, the checkpoint says {}", ck.frames));
    }
    // The certificate records, so that the verifier knows every writer again (a certificate
    // may depend on one stored after it: retry until nothing more verifies).
    let mut waiting: Vec<Record> = Vec::new();
    for loc in &ck.certs {
        if loc.len < MIN_RECORD_LEN || loc.len > limits.record_bytes_max || loc.offset >= ck.log_end {
            return Err(format!(
                "a certificate record at offset {} of {} bytes is not in the prefix",
                loc.offset, loc.len
            ));
        }
        let mut buf = vec![0u8; FRAME_HEADER_LEN as usize + loc.len as usize];
        read_exact_at(file, &mut buf, loc.offset).map_err(|e| format!("reading offset {}: {e}", loc.offset))?;
        let rec = Record::decode(&buf[FRAME_HEADER_LEN as usize..], &limits)
            .map_err(|e| format!("the certificate record at offset {}: {e}", loc.offset))?;
        waiting.push(rec);
    }
    loop {
        let before = waiting.len();
        let mut last = None;
        waiting.retain(|rec| match verifier.verify(rec.clone()) {
            Ok(_) => false,
            Err(e) => {
                last = Some(e.to_string());
                true
            }
        });
        if waiting.is_empty() {
            break;
        }
        if waiting.len() == before {
            return Err(format!("{} certificate records do not verify: {}", waiting.len(), last.unwrap_or_default()));
        }
    }
    let idx = Index::resume(index_dir, cfg, &ck).map_err(|e| format!("index files: {e}"))?;
    Ok(Some((idx, (ck.log_end, ck.frames))))
}

fn revoked_frame(d: &crate::frame::DamagedFrame) -> Option<Orphan> {
    let FrameFault::Verify(rej) = &d.fault else { return None };
    let psl_capsule::Reason::Revoked { writer, seq, from_epoch, from_seq, .. } = rej.reason else { return None };
    Some(Orphan {
        index: d.index,
        offset: d.offset,
        writer,
        seq,
        hash: rej.hash.unwrap_or(Hash256::ZERO),
        cause: crate::index::OrphanCause::Revoked { from_epoch, from_seq },
    })
}

fn drop_revoked(
    reader: &mut LogReader<'_>,
    idx: &mut Index,
    report: &mut OpenReport,
    verifier: &Verifier,
) -> io::Result<()> {
    let limits = verifier.metadata().meta.policy.limits;
    let writers: std::collections::BTreeSet<u32> = verifier.revocations().iter().map(|r| r.writer).collect();
    let header_at = |reader: &mut LogReader<'_>, e: &Entry| -> io::Result<Option<Record>> {
        Ok(match crate::frame::probe(reader, e.loc.offset, &limits)? {
            crate::frame::Probe::Ok { record, .. } => Some(record),
            crate::frame::Probe::Bad { .. } => None,
        })
    };
    let mut cut_any = false;
    for w in writers {
        let mut first = None;
        for item in idx.walk(w) {
            let (seq, e) = item?;
            let Some(rec) = header_at(reader, &e)? else { continue };
            if let Err(psl_capsule::Reason::Revoked { from_epoch, from_seq, .. }) = verifier.recheck(rec.header()) {
                first = Some((seq, from_epoch, from_seq));
                break;
            }
        }
        let Some((seq, from_epoch, from_seq)) = first else { continue };
        if !cut_any {
            // The checkpoint no longer describes the chains once they are cut.
            idx.drop_checkpoint()?;
        }
        let cut = idx.truncate(w, seq)?;
        cut_any = true;
        for (i, e) in cut.iter().enumerate() {
            report.revoked.push(Orphan {
                index: crate::index::FRAME_INDEX_UNKNOWN,
                offset: e.loc.offset,
                writer: w,
                seq: seq + i as u64,
                hash: e.hash,
                cause: if i == 0 {
                    crate::index::OrphanCause::Revoked { from_epoch, from_seq }
                } else {
                    crate::index::OrphanCause::Gap { expected: seq }
                },
            });
        }
        // The chain's head fields come from its new newest record.
        if let Some(last) = seq.checked_sub(1).map(|s| idx.entry(w, s)).transpose()?.flatten() {
            if let Some(rec) = header_at(reader, &last)? {
                let h = rec.header();
                idx.set_head_fields(w, h.lamport, h.epoch);
            }
        }
    }
    if cut_any && idx.latest_sync.is_none() {
        // The newest SYNC was cut (a revoked coordinator): find the newest one kept.
        let mut newest: Option<(u64, u64, Hash256)> = None;
        for w in idx.writers() {
            for item in idx.walk(w) {
                let (_, e) = item?;
                if let Some(rec) = header_at(reader, &e)? {
                    let h = rec.header();
                    if h.kind == Kind::Sync && newest.is_none_or(|(ep, s, _)| (h.epoch, h.seq) > (ep, s)) {
                        newest = Some((h.epoch, h.seq, e.hash));
                    }
                }
            }
        }
        idx.latest_sync = newest;
    }
    Ok(())
}

/// Name of the lock file in a store directory.
pub const LOCK_FILE: &str = "LOCK";

/// Takes the directory's exclusive lock (released when the returned file is dropped, or when
/// the process dies).
fn lock_dir(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| StoreError::io(&path, "opening the lock file", None, e))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked { path }),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::io(&path, "locking", None, e)),
    }
}

/// For a read-only open: a shared lock on the directory's `LOCK` file, if no writer holds it
/// (kept until the store is dropped, so that no writer opens the store meanwhile); or `None`
/// and `true` if a writer holds it (a running server). A store without a `LOCK` file was
/// never opened for writing by this version: `None`, `false` (nothing is created).
fn lock_dir_shared(dir: &Path) -> Result<(Option<File>, bool), StoreError> {
    let path = dir.join(LOCK_FILE);
    let f = match OpenOptions::new().read(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, false)),
        Err(e) => return Err(StoreError::io(&path, "opening the lock file", None, e)),
    };
    match f.try_lock_shared() {
        Ok(()) => Ok((Some(f), false)),
        Err(std::fs::TryLockError::WouldBlock) => Ok((None, true)),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::io(&path, "locking (shared)", None, e)),
    }
}

/// A consistent view of a store to check ([`DiskStore::check_view`]), independent of the store
/// it came from.
///
/// Why a check of a live store cannot report false damage: the log is append-only, and its
/// writer only ever adds frames past the end its index describes (a failed append is cut back
/// to that end; a repair writes a new file and renames it over the old one, which this view's
/// handle still reads). So the first `scanned` bytes are exactly what the index was built from,
/// and a check reads those only: records appended after the view was taken are the unindexed
/// tail (as a crash leaves one), reported as [`CheckReport::appended_bytes`], never as damage.
pub struct CheckView {
    file: Option<File>,
    log_path: PathBuf,
    scanned: u64,
    index: Index,
    verifier: Arc<Verifier>,
    live_writer: bool,
}

impl CheckView {
    /// Bytes of the log this view covers.
    pub fn bytes(&self) -> u64 {
        self.scanned
    }

    /// Runs the check (see [`DiskStore::check`]).
    pub fn check(&self) -> Result<CheckReport, StoreError> {
        let file = match &self.file {
            Some(f) => f,
            None => {
                let e = io::Error::other("could not duplicate the log's file handle");
                return Err(StoreError::io(&self.log_path, "opening", None, e));
            }
        };
        let now = file.metadata().map_err(|e| StoreError::io(&self.log_path, "stat", None, e))?.len();
        let mut rep = CheckReport {
            checked_bytes: self.scanned.min(now),
            appended_bytes: now.saturating_sub(self.scanned),
            live_writer: self.live_writer,
            ..CheckReport::default()
        };
        if now < self.scanned {
            rep.shrunk = Some((self.scanned, now));
        }
        let mut reader = LogReader::new(file, rep.checked_bytes);
        let mut idx = Index::default();
        let name = self.verifier.name();
        let mut replica = Replica::new(name);
        rep.frames = scan(&mut reader, &self.verifier, |ev| match ev {
            Event::Good { index, offset, len, record } => {
                rep.verified += 1;
                // In memory: `place` reads no file.
                match idx.place(&record) {
                    Ok(Placement::Extends) => idx.push(&record, Loc { offset, len }),
                    Ok(Placement::Duplicate) => rep.duplicate_frames += 1,
                    Ok(Placement::Orphan(cause)) => rep.orphaned.push(orphan(index, offset, &record, cause)),
                    Err(_) => {}
                }
                // The verifier checked the capsule name, so this cannot fail.
                let _ = replica.insert(record);
            }
            // Refused by a revocation this store knows: valid when stored, not damage (see
            // `drop_revoked`).
            Event::Damaged(d) if revoked_frame(&d).is_some() => {}
            Event::Damaged(d) => rep.damaged.push(d),
            Event::Unreadable(u) => rep.unreadable.push(u),
            Event::Torn(t) => rep.torn_tail = Some(t),
        })
        .map_err(|e| StoreError::io(&self.log_path, "reading", None, e))?;
        // As on open: records a revocation found later in the log refuses are not the store's
        // (not damage either: they were valid when stored).
        let mut cut = OpenReport::default();
        drop_revoked(&mut reader, &mut idx, &mut cut, &self.verifier)
            .map_err(|e| StoreError::io(&self.log_path, "reading", None, e))?;
        rep.chain_problems = replica.check();
        let index_err =
            |e: io::Error| StoreError::io(self.log_path.with_file_name(INDEX_DIR), "reading the index", None, e);
        // Every record the store's index holds must be where the log now has it...
        for w in self.index.writers() {
            for item in self.index.walk(w) {
                let (_, e) = item.map_err(index_err)?;
                let found = idx.lookup(&e.hash).map_err(index_err)?;
                if found.map(|f| f.2) != Some(e.loc) {
                    rep.lost.push(LostRecord { hash: e.hash, offset: e.loc.offset });
                }
            }
        }
        rep.lost.sort_by_key(|l| l.offset);
        // ... and every record the log holds must be in the store's index.
        let mut unindexed: Vec<(u64, Hash256)> = Vec::new();
        for w in idx.writers() {
            for e in idx.entries(w, 0, u64::MAX).map_err(index_err)? {
                if self.index.lookup(&e.hash).map_err(index_err)?.is_none() {
                    unindexed.push((e.loc.offset, e.hash));
                }
            }
        }
        unindexed.sort();
        rep.unindexed = unindexed.into_iter().map(|(_, h)| h).collect();
        Ok(rep)
    }
}

#[cfg(test)]
mod rotation_tests {
    use super::*;
    use psl_capsule::{new_capsule, Author, Limits, Link, RotationCert};
    use psl_crypto::OwnerKey;

    #[test]
    fn a_rotated_store_keeps_its_certificate_and_reopens_clean() {
        let dir = tempfile::tempdir().unwrap();
        let owner = OwnerKey::from_seed(&[5; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "rot-store", 0, Limits::default()).unwrap();
        let cert = RotationCert::issue(&owner, &meta, 1, 2, 3).unwrap();
        let new_app = owner.app(2).unwrap();
        let mut a = Author::new(&meta, &owner.app(1).unwrap(), 5).unwrap();
        a.schedule_rotation(&cert, new_app.writer(5).unwrap(), new_app.data_key()).unwrap();
        let old = a.write_ops([("a", Some("0"))]).unwrap();
        a.enter_epoch(Link { writer: psl_capsule::DEFAULT_COORDINATOR, seq: 0, hash: Hash256::ZERO }, 3);
        let new = a.write_ops([("b", Some("1"))]).unwrap();
        assert_eq!(new.header().key_gen, 1);

        let mut s = DiskStore::create(dir.path(), meta.clone(), None).unwrap();
        let v_old = s.verifier().verify(old.clone()).unwrap();
        assert!(s.verifier().verify(new.clone()).is_err(), "generation 1 unknown before the certificate");
        assert!(s.install_rotation(&cert).unwrap());
        assert!(!s.install_rotation(&cert).unwrap(), "idempotent");
        let v_new = s.verifier().verify(new.clone()).unwrap();
        s.append(&[v_old, v_new]).unwrap();
        drop(s);

        // Reopened from disk: the certificate comes back, both records verify.
        let (s, rep) = DiskStore::open(dir.path(), None).unwrap();
        assert!(!rep.is_damaged(), "{rep}");
        assert_eq!(s.len(), 2);
        assert_eq!(s.verifier().key_gen_newest(), 1);
        drop(s);
        // Without the certificate the new generation's record does not verify: the file matters.
        fs::remove_file(dir.path().join(ROTATIONS_FILE)).unwrap();
        let (_s, rep) = DiskStore::open_readonly(dir.path(), None).unwrap();
        assert!(rep.is_damaged(), "the generation-1 record must not verify without its certificate");
        // A damaged rotations file is an error naming it, never a panic.
        fs::write(dir.path().join(ROTATIONS_FILE), b"junk").unwrap();
        let e = DiskStore::open_readonly(dir.path(), None).err().unwrap();
        assert!(e.to_string().contains(ROTATIONS_FILE), "{e}");
    }
}
