//! An operator's check of a live capsule server (issue 15, finding 2): while a node keeps
//! writing to three servers, `psl capsule-server check --dir` and `psl capsule verify` of a
//! running server's directory are run again and again. Neither may ever say DAMAGED or fail:
//! they read a consistent view (what the log held when the check began; what the running
//! server appends meanwhile is its tail, not damage) and say that the server holds the store.
//! `psl capsule-server check --read ADDR` checks through the running server itself. Before the
//! fix the offline check raced the writer and reported "records.log holds record ... that the
//! index does not know" and DAMAGED. A real corruption is still found, live or not.
//! Every wait is bounded; every process is killed at the end.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{start_durable_cluster, start_node};

fn psl(dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_psl")).args(args).current_dir(dir).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.code().unwrap_or(-1), text)
}

#[test]
fn server_check_of_a_live_server_never_reports_false_damage() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let (router, _coord, servers) = start_durable_cluster(d, "check-live");
    let n1 = start_node(d, router.addr(), 1, &["--servers", "3"]);
    // A writer that never stops: small pipelined rounds, so that records land on the servers
    // all the time (many appends, each its own fsync'd batch).
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let bg = {
        let (stop, rounds, addr) = (stop.clone(), rounds.clone(), n1.addr());
        std::thread::spawn(move || {
            let mut c = common::control(addr);
            let mut r = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lines: Vec<String> = (0..20).map(|i| format!("PUT k{} v{r}-{i}", (r * 20 + i) % 500)).collect();
                for a in c.pipeline(&lines).unwrap() {
                    assert_eq!(a, "OK");
                }
                assert_eq!(c.call("SYNC 20000").unwrap(), "OK");
                r += 1;
                rounds.store(r, Ordering::Relaxed);
            }
        })
    };
    common::eventually("writes flowing", || rounds.load(Ordering::Relaxed) >= 5);
    let mut findings = Vec::new();
    let (mut checks, t0) = (0, Instant::now());
    while checks < 40 && t0.elapsed() < Duration::from_secs(60) {
        checks += 1;
        let (code, out) = psl(d, &["capsule-server", "check", "--dir", "s0"]);
        if code != 0 || out.contains("DAMAGED") {
            findings.push(format!("check --dir (exit {code}): {out}"));
        }
        let (code, out) = psl(d, &["capsule", "verify", "s1"]);
        if code != 0 || out.contains("FAILED") {
            findings.push(format!("capsule verify (exit {code}): {out}"));
        }
        let (code, out) = psl(d, &["capsule-server", "check", "--read", &servers[2].line]);
        if code != 0 || out.contains("DAMAGED") {
            findings.push(format!("check --read (exit {code}): {out}"));
        }
        if checks == 1 {
            assert!(out.contains("clean"), "{out}");
        }
    }
    let (_, live) = psl(d, &["capsule-server", "check", "--dir", "s0"]);
    stop.store(true, Ordering::Relaxed);
    bg.join().unwrap();
    assert!(
        findings.is_empty(),
        "{} of {checks} rounds reported damage on healthy live servers:\n{}",
        findings.len(),
        findings.join("\n")
    );
    // The live check says what it covered and how to check through the server.
    assert!(live.contains("held by a running server") && live.contains("--read"), "{live}");

    // A real corruption in the middle of a live server's log is still reported, by both.
    let log = d.join("s0").join("records.log");
    let len = std::fs::metadata(&log).unwrap().len();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&log).unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, len / 2).unwrap();
        f.write_all_at(&[b[0] ^ 0x5a], len / 2).unwrap();
    }
    let (code, out) = psl(d, &["capsule-server", "check", "--dir", "s0"]);
    assert!(code == 1 && out.contains("DAMAGED"), "a flipped byte must be found (exit {code}): {out}");
    let (code, out) = psl(d, &["capsule-server", "check", "--read", &servers[0].line]);
    assert!(code == 1 && out.contains("DAMAGED"), "the server's own check must find it too (exit {code}): {out}");
}
