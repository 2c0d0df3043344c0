//! `psl chaos --byzantine` end to end: one short seed over real processes in which the runner
//! also holds a leaked certified writer key. It writes honest records, the coordinators revoke
//! it mid-run (`REVOKE` signed with the operator key), and it goes on publishing records it
//! withheld, forged records claiming old and new epochs, equivocating copies and replays. The
//! seed must pass every check, `byzantine` included (no node or front end shows a `byz/post/`
//! key, no server stores the writer's chain at or past the revocation's seq bound), its report
//! must name how to replay it (with `--byzantine`), and the attack must really have happened:
//! revoked, records sent after the revocation, and refused as `revoked` by the nodes.
//! Bounded: the command is killed if it runs past its deadline.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SEED: u64 = 3;

#[test]
fn a_revoked_writer_that_keeps_forging_is_applied_and_stored_nowhere() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("chaos");
    #[rustfmt::skip]
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["chaos", "--seeds", "1", "--start", &SEED.to_string(), "--fault-ms", "3000",
               "--disk-faults", "off", "--byzantine", "--json", "--dir", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("psl chaos --byzantine ran past its deadline");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reports: Vec<serde_json::Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let seed = reports.iter().find(|r| r["seed"] == SEED).unwrap_or_else(|| panic!("no report: {stdout} {stderr}"));
    let replay = seed["replay"].as_str().unwrap();
    assert!(replay.contains(&format!("--start {SEED} --fault-ms 3000 --disk-faults off --byzantine")), "{replay}");
    assert!(
        seed["ok"] == true,
        "seed {SEED} failed; replay with `{replay}`; violations: {}\n{stderr}",
        seed["violations"]
    );
    assert!(status.success(), "psl chaos exited with {status}\n{stderr}");
    let b = &seed["byzantine"];
    assert!(b["revoked"]["from_seq"].as_u64().is_some(), "the writer was revoked: {b}");
    assert!(b["withheld"].as_u64().unwrap() > 0, "withheld records were published: {b}");
    assert!(b["forged"].as_u64().unwrap() > 0, "forged records were published: {b}");
    assert!(b["equivocations"].as_u64().unwrap() > 0 && b["replays"].as_u64().unwrap() > 0, "{b}");
    assert!(b["refused_revoked"].as_u64().unwrap() > 0, "the nodes refused records as revoked: {b}");
    assert!(b["pre_applied"].as_u64().unwrap() > 0, "records before the revocation were applied: {b}");
    assert_eq!(b["errors"].as_array().map(Vec::len), Some(0), "{b}");
}
