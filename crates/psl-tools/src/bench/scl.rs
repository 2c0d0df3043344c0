//! `psl bench scl`: SCL put and get throughput on the embedded deployment (all nodes in one
//! process on the in-process fabric), the batching ablation, and the boundary ring crossing.
//!
//! Put throughput counts each put once, and only when every node has applied it: the writer
//! sealed and signed it, and every other node (the other writers and one receive-only node)
//! verified, decrypted and applied it. The receive-only node also runs the coordinator. Keys:
//! YCSB zipfian 0.99 over 100,000 keys; 100-byte values. Baseline in the same run: the same
//! workload with one op per record (every op sealed and signed alone), the ablation the PSL
//! paper reports; `--cases u1,u2,u4,u8` (only when named) runs it with 1 to 8 writer nodes.
//!
//! Each case's detail says where records were lost (the fabric's receive queues, the rings,
//! the verify queues, the hold-back buffer) and how many repairs followed: a node that falls
//! behind loses records and every holder answers its repairs, so losses, not the per-op cost,
//! are what collapse the many-writer cases. `PSL_BENCH_TRACE=1` prints the writers' and the
//! receiver's progress every 250 ms to stderr.
//!
//! Capsules certify their writers (hardened keys known by certificates). The `keys` case runs
//! the unbatched single-writer load in a certified and in a version-1 (derived keys) capsule,
//! alternating, three rounds each: `ratio_u1_certified_derived`, of the medians, is what
//! certificates cost a whole put pipeline where per-record verification weighs most.

use super::zipf::Zipf;
use anyhow::{bail, Result};
use psl_capsule::{new_capsule_with, Limits, WriterKeys};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub, Interest};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::{CoordinatorConfig, Metrics};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: u64 = 100_000;
const VALUE_BYTES: usize = 100;

/// Each writer's op queue: 128 records' worth at the case's batch size (at least 1,024 ops),
/// so the backlog a load leaves behind is the same in records, batched or not, and a full
/// queue holds the load threads back (as it would hold back clients). The default 65,536 ops
/// are 128 records batched but 65,536 records unbatched: a quarter-second load of eight
/// unbatched writers then queued half a million records whose sealing and verification
/// outlasted the 120 s drain bound on a loaded machine (`psl report --quick`'s scl case).
fn queue_ops_max(batch_ops_max: usize) -> usize {
    batch_ops_max.saturating_mul(128).max(1024)
}

struct Case {
    writers: usize,
    batch_ops_max: usize,
    /// Certified writer keys (the default) or the version-1 derived ones (the `keys` case's
    /// baseline).
    writer_keys: WriterKeys,
}

