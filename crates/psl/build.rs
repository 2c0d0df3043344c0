//! Names the git commit this `psl` was built from, for `psl --version`: `PSL_GIT_COMMIT` is
//! `git rev-parse --short HEAD`, or "unknown" where git or the repository is absent (a source
//! tarball, a vendored copy). Rebuilds when HEAD moves: on a new commit or a branch switch.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=PSL_GIT_COMMIT={commit}");
    // HEAD, the ref it points to (a loose file, or packed-refs once git packs it), each only
    // if it exists: without a repository the build script runs once and says "unknown".
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        watch(&absolute(&head));
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &r]) {
            watch(&absolute(&p));
        }
    }
    if let Some(p) = git(&["rev-parse", "--git-path", "packed-refs"]) {
        watch(&absolute(&p));
    }
}

/// `git rev-parse --git-path` answers relative to the current directory (the crate's).
fn absolute(p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}
