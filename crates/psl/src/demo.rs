//! `psl demo`: the embedded end-to-end demonstration of what is built so far.

use anyhow::{bail, Context, Result};
use clap::Args;
use psl_capsule::{audit_file, file, new_capsule_with, Author, Limits, MembershipProof, Record, WriterKeys};
use psl_crypto::OwnerKey;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct DemoArgs {
    /// Directory for the demo's files (a fresh temporary directory when not given).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Number of writers.
    #[arg(long, default_value_t = 4)]
    writers: u32,
    /// Records per writer per epoch.
    #[arg(long, default_value_t = 5)]
    records: u32,
    /// Ops per record.
    #[arg(long, default_value_t = 16)]
    batch: u32,
}

pub fn run(a: DemoArgs) -> Result<i32> {
    let t0 = Instant::now();
    let dir = demo_dir(a.dir.clone())?;
    let owner = OwnerKey::generate();
    crate::util::write_atomic(&dir.join("owner.key"), owner.to_file_string().as_bytes(), 0o600)?;
    let app_index = rand::random::<u32>() >> 1;
    let app = owner.app(app_index)?;
    let meta =
        new_capsule_with(&owner, app_index, "demo", crate::util::now_ms(), Limits::default(), WriterKeys::Certified)?;
    println!("1. owner key {} -> application {app_index} -> capsule {}", owner.public(), meta.name());

    let records = write_records(&a, &meta, &app)?;
    let bytes = file::encode(&meta, &records);
    let path = dir.join("demo.capsule");
    crate::util::write_atomic(&path, &bytes, 0o644)?;
    let audit = audit_file(&bytes, Some(app.data_key()));
    if !audit.ok() {
        bail!("demo capsule failed verification: {}", audit.problems[0]);
    }
    println!("3. {} ({} bytes) verifies: every signature, hash, chain, link and body", path.display(), bytes.len());

    let replica = audit.replica.expect("verified");
    prove_membership(&meta, &replica, &records[0])?;
    let _store = store_round(&dir.join("store"), &bytes, &app)?;
    scl_round(&meta, &app)?;
    println!(
        "done in {:.0} ms; try: psl capsule show {} --key {}",
        t0.elapsed().as_secs_f64() * 1e3,
        path.display(),
        dir.join("owner.key").display()
    );
    Ok(0)
}

