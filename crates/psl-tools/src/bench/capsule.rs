//! `psl bench capsule`: seal+sign and verify+open throughput by batch size.
//!
//! Baseline in the same run: one bare secp256k1 sign and verify of a 32-byte digest, the floor
//! that batching amortizes. Headline: `ratio_b1_b128`, the per-op cost of a 1-op record over
//! that of a 128-op record (seal+sign plus verify+open). The batches run in a capsule with
//! certified (hardened) writer keys, the default.
//!
//! Writer keys: `ratio_verify_certified_derived` is the per-record verify+open cost of 1-op
//! records in a certified capsule (the writer's key from its cached certificate) over the same
//! in a version-1 capsule (the key derived from the application key, cached): rounds of each
//! alternate, and the medians are compared, so that drift on a noisy machine hits both.

use anyhow::Result;
use psl_capsule::{new_capsule_with, Author, Limits, Record, Verifier, WriterKeys};
use psl_crypto::{sha256, OwnerKey};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

const BATCHES: [usize; 4] = [1, 16, 128, 1024];
const VALUE_BYTES: usize = 100;

pub fn run(seconds: f64, show_progress: bool) -> Result<Value> {
    let budget = Duration::from_secs_f64(seconds.max(0.05));
    let owner = OwnerKey::generate();
    let app = owner.app(1)?;
    let meta = new_capsule_with(&owner, 1, "bench", 0, Limits::default(), WriterKeys::Certified)?;
    let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
    let pb = progress_bar(show_progress, BATCHES.len() as u64 * 2 + 3);

    // Baseline: the bare signature primitives.
    let key = app.writer(1)?;
    let vk = key.verifying_key();
    let digest = sha256(&[b"baseline"]);
    let (n, t) = timed(budget, || {
        std::hint::black_box(key.sign(&digest));
    });
    let sign_us = t.as_secs_f64() * 1e6 / n as f64;
    pb.inc(1);
    let sig = key.sign(&digest);
    let (n, t) = timed(budget, || {
        vk.verify(&digest, &sig).expect("baseline signature verifies");
    });
    let verify_us = t.as_secs_f64() * 1e6 / n as f64;
    pb.inc(1);

    let mut out = Map::new();
    let mut per_op = Vec::new();
    let value = vec![b'v'; VALUE_BYTES];
    for &b in &BATCHES {
        let mut author = Author::new(&meta, &app, 1)?;
        if let Some(intro) = author.write_own_cert() {
            verifier.verify(intro?).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let mut k = 0u64;
        let mut recs: Vec<Record> = Vec::new();
        let start = Instant::now();
        while start.elapsed() < budget || recs.len() < 8 {
            let ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..b)
                .map(|_| {
                    k += 1;
                    (format!("key{k:010}").into_bytes(), Some(value.clone()))
                })
                .collect();
            recs.push(author.write_ops(ops)?);
        }
        let seal_t = start.elapsed();
        pb.inc(1);
        let start = Instant::now();
        let mut opened = 0usize;
        for r in &recs {
            let o = verifier.verify_open(r.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
            if let Some(ops) = o.body.data_ops() {
                opened += ops.len();
            }
        }
        let verify_t = start.elapsed();
        pb.inc(1);
        assert_eq!(opened, recs.len() * b, "every op comes back");
        let nrec = recs.len() as f64;
        let nops = nrec * b as f64;
        let seal_op_us = seal_t.as_secs_f64() * 1e6 / nops;
        let verify_op_us = verify_t.as_secs_f64() * 1e6 / nops;
        per_op.push((b, seal_op_us, verify_op_us));
        out.insert(
            format!("b{b}"),
            json!({
                "ops_per_record": b,
                "record_bytes": recs[0].bytes().len(),
                "records": recs.len(),
                "seal_records_per_s": nrec / seal_t.as_secs_f64(),
                "seal_ops_per_s": nops / seal_t.as_secs_f64(),
                "verify_records_per_s": nrec / verify_t.as_secs_f64(),
                "verify_ops_per_s": nops / verify_t.as_secs_f64(),
                "seal_us_per_op": seal_op_us,
                "verify_us_per_op": verify_op_us,
                "signature_us_per_op": (sign_us + verify_us) / b as f64,
            }),
        );
    }
    let keys = writer_keys(&owner, budget)?;
    pb.inc(1);
    pb.finish_and_clear();
    out.insert("ratio_verify_certified_derived".into(), keys["ratio_verify_certified_derived"].clone());
    out.insert("writer_keys".into(), keys);
    let get = |b: usize| per_op.iter().find(|x| x.0 == b).copied().expect("measured");
    let (_, s1, v1) = get(1);
    let (_, s128, v128) = get(128);
    out.insert("ratio_b1_b128".into(), json!((s1 + v1) / (s128 + v128)));
    out.insert("ratio_seal_b1_b128".into(), json!(s1 / s128));
    out.insert("ratio_verify_b1_b128".into(), json!(v1 / v128));
    out.insert("baseline_sign_us".into(), json!(sign_us));
    out.insert("baseline_verify_us".into(), json!(verify_us));
    out.insert("value_bytes".into(), json!(VALUE_BYTES));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}

/// Verify+open of 1-op records, certified against derived writer keys (module docs).
fn writer_keys(owner: &OwnerKey, budget: Duration) -> Result<Value> {
    const RECORDS: usize = 512;
    const ROUNDS: usize = 7;
    let app = owner.app(2)?;
    let mut sides = Vec::new();
    for scheme in [WriterKeys::Derived, WriterKeys::Certified] {
        let meta = new_capsule_with(owner, 2, "bench-keys", 0, Limits::default(), scheme)?;
        let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
        let mut author = Author::new(&meta, &app, 7)?;
        if let Some(intro) = author.write_own_cert() {
            verifier.verify(intro?).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let recs: Vec<Record> = (0..RECORDS)
            .map(|i| author.write_ops([(format!("key{i:010}"), Some(vec![b'v'; VALUE_BYTES]))]))
            .collect::<Result<_, _>>()?;
        // Warm the key cache (derived) or check the certificate is installed (certified).
        verifier.verify_open(recs[0].clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
        sides.push((scheme, verifier, recs, Vec::new()));
    }
    let round_budget = budget / (2 * ROUNDS as u32);
    for _ in 0..ROUNDS {
        for (_, verifier, recs, times) in sides.iter_mut() {
            let start = Instant::now();
            let mut n = 0usize;
            while start.elapsed() < round_budget || n < RECORDS {
                let r = &recs[n % RECORDS];
                std::hint::black_box(verifier.verify_open(r.clone()).expect("verifies"));
                n += 1;
            }
            times.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut m = Map::new();
    let mut us = Vec::new();
    for (scheme, _, _, times) in sides.iter_mut() {
        let med = median(times);
        m.insert(format!("verify_us_per_record_{}", scheme.name()), json!(med));
        us.push(med);
    }
    m.insert("ratio_verify_certified_derived".into(), json!(us[1] / us[0]));
    m.insert("rounds".into(), json!(ROUNDS));
    Ok(Value::Object(m))
}

fn timed(budget: Duration, mut f: impl FnMut()) -> (u64, Duration) {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget || n < 16 {
        for _ in 0..16 {
            f();
        }
        n += 16;
    }
    (n, start.elapsed())
}

fn progress_bar(show: bool, len: u64) -> indicatif::ProgressBar {
    if show {
        super::progress(len, "bench capsule")
    } else {
        indicatif::ProgressBar::hidden()
    }
}
