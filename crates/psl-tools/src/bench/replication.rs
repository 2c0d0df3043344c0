//! `psl bench replication`: write-only zipfian throughput with 1, 2, 4, 8, 16 writer nodes,
//! without durability and with three capsule servers (f = 1), on the embedded deployment (all
//! in one process, in-process fabric, servers' stores in a temporary directory on this
//! machine's disk, one fsync per group commit), and the latency of a durable write.
//!
//! Both cases run the same closed loop, so they see the same offered load: each writer thread
//! puts a round of 256 ops plus a marker key of its own (`marker-<writer>` = round number),
//! then waits for its round to be done before the next one, and only done rounds count. Done
//! means, without durability, that a receive-only node has applied the marker (records apply
//! in per-writer order, so the whole round is applied there); with durability, that
//! `sync_durable` returned (f + 1 = 2 of the 3 servers acked every record up to the marker).
//! Writes stay asynchronous inside a round, which is how the API is meant to be used.
//!
//! (Earlier versions let the non-durable writers run open loop: they overran the two cores, the
//! receiver fell minutes behind, and the ratio measured the overload, not durability.)
//!
//! Latency: `put_durable` of one op, measured separately on an idle deployment and under the
//! 8-writer load.
//!
//! `--cases big-store` runs another case instead, a capsule server process on a store of many
//! records (its memory, its reads from a cold index): `super::bigstore`.

use super::zipf::Zipf;
use anyhow::{bail, Result};
use psl_capsule::{new_capsule, Limits, SignedMetadata};
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::Metrics;
use psl_server::{server_key, Server, ServerOptions};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: u64 = 100_000;
const VALUE_BYTES: usize = 100;
const ROUND: usize = 256;

struct Deployment {
    _dir: tempfile::TempDir,
    writers: Vec<Arc<Node>>,
    receiver: Node,
    _servers: Vec<Server>,
}

fn deploy(writers: usize, servers: u32) -> Result<Deployment> {
    let owner = OwnerKey::generate();
    let app = owner.app(1)?;
    let meta = new_capsule(&owner, 1, "bench", 0, Limits::default())?;
    let hub = InProcHub::new(FabricConfig { queue_msgs_max: 1 << 16, ..FabricConfig::default() })?;
    let dir = tempfile::tempdir()?;
    let mut srv = Vec::new();
    for id in 0..servers {
        srv.push(start_server(&hub, &meta, &app, id, &dir.path().join(format!("s{id}")))?);
    }
    let mut ws = Vec::new();
    for id in 1..=writers as u32 {
        let mut o = NodeOptions { node_id: id, writers: 1, verifiers: 1, ..NodeOptions::default() };
        o.core.servers = servers;
        ws.push(Arc::new(Node::start(NodeKeys::derive(&meta, &app, &o)?, ep(&hub, &format!("w{id}")), o)?));
    }
    let ro = NodeOptions { node_id: 100, writers: 0, verifiers: 1, ..NodeOptions::default() };
    let receiver = Node::start(NodeKeys::derive(&meta, &app, &ro)?, ep(&hub, "receiver"), ro)?;
    Ok(Deployment { _dir: dir, writers: ws, receiver, _servers: srv })
}

fn start_server(
    hub: &InProcHub,
    meta: &SignedMetadata,
    app: &AppKey,
    id: u32,
    dir: &std::path::Path,
) -> Result<Server> {
    let key = server_key(app, id).ok_or_else(|| anyhow::anyhow!("server id {id}"))?;
    Ok(Server::start(
        dir,
        meta.clone(),
        key,
        ep(hub, &format!("server{id}")),
        ServerOptions { id, verifiers: 1, ..Default::default() },
    )?)
}

fn ep(hub: &InProcHub, name: &str) -> Arc<dyn Fabric> {
    Arc::new(hub.endpoint(name))
}

