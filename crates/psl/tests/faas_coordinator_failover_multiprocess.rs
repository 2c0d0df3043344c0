//! A job's coordinators as their own processes (`psl up`: two `psl coordinator-host`s, the
//! primary on host 0 and its shadow on host 1, keyed by the leader after attestation), and the
//! job surviving the loss of a role mid-job:
//! - `kill -9` of the primary coordinator's host: the shadow takes over the SYNCs, every
//!   lambda's `sync()` keeps returning and the job's result is the correct one; the next job
//!   makes the surviving host its primary;
//! - `kill -9` of the leader: the coordinators, capsule hosts and workers carry on, `psl up`
//!   starts the leader again on its address, and the client has it take the job back to end it
//!   (capsule closed on every host, coordinators stopped); the next job runs as usual.

mod common;

use common::faas::{finish, kill9, spawn, up};
use std::path::Path;
use std::time::Duration;

/// Rounds of `put` + `sync()` per lambda (the input), then lambda 0 sums every lambda's writes.
const PROGRAM: &str = include_str!("../../psl-faas/tests/data/sync_rounds.js");
const ROUNDS: u64 = 150;
const LAMBDAS: u64 = 4;

/// Starts `psl run` of [`PROGRAM`] with `lambdas` lambdas of `rounds` rounds each.
fn start_job(dir: &Path, cluster: &Path, lambdas: u64, rounds: u64) -> std::process::Child {
    let prog = dir.join("rounds.js");
    std::fs::write(&prog, PROGRAM).unwrap();
    let input = dir.join(format!("rounds-{rounds}.txt"));
    std::fs::write(&input, rounds.to_string()).unwrap();
    spawn(&[
        "run",
        prog.to_str().unwrap(),
        "--lambdas",
        &lambdas.to_string(),
        "--input",
        input.to_str().unwrap(),
        "--json",
        "--cluster",
        cluster.to_str().unwrap(),
    ])
}

/// Bytes of every file under `dir`, recursively (0 if it does not exist yet).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .map_while(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// Waits until the job is under way: at least 1.5 s after its start and its lambdas' records
/// reaching capsule host 0's store (its files grew by 32 KiB since `before`), so that a kill
/// lands mid-job and not while the client is still attesting the leader on a loaded machine.
fn wait_until_under_way(dir: &Path, before: u64) {
    std::thread::sleep(Duration::from_millis(1500));
    let host0 = dir.join("c/server0");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while bytes_under(&host0) < before + (32 << 10) {
        assert!(std::time::Instant::now() < deadline, "the job stored nothing on capsule host 0 in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The job's report; checks it ended ok with every write summed.
fn check_result(o: &std::process::Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "psl run failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let l0 = v["lambdas"].as_array().unwrap().iter().find(|l| l["lambda"] == 0).unwrap();
    let out: serde_json::Value = serde_json::from_str(l0["emitted"][0].as_str().unwrap()).unwrap();
    assert_eq!(out["missing"], 0, "{out}");
    assert_eq!(out["sum"], LAMBDAS * ROUNDS * (ROUNDS - 1) / 2, "{out}");
    v
}

#[test]
fn faas_coordinator_failover_multiprocess_kill9_of_the_primary_leaves_the_job_to_the_shadow() {
    let dir = tempfile::tempdir().unwrap();
    let u = up(dir.path(), &["--workers", "2", "--heartbeat-timeout-ms", "5000"]);
    assert_eq!(u.info.coordinator_hosts.len(), 2, "{:?}", u.info.coordinator_hosts);
    let before = bytes_under(&dir.path().join("c/server0"));
    let job = start_job(dir.path(), &u.file, LAMBDAS, ROUNDS);
    wait_until_under_way(dir.path(), before);
    kill9(u.pid("coordinator host 0"));
    let v = check_result(&finish(job, 90, "psl run"));
    assert!(v["launch"]["total_ms"].as_f64().unwrap() > 1500.0, "the job was still running at the kill: {v}");
    let c = v["coordinators"].as_array().unwrap();
    assert_eq!(c.len(), 2, "{v}");
    assert_eq!((c[0]["rank"].as_u64(), c[1]["rank"].as_u64()), (Some(0), Some(1)));
    assert_eq!(c[0]["alive"], false, "the primary's host was killed: {}", c[0]);
    assert_eq!(c[1]["alive"], true, "{}", c[1]);
    assert!(c[1]["records_written"].as_u64().unwrap() > 10, "the shadow took over the SYNCs: {}", c[1]);
    assert!(c[1]["epoch"].as_u64().unwrap() >> 32 >= 1, "the job ended in the shadow's term: {}", c[1]);
    // The capsule hosts stored the job throughout.
    let stored = v["stored_records"].as_array().unwrap();
    assert_eq!(stored.len(), 3, "{v}");
    assert!(stored.iter().all(|s| s[1].as_u64().unwrap() > 0), "{v}");
    // The next job, with host 0 still down: host 1 is its primary (rank 0) from the start.
    let o = finish(start_job(dir.path(), &u.file, 2, 5), 60, "the second psl run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let c = v["coordinators"].as_array().unwrap();
    assert_eq!(c.len(), 1, "{v}");
    assert_eq!((c[0]["host"].as_u64(), c[0]["rank"].as_u64()), (Some(1), Some(0)), "{v}");
    assert_eq!(c[0]["epoch"].as_u64().unwrap() >> 32, 0, "no takeover was needed: {v}");
}

#[test]
fn faas_coordinator_failover_multiprocess_kill9_of_the_leader_mid_job_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let u = up(dir.path(), &["--workers", "2", "--heartbeat-timeout-ms", "5000"]);
    let before = bytes_under(&dir.path().join("c/server0"));
    let job = start_job(dir.path(), &u.file, LAMBDAS, ROUNDS);
    wait_until_under_way(dir.path(), before);
    kill9(u.pid("leader"));
    let o = finish(job, 90, "psl run");
    let v = check_result(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("the leader went away during the job"), "the leader was lost mid-job: {stderr}");
    assert!(v["launch"]["total_ms"].as_f64().unwrap() > 1500.0, "the job was still running at the kill: {v}");
    // The restarted leader took the job back: it closed the capsule on every host (each had
    // kept serving it) and stopped both coordinators (each had kept running).
    let stored = v["stored_records"].as_array().unwrap();
    assert_eq!(stored.len(), 3, "{v}");
    assert!(stored.iter().all(|s| s[1].as_u64().unwrap() > 0), "{v}");
    let c = v["coordinators"].as_array().unwrap();
    assert_eq!(c.len(), 2, "{v}");
    assert!(c.iter().all(|c| c["alive"] == true), "{v}");
    // The primary wrote the SYNCs (or, after a stall of a loaded machine, the shadow did).
    assert!(c.iter().any(|c| c["records_written"].as_u64().unwrap() > 10), "{v}");
    let log = std::fs::read_to_string(dir.path().join("up.log")).unwrap();
    assert!(log.contains("starting it again"), "psl up restarted the leader: {log}");
    // The deployment runs the next job as usual.
    let o = finish(start_job(dir.path(), &u.file, 2, 5), 60, "the second psl run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
}
