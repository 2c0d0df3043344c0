//! `psl run examples/wordcount.js --lambdas 4 --json --capsule-out F`, then
//! `psl capsule verify F` (and with the owner key, which also decrypts every body).

use std::process::Command;

#[test]
fn run_wordcount_cli_json_and_capsule_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let psl = env!("CARGO_BIN_EXE_psl");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b a\nc a b\nd\n").unwrap();
    let key = dir.path().join("owner.key");
    assert!(Command::new(psl).args(["keys", "new", "--out"]).arg(&key).status().unwrap().success());
    let cap = dir.path().join("job.capsule");
    let out = Command::new(psl)
        .arg("run")
        .arg(root.join("examples/wordcount.js"))
        .args(["--lambdas", "4", "--json", "--input"])
        .arg(&input)
        .arg("--owner")
        .arg(&key)
        .arg("--capsule-out")
        .arg(&cap)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    let counts: serde_json::Value = serde_json::from_str(v["lambdas"][0]["emitted"][1].as_str().unwrap()).unwrap();
    assert_eq!(counts, serde_json::json!({"a": 3, "b": 2, "c": 1, "d": 1}));
    for k in [
        "client_to_scheduler_ms",
        "scheduler_to_workers_ms",
        "attestation_ms",
        "key_delivery_ms",
        "program_load_ms",
        "first_op_ms",
        "launch_ms",
    ] {
        assert!(v["launch"][k].is_number(), "{k}");
    }
    for extra in [vec![], vec!["--key".to_string(), key.display().to_string()]] {
        let st = Command::new(psl).args(["capsule", "verify"]).arg(&cap).args(&extra).status().unwrap();
        assert!(st.success(), "capsule verify {extra:?}");
    }
    // The job capsule certifies its writers, and the workers' RESET at the job's end revoked
    // every worker writer (the coordinator carried the revocations into the log).
    let o = Command::new(psl).args(["capsule", "show", "--json"]).arg(&cap).output().unwrap();
    let show: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(show["writer_keys"], "certified");
    let coordinator = psl_capsule::DEFAULT_COORDINATOR as u64;
    let certified: Vec<u64> =
        show["certificates"].as_array().unwrap().iter().map(|c| c["writer"].as_u64().unwrap()).collect();
    // The primary coordinator and its shadow (each on its own coordinator host) introduced
    // themselves in the log.
    assert!(certified.contains(&coordinator) && certified.contains(&(coordinator - 1)), "{show}");
    let workers: Vec<u64> = certified.iter().copied().filter(|w| *w + 3 <= coordinator).collect();
    assert!(!workers.is_empty(), "{show}");
    let revoked: Vec<u64> =
        show["revocations"].as_array().unwrap().iter().map(|r| r["writer"].as_u64().unwrap()).collect();
    for w in &workers {
        assert!(revoked.contains(w), "worker writer {w} not revoked at RESET: {revoked:?}");
    }
    assert!(!revoked.contains(&coordinator) && !revoked.contains(&(coordinator - 1)));
}
