//! The scale scenario (`psl sim --scenario scale --nodes N`, or `--shards S`): N worker nodes
//! spread over C capsules (each with its own primary coordinator; a capsule is a shard of the
//! KV key space, docs/protocol/sharding.md, so `--shards S` runs S capsules of
//! `--nodes-per-shard` nodes each), the real protocol engines, and a network
//! that delivers the way NATS subjects do: a message reaches only the endpoints whose role
//! subscribes to its leaf of its capsule's subject tree (`psl_fabric::subject`: records,
//! repair and heads to the capsule's nodes and coordinator, an ack to its writing node only).
//! Beside it the run counts what the router tree would have delivered instead (every message to
//! every endpoint; the receivers then drop other capsules' messages by name, but the bytes
//! arrived). No faults: this scenario measures cost, the `scl` scenario checks safety.
//!
//! Reported per node (mean and max over nodes): records and bytes received per simulated
//! second, under subjects and under the flood; and the process's memory per node (the caller
//! measures resident memory, the engines' state included, since this crate does no I/O).
//! Reported over the whole deployment: the ops applied by every node of their shard per
//! simulated second of the write phase (the aggregate throughput), and the records verified
//! and applied per simulated second.
//! At the end the run checks that the nodes of each capsule converged (equal memtables).

use crate::node::{Effect, NodeSpec, SimNode};
use psl_capsule::{new_capsule, Limits, SignedMetadata};
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::subject::{classify, Interest, Leaf, Route};
use psl_scl::{CoordinatorConfig, Metrics};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

/// What one scale run looks like.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleConfig {
    /// Seeds the capsules' owner keys, the record salts and the workload.
    pub seed: u64,
    /// Worker nodes, over all capsules (at least `capsules`).
    pub nodes: usize,
    /// Capsules (KV spaces); node `i` serves capsule `i % capsules`.
    pub capsules: usize,
    /// Writes per node per simulated second.
    pub puts_per_node_per_s: f64,
    /// Size of every value written, in bytes.
    pub value_bytes: usize,
    /// Distinct keys per capsule.
    pub keys: usize,
    /// Milliseconds during which the nodes write.
    pub work_ms: u64,
    /// Quiet time after the writes for the nodes to converge.
    pub settle_ms: u64,
    /// Flush delay in ms of every data writer: a batch that is not full is sealed this long
    /// after its writer first saw it (the runtime's seal policy, `psl_scl::engine::queue`).
    pub flush_ms: u64,
    /// Period in ms of the nodes' ticks (timers, repair, announcements).
    pub tick_ms: u64,
    /// The coordinators' epoch length in ms.
    pub epoch_ms: u64,
    /// Pending ops of one writer that make it seal a record at once.
    pub batch_ops_max: usize,
}

impl ScaleConfig {
    /// `nodes` nodes, ten per capsule (at least one capsule).
    pub fn new(nodes: usize) -> ScaleConfig {
        ScaleConfig {
            seed: 1,
            nodes,
            capsules: nodes.div_ceil(10).max(1),
            puts_per_node_per_s: 20.0,
            value_bytes: 100,
            keys: 200,
            work_ms: 1_000,
            settle_ms: 1_500,
            flush_ms: 10,
            tick_ms: 10,
            epoch_ms: 100,
            batch_ops_max: 64,
        }
    }

    /// `shards` capsules (shards of the key space) of `nodes_per_shard` worker nodes each.
    pub fn sharded(shards: usize, nodes_per_shard: usize) -> ScaleConfig {
        ScaleConfig { capsules: shards, ..ScaleConfig::new(shards * nodes_per_shard) }
    }
}

/// Mean and max over nodes.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Spread {
    /// The mean over nodes (0 with no nodes).
    pub mean: f64,
    /// The largest value of any node.
    pub max: f64,
}

fn spread(v: &[f64]) -> Spread {
    if v.is_empty() {
        return Spread::default();
    }
    Spread { mean: v.iter().sum::<f64>() / v.len() as f64, max: v.iter().copied().fold(0.0, f64::max) }
}

