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

/// Reads an owner key file (`psl keys new`); the file's text is zeroed once parsed.
pub fn read_owner_key(path: &Path) -> Result<OwnerKey> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("reading key file {}", path.display()))?,
    );
    OwnerKey::from_file_string(&text).with_context(|| format!("key file {}", path.display()))
}

/// Reads the operator's control public key (`control.pub`), what roles check commands with.
pub fn read_control_pub(path: &Path) -> Result<psl_crypto::VerifyingKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    psl_node::control::operator_pub_from_text(&text).with_context(|| format!("{}", path.display()))
}

/// Reads the operator's control key (`control.key`, secret), what control clients sign with.
pub fn read_control_key(path: &Path) -> Result<std::sync::Arc<psl_crypto::SigningKey>> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("reading key file {}", path.display()))?,
    );
    let k = psl_node::control::operator_key_from_text(&text).with_context(|| format!("{}", path.display()))?;
    Ok(std::sync::Arc::new(k))
}

/// Writes a new operator control key pair: `key` (secret, mode 0600) and `public` (0644).
/// Keeps an existing pair (returns false).
pub fn write_control_keys(key: &Path, public: &Path) -> Result<bool> {
    if key.exists() {
        let k = read_control_key(key)?;
        if !public.exists() {
            write_atomic(public, psl_node::control::operator_pub_text(&k.verifying_key()).as_bytes(), 0o644)?;
        }
        return Ok(false);
    }
    let k = psl_node::control::generate_operator_key();
    write_atomic(key, psl_node::control::operator_key_text(&k).as_bytes(), 0o600)?;
    write_atomic(public, psl_node::control::operator_pub_text(&k.verifying_key()).as_bytes(), 0o644)?;
    Ok(true)
}

/// The data key of a capsule, derived from the owner key; refuses a key of another owner.
pub fn data_key_for(owner: &OwnerKey, meta: &SignedMetadata) -> Result<DataKey> {
    if owner.public() != meta.meta.owner {
        bail!("the key file is not the owner key of this capsule (owner {} expected)", meta.meta.owner);
    }
    Ok(owner.app(meta.meta.app_index)?.data_key())
}

/// Milliseconds since the Unix epoch (0 if the clock is set before it).
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

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_message(what.to_string());
    pb
}

/// The binary `name` in this executable's directory: `psl` and `psl-tools` are built and
/// installed side by side, and each runs the other from there (`psl bench` runs `psl-tools`;
/// the tools start `psl` roles). From a test binary (`target/*/deps`), the directory above.
pub fn sibling_exe(name: &str) -> Result<std::path::PathBuf> {
    let me = std::env::current_exe().context("finding this binary")?;
    let dir = me.parent().context("this binary's directory")?;
    let beside = dir.join(name);
    if beside.is_file() {
        return Ok(beside);
    }
    if dir.file_name() == Some(std::ffi::OsStr::new("deps")) {
        if let Some(up) = dir.parent().map(|d| d.join(name)).filter(|p| p.is_file()) {
            return Ok(up);
        }
    }
    bail!(
        "{} not found: `{name}` is a binary of its own, installed beside {}; build it with \
         `cargo build --release -p {name}` (or `cargo build -p {name}`) and put it there",
        beside.display(),
        me.display()
    )
}
