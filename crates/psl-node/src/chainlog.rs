//! The coordinator's own-chain log: every record the coordinator writer signs is appended and
//! fsync'd here *before* it is published, so a coordinator restarted on the same state directory
//! knows the newest seq it ever let out and never signs a second record for it (equivocation).
//!
//! A coordinator's writer index has no incarnation (the policy names coordinator writers by rank),
//! so without this log a restarted coordinator could learn its own chain only from its peers
//! during the rejoin period, and a coordinator that came back while its peers were cut off or
//! restarting signed its slots again from seq 0 (found by `psl chaos`, seed 115).
//!
//! File `coordinator-chain` in the state directory: frames of `len: u32 LE` then `len` bytes of
//! one encoded record, in chain order. Only the newest [`KEEP_RECORDS`] matter; the file is
//! rewritten with just those (temporary file, fsync, rename, fsync of the directory) every
//! [`COMPACT_AFTER`] appends. A crash can tear only the last frame (it was never fsync'd, so the
//! record it held was never published): [`parse`] drops a torn last frame and refuses anything
//! else that does not decode.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Records kept when the file is compacted (the restarted coordinator re-offers them to peers).
pub const KEEP_RECORDS: usize = 64;
/// Appends between two compactions.
pub const COMPACT_AFTER: usize = 4096;
/// The largest frame accepted (a record is far smaller; anything larger is damage).
pub const FRAME_BYTES_MAX: usize = 16 << 20;
const FILE: &str = "coordinator-chain";

/// Why the coordinator's own-chain log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum ChainLogError {
    /// A file operation (opening, reading, appending, syncing, compacting) failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file the operation was on.
        path: PathBuf,
        /// What was being done, e.g. `"appending"` or `"syncing"`.
        op: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The log is damaged before its last frame (a torn last frame is dropped, not this).
    #[error("{path}: damaged at byte {offset}: {what} (not a torn last write; refusing to guess the coordinator's newest seq)")]
    Damaged {
        /// The log file.
        path: PathBuf,
        /// Byte offset of the damaged frame.
        offset: usize,
        /// What is wrong with it.
        what: String,
    },
}

/// What [`parse`] found: the frames' payloads, and whether a torn last frame was dropped.
#[derive(Debug, PartialEq, Eq)]
pub struct Parsed<'a> {
    /// The payloads of the whole frames, in file order.
    pub frames: Vec<&'a [u8]>,
    /// Bytes of the torn last frame that was dropped (0: none).
    pub torn_tail_bytes: usize,
}

/// Splits a log file's bytes into frames. A last frame cut short is dropped (reported in
/// `torn_tail_bytes`); a frame that claims more than [`FRAME_BYTES_MAX`] bytes is damage.
/// Never panics, whatever the bytes.
pub fn parse(bytes: &[u8]) -> Result<Parsed<'_>, (usize, String)> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(len) = bytes.get(at..at + 4) else {
            return Ok(Parsed { frames, torn_tail_bytes: bytes.len() - at });
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len == 0 || len > FRAME_BYTES_MAX {
            return Err((at, format!("frame length {len} (1 to {FRAME_BYTES_MAX})")));
        }
        match bytes.get(at + 4..at + 4 + len) {
            Some(p) => frames.push(p),
            None => return Ok(Parsed { frames, torn_tail_bytes: bytes.len() - at }),
        }
        at += 4 + len;
    }
    Ok(Parsed { frames, torn_tail_bytes: 0 })
}

/// The open log: appends, fsyncs, compacts.
#[derive(Debug)]
pub struct ChainLog {
    dir: PathBuf,
    file: File,
    /// The newest records (at most [`KEEP_RECORDS`]), for compaction.
    recent: std::collections::VecDeque<Vec<u8>>,
    appended: usize,
}