/// What one scale run measured: delivery costs per worker node under subjects and under the
/// router tree's flood, verifications, convergence and memory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleReport {
    /// The configuration that ran.
    pub config: ScaleConfig,
    /// Worker nodes per capsule, on average.
    pub nodes_per_capsule: f64,
    /// Puts the worker nodes issued.
    pub ops_issued: u64,
    /// Messages published per simulated second, all endpoints.
    pub published_per_s: f64,
    /// Subject fan-out: records each worker node received, per simulated second.
    pub records_received_per_s: Spread,
    /// Subject fan-out: bytes (all messages) each worker node received, per simulated second.
    pub bytes_received_per_s: Spread,
    /// The router tree's flood: records each worker node would have received, per simulated
    /// second.
    pub flood_records_received_per_s: Spread,
    /// The flood: bytes (all messages) each worker node would have received, per simulated
    /// second.
    pub flood_bytes_received_per_s: Spread,
    /// Records verified per simulated second, all nodes (each receiver verifies each record).
    /// Counted as records delivered; `records_applied_per_s` counts what the engines applied.
    pub verifications_per_s: f64,
    /// Ops (puts) that every worker node of their capsule had applied when the run ended, each
    /// op counted once (not once per node). The writing node counts an op as applied once it is
    /// sealed into a record; another node, once its engine has applied that record (records of
    /// a writer are applied in seq order, so: once its orderer expects a later seq of that
    /// writer). Equal to `ops_issued` when every op reached every node of its capsule.
    pub ops_applied: u64,
    /// Aggregate throughput: ops that every worker node of their capsule had applied by the end
    /// of the write phase (`work_ms`), counted as in `ops_applied`, per simulated second of the
    /// write phase. Ops still in flight when the phase ends (not yet sealed, or their record
    /// not yet delivered) are not counted, so this is a little below `ops_issued` per second.
    pub ops_applied_per_s: f64,
    /// Records verified and applied per simulated second of the whole run, summed over all
    /// endpoints (worker nodes and coordinators): the engines' `records_applied` counters (a
    /// node's own records are not counted).
    pub records_applied_per_s: f64,
    /// Every capsule's nodes hold identical memtables at the end.
    pub converged: bool,
    /// Resident memory when the run ended, in bytes (from the caller's probe).
    pub rss_bytes: u64,
    /// Growth of resident memory from before the nodes were made to the end, per worker
    /// node, in bytes (coordinators' share included).
    pub rss_per_node_bytes: u64,
}

/// Everything published, all endpoints (what the flood delivers to each non-sender).
#[derive(Default)]
struct FloodTotals {
    bytes: u64,
    records: u64,
}

struct Ep {
    node: SimNode,
    capsule: usize,
    interest: Interest,
    worker: bool,
    /// A worker's data writer (its only one).
    writer: Option<u32>,
    /// The data records its writer sealed, in seq order: (seq, ops sealed up to and including
    /// this record).
    written: Vec<(u64, u64)>,
    rx_records: u64,
    rx_bytes: u64,
    flood_records: u64,
    flood_bytes: u64,
}

