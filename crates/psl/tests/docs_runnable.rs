//! Docs that cannot rot: every shell block of README.md, docs/tutorial.md and docs/cli.md that
//! is marked runnable is run, with the `psl` this test was built with first on PATH, and the
//! test fails naming the file, the block's line and what the block printed.
//!
//! How a block is marked: an HTML comment alone on the line right before its fence (invisible
//! once rendered), and the fence is ```` ```sh ```` or ```` ```bash ````:
//!
//! - `<!-- runnable -->`: the block runs in a fresh, empty temporary directory;
//! - `<!-- runnable, continued -->`: the block runs in the directory of the file's previous
//!   runnable block, after it (a tutorial's later step uses what an earlier one made).
//!
//! Each block runs as `bash -euo pipefail` (any failing command fails it), in its own process
//! group, which is killed when the block ends (a `psl up &` a failing block leaves behind goes
//! with it) or after [`BLOCK_TIMEOUT`]. Unmarked blocks are not run: those that need root, network
//! namespaces or a long build, and the README's two set-up commands (they build and test the
//! whole workspace); the docs say so beside them.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BLOCK_TIMEOUT: Duration = Duration::from_secs(100);
const MARK: &str = "<!-- runnable -->";
const MARK_CONTINUED: &str = "<!-- runnable, continued -->";

#[derive(Debug, PartialEq, Eq)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    continued: bool,
    script: String,
}

/// The runnable blocks of a markdown text, or what is wrong with a marker.
fn runnable_blocks(text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim();
        let continued = t == MARK_CONTINUED;
        if t != MARK && !continued {
            if t.starts_with("<!--") && t.contains("runnable") {
                return Err(format!("line {}: unknown marker {t:?} (use {MARK} or {MARK_CONTINUED})", i + 1));
            }
            i += 1;
            continue;
        }
        let fence = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        if fence != "```sh" && fence != "```bash" {
            return Err(format!("line {}: {t} is not followed by a ```sh or ```bash fence", i + 1));
        }
        if continued && out.is_empty() {
            return Err(format!("line {}: {t} but no runnable block before it", i + 1));
        }
        let start = i + 1;
        let mut j = start + 1;
        let mut script = String::new();
        while j < lines.len() && lines[j].trim() != "```" {
            script.push_str(lines[j]);
            script.push('\n');
            j += 1;
        }
        if j == lines.len() {
            return Err(format!("line {}: the runnable block is never closed", start + 1));
        }
        out.push(Block { line: start + 1, continued, script });
        i = j + 1;
    }
    Ok(out)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn path_with_psl_first() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_psl")).parent().expect("the binary's directory").to_path_buf();
    let mut dirs = vec![bin];
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(dirs).expect("PATH entries")
}

/// Runs one block in `dir`; its combined output on failure.
fn run_block(b: &Block, dir: &Path, log: &Path, timeout: Duration) -> Result<Duration, String> {
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut child = Command::new("bash")
        .args(["--noprofile", "--norc", "-euo", "pipefail", "-c", &b.script])
        .current_dir(dir)
        .env("PATH", path_with_psl_first())
        .env_remove("PSL_LOG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("bash: {e}"))?;
    let pgid = child.id() as i32;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for bash: {e}")),
        }
    };
    // Whatever the block left running (a background `psl up` when it failed early) goes too.
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        // SAFETY: kill(2) on the process group this test made for the block.
        unsafe {
            libc::kill(-pgid, sig);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = child.wait();
    let mut text = String::new();
    let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_string(&mut text));
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    match status {
        Some(s) if s.success() => Ok(t0.elapsed()),
        Some(s) => Err(format!("exited with {s}; its output (last 80 lines):\n{tail}")),
        None => Err(format!("still running after {timeout:?}, killed; its output (last 80 lines):\n{tail}")),
    }
}

