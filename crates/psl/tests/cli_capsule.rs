//! The `psl keys` / `psl capsule` command line, driven as a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn psl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psl")).args(args).current_dir(dir).output().expect("psl runs")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = psl(dir, args);
    assert!(
        o.status.success(),
        "psl {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 output")
}

fn json(dir: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(ok(dir, args).trim()).expect("one JSON object")
}

/// A capsule with writers 3 and 4, a SYNC, and one record after it.
fn setup() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().to_path_buf();
    ok(&d, &["keys", "new", "--out", "owner.key"]);
    ok(&d, &["capsule", "new", "--owner", "owner.key", "--label", "demo", "--out", "demo.capsule"]);
    ok(
        &d,
        &[
            "capsule",
            "append",
            "demo.capsule",
            "--owner",
            "owner.key",
            "--writer",
            "3",
            "--put",
            "k1=v1",
            "--put",
            "k2=v2",
            "--del",
            "k0",
        ],
    );
    ok(&d, &["capsule", "append", "demo.capsule", "--owner", "owner.key", "--writer", "4", "--put", "k1=x"]);
    ok(&d, &["capsule", "sync", "demo.capsule", "--owner", "owner.key"]);
    ok(&d, &["capsule", "append", "demo.capsule", "--owner", "owner.key", "--writer", "3", "--put", "k3=v3"]);
    (t, d)
}

#[test]
fn issue_command_forms_work_end_to_end() {
    let (_t, d) = setup();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join("owner.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "key file must be private");
    }
    let keys = json(&d, &["keys", "pub", "owner.key", "--json"]);
    assert_eq!(keys["owner_public_key"].as_str().unwrap().len(), 66);
    let secret = std::fs::read_to_string(d.join("owner.key")).unwrap();
    let secret_hex = secret.lines().nth(1).unwrap();
    assert!(!ok(&d, &["keys", "pub", "owner.key", "--app", "1", "--writer", "2"]).contains(&secret_hex[..32]));

    let v = json(&d, &["capsule", "verify", "demo.capsule", "--json"]);
    assert_eq!(v["ok"], true);
    // Certified writer keys (the default): each writer's first record is its own certificate.
    assert_eq!(v["records"], 7);
    assert_eq!(v["decrypted"], false);
    let v = json(&d, &["capsule", "verify", "demo.capsule", "--key", "owner.key", "--json"]);
    assert_eq!(v["decrypted"], true);

    let show = json(&d, &["capsule", "show", "demo.capsule", "--key", "owner.key", "--json"]);
    let recs = show["records"].as_array().unwrap();
    assert_eq!(recs.len(), 7);
    assert_eq!(show["writer_keys"], "certified");
    assert_eq!(show["certificates"].as_array().unwrap().len(), 3, "writers 3, 4 and the coordinator");
    assert_eq!(recs[0]["kind"], "cert");
    assert_eq!(recs[1]["body"][0], "@2 put k1 = v1");
    assert_eq!(recs[1]["body"][2], "@4 del k0");
    assert_eq!(recs[5]["kind"], "sync");
    // Without the key, no plaintext.
    let plain = ok(&d, &["capsule", "show", "demo.capsule"]);
    assert!(!plain.contains("v1") && !plain.contains("k1"), "{plain}");
    assert!(ok(&d, &["capsule", "log", "demo.capsule", "--key", "owner.key"]).contains("put k3 = v3"));

    // Proof of the first record, from the SYNC, checked against the capsule name.
    let name = show["capsule"].as_str().unwrap().to_string();
    let first = recs[1]["hash"].as_str().unwrap().to_string();
    let p = json(&d, &["capsule", "prove", "demo.capsule", "--record", &first, "--out", "r.proof", "--json"]);
    assert_eq!(p["head_kind"], "sync");
    assert_eq!(json(&d, &["capsule", "check-proof", "r.proof", "--name", &name, "--json"])["ok"], true);
    let wrong = "0".repeat(64);
    assert!(!psl(&d, &["capsule", "check-proof", "r.proof", "--name", &wrong]).status.success());

    // Merge: a diverged copy plus the original.
    std::fs::copy(d.join("demo.capsule"), d.join("a.capsule")).unwrap();
    ok(&d, &["capsule", "append", "a.capsule", "--owner", "owner.key", "--writer", "5", "--put", "z=1"]);
    ok(&d, &["capsule", "append", "demo.capsule", "--owner", "owner.key", "--writer", "6", "--put", "y=2"]);
    let m = json(&d, &["capsule", "merge", "a.capsule", "demo.capsule", "--out", "c.capsule", "--json"]);
    assert_eq!(m["records"], 11);
    assert_eq!(json(&d, &["capsule", "verify", "c.capsule", "--key", "owner.key", "--json"])["ok"], true);
    // Merging in either order gives the same replica.
    ok(&d, &["capsule", "merge", "demo.capsule", "a.capsule", "--out", "c2.capsule"]);
    assert_eq!(std::fs::read(d.join("c.capsule")).unwrap(), std::fs::read(d.join("c2.capsule")).unwrap());

    // Store round trip.
    let i = json(&d, &["capsule", "import", "c.capsule", "--into", "store", "--json"]);
    assert_eq!(i["appended"], 11);
    assert_eq!(json(&d, &["capsule", "import", "c.capsule", "--into", "store", "--json"])["duplicates"], 11);
    assert_eq!(json(&d, &["capsule", "verify", "store", "--key", "owner.key", "--json"])["ok"], true);
    ok(&d, &["capsule", "export", "store", "--out", "x.capsule"]);
    assert_eq!(std::fs::read(d.join("x.capsule")).unwrap(), std::fs::read(d.join("c.capsule")).unwrap());
}

