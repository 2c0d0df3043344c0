//! `psl capsule check-proof` names who vouches for a record (the head's writer and kind) and
//! refuses a proof forged with a capsule server's certified ack key: a made-up record of
//! writer 7 under a head of the server's own.

use psl_capsule::{
    server_writer, writer_credentials, Body, CapsuleFile, ControlCode, Draft, MembershipProof, Op, ProofStep, Record,
    DEFAULT_COORDINATOR,
};
use psl_crypto::{Hash256, OwnerKey};
use std::path::Path;
use std::process::{Command, Output};

fn psl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psl")).args(args).current_dir(dir).output().expect("psl runs")
}

fn json(dir: &Path, args: &[&str]) -> (bool, serde_json::Value) {
    let o = psl(dir, args);
    let out = String::from_utf8(o.stdout).expect("utf-8 output");
    let v = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        panic!("psl {args:?}: not one JSON object ({e}): {out}{}", String::from_utf8_lossy(&o.stderr))
    });
    (o.status.success(), v)
}

fn ok(dir: &Path, args: &[&str]) {
    let o = psl(dir, args);
    assert!(o.status.success(), "psl {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
}

fn step(r: &Record) -> ProofStep {
    ProofStep { header: r.header_bytes().to_vec(), body_len: r.body_len(), body_digest: r.body_digest() }
}

#[test]
fn check_proof_names_the_head_and_refuses_a_server_signed_head() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    ok(d, &["capsule", "new", "--owner", "owner.key", "--label", "demo", "--out", "demo.capsule"]);
    ok(d, &["capsule", "append", "demo.capsule", "--owner", "owner.key", "--writer", "3", "--put", "k=v"]);
    ok(d, &["capsule", "sync", "demo.capsule", "--owner", "owner.key"]);
    let file = CapsuleFile::parse(&std::fs::read(d.join("demo.capsule")).unwrap()).unwrap();
    let meta = file.metadata;
    let name = meta.name().to_string();

    // An honest proof: the output names the target, and the head that vouches for it.
    let target = file.records.iter().find(|r| r.header().writer == 3 && r.header().seq == 1).unwrap();
    let target_hex = target.hash().to_hex();
    ok(d, &["capsule", "prove", "demo.capsule", "--record", &target_hex, "--out", "honest.proof"]);
    let (success, v) = json(d, &["capsule", "check-proof", "honest.proof", "--name", &name, "--json"]);
    assert!(success, "{v}");
    assert_eq!(v["ok"], true);
    assert_eq!(v["target"], target_hex.as_str());
    assert_eq!(v["target_writer"], 3);
    assert_eq!(v["head_kind"], "sync");
    assert_eq!(v["head_writer"], DEFAULT_COORDINATOR);
    let text = String::from_utf8(psl(d, &["capsule", "check-proof", "honest.proof", "--name", &name]).stdout).unwrap();
    assert!(
        text.contains("proof OK")
            && text.contains("head sync")
            && text.contains(&format!("writer {DEFAULT_COORDINATOR}")),
        "{text}"
    );

    // Capsule server 0's certified ack key, as the server holds it, forges writer 7's record
    // and heads a proof of it with a control record of its own that links to it.
    let owner =
        OwnerKey::from_file_string(&std::fs::read_to_string(d.join("owner.key")).unwrap()).expect("owner key file");
    let app = owner.app(meta.meta.app_index).unwrap();
    let s = server_writer(0).unwrap();
    let (key, cert) = writer_credentials(&meta, &app, s).unwrap();
    let limits = meta.meta.policy.limits;
    let body = Body::Data(vec![Op::put(1, b"balance".to_vec(), b"1000000".to_vec())]);
    let fake = Draft { writer: 7, key_gen: 0, seq: 0, lamport: 1, epoch: 0, prev: Hash256::ZERO, links: vec![], body }
        .seal(meta.name(), &limits, &key, &app.data_key())
        .unwrap();
    let eoe = Body::Control { code: ControlCode::Eoe, payload: vec![0; 8] };
    let head = Draft {
        writer: s,
        key_gen: 0,
        seq: 0,
        lamport: 1,
        epoch: 0,
        prev: Hash256::ZERO,
        links: vec![fake.link()],
        body: eoe,
    }
    .seal(meta.name(), &limits, &key, &app.data_key())
    .unwrap();
    let forged = MembershipProof {
        metadata: meta.clone(),
        head_signature: head.signature(),
        head_cert: cert,
        steps: vec![step(&head), step(&fake)],
    };
    std::fs::write(d.join("forged.proof"), forged.encode()).unwrap();
    let (success, v) = json(d, &["capsule", "check-proof", "forged.proof", "--name", &name, "--json"]);
    assert!(!success, "a server-signed head must be refused: {v}");
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("capsule server"), "{v}");
    let o = psl(d, &["capsule", "check-proof", "forged.proof", "--name", &name]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("proof FAILED"));
}