pub fn run(seconds: f64, show_progress: bool) -> Result<Value> {
    let secs = seconds.max(0.2);
    let counts = [1usize, 2, 4, 8, 16];
    let pb = if show_progress {
        super::progress(2 * counts.len() as u64 + 1, "bench replication")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let keys: Arc<Vec<Vec<u8>>> = Arc::new((0..KEYS).map(|i| format!("user{i:012}").into_bytes()).collect());
    let mut out = Map::new();
    let mut lat_loaded = Vec::new();
    for w in counts {
        let plain = load(w, 0, secs, &keys, false)?;
        pb.inc(1);
        let durable = load(w, 3, secs, &keys, w == 8)?;
        pb.inc(1);
        out.insert(format!("puts_per_s_w{w}"), json!(plain.puts_per_s));
        out.insert(format!("durable_puts_per_s_w{w}"), json!(durable.puts_per_s));
        out.insert(format!("ratio_w{w}"), json!(plain.puts_per_s / durable.puts_per_s.max(1e-9)));
        out.insert(format!("detail_w{w}"), json!({"plain": plain.detail, "durable": durable.detail}));
        if w == 8 {
            lat_loaded = durable.latencies_ms;
        }
    }
    let idle = idle_latency(200)?;
    pb.inc(1);
    pb.finish_and_clear();
    let (p50, p99) = percentiles(&idle);
    let (lp50, lp99) = percentiles(&lat_loaded);
    out.insert("durable_put_ms_p50".into(), json!(p50));
    out.insert("durable_put_ms_p99".into(), json!(p99));
    out.insert("durable_put_ms_p50_under_load_w8".into(), json!(lp50));
    out.insert("durable_put_ms_p99_under_load_w8".into(), json!(lp99));
    out.insert("servers".into(), json!(3));
    out.insert("quorum".into(), json!(2));
    out.insert("round_puts".into(), json!(ROUND));
    out.insert("keys".into(), json!(KEYS));
    out.insert("value_bytes".into(), json!(VALUE_BYTES));
    out.insert("zipf_theta".into(), json!(0.99));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}

fn percentiles(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| s[((s.len() as f64 * q) as usize).min(s.len() - 1)];
    (at(0.50), at(0.99))
}

struct LoadResult {
    puts_per_s: f64,
    detail: Value,
    latencies_ms: Vec<f64>,
}

fn load(writers: usize, servers: u32, secs: f64, keys: &Arc<Vec<Vec<u8>>>, sample_latency: bool) -> Result<LoadResult> {
    let d = deploy(writers, servers)?;
    let stop = Arc::new(AtomicBool::new(false));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut loads = Vec::new();
    let receiver = Arc::new(d.receiver);
    for (i, n) in d.writers.iter().enumerate() {
        let (n, stop, keys, lat, rx) = (n.clone(), stop.clone(), keys.clone(), lat.clone(), receiver.clone());
        loads.push(std::thread::spawn(move || -> Result<u64> {
            let mut z = Zipf::new(KEYS, 0.99, 0x9e37 + i as u64);
            let value = vec![b'x'; VALUE_BYTES];
            let marker = format!("marker-{i}").into_bytes();
            let mut count = 0u64;
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..ROUND {
                    n.put(&keys[z.next_item() as usize], &value)?;
                }
                round += 1;
                let tag = round.to_string().into_bytes();
                n.put(&marker, &tag)?;
                if servers == 0 {
                    // Done once the receiver applied the marker (so the whole round).
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while rx.get(&marker).as_deref() != Some(&tag[..]) {
                        if Instant::now() > deadline {
                            bail!("the receiver did not apply writer {i}'s round {round} within 60 s");
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                } else {
                    n.sync_durable(Duration::from_secs(60))?;
                    if sample_latency && i == 0 {
                        let t = Instant::now();
                        n.put_durable(&keys[z.next_item() as usize], &value, Duration::from_secs(60))?;
                        lat.lock().unwrap_or_else(|p| p.into_inner()).push(t.elapsed().as_secs_f64() * 1e3);
                        count += 1;
                    }
                }
                count += ROUND as u64;
            }
            Ok(count)
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for l in loads {
        total += l.join().map_err(|_| anyhow::anyhow!("load thread panicked"))??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let latencies_ms = std::mem::take(&mut *lat.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(LoadResult {
        puts_per_s: total as f64 / elapsed,
        detail: json!({
            "writer_nodes": writers,
            "servers": servers,
            "puts": total,
            "seconds": elapsed,
            "receiver_records_applied": Metrics::get(&receiver.metrics().records_applied),
            "receiver_duplicates": receiver.metrics().rejected(psl_scl::RejectReason::Duplicate),
            "receiver_repair_requests_sent": Metrics::get(&receiver.metrics().repair_requests_sent),
        }),
        latencies_ms,
    })
}

fn idle_latency(n: usize) -> Result<Vec<f64>> {
    let d = deploy(1, 3)?;
    let node = &d.writers[0];
    let value = vec![b'x'; VALUE_BYTES];
    // Warm up (first acks, key derivation caches).
    node.put_durable(b"warm", &value, Duration::from_secs(30))?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        node.put_durable(format!("k{i}").as_bytes(), &value, Duration::from_secs(30))?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(v)
}