/// The demo's directory (`--dir` or a fresh temporary one), created, and refused if it holds a demo.
fn demo_dir(dir: Option<PathBuf>) -> Result<PathBuf> {
    let dir = match dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("psl-demo-{}", crate::util::now_ms())),
    };
    if dir.join("store").exists() {
        bail!("{} already holds a demo; give another --dir", dir.display());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Step 2: the writers' certificates, two epochs of op records, and a SYNC record per epoch.
fn write_records(a: &DemoArgs, meta: &psl_capsule::SignedMetadata, app: &psl_crypto::AppKey) -> Result<Vec<Record>> {
    let mut authors: Vec<Author> = (1..=a.writers).map(|w| Author::new(meta, app, w)).collect::<Result<_, _>>()?;
    let mut coord = Author::new(meta, app, meta.meta.policy.coordinator)?;
    let mut records: Vec<Record> = Vec::new();
    // Certified writer keys: each writer's first record is its own certificate.
    for au in authors.iter_mut().chain(std::iter::once(&mut coord)) {
        if let Some(intro) = au.write_own_cert() {
            records.push(intro?);
        }
    }
    let mut ops = 0u64;
    for epoch in 0..2u64 {
        for _ in 0..a.records {
            for au in authors.iter_mut() {
                let w = au.writer();
                let batch: Vec<(String, Option<String>)> = (0..a.batch)
                    .map(|i| (format!("w{w}/k{i}"), Some(format!("value {i} from writer {w} in epoch {epoch}"))))
                    .collect();
                ops += batch.len() as u64;
                records.push(au.write_ops(batch)?);
            }
        }
        let heads = authors
            .iter()
            .map(|au| records.iter().rev().find(|r| r.header().writer == au.writer()).expect("wrote").link())
            .collect();
        let sync = coord.write_sync(heads)?;
        for au in authors.iter_mut() {
            au.enter_epoch(sync.link(), sync.header().epoch);
        }
        records.push(sync);
    }
    println!(
        "2. {} writers sealed and signed {ops} ops into {} records, with 2 SYNC records",
        a.writers,
        records.len()
    );
    Ok(records)
}

/// Step 4: a membership proof of `first` from the replica's head, checked with public keys only.
fn prove_membership(meta: &psl_capsule::SignedMetadata, replica: &psl_capsule::Replica, first: &Record) -> Result<()> {
    let target = first.hash();
    let proof = MembershipProof::build(meta, replica, target, None)?;
    let outcome = proof.verify(Some(meta.name()))?;
    println!(
        "4. membership proof of the first record from {} {} in {} steps ({} bytes), checked with public keys only",
        outcome.head_kind.name(),
        outcome.head.hash.short(),
        proof.steps.len() - 1,
        proof.encode().len()
    );
    Ok(())
}

/// Step 5: imports the capsule into a durable store, reopens it and re-verifies it from disk;
/// returns the reopened store (the caller keeps it, and its lock, until the demo ends).
fn store_round(store_dir: &Path, bytes: &[u8], app: &psl_crypto::AppKey) -> Result<psl_store::DiskStore> {
    let (store, outcome) = psl_store::import_into(store_dir, bytes, None)?;
    drop(store);
    let (store, report) = psl_store::DiskStore::open(store_dir, Some(app.data_key()))?;
    if !report.is_clean() {
        bail!("store reopened damaged: {report}");
    }
    let check = store.check()?;
    if !check.is_clean() {
        bail!("store check failed: {:?}", check.problems());
    }
    println!(
        "5. durable store {}: {} records appended, reopened and re-verified from disk",
        store_dir.display(),
        outcome.appended
    );
    Ok(store)
}

/// Step 6: three nodes and a coordinator in this process share the capsule through SCL.
fn scl_round(meta: &psl_capsule::SignedMetadata, app: &psl_crypto::AppKey) -> Result<()> {
    use psl_fabric::{Fabric, FabricConfig, InProcHub};
    use psl_node::{Node, NodeKeys, NodeOptions};
    use std::sync::Arc;
    use std::time::Duration;
    let t = Instant::now();
    let hub = InProcHub::new(FabricConfig::default())?;
    let copts = NodeOptions {
        node_id: 0x7000,
        writers: 0,
        coordinator: Some(psl_scl::CoordinatorConfig { epoch_ms: 20, eoe_timeout_ms: 100, ..Default::default() }),
        ..NodeOptions::default()
    };
    let ep = |name: &str| -> Arc<dyn Fabric> { Arc::new(hub.endpoint(name)) };
    let _coordinator = Node::start(NodeKeys::derive(meta, app, &copts)?, ep("coordinator"), copts)?;
    let nodes: Vec<Node> = (1..=3u32)
        .map(|id| {
            let o = NodeOptions { node_id: id, writers: 2, ..NodeOptions::default().shared_cores() };
            Node::start(NodeKeys::derive(meta, app, &o)?, ep(&format!("node{id}")), o)
        })
        .collect::<Result<_, _>>()?;
    for i in 0..3000u32 {
        let n = &nodes[(i % 3) as usize];
        n.put(format!("key{}", i % 500).as_bytes(), format!("value {i} via node {}", i % 3 + 1).as_bytes())?;
    }
    for n in &nodes {
        n.sync(Duration::from_secs(30))?;
    }
    let digests: Vec<_> = nodes.iter().map(|n| n.digest()).collect();
    if digests.windows(2).any(|w| w[0] != w[1]) {
        bail!("SCL demo: memtables differ after sync");
    }
    let m = nodes[0].metrics();
    println!(
        "6. SCL: 3 nodes put 3000 ops concurrently; after sync() every memtable holds the same {} keys (digest {}), {} records verified and applied by node 1, in {:.0} ms",
        nodes[0].memtable().len(),
        digests[0].short(),
        psl_scl::Metrics::get(&m.records_applied),
        t.elapsed().as_secs_f64() * 1e3
    );
    for n in nodes {
        n.shutdown();
    }
    Ok(())
}
