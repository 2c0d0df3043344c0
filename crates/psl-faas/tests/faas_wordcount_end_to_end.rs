//! wordcount.js with 4 lambdas on the embedded deployment: exact counts, a capsule that passes
//! every check (with the data key), every worker RESET afterwards.
mod common;
use psl_capsule::audit_file;
use psl_crypto::OwnerKey;
use psl_faas::JobRequest;
use std::collections::BTreeMap;

#[test]
fn faas_wordcount_four_lambdas_exact_and_capsule_verifies() {
    let d = common::deployment(4, vec![]);
    let mut text = String::new();
    for i in 0..200 {
        text.push_str(&format!("alpha beta line{} gamma {}\n", i % 7, if i % 3 == 0 { "Alpha" } else { "delta" }));
    }
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for w in text.to_lowercase().split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()) {
        *expected.entry(w.to_string()).or_default() += 1;
    }
    let program = std::fs::read_to_string(common::examples().join("wordcount.js")).unwrap();
    let seed = [9u8; 32];
    let r = d
        .run_job(JobRequest {
            program,
            lambdas: 4,
            input: Some(text),
            owner: Some(OwnerKey::from_seed(&seed).unwrap()),
            rotate_after_ms: None,
        })
        .unwrap();
    assert!(r.ok, "{:?}", r.lambdas);
    assert_eq!(r.lambdas.len(), 4);
    let result = r.lambdas[0].emitted.last().unwrap();
    let got: BTreeMap<String, u64> = serde_json::from_str(result).unwrap();
    assert_eq!(got, expected);
    // The capsule: every record the job wrote, each signature, hash, chain and body checked.
    let bytes = r.capsule_file.as_ref().unwrap();
    let meta = psl_capsule::CapsuleFile::parse(bytes).unwrap().metadata;
    let app = OwnerKey::from_seed(&seed).unwrap().app(meta.meta.app_index).unwrap();
    let audit = audit_file(bytes, Some(app.data_key()));
    assert!(audit.ok(), "{:?}", audit.problems);
    assert!(audit.records_verified > 4, "{} records", audit.records_verified);
    // RESET: no worker holds a key or a memtable entry.
    assert_eq!(r.resets.len(), 4);
    for (w, s) in &r.resets {
        assert!(!s.holds_keys && !s.node_running && !s.attested && s.memtable_entries == 0, "worker {w}: {s:?}");
    }
    eprintln!("launch: {:?}", r.launch);
}
