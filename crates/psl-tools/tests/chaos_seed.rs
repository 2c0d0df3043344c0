//! `psl chaos` end to end: a few seeded fault schedules over real processes on loopback (kills,
//! pauses, restarts with and without state, fabric cuts, a lossy and reordering router), then
//! the checker over the whole history. Longer runs belong to `psl chaos --seeds N`; this keeps
//! the command itself working and its failures explained (seed and replay command).
//! Bounded: the command is killed if it runs past its deadline.
//!
//! The tool (`psl-tools chaos`, what `psl chaos` runs) starts the `psl` binary beside it for
//! the roles: `cargo test --workspace` builds both; with `-p psl-tools` alone, build `psl`
//! first (`cargo build -p psl`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn psl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_psl-tools"))
}

#[test]
fn a_seed_decides_schedule_and_workload_exactly() {
    let run = || {
        let out = psl().args(["chaos", "--seeds", "2", "--start", "11", "--dry-run"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b, "a dry run must print the same schedule and workload for the same seeds");
    let lines: Vec<serde_json::Value> = a.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["seed"], 11);
    assert_ne!(lines[0]["schedule"], lines[1]["schedule"], "two seeds, two schedules");
}

/// The short form CI runs: a handful of seeds, each a 3-second fault phase.
const SEEDS: u64 = 3;
const START: u64 = 3;

/// Runs `psl chaos` on `seeds` seeds from `start` (3-second fault phases, no disk faults, with
/// `extra` arguments) in `dir`, bounded; requires every seed to pass every check and its report
/// to name how to replay it. Returns every seed's report.
/// One `psl chaos` at a time: each process picks its ports itself (free, outside the ephemeral
/// range), and a port a crashed node leaves free until its restart can be picked meanwhile by a
/// second `psl chaos` (CI: "binding the control address ...: Address already in use").
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeds_pass(dir: &std::path::Path, start: u64, seeds: u64, extra: &[&str]) -> Vec<serde_json::Value> {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    #[rustfmt::skip]
    let mut child = psl()
        .args(["chaos", "--seeds", &seeds.to_string(), "--start", &start.to_string(), "--fault-ms", "3000",
               "--disk-faults", "off", "--json", "--dir", dir.to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(480);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("psl chaos ran past its deadline");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reports: Vec<serde_json::Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    for n in start..start + seeds {
        let seed = reports
            .iter()
            .find(|r| r["seed"] == n)
            .unwrap_or_else(|| panic!("no report of seed {n}: {stdout} {stderr}"));
        // Whatever the outcome, the report names how to replay it.
        let replay = seed["replay"].as_str().unwrap();
        assert!(replay.contains(&format!("--start {n} --fault-ms 3000 --disk-faults off")), "{replay}");
        if let Some(i) = extra.iter().position(|a| *a == "--front-ends") {
            let want = format!("--front-ends {}", extra[i + 1]);
            assert!(replay.contains(&want), "{replay} lacks {want}");
        }
        assert!(seed["writes"].as_u64().unwrap() > 0 && seed["steps"].as_u64().unwrap() > 0, "{seed}");
        assert!(
            seed["ok"] == true,
            "seed {n} failed; replay with `{replay}`; violations: {}\n{stderr}",
            seed["violations"]
        );
    }
    assert!(status.success(), "psl chaos exited with {status}\n{stderr}");
    let summary = reports.iter().find(|r| r["summary"] == true).unwrap();
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["seeds"], seeds);
    reports.into_iter().filter(|r| r["summary"] != true).collect()
}

#[test]
fn a_handful_of_seeds_over_real_processes_pass_every_check() {
    let t = tempfile::tempdir().unwrap();
    seeds_pass(&t.path().join("chaos"), START, SEEDS, &[]);
}

/// Seed 27 with three front ends kills front end 0 (the home of slot 0) for 2.5 s of its
/// 3-second fault phase: the survivors take its slot over while the cas clients run, and the
/// checker finds no lost or doubled `cas`. The front ends' logs show the takeover.
#[test]
fn a_seed_that_kills_a_home_front_end_passes_every_check_with_failover() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("chaos");
    seeds_pass(&dir, 27, 1, &["--front-ends", "3", "--keep"]);
    let logs = dir.join("seed-27").join("logs");
    let took_over = std::fs::read_dir(&logs)
        .unwrap_or_else(|e| panic!("{}: {e}", logs.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("mc"))
        .any(|e| {
            std::fs::read_to_string(e.path()).unwrap_or_default().contains("took over another front end's home slot")
        });
    assert!(took_over, "no front end took over the killed one's slot (logs in {})", logs.display());
}

/// `psl chaos --byzantine`: one short seed in which the runner also holds a leaked certified
/// writer key. It writes honest records, the coordinators revoke it mid-run (`REVOKE` signed
/// with the operator key), and it goes on publishing records it withheld, forged records
/// claiming old and new epochs, equivocating copies and replays. The seed must pass every
/// check, `byzantine` included (no node or front end shows a `byz/post/` key, no server stores
/// the writer's chain at or past the revocation's seq bound), its replay command must name
/// `--byzantine`, and the attack must really have happened: revoked, records sent after the
/// revocation, and refused as `revoked` by the nodes. The lying capsule server of the same mode
/// (listed first for every restarted node, CapsuleDB and one final recovery) must have been
/// read from and have lied, and that recovery must hold every durable write and nothing the
/// revocation covers (the seed's checks).
#[test]
fn a_revoked_writer_that_keeps_forging_is_applied_and_stored_nowhere() {
    let t = tempfile::tempdir().unwrap();
    let reports = seeds_pass(&t.path().join("chaos"), 3, 1, &["--byzantine"]);
    let seed = &reports[0];
    let replay = seed["replay"].as_str().unwrap();
    assert!(replay.contains("--byzantine"), "{replay}");
    let b = &seed["byzantine"];
    assert!(b["revoked"]["from_seq"].as_u64().is_some(), "the writer was revoked: {b}");
    assert!(b["withheld"].as_u64().unwrap() > 0, "withheld records were published: {b}");
    assert!(b["forged"].as_u64().unwrap() > 0, "forged records were published: {b}");
    assert!(b["equivocations"].as_u64().unwrap() > 0 && b["replays"].as_u64().unwrap() > 0, "{b}");
    assert!(b["refused_revoked"].as_u64().unwrap() > 0, "the nodes refused records as revoked: {b}");
    assert!(b["pre_applied"].as_u64().unwrap() > 0, "records before the revocation were applied: {b}");
    assert_eq!(b["errors"].as_array().map(Vec::len), Some(0), "{b}");
    // The lying capsule server was asked, and lied the way its mode says (seed 3 at 3 s: stale
    // and forged): a frozen copy, the leaked writer's chain claimed, its revocation withheld.
    let r = &b["rogue"];
    assert!(r["requests"].as_u64().unwrap() > 0, "the rogue was read from: {r}");
    let mode = r["mode"].as_str().unwrap();
    if mode.contains("Stale") {
        assert!(r["frozen_at_ms"].as_u64().is_some() && r["stale_answers"].as_u64().unwrap() > 0, "{r}");
    }
    if mode.contains("Forged") {
        assert!(r["revocations_withheld"].as_u64().unwrap() > 0, "{r}");
        assert!(r["forged_heads"].as_u64().unwrap() > 0, "{r}");
    }
}
