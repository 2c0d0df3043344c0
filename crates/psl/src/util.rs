//! File helpers shared by the commands.

use anyhow::{bail, Context, Result};
use psl_capsule::SignedMetadata;
use psl_crypto::{DataKey, OwnerKey};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. A crash leaves either the old file or the new one.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().context("output path has no file name")?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes).with_context(|| format!("writing {}", tmp.display()))?;
    f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))?;
    Ok(())
}

pub fn read_owner_key(path: &Path) -> Result<OwnerKey> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("reading key file {}", path.display()))?,
    );
    OwnerKey::from_file_string(&text).with_context(|| format!("key file {}", path.display()))
}

/// The data key of a capsule, derived from the owner key; refuses a key of another owner.
pub fn data_key_for(owner: &OwnerKey, meta: &SignedMetadata) -> Result<DataKey> {
    if owner.public() != meta.meta.owner {
        bail!("the key file is not the owner key of this capsule (owner {} expected)", meta.meta.owner);
    }
    Ok(owner.app(meta.meta.app_index)?.data_key())
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Shows bytes as text when printable, else as hex.
pub fn show_bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => s.to_string(),
        _ => format!("0x{}", hex::encode(b)),
    }
}
