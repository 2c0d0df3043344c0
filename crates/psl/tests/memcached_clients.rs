//! Real memcached clients against `psl memcached` (the binary, embedded default): the Python
//! `pymemcache` and `pylibmc` (libmemcached) scripts of `crates/psl-memcached/tests/clients/`,
//! and Debian's `memcaslap` load generator. `scripts/install-memcached-test-deps.sh` installs
//! them; a missing one is skipped with a loud message, never silently.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["memcached", "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port =
        line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("bad line {line:?}"));
    Server { child, port }
}

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../psl-memcached/tests/clients")
}

fn python_has(module: &str) -> bool {
    Command::new("python3").args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
}

fn run_script(script: &str, module: &str, port: u16) {
    if !python_has(module) {
        eprintln!(
            "\n!!!!!!!! SKIPPED {script}: python3 module `{module}` is missing; run scripts/install-memcached-test-deps.sh !!!!!!!!\n"
        );
        return;
    }
    let out = Command::new("python3")
        .arg(clients_dir().join(script))
        .args(["127.0.0.1", &port.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
}

#[test]
fn pymemcache_and_pylibmc_scripts_pass() {
    let srv = start(&[]);
    run_script("pymemcache_client.py", "pymemcache", srv.port);
    run_script("pylibmc_client.py", "pylibmc", srv.port);
}

fn memcaslap() -> Option<&'static str> {
    ["memcaslap", "memaslap", "memcslap"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success() || !o.stdout.is_empty()))
}

#[test]
fn memcaslap_runs_without_errors() {
    let Some(bin) = memcaslap() else {
        eprintln!("\n!!!!!!!! SKIPPED memcaslap: not installed; run scripts/install-memcached-test-deps.sh !!!!!!!!\n");
        return;
    };
    let srv = start(&["--replicas", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mix.cfg");
    std::fs::write(&cfg, "key\n30 30 1\nvalue\n100 100 1\ncmd\n0 0.1\n1 0.9\n").unwrap();
    let out = Command::new(bin)
        .args(["-s", &format!("127.0.0.1:{}", srv.port), "-t", "3s", "-T", "1", "-c", "16", "-w", "1k", "-v", "0.1"])
        .arg("-F")
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{bin} failed:\n{text}");
    let ops: u64 = text
        .lines()
        .find_map(|l| l.split("Ops: ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no Ops in:\n{text}"));
    assert!(ops > 1000, "{text}");
    // memcaslap counts failed verifications and unexpected replies.
    for bad in ["verify_failed: ", "unexp_unget: "] {
        if let Some(n) = text.lines().find_map(|l| l.trim().strip_prefix(bad)) {
            assert_eq!(n.trim(), "0", "{bad}{n}\n{text}");
        }
    }
    for bad in ["ERROR", "error"] {
        assert!(!text.contains(bad), "{text}");
    }
    // The mix really ran gets, and they hit.
    let count = |name: &str| -> u64 {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(name))
            .filter_map(|n| n.trim().parse().ok())
            .next_back()
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    };
    assert!(count("cmd_get:") > count("cmd_set:"), "{text}");
    assert!(count("get_misses:") * 100 <= count("cmd_get:"), "{text}");
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn memccapable_ascii_conformance_suite_passes() {
    if Command::new("memccapable").arg("--help").output().is_err() {
        eprintln!(
            "\n!!!!!!!! SKIPPED memccapable: not installed; run scripts/install-memcached-test-deps.sh !!!!!!!!\n"
        );
        return;
    }
    let srv = start(&[]);
    let out =
        Command::new("memccapable").args(["-h", "127.0.0.1", "-p", &srv.port.to_string(), "-a"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !text.contains("FAIL"), "memccapable -a:\n{text}");
    assert!(text.contains("ascii cas") && text.contains("[pass]"), "{text}");
}