#[test]
fn bad_inputs_are_refused_with_a_reason() {
    let (_t, d) = setup();
    // Another owner's key cannot append or decrypt.
    ok(&d, &["keys", "new", "--out", "other.key"]);
    let o = psl(&d, &["capsule", "append", "demo.capsule", "--owner", "other.key", "--writer", "1", "--put", "a=b"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not the owner key"));
    // Over-limit key.
    let long = format!("{}=v", "k".repeat(251));
    assert!(!psl(&d, &["capsule", "append", "demo.capsule", "--owner", "owner.key", "--writer", "1", "--put", &long])
        .status
        .success());
    // Refuses to overwrite.
    assert!(!psl(&d, &["keys", "new", "--out", "owner.key"]).status.success());
    // Merging replicas of different capsules.
    ok(&d, &["capsule", "new", "--owner", "owner.key", "--out", "other.capsule"]);
    assert!(!psl(&d, &["capsule", "merge", "demo.capsule", "other.capsule", "--out", "x.capsule"]).status.success());
    // A file that is not a capsule.
    std::fs::write(d.join("junk.capsule"), b"hello").unwrap();
    assert!(!psl(&d, &["capsule", "verify", "junk.capsule"]).status.success());
}

/// Record frame spans (start, end) of a capsule file, from `show --json` sizes.
fn record_spans(d: &Path, file: &str) -> Vec<(usize, usize)> {
    let show = json(d, &["capsule", "show", file, "--json"]);
    let bytes = std::fs::read(d.join(file)).unwrap();
    let mut spans = Vec::new();
    let meta_len = 8 + 2 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize + 64;
    let mut off = meta_len;
    for r in show["records"].as_array().unwrap() {
        let n = r["bytes"].as_u64().unwrap() as usize;
        spans.push((off + 5, off + 5 + n));
        off += 5 + n;
    }
    spans
}

#[test]
fn verify_names_the_tampered_record_in_a_file() {
    let (_t, d) = setup();
    let spans = record_spans(&d, "demo.capsule");
    let orig = std::fs::read(d.join("demo.capsule")).unwrap();
    // A sample of bytes of every record (the library test covers every byte of every record).
    for (i, &(start, end)) in spans.iter().enumerate() {
        for off in (start..end).step_by(23).chain([start, end - 1]) {
            let mut b = orig.clone();
            b[off] ^= 0x20;
            std::fs::write(d.join("t.capsule"), &b).unwrap();
            let o = psl(&d, &["capsule", "verify", "t.capsule"]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(1), "flip at {off}: {out}");
            assert!(out.contains(&format!("record #{i}")), "flip at {off} of record #{i} not named: {out}");
            assert!(out.contains("check failed"), "{out}");
        }
    }
}

#[test]
fn verify_names_every_tampered_byte_of_a_stored_replica() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    // Version-1 (derived) metadata: old capsules keep verifying, and two frames keep this
    // exhaustive test short.
    ok(d, &["capsule", "new", "--owner", "owner.key", "--writer-keys", "derived", "--out", "s.capsule"]);
    ok(d, &["capsule", "append", "s.capsule", "--owner", "owner.key", "--writer", "1", "--put", "a=1"]);
    ok(d, &["capsule", "append", "s.capsule", "--owner", "owner.key", "--writer", "2", "--del", "b"]);
    ok(d, &["capsule", "import", "s.capsule", "--into", "store"]);
    let log = d.join("store/records.log");
    let orig = std::fs::read(&log).unwrap();
    // Frames: u32 len | u32 crc | record.
    let mut frames = Vec::new();
    let mut off = 0;
    while off < orig.len() {
        let n = u32::from_le_bytes(orig[off..off + 4].try_into().unwrap()) as usize;
        frames.push((off, off + 8 + n));
        off += 8 + n;
    }
    assert_eq!(frames.len(), 2);
    // Every byte of every record (the frame's record bytes), exhaustively.
    for (i, &(start, end)) in frames.iter().enumerate() {
        for pos in start + 8..end {
            let mut b = orig.clone();
            b[pos] ^= 0x01;
            std::fs::write(&log, &b).unwrap();
            let o = psl(d, &["capsule", "verify", "store"]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(1), "flip at {pos}: {out}");
            assert!(out.contains(&format!("frame #{i}")), "flip at {pos} of frame #{i} not named: {out}");
        }
    }
    std::fs::write(&log, &orig).unwrap();
    assert!(psl(d, &["capsule", "verify", "store"]).status.success());
}

#[test]
fn one_writer_is_revoked_and_an_offline_certificate_admits_another() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    ok(d, &["capsule", "new", "--owner", "owner.key", "--out", "r.capsule"]);
    ok(d, &["capsule", "append", "r.capsule", "--owner", "owner.key", "--writer", "1", "--put", "a=1"]);
    ok(d, &["capsule", "append", "r.capsule", "--owner", "owner.key", "--writer", "2", "--put", "b=1"]);
    ok(d, &["capsule", "sync", "r.capsule", "--owner", "owner.key"]);
    let r = json(d, &["capsule", "revoke", "r.capsule", "--owner", "owner.key", "--writer", "1", "--json"]);
    assert_eq!(r["from_epoch"], 2);
    assert_eq!(r["from_seq"], 2, "after its certificate (seq 0) and its one data record (seq 1)");
    ok(d, &["capsule", "sync", "r.capsule", "--owner", "owner.key"]);
    // The revoked writer cannot append any more; the other one continues.
    let o = psl(d, &["capsule", "append", "r.capsule", "--owner", "owner.key", "--writer", "1", "--put", "a=2"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("revoked from epoch 2"), "{o:?}");
    ok(d, &["capsule", "append", "r.capsule", "--owner", "owner.key", "--writer", "2", "--put", "b=2"]);
    // An offline certificate for writer 7, used by the append path; a wrong one is refused.
    ok(
        d,
        &[
            "keys",
            "cert",
            "owner.key",
            "--capsule",
            "r.capsule",
            "--writer",
            "7",
            "--from-epoch",
            "2",
            "--out",
            "w7.cert",
        ],
    );
    let o = psl(
        d,
        &[
            "capsule",
            "append",
            "r.capsule",
            "--owner",
            "owner.key",
            "--writer",
            "8",
            "--cert",
            "w7.cert",
            "--put",
            "x=1",
        ],
    );
    assert!(!o.status.success());
    ok(
        d,
        &[
            "capsule",
            "append",
            "r.capsule",
            "--owner",
            "owner.key",
            "--writer",
            "7",
            "--cert",
            "w7.cert",
            "--put",
            "x=1",
        ],
    );
    let show = json(d, &["capsule", "show", "r.capsule", "--json"]);
    let certs = show["certificates"].as_array().unwrap();
    assert!(certs.iter().any(|c| c["writer"] == 7 && c["valid_from_epoch"] == 2), "{certs:?}");
    let revs = show["revocations"].as_array().unwrap();
    assert_eq!(revs.len(), 1);
    assert_eq!(revs[0]["writer"], 1);
    assert_eq!(json(d, &["capsule", "verify", "r.capsule", "--key", "owner.key", "--json"])["ok"], true);
    // A record of the revoked writer after its epoch, slipped into the file, is named.
    let bytes = std::fs::read(d.join("r.capsule")).unwrap();
    let f = psl_capsule::CapsuleFile::parse(&bytes).unwrap();
    let (meta, mut records) = (f.metadata, f.records);
    let owner = psl_crypto::OwnerKey::from_file_string(&std::fs::read_to_string(d.join("owner.key")).unwrap()).unwrap();
    let app = owner.app(meta.meta.app_index).unwrap();
    let mut a = psl_capsule::Author::new(&meta, &app, 1).unwrap();
    let last = records.iter().rfind(|r| r.header().writer == 1).unwrap();
    let h = last.header();
    a.resume(&psl_capsule::Head { writer: 1, seq: h.seq, hash: last.hash(), lamport: h.lamport, epoch: 2 });
    records.push(a.write_ops([("a", Some("stolen"))]).unwrap());
    std::fs::write(d.join("bad.capsule"), psl_capsule::file::encode(&meta, &records)).unwrap();
    let o = psl(d, &["capsule", "verify", "bad.capsule", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"][0]["check"], "revoked", "{v}");
}