/// Runs one scale scenario. `rss` reads the process's resident memory (bytes); it is called
/// before the nodes are made and at the end, while they are all alive.
pub fn run_scale(cfg: &ScaleConfig, rss: &dyn Fn() -> u64) -> Result<ScaleReport, String> {
    if cfg.nodes == 0 || cfg.capsules == 0 || cfg.capsules > cfg.nodes {
        return Err(format!("{} nodes over {} capsules: need 1 <= capsules <= nodes", cfg.nodes, cfg.capsules));
    }
    let base_rss = rss();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    // The capsules' keys stay alive with the nodes (they count in the memory measured).
    let (_metas, mut eps) = endpoints(cfg)?;
    let mut by_capsule: Vec<Vec<usize>> = vec![Vec::new(); cfg.capsules];
    for (i, e) in eps.iter().enumerate() {
        by_capsule[e.capsule].push(i);
    }
    let total = cfg.work_ms + cfg.settle_ms;
    let (published, ops, flood, applied_in_work) = drive(cfg, &mut rng, &mut eps, &by_capsule);
    let ops_applied = applied_everywhere(&eps, &by_capsule);
    let mut verifications = 0u64;
    let mut records_applied = 0u64;
    for e in &mut eps {
        verifications += e.rx_records;
        records_applied += Metrics::get(&e.node.metrics.records_applied);
        // Until here `flood_*` held what the endpoint itself published.
        e.flood_bytes = flood.bytes - e.flood_bytes;
        e.flood_records = flood.records - e.flood_records;
    }
    let converged = by_capsule.iter().all(|members| {
        let mut digests = members.iter().filter(|&&i| eps[i].worker).map(|&i| eps[i].node.memtable.digest());
        let first = digests.next();
        digests.all(|d| Some(d) == first)
    });
    let end_rss = rss();
    let secs = total as f64 / 1000.0;
    let workers: Vec<&Ep> = eps.iter().filter(|e| e.worker).collect();
    let per =
        |f: &dyn Fn(&Ep) -> u64| -> Spread { spread(&workers.iter().map(|e| f(e) as f64 / secs).collect::<Vec<_>>()) };
    Ok(ScaleReport {
        config: cfg.clone(),
        nodes_per_capsule: cfg.nodes as f64 / cfg.capsules as f64,
        ops_issued: ops,
        published_per_s: published as f64 / secs,
        records_received_per_s: per(&|e| e.rx_records),
        bytes_received_per_s: per(&|e| e.rx_bytes),
        flood_records_received_per_s: per(&|e| e.flood_records),
        flood_bytes_received_per_s: per(&|e| e.flood_bytes),
        verifications_per_s: verifications as f64 / secs,
        ops_applied,
        ops_applied_per_s: if cfg.work_ms == 0 { 0.0 } else { applied_in_work as f64 * 1000.0 / cfg.work_ms as f64 },
        records_applied_per_s: records_applied as f64 / secs,
        converged,
        rss_bytes: end_rss,
        rss_per_node_bytes: end_rss.saturating_sub(base_rss) / cfg.nodes as u64,
    })
}

/// The capsules (their owner keys from the seed) and the endpoints: the worker nodes, node
/// `i` in capsule `i % capsules`, then one coordinator per capsule.
#[allow(clippy::type_complexity)]
fn endpoints(cfg: &ScaleConfig) -> Result<(Vec<(SignedMetadata, AppKey)>, Vec<Ep>), String> {
    let mut metas = Vec::new();
    for c in 0..cfg.capsules {
        let mut s = [0u8; 32];
        s[..8].copy_from_slice(&cfg.seed.to_le_bytes());
        s[8..16].copy_from_slice(&(c as u64).to_le_bytes());
        s[16] = 0x5c;
        let owner = OwnerKey::from_seed(&s).map_err(|e| e.to_string())?;
        let app = owner.app(1).map_err(|e| e.to_string())?;
        let meta = new_capsule(&owner, 1, &format!("scale-{c}"), 0, Limits::default()).map_err(|e| e.to_string())?;
        metas.push((meta, app));
    }
    let mut eps: Vec<Ep> = Vec::with_capacity(cfg.nodes + cfg.capsules);
    for i in 0..cfg.nodes {
        let c = i % cfg.capsules;
        let (meta, app) = &metas[c];
        let id = i as u32 + 1;
        let node = SimNode::new(NodeSpec {
            id,
            incarnation: 0,
            meta,
            app,
            writers: 1,
            coordinator: None,
            seed: cfg.seed ^ id as u64,
            now: 0,
            batch_ops_max: cfg.batch_ops_max,
            flush_ms: cfg.flush_ms,
            config: NodeSpec::config(0),
            log: None,
        });
        let interest = Interest::node(meta.name().0 .0, id, false);
        let writer = node.authors.first().map(|a| a.writer());
        eps.push(Ep {
            node,
            capsule: c,
            interest,
            worker: true,
            writer,
            written: Vec::new(),
            rx_records: 0,
            rx_bytes: 0,
            flood_records: 0,
            flood_bytes: 0,
        });
    }
    for (c, (meta, app)) in metas.iter().enumerate() {
        let ccfg = CoordinatorConfig {
            epoch_ms: cfg.epoch_ms,
            epoch_idle_ms: psl_scl::coordinator::EPOCH_IDLE_MS_DEFAULT,
            eoe_timeout_ms: cfg.epoch_ms * 3,
            takeover_after_epochs: 5,
            rank: 0,
            ranks: meta.meta.policy.coordinators,
            missed_eoe_max: 3,
        };
        let id = 32_000 + c as u32;
        let node = SimNode::new(NodeSpec {
            id,
            incarnation: 0,
            meta,
            app,
            writers: 0,
            coordinator: Some((0, ccfg)),
            seed: cfg.seed ^ 0xC0,
            now: 0,
            batch_ops_max: cfg.batch_ops_max,
            flush_ms: cfg.flush_ms,
            config: NodeSpec::config(0),
            log: None,
        });
        let interest = Interest::coordinator(meta.name().0 .0);
        eps.push(Ep {
            node,
            capsule: c,
            interest,
            worker: false,
            writer: None,
            written: Vec::new(),
            rx_records: 0,
            rx_bytes: 0,
            flood_records: 0,
            flood_bytes: 0,
        });
    }
    Ok((metas, eps))
}

