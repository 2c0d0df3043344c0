//! Application key rotation over the multi-process deployment (`psl up` and
//! `psl run --cluster --rotate-after-ms`): the client asks the leader mid-job, the leader sends
//! each worker its sealed bundle over the worker's attested TLS channel and each capsule host
//! the certificate; the job completes with every write read back, the recorded capsule
//! verifies with both key generations, and every host's store (which keeps the certificate in
//! `rotations.bin`) checks clean when opened again from disk.

use psl_capsule::{audit_file, audit_file_rotated, Kind, RotationCert};
use psl_crypto::OwnerKey;
use std::process::Output;

mod common;

use common::faas::{finish, spawn, up};

fn run(args: &[&str]) -> Output {
    finish(spawn(args), 60, &format!("psl {args:?}"))
}

/// Writes across the rotation, then lambda 0 reads every key back (shared with the embedded test).
const PROGRAM: &str = include_str!("../../psl-faas/tests/data/write_across_rotation.js");

#[test]
fn faas_multiprocess_key_rotation_mid_job() {
    let dir = tempfile::tempdir().unwrap();
    let u = up(dir.path(), &["--workers", "3", "--heartbeat-timeout-ms", "5000"]);
    let info = &u.info;
    let prog = dir.path().join("rot.js");
    std::fs::write(&prog, PROGRAM).unwrap();
    let owner_file = dir.path().join("owner.key");
    assert!(run(&["keys", "new", "--out", owner_file.to_str().unwrap()]).status.success());
    let cap = dir.path().join("job.capsule");
    let o = run(&[
        "run",
        prog.to_str().unwrap(),
        "--lambdas",
        "3",
        "--json",
        "--owner",
        owner_file.to_str().unwrap(),
        "--capsule-out",
        cap.to_str().unwrap(),
        "--rotate-after-ms",
        "300",
        "--cluster",
        dir.path().join("c").to_str().unwrap(),
    ]);
    if !o.status.success() {
        let log = std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "psl run: {}\n--- psl up log (last lines, newest first):\n{}",
            String::from_utf8_lossy(&o.stderr),
            tail.join("\n")
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let out: serde_json::Value = serde_json::from_str(v["lambdas"][0]["emitted"][0].as_str().unwrap()).unwrap();
    assert_eq!(out["bad"], 0, "{out}");
    assert!(out["total"].as_u64().unwrap() >= 600, "{out}");

    // One rotation, taken by every worker (over its attested channel) and every host.
    let rots = v["key_rotations"].as_array().unwrap();
    assert_eq!(rots.len(), 1, "{v}");
    let k = &rots[0];
    assert_eq!(k["key_gen"], 1);
    assert_eq!(k["workers"].as_array().unwrap().len(), 3, "{k}");
    assert_eq!(k["hosts"].as_array().unwrap().len(), 3, "{k}");
    for (_, e) in k["workers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(k["hosts"].as_array().unwrap())
        .map(|x| (x[0].clone(), x[1].clone()))
    {
        assert!(e.is_null(), "{k}");
    }
    let cert = RotationCert::decode(&hex::decode(k["cert"].as_str().unwrap()).unwrap()).unwrap();

    // The capsule verifies with both generations; both wrote data.
    let owner = OwnerKey::from_file_string(&std::fs::read_to_string(&owner_file).unwrap()).unwrap();
    let bytes = std::fs::read(&cap).unwrap();
    let app0 = audit_file(&bytes, None).metadata.unwrap().meta.app_index;
    let audit = audit_file_rotated(
        &bytes,
        Some(owner.app(app0).unwrap().data_key()),
        vec![(cert.clone(), Some(owner.app(cert.app_index).unwrap().data_key()))],
    );
    assert!(audit.ok(), "{:?}", audit.problems.iter().take(5).collect::<Vec<_>>());
    let mut data = [0usize; 2];
    for r in audit.replica.as_ref().unwrap().iter() {
        if r.header().kind == Kind::Data {
            data[r.header().key_gen as usize] += 1;
        }
    }
    assert!(data[0] > 0 && data[1] > 0, "data records by generation: {data:?}");

    // Every host stored records of both generations and its store checks clean from disk.
    let stored = v["stored_records"].as_array().unwrap();
    assert_eq!(stored.len(), 3, "{v}");
    for (id, _, hdir) in &info.capsule_hosts {
        let n = stored.iter().find(|s| s[0] == *id).unwrap()[1].as_u64().unwrap();
        let store = hdir.join(v["capsule"].as_str().unwrap());
        assert!(store.join(psl_store::ROTATIONS_FILE).exists(), "host {id} kept the certificate");
        let o = run(&["capsule-server", "check", "--json", "--dir", store.to_str().unwrap()]);
        assert!(o.status.success(), "host {id}: {}", String::from_utf8_lossy(&o.stdout));
        let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(c["records"].as_u64().unwrap(), n, "{c}");
        assert!(n as usize > data[0], "host {id} stored {n} records, the new generation's too");
    }
    for r in v["resets"].as_array().unwrap() {
        assert_eq!(r[1]["holds_keys"], false, "{r}");
    }
}
