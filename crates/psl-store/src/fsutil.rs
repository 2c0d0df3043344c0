//! Small file-system helpers: positional I/O, directory fsync, atomic file creation.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

#[cfg(not(unix))]
compile_error!("psl-store uses positional file I/O and directory fsync, which it implements for unix only");

/// Reads exactly `buf.len()` bytes at `offset` without moving any file cursor.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Writes all of `buf` at `offset` without moving any file cursor.
pub(crate) fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
}

/// Makes a directory's entries (creations, renames) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` so that after a crash `path` holds either nothing or all of them:
/// write a temporary file, fsync it, rename it into place, fsync the directory.
/// Fails if `path` already exists.
pub(crate) fn write_new_atomic(dir: &Path, path: &Path, tmp: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    if path.exists() {
        let _ = fs::remove_file(tmp);
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file appeared while it was being created"));
    }
    fs::rename(tmp, path)?;
    sync_dir(dir)
}

/// Writes `bytes` to `path` through `tmp` (write, fsync, rename over any old file, directory
/// fsync): after a crash `path` holds either the old or the new bytes.
pub(crate) fn replace_atomic(dir: &Path, path: &Path, tmp: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(tmp, path)?;
    sync_dir(dir)
}