/// Ops that every worker node of their capsule has applied (see `ScaleReport::ops_applied`).
fn applied_everywhere(eps: &[Ep], by_capsule: &[Vec<usize>]) -> u64 {
    let mut n = 0u64;
    for members in by_capsule {
        for &w in members {
            let Some(writer) = eps[w].writer else { continue };
            // The first seq of `writer` that some other node of the capsule has not applied.
            let next = members
                .iter()
                .filter(|&&o| o != w && eps[o].worker)
                .map(|&o| eps[o].node.engine.core().orderer().next_seq(writer))
                .min()
                .unwrap_or(u64::MAX);
            let written = &eps[w].written;
            let k = written.partition_point(|&(seq, _)| seq < next);
            n += if k == 0 { 0 } else { written[k - 1].1 };
        }
    }
    n
}

/// The run: writes during `work_ms`, then quiet until `settle_ms` more have passed; messages
/// routed by subject. Returns (messages published, ops issued, the flood's totals, the ops
/// applied by every node of their capsule when the write phase ended).
fn drive(
    cfg: &ScaleConfig,
    rng: &mut StdRng,
    eps: &mut [Ep],
    by_capsule: &[Vec<usize>],
) -> (u64, u64, FloodTotals, u64) {
    // Deliveries due next millisecond: (to, bytes).
    let mut due: VecDeque<(usize, std::sync::Arc<[u8]>)> = VecDeque::new();
    let mut published = 0u64;
    let mut ops = 0u64;
    let p_put = cfg.puts_per_node_per_s / 1000.0;
    let total = cfg.work_ms + cfg.settle_ms;
    let mut fx = Vec::new();
    let mut flood = FloodTotals::default();
    let n_eps = eps.len();
    let mut applied_in_work = None;
    for now in 0..total {
        if now == cfg.work_ms {
            // What was applied during milliseconds 0 .. work_ms.
            applied_in_work = Some(applied_everywhere(eps, by_capsule));
        }
        // Deliver what was published during the previous millisecond.
        let batch: Vec<_> = due.drain(..).collect();
        for (to, bytes) in batch {
            fx.clear();
            eps[to].node.receive(&bytes, now, &mut fx);
            publish(eps, by_capsule, &mut flood, to, &mut fx, &mut due, &mut published);
        }
        for i in 0..n_eps {
            fx.clear();
            let e = &mut eps[i];
            if e.worker && now < cfg.work_ms && rng.random_bool(p_put.min(1.0)) {
                let key = format!("k{}", rng.random_range(0..cfg.keys)).into_bytes();
                let value = vec![b'v'; cfg.value_bytes];
                e.node.put(key, Some(value), now, &mut fx);
                ops += 1;
            }
            e.node.seal_due(now, &mut fx);
            if now.is_multiple_of(cfg.tick_ms) {
                e.node.tick(now, &mut fx);
            }
            publish(eps, by_capsule, &mut flood, i, &mut fx, &mut due, &mut published);
        }
    }
    let applied_in_work = applied_in_work.unwrap_or_else(|| applied_everywhere(eps, by_capsule));
    (published, ops, flood, applied_in_work)
}