pub fn run(seconds: f64, cases: &[String], show_progress: bool) -> Result<Value> {
    let secs = seconds.max(0.2);
    let want = |c: &str| cases.is_empty() || cases.iter().any(|x| x == c);
    let pb = if show_progress { super::progress(8, "bench scl") } else { indicatif::ProgressBar::hidden() };
    let keys: Arc<Vec<Vec<u8>>> = Arc::new((0..KEYS).map(|i| format!("user{i:012}").into_bytes()).collect());
    let mut out = Map::new();
    for w in [1usize, 2, 4, 8] {
        if !want(&format!("w{w}")) {
            continue;
        }
        let r = put_case(
            &Case {
                writers: w,
                batch_ops_max: NodeOptions::default().batch_ops_max,
                writer_keys: WriterKeys::Certified,
            },
            secs,
            &keys,
        )?;
        out.insert(format!("puts_per_s_w{w}"), json!(r.puts_per_s));
        out.insert(format!("records_per_s_w{w}"), json!(r.records_per_s));
        out.insert(format!("detail_w{w}"), r.detail);
        pb.inc(1);
    }
    // The unbatched sweep (one op per record, every op sealed and signed alone) with 1 to 8
    // writer nodes: only when named (`--cases u1,u2,u4,u8`), for `psl report`'s plot.
    let named = |c: &str| cases.iter().any(|x| x == c);
    for w in [1usize, 2, 4, 8] {
        if !named(&format!("u{w}")) {
            continue;
        }
        let r = put_case(&Case { writers: w, batch_ops_max: 1, writer_keys: WriterKeys::Certified }, secs, &keys)?;
        out.insert(format!("puts_per_s_u{w}"), json!(r.puts_per_s));
        out.insert(format!("detail_u{w}"), r.detail);
    }
    if want("ablation") {
        let unbatched =
            put_case(&Case { writers: 1, batch_ops_max: 1, writer_keys: WriterKeys::Certified }, secs, &keys)?;
        out.insert("puts_per_s_w1_unbatched".into(), json!(unbatched.puts_per_s));
        if let Some(batched) = out.get("puts_per_s_w1").and_then(Value::as_f64) {
            out.insert("ablation_ratio".into(), json!(batched / unbatched.puts_per_s.max(1e-9)));
        }
    }
    if want("keys") {
        // Writer keys: one op per record (so per-record verification weighs most), certified
        // against derived, alternating, three rounds each; the medians are compared.
        let mut runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (i, k) in [WriterKeys::Derived, WriterKeys::Certified].into_iter().enumerate() {
                let r = put_case(&Case { writers: 1, batch_ops_max: 1, writer_keys: k }, secs / 2.0, &keys)?;
                runs[i].push(r.puts_per_s);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (d, c) = (median(&mut runs[0]), median(&mut runs[1]));
        out.insert("puts_per_s_u1_derived".into(), json!(d));
        out.insert("puts_per_s_u1_certified".into(), json!(c));
        out.insert("ratio_u1_certified_derived".into(), json!(c / d.max(1e-9)));
    }
    pb.inc(1);
    if want("gets") {
        out.insert("gets_per_s".into(), json!(get_case(secs, &keys)?));
    }
    pb.inc(1);
    if want("ring") {
        let ring = psl_boundary::bench_crossings(psl_boundary::CrossingConfig::default());
        let rv = serde_json::to_value(&ring)?;
        for k in psl_boundary::HEADLINE_KEYS {
            if let Some(v) = rv.get(k) {
                out.insert(k.into(), v.clone());
            }
        }
        out.insert("ring".into(), rv);
    }
    pb.inc(1);
    pb.finish_and_clear();
    out.insert("keys".into(), json!(KEYS));
    out.insert("value_bytes".into(), json!(VALUE_BYTES));
    out.insert("zipf_theta".into(), json!(0.99));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}

pub(crate) struct PutResult {
    pub puts_per_s: f64,
    pub records_per_s: f64,
    pub detail: Value,
}

/// An endpoint maker: a name and what the endpoint's role wants to receive.
pub(crate) type MakeEndpoint<'a> = &'a dyn Fn(&str, &Interest) -> Result<Arc<dyn Fabric>>;

fn put_case(c: &Case, secs: f64, keys: &Arc<Vec<Vec<u8>>>) -> Result<PutResult> {
    let hub = InProcHub::new(FabricConfig { queue_msgs_max: 1 << 16, ..FabricConfig::default() })?;
    put_case_with(c, secs, keys, &|name, _| Ok(ep(&hub, name)))
}

/// The put case with `writers` writer nodes on endpoints `make` gives (`psl bench fabric`).
pub(crate) fn put_case_on(writers: usize, secs: f64, make: MakeEndpoint) -> Result<PutResult> {
    let keys: Arc<Vec<Vec<u8>>> = Arc::new((0..KEYS).map(|i| format!("user{i:012}").into_bytes()).collect());
    let c = Case { writers, batch_ops_max: NodeOptions::default().batch_ops_max, writer_keys: WriterKeys::Certified };
    put_case_with(&c, secs, &keys, make)
}

fn put_case_with(c: &Case, secs: f64, keys: &Arc<Vec<Vec<u8>>>, make: MakeEndpoint) -> Result<PutResult> {
    let owner = OwnerKey::generate();
    let app = owner.app(1)?;
    let meta = new_capsule_with(&owner, 1, "bench", 0, Limits::default(), c.writer_keys)?;
    let capsule = meta.name().0 .0;
    let mut writers = Vec::new();
    let mut eps: Vec<Arc<dyn Fabric>> = Vec::new();
    for id in 1..=c.writers as u32 {
        let o = NodeOptions {
            node_id: id,
            writers: 1,
            verifiers: 1,
            batch_ops_max: c.batch_ops_max,
            queue_ops_max: queue_ops_max(c.batch_ops_max),
            ..NodeOptions::default().shared_cores()
        };
        let e = make(&format!("w{id}"), &Interest::node(capsule, id, false))?;
        eps.push(e.clone());
        writers.push(Arc::new(Node::start(NodeKeys::derive(&meta, &app, &o)?, e, o)?));
    }
    // The receive-only node also runs the coordinator (its own writer key; it seals only RTS and
    // SYNC records), as a deployment would co-locate them: a separate coordinator node would be
    // one more node verifying and applying every record, which the workload does not name.
    // Epochs are slow here: the bench measures the data path.
    let ro = NodeOptions {
        node_id: 100,
        writers: 0,
        verifiers: 1,
        coordinator: Some(CoordinatorConfig { epoch_ms: 1000, eoe_timeout_ms: 1000, ..CoordinatorConfig::default() }),
        ..NodeOptions::default().shared_cores()
    };
    let e = make("receiver", &Interest::node(capsule, 100, false))?;
    eps.push(e.clone());
    let receiver = Node::start(NodeKeys::derive(&meta, &app, &ro)?, e, ro)?;

    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let cpu0 = super::process_cpu_seconds();
    let start = Instant::now();
    let mut loads = Vec::new();
    for (i, n) in writers.iter().enumerate() {
        let (n, stop, issued, keys) = (n.clone(), stop.clone(), issued.clone(), keys.clone());
        loads.push(std::thread::spawn(move || -> Result<u64> {
            let mut z = Zipf::new(KEYS, 0.99, 0x9e37 + i as u64);
            let value = vec![b'x'; VALUE_BYTES];
            let mut count = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..256 {
                    n.put(&keys[z.next_item() as usize], &value)?;
                }
                count += 256;
            }
            issued.fetch_add(count, Ordering::Relaxed);
            Ok(count)
        }));
    }
    if std::env::var_os("PSL_BENCH_TRACE").is_some() {
        while start.elapsed().as_secs_f64() < secs {
            std::thread::sleep(Duration::from_millis(250));
            eprintln!(
                "t={:.2} written={} recv_applied={} recv_records={}",
                start.elapsed().as_secs_f64(),
                writers.iter().map(|w| Metrics::get(&w.metrics().ops_written)).sum::<u64>(),
                Metrics::get(&receiver.metrics().ops_applied),
                Metrics::get(&receiver.metrics().records_applied)
            );
        }
    }
    std::thread::sleep(Duration::from_secs_f64((secs - start.elapsed().as_secs_f64()).max(0.0)));
    stop.store(true, Ordering::Relaxed);
    let load_end = Instant::now();
    let mut total = 0u64;
    for l in loads {
        total += l.join().map_err(|_| anyhow::anyhow!("load thread panicked"))??;
    }
    // Done when every node has every op: each writer holds the others', the receiver all.
    let deadline = Instant::now() + Duration::from_secs(120);
    let applied = |n: &Node| Metrics::get(&n.metrics().ops_applied);
    loop {
        let others_ok = writers.iter().all(|w| applied(w) + Metrics::get(&w.metrics().ops_written) >= total);
        if applied(&receiver) >= total && others_ok {
            break;
        }
        if Instant::now() > deadline {
            bail!("nodes did not apply every op within 120 s ({} of {total} at the receiver)", applied(&receiver));
        }
        std::thread::sleep(Duration::from_millis(2));
        if std::env::var_os("PSL_BENCH_TRACE").is_some() && start.elapsed().as_millis() % 250 < 3 {
            eprintln!(
                "drain t={:.2} total={total} recv_applied={}",
                start.elapsed().as_secs_f64(),
                Metrics::get(&receiver.metrics().ops_applied)
            );
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let load_secs = load_end.duration_since(start).as_secs_f64();
    let cpu = super::process_cpu_seconds() - cpu0;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    let records = Metrics::get(&receiver.metrics().records_applied) as f64;
    let rm = receiver.metrics();
    let all: Vec<&Node> = writers.iter().map(|w| &**w).chain([&receiver]).collect();
    Ok(PutResult {
        puts_per_s: total as f64 / elapsed,
        records_per_s: records / elapsed,
        detail: json!({
            "writer_nodes": c.writers,
            "batch_ops_max": c.batch_ops_max,
            "puts": total,
            "seconds": elapsed,
            // How long the load ran, and how long after it every node took to apply the rest
            // (small when the receivers keep up).
            "load_seconds": load_secs,
            "drain_seconds": elapsed - load_secs,
            // CPU of the whole process (writers, every receiving node, the load threads) per
            // put, and how busy the machine's cores were: at 1.0 adding writers cannot add puts.
            "cpu_ns_per_put": cpu * 1e9 / (total.max(1) as f64),
            "cpu_utilization": cpu / (elapsed * cores),
            "receiver_records_applied": records,
            "receiver_repair_requests": Metrics::get(&rm.repair_requests_sent),
            "receiver_duplicates": rm.rejected(psl_scl::RejectReason::Duplicate),
            // Where records were lost (each loss is a gap that repair must fill), over all nodes:
            // the fabric's receive queues, the host-to-core rings, the verify queues, hold-back.
            "fabric_dropped_full": eps.iter().map(|e| e.stats().dropped_full).sum::<u64>(),
            "inbound_ring_dropped": all.iter().map(|n| n.host_stats().inbound_dropped.load(Ordering::Relaxed)).sum::<u64>(),
            "overload_rejected": all.iter().map(|n| n.metrics().rejected(psl_scl::RejectReason::Overload)).sum::<u64>(),
            "hold_full_rejected": all.iter().map(|n| n.metrics().rejected(psl_scl::RejectReason::HoldFull)).sum::<u64>(),
            "repair_requests": all.iter().map(|n| Metrics::get(&n.metrics().repair_requests_sent)).sum::<u64>(),
        }),
    })
}

fn get_case(secs: f64, keys: &Arc<Vec<Vec<u8>>>) -> Result<f64> {
    let owner = OwnerKey::generate();
    let app = owner.app(1)?;
    let meta = new_capsule_with(&owner, 1, "bench", 0, Limits::default(), WriterKeys::Certified)?;
    let hub = InProcHub::new(FabricConfig::default())?;
    let o = NodeOptions { node_id: 1, writers: 1, ..NodeOptions::default() };
    let node = Arc::new(Node::start(NodeKeys::derive(&meta, &app, &o)?, ep(&hub, "n"), o)?);
    let value = vec![b'x'; VALUE_BYTES];
    for k in keys.iter() {
        node.put(k, &value)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (n, s, keys) = (node.clone(), stop.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut z = Zipf::new(KEYS, 0.99, 77 + t);
                let mut c = 0u64;
                while !s.load(Ordering::Relaxed) {
                    for _ in 0..1024 {
                        std::hint::black_box(n.get(&keys[z.next_item() as usize]));
                    }
                    c += 1024;
                }
                c
            })
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

fn ep(hub: &InProcHub, name: &str) -> Arc<dyn Fabric> {
    Arc::new(hub.endpoint(name))
}