/// Runs every runnable block of `file` (relative to the repository root); fails with each
/// failing block's file, line and output, or if the file marks none.
fn run_file(file: &str) {
    let path = repo_root().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blocks = runnable_blocks(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert!(!blocks.is_empty(), "{file}: no block is marked {MARK}: this test would check nothing");
    for b in &blocks {
        for forbidden in ["scripts/test-all.sh", "cargo "] {
            assert!(
                !b.script.contains(forbidden),
                "{file}:{}: a runnable block runs {forbidden:?} (the set-up commands stay unmarked)",
                b.line
            );
        }
    }
    let logs = tempfile::tempdir().unwrap();
    let mut dir: Option<tempfile::TempDir> = None;
    let mut failures = Vec::new();
    for (n, b) in blocks.iter().enumerate() {
        if !b.continued {
            dir = Some(tempfile::tempdir().unwrap());
        }
        let Some(d) = dir.as_ref().map(|d| d.path()) else {
            failures.push(format!("{file}:{}: not run: it continues a block that failed", b.line));
            continue;
        };
        match run_block(b, d, &logs.path().join(format!("block{n}.log")), BLOCK_TIMEOUT) {
            Ok(took) => eprintln!("{file}:{}: ok in {took:.1?}", b.line),
            Err(why) => {
                failures.push(format!(
                    "{file}:{}: the runnable block failed: {why}\n--- the block ---\n{}",
                    b.line, b.script
                ));
                // The blocks that continue this one would fail for the same reason: not run.
                dir = None;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runnable blocks failed:\n\n{}",
        failures.len(),
        blocks.len(),
        failures.join("\n\n")
    );
}

#[test]
fn readme_runnable_blocks_pass() {
    run_file("README.md");
}

#[test]
fn tutorial_runnable_blocks_pass() {
    run_file("docs/tutorial.md");
}

#[test]
fn markers_are_parsed_and_misplaced_ones_refused() {
    let md = "text\n<!-- runnable -->\n```sh\necho a\necho b\n```\n\n```sh\nnot run\n```\n<!-- runnable, continued -->\n```bash\necho c\n```\n";
    let b = runnable_blocks(md).unwrap();
    assert_eq!(
        b,
        vec![
            Block { line: 3, continued: false, script: "echo a\necho b\n".into() },
            Block { line: 12, continued: true, script: "echo c\n".into() },
        ]
    );
    assert!(runnable_blocks("<!-- runnable -->\n\n```sh\nx\n```\n").unwrap_err().contains("not followed"));
    assert!(runnable_blocks("<!-- runnable -->\n```sh\nx\n").unwrap_err().contains("never closed"));
    assert!(runnable_blocks("<!-- runnable, continued -->\n```sh\nx\n```\n")
        .unwrap_err()
        .contains("no runnable block"));
    assert!(runnable_blocks("<!-- runable -->\n").is_ok(), "a typo without the word is just a comment");
    assert!(runnable_blocks("<!-- runnable please -->\n```sh\nx\n```\n").unwrap_err().contains("unknown marker"));
}

#[test]
fn a_failing_block_is_reported_with_its_output() {
    let d = tempfile::tempdir().unwrap();
    let b = Block { line: 7, continued: false, script: "echo before\npsl --version\nfalse\necho never\n".into() };
    let err = run_block(&b, d.path(), &d.path().join("log"), BLOCK_TIMEOUT).unwrap_err();
    assert!(err.contains("before") && err.contains("psl 0.") && !err.contains("never"), "{err}");
    // The psl on PATH is the one this test was built with.
    let script = format!("test \"$(command -v psl)\" = {:?}\n", env!("CARGO_BIN_EXE_psl"));
    run_block(&Block { line: 1, continued: false, script }, d.path(), &d.path().join("log2"), BLOCK_TIMEOUT).unwrap();
    // A block that outlives its bound is killed, background children and all, and says so.
    let slow = Block { line: 1, continued: false, script: "sleep 300 &\necho $! > bg.pid\nsleep 300\n".into() };
    let t0 = Instant::now();
    let err = run_block(&slow, d.path(), &d.path().join("log3"), Duration::from_secs(1)).unwrap_err();
    assert!(err.contains("still running after 1s"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let bg = std::fs::read_to_string(d.path().join("bg.pid")).unwrap();
    let gone = !Path::new(&format!("/proc/{}", bg.trim())).exists()
        || std::fs::read_to_string(format!("/proc/{}/stat", bg.trim())).is_ok_and(|s| s.contains(") Z "));
    assert!(gone, "the block's background sleep {} still runs", bg.trim());
}