/// Routes what endpoint `from` published: to its capsule's subscribers by subject (queued for
/// the next millisecond), and counts what the flood would have delivered to everyone. Notes
/// the data records `from` sealed.
fn publish(
    eps: &mut [Ep],
    by_capsule: &[Vec<usize>],
    flood: &mut FloodTotals,
    from: usize,
    fx: &mut Vec<Effect>,
    due: &mut VecDeque<(usize, std::sync::Arc<[u8]>)>,
    published: &mut u64,
) {
    for f in fx.drain(..) {
        let bytes = match f {
            Effect::Publish(bytes) => bytes,
            Effect::Wrote(writer, seq, _, ops) if !ops.is_empty() && eps[from].writer == Some(writer) => {
                let w = &mut eps[from].written;
                let before = w.last().map_or(0, |&(_, n)| n);
                w.push((seq, before + ops.len() as u64));
                continue;
            }
            _ => continue,
        };
        *published += 1;
        let len = bytes.len() as u64;
        let route = classify(&bytes);
        let is_record = matches!(&route, Route::Capsule { leaves, .. } if leaves[..] == [Leaf::Record]);
        // The flood reaches every endpoint but the sender: count it once globally and the
        // sender's own share on the sender (flood_i = total - own_i), O(1) per message.
        flood.bytes += len;
        flood.records += is_record as u64;
        eps[from].flood_bytes += len;
        eps[from].flood_records += is_record as u64;
        let bytes: std::sync::Arc<[u8]> = bytes.into();
        match route {
            Route::Capsule { capsule, leaves } => {
                let c = eps[from].capsule;
                for &i in &by_capsule[c] {
                    let e = &mut eps[i];
                    if i != from && leaves.iter().any(|l| e.interest.wants(&capsule, *l)) {
                        e.rx_bytes += len;
                        e.rx_records += is_record as u64;
                        due.push_back((i, bytes.clone()));
                    }
                }
            }
            Route::Any => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_deliver_within_a_capsule_and_the_capsules_converge() {
        let cfg = ScaleConfig { work_ms: 400, settle_ms: 800, ..ScaleConfig::new(20) };
        let r = run_scale(&cfg, &|| 0).unwrap();
        assert!(r.converged, "{r:?}");
        assert_eq!(cfg.capsules, 2);
        assert!(r.ops_issued > 50);
        // Ten nodes per capsule: each receives from its nine peers and its coordinator, a
        // fraction of the flood (twenty-two endpoints).
        let (sub, flood) = (r.records_received_per_s.mean, r.flood_records_received_per_s.mean);
        assert!(sub > 0.0 && flood > 1.8 * sub, "subject {sub} flood {flood}");
    }

    #[test]
    fn per_node_cost_stays_flat_while_throughput_grows_with_shards() {
        let run = |shards| {
            let cfg = ScaleConfig {
                puts_per_node_per_s: 100.0,
                work_ms: 300,
                settle_ms: 500,
                ..ScaleConfig::sharded(shards, 3)
            };
            run_scale(&cfg, &|| 0).unwrap()
        };
        let (one, three) = (run(1), run(3));
        assert_eq!((one.config.nodes, one.config.capsules, three.config.nodes, three.config.capsules), (3, 1, 9, 3));
        for r in [&one, &three] {
            assert!(r.converged, "{r:?}");
            // Every op reached every node of its shard by the end, and most of them during the
            // write phase (what was in flight when it ended is not counted there).
            assert_eq!(r.ops_applied, r.ops_issued, "{r:?}");
            let offered = r.ops_issued as f64 * 1000.0 / r.config.work_ms as f64;
            assert!(r.ops_applied_per_s > 0.8 * offered && r.ops_applied_per_s <= offered, "{r:?}");
        }
        // Per node: what it receives depends on its shard only.
        for (a, b) in [
            (one.records_received_per_s.mean, three.records_received_per_s.mean),
            (one.bytes_received_per_s.mean, three.bytes_received_per_s.mean),
        ] {
            assert!(a > 0.0 && b / a < 1.5 && a / b < 1.5, "1 shard {a}/s, 3 shards {b}/s per node");
        }
        // Over the deployment: the work grows with the shards.
        let (a, b) = (one.ops_applied_per_s, three.ops_applied_per_s);
        assert!(a > 0.0 && b >= 2.0 * a, "ops applied/s: 1 shard {a}, 3 shards {b}");
        let (a, b) = (one.records_applied_per_s, three.records_applied_per_s);
        assert!(a > 0.0 && b >= 2.0 * a, "records applied/s: 1 shard {a}, 3 shards {b}");
    }
}