impl ChainLog {
    fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// Opens (creating) the log in `dir`. Returns it with the records it holds, oldest first; the
    /// caller verifies them (a record that does not verify is damage too). A torn last frame is
    /// cut off the file before appending resumes.
    pub fn open(dir: &Path) -> Result<(ChainLog, Vec<Vec<u8>>), ChainLogError> {
        let path = Self::path(dir);
        let io = |op, source| ChainLogError::Io { path: path.clone(), op, source };
        std::fs::create_dir_all(dir).map_err(|e| io("creating the state directory", e))?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io("reading", e)),
        };
        let parsed =
            parse(&bytes).map_err(|(offset, what)| ChainLogError::Damaged { path: path.clone(), offset, what })?;
        let records: Vec<Vec<u8>> = parsed.frames.iter().map(|f| f.to_vec()).collect();
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(|e| io("opening", e))?;
        if parsed.torn_tail_bytes > 0 {
            tracing::warn!(path = %path.display(), bytes = parsed.torn_tail_bytes, "dropping a torn last frame (never published)");
            file.set_len((bytes.len() - parsed.torn_tail_bytes) as u64).map_err(|e| io("truncating a torn tail", e))?;
            file.sync_all().map_err(|e| io("syncing", e))?;
        }
        let recent = records.iter().rev().take(KEEP_RECORDS).rev().cloned().collect();
        Ok((ChainLog { dir: dir.to_path_buf(), file, recent, appended: records.len() }, records))
    }

    /// Appends one encoded record and fsyncs it. Only after this returns may the record be
    /// published.
    pub fn append(&mut self, record: &[u8]) -> Result<(), ChainLogError> {
        let path = Self::path(&self.dir);
        if record.is_empty() || record.len() > FRAME_BYTES_MAX {
            return Err(ChainLogError::Damaged { path, offset: 0, what: format!("record of {} bytes", record.len()) });
        }
        let mut frame = Vec::with_capacity(4 + record.len());
        frame.extend_from_slice(&(record.len() as u32).to_le_bytes());
        frame.extend_from_slice(record);
        self.file.write_all(&frame).map_err(|e| ChainLogError::Io {
            path: path.clone(),
            op: "appending",
            source: e,
        })?;
        self.file.sync_data().map_err(|e| ChainLogError::Io { path, op: "syncing", source: e })?;
        self.recent.push_back(record.to_vec());
        while self.recent.len() > KEEP_RECORDS {
            self.recent.pop_front();
        }
        self.appended += 1;
        if self.appended >= COMPACT_AFTER {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the file with the newest records only.
    fn compact(&mut self) -> Result<(), ChainLogError> {
        let path = Self::path(&self.dir);
        let tmp = self.dir.join(format!(".{FILE}.tmp"));
        let io = |op, source| ChainLogError::Io { path: tmp.clone(), op, source };
        let mut bytes = Vec::new();
        for r in &self.recent {
            bytes.extend_from_slice(&(r.len() as u32).to_le_bytes());
            bytes.extend_from_slice(r);
        }
        let mut f = File::create(&tmp).map_err(|e| io("creating", e))?;
        f.write_all(&bytes).map_err(|e| io("writing", e))?;
        f.sync_all().map_err(|e| io("syncing", e))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(|e| io("renaming over the log", e))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing the directory", e))?;
        self.file = OpenOptions::new().append(true).open(&path).map_err(|e| io("reopening", e))?;
        self.appended = self.recent.len();
        Ok(())
    }
}

/// The engine's coordinator writes through this log: a record is published only once appended.
impl psl_scl::engine::CoordinatorLog for ChainLog {
    fn append(&mut self, rec: &psl_capsule::Record) -> Result<(), String> {
        ChainLog::append(self, rec.bytes()).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_survive_reopen_and_compaction_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, old) = ChainLog::open(dir.path()).unwrap();
            assert!(old.is_empty());
            for i in 0..(COMPACT_AFTER + 10) as u32 {
                log.append(&i.to_le_bytes()).unwrap();
            }
        }
        let (_, records) = ChainLog::open(dir.path()).unwrap();
        assert!(records.len() >= KEEP_RECORDS && records.len() < COMPACT_AFTER, "{} records", records.len());
        let last = u32::from_le_bytes(records.last().unwrap()[..4].try_into().unwrap());
        assert_eq!(last, (COMPACT_AFTER + 9) as u32, "the newest record is kept");
        let first = u32::from_le_bytes(records[0][..4].try_into().unwrap());
        assert_eq!(last - first + 1, records.len() as u32, "consecutive, oldest first");
    }

    #[test]
    fn a_torn_last_frame_is_dropped_and_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, _) = ChainLog::open(dir.path()).unwrap();
            log.append(b"one").unwrap();
            log.append(b"two").unwrap();
        }
        let p = dir.path().join(FILE);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&[9, 0, 0, 0, b't', b'o']).unwrap();
        drop(f);
        let (mut log, records) = ChainLog::open(dir.path()).unwrap();
        assert_eq!(records, vec![b"one".to_vec(), b"two".to_vec()]);
        log.append(b"three").unwrap();
        drop(log);
        let (_, records) = ChainLog::open(dir.path()).unwrap();
        assert_eq!(records, vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    }

    #[test]
    fn damage_before_the_tail_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), [0u8, 0, 0, 0, 1, 2, 3]).unwrap();
        let e = ChainLog::open(dir.path()).unwrap_err();
        assert!(matches!(e, ChainLogError::Damaged { offset: 0, .. }), "{e}");
        assert!(e.to_string().contains("coordinator-chain"), "{e}");
    }

    #[test]
    fn parse_never_panics_on_short_or_huge_lengths() {
        for bytes in [&[][..], &[1][..], &[1, 0, 0, 0][..], &[255, 255, 255, 255, 0][..], &[2, 0, 0, 0, 7][..]] {
            let _ = parse(bytes);
        }
        assert_eq!(parse(&[2, 0, 0, 0, 7, 8]).unwrap(), Parsed { frames: vec![&[7, 8][..]], torn_tail_bytes: 0 });
    }
}
