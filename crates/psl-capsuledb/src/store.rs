//! [`DirStore`]: a [`BlockStore`] in a directory, one file per record (named by the record's
//! hash in hex), written to a temporary name and renamed into place; [`BlockStore::sync`]
//! fsyncs the files written since the last sync and the directory in one go (CapsuleDB calls
//! it before and after each index record, so an index is durable only after its blocks). And
//! the `NEWEST` pointer to the newest index record, which [`crate::CapsuleDb::open`] restarts
//! from. A file torn by a crash before its sync fails verification at read time.
//!
//! The directory is untrusted like any store: every read is verified by [`crate::CapsuleDb`].
//! Several directories (on different disks or machines) give the re-fetch from another copy.

use crate::db::BlockStore;
use crate::RecordHash;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NEWEST: &str = "NEWEST";

#[derive(Debug)]
pub struct DirStore {
    dir: PathBuf,
    /// Files written since the last sync.
    unsynced: std::sync::Mutex<Vec<PathBuf>>,
}

impl DirStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<Arc<DirStore>> {
        fs::create_dir_all(dir)?;
        Ok(Arc::new(DirStore { dir: dir.to_path_buf(), unsynced: std::sync::Mutex::new(Vec::new()) }))
    }

    fn path(&self, hash: &RecordHash) -> PathBuf {
        self.dir.join(format!("{}.rec", hex(hash)))
    }

    fn write_atomic(&self, name: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = name.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, name)
    }

    /// Records the newest index (after its record is stored).
    pub fn set_newest(&self, hash: &RecordHash) -> std::io::Result<()> {
        self.write_atomic(&self.dir.join(NEWEST), hex(hash).as_bytes())?;
        fs::File::open(&self.dir)?.sync_all()
    }

    /// The newest index, if one was recorded. A garbled pointer is an error, not `None`.
    pub fn newest(&self) -> std::io::Result<Option<RecordHash>> {
        let text = match fs::read_to_string(self.dir.join(NEWEST)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        parse_hex(text.trim()).map(Some).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a 64-digit hex hash", self.dir.join(NEWEST).display()),
            )
        })
    }

    /// The file holding record `hash` (tests alter it).
    pub fn record_path(&self, hash: &RecordHash) -> PathBuf {
        self.path(hash)
    }
}

impl BlockStore for DirStore {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        let p = self.path(&hash);
        let tmp = p.with_extension("tmp");
        fs::write(&tmp, &bytes)
            .and_then(|()| fs::rename(&tmp, &p))
            .map_err(|e| std::io::Error::new(e.kind(), format!("capsuledb store: writing {}: {e}", p.display())))?;
        self.unsynced.lock().unwrap_or_else(|e| e.into_inner()).push(p);
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        let files = std::mem::take(&mut *self.unsynced.lock().unwrap_or_else(|e| e.into_inner()));
        if files.is_empty() {
            return Ok(());
        }
        let r = files
            .iter()
            .try_for_each(|p| {
                fs::File::open(p).and_then(|f| f.sync_all()).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("capsuledb store: syncing {}: {e}", p.display()))
                })
            })
            .and_then(|()| fs::File::open(&self.dir)?.sync_all());
        if r.is_err() {
            // Not durable: sync them again next time.
            self.unsynced.lock().unwrap_or_else(|e| e.into_inner()).extend(files);
        }
        r
    }

    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        fs::read(self.path(hash)).ok()
    }
}

fn hex(h: &RecordHash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits.
pub fn parse_hex(s: &str) -> Option<RecordHash> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
