//! `psl bench fabric`: the two fabrics side by side, in one run: the router tree (`psl router`,
//! a child process) and a local `nats-server` (a child process too), each on loopback.
//!
//! - **Messages**: one publisher and three receivers, each an endpoint of its own in this
//!   process, for 256-byte and 64 KiB messages (encoded as SCL record messages of one capsule,
//!   so NATS routes them on the capsule's `rec` subject as it would records). Throughput: the
//!   publisher sends as fast as the endpoint takes messages for the case's time; the figure is
//!   the messages each receiver got per second (mean of the three), and the losses are what
//!   the fabric dropped (both fabrics are best effort: full queues drop, counted). Latency: a
//!   second, paced phase (at most 2,000 messages/s, 200 for 64 KiB) so that the figure is the
//!   fabric's, not a flood's queueing; p50 and p99 of publish-to-receive over every receiver.
//! - **SCL puts**: `psl bench scl`'s put case (two writer nodes, one receive-only node that
//!   also runs the coordinator; zipfian keys, 100-byte values), each node on its own endpoint
//!   of the fabric under test. Puts count once every node has applied them.
//!   `ratio_nats_vs_router` is the headline (goal: at least 0.8).
//! - **Fabric CPU**: the broker's CPU (router or nats-server, from `/proc/PID/stat`) over the
//!   broker's plus this process's CPU during the SCL case (`fabric_cpu_share_*`; goal: a third
//!   or less). The clients' fabric threads run in this process and count as PSL's.

use super::scl;
use anyhow::{bail, Context, Result};
use psl_fabric::{Fabric, Interest, NatsConfig, NatsEndpoint, TcpConfig, TcpEndpoint};
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RECEIVERS: usize = 3;
const SIZES: [usize; 2] = [256, 64 * 1024];
/// The capsule the message phase's records name (any 32 bytes: nothing verifies them).
const CAPSULE: [u8; 32] = [0x5c; 32];

/// Which fabric a case runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Backend {
    Router(SocketAddr),
    Nats(SocketAddr),
}

impl Backend {
    fn key(&self) -> &'static str {
        match self {
            Backend::Router(_) => "router",
            Backend::Nats(_) => "nats",
        }
    }

    /// A connected endpoint for `interest` (the router ignores it: it sends everything
    /// everywhere).
    pub(crate) fn endpoint(&self, name: &str, interest: &Interest) -> Result<Arc<dyn Fabric>> {
        let wait = Duration::from_secs(10);
        match *self {
            Backend::Router(addr) => {
                let ep = TcpEndpoint::connect(
                    addr,
                    TcpConfig { name: name.into(), queue_msgs_max: 1 << 16, ..TcpConfig::default() },
                )?;
                if !ep.wait_connected(wait) {
                    bail!("{name}: not connected to the router {addr} within {wait:?}");
                }
                Ok(Arc::new(ep))
            }
            Backend::Nats(addr) => {
                let cfg = NatsConfig {
                    name: name.into(),
                    queue_msgs_max: 1 << 16,
                    subscription_capacity: 1 << 16,
                    ..NatsConfig::default()
                };
                let ep = NatsEndpoint::connect(&[format!("nats://{addr}")], interest, cfg)?;
                if !ep.wait_connected(wait) {
                    bail!("{name}: not connected to nats-server {addr} within {wait:?}");
                }
                Ok(Arc::new(ep))
            }
        }
    }
}

/// A broker child process, killed on drop.
enum Broker {
    Router(Child),
    /// The server, and its configuration and log directory (removed when dropped).
    Nats(psl_fabric::natsd::NatsServer, #[allow(dead_code)] tempfile::TempDir),
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Broker::Router(c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Broker {
    fn cpu_seconds(&self) -> f64 {
        match self {
            Broker::Router(c) => super::pid_cpu_seconds(c.id()),
            Broker::Nats(s, _) => s.pid().map_or(0.0, super::pid_cpu_seconds),
        }
    }
}

fn start_router() -> Result<(Broker, SocketAddr)> {
    let exe = psl::util::sibling_exe("psl")?;
    let mut child = Command::new(exe)
        .args(["router", "--listen", "127.0.0.1:0", "--stats-every", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting psl router")?;
    let read = router_addr(&mut child);
    let broker = Broker::Router(child);
    Ok((broker, read?))
}

/// The address a `psl router` started with `--listen HOST:0` and a piped stdout listens on
/// (its first line, `listening ADDR`).
pub(super) fn router_addr(child: &mut std::process::Child) -> Result<SocketAddr> {
    let out = child.stdout.take().context("psl router's stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).context("reading psl router's first line")?;
    line.trim()
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("psl router printed {line:?}, not 'listening ADDR'"))
}

fn start_nats() -> Result<(Broker, SocketAddr)> {
    let dir = tempfile::tempdir()?;
    let listen = psl_fabric::natsd::free_port("127.0.0.1".parse()?)?;
    let opts = psl_fabric::natsd::NatsServerOptions::new("psl-bench", listen, dir.path());
    let s = psl_fabric::natsd::NatsServer::start(&opts, Duration::from_secs(10))
        .context("starting nats-server (is it installed? scripts/install-nats-test-deps.sh)")?;
    Ok((Broker::Nats(s, dir), listen))
}

/// Bytes before a record message's payload (version, type, capsule name).
fn record_prefix_len() -> usize {
    record_msg(Vec::new()).len()
}

fn record_msg(payload: Vec<u8>) -> Vec<u8> {
    psl_scl::Msg::Record { capsule: psl_capsule::CapsuleName(psl_crypto::Hash256(CAPSULE)), bytes: payload.into() }
        .encode()
}

/// The message the publisher sends: an SCL record message of `size` bytes in all whose first
/// 8 payload bytes carry the send time (ns since `base`) and the ninth the phase (0: flood,
/// 1: paced), so that a flood's stragglers never count as latency samples.
fn message(size: usize, base: Instant, phase: u8) -> psl_fabric::Message {
    let mut payload = vec![0u8; size.saturating_sub(record_prefix_len()).max(9)];
    payload[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
    payload[8] = phase;
    psl_fabric::Message::from(record_msg(payload))
}

struct MsgResult {
    per_receiver_msgs_per_s: f64,
    sent: u64,
    received: u64,
    p50_us: f64,
    p99_us: f64,
}

/// One message case: flood for `secs`, then a paced latency phase.
fn messages(b: Backend, size: usize, secs: f64) -> Result<MsgResult> {
    let interest = Interest { capsules: vec![CAPSULE], records: true, ..Interest::default() };
    let publisher = b.endpoint("bench-pub", &Interest::default())?;
    let receivers: Vec<Arc<dyn Fabric>> =
        (0..RECEIVERS).map(|i| b.endpoint(&format!("bench-recv{i}"), &interest)).collect::<Result<_>>()?;
    // Subscriptions travel to the server asynchronously: let them settle.
    std::thread::sleep(Duration::from_millis(300));
    let base = Instant::now();
    let prefix = record_prefix_len();

    // Flood.
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<_> = receivers
        .iter()
        .map(|r| {
            let (r, stop) = (r.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(_)) = r.recv_timeout(Duration::from_millis(20)) {
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            if publisher.publish(message(size, base, 0)).is_ok() {
                sent += 1;
            }
        }
    }
    let flood_secs = start.elapsed().as_secs_f64();
    // What is in flight still arrives (counted against the flood's time: a fabric that queues
    // more does not gain by it beyond this grace).
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let received: u64 = counters.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    // Drain the flood's stragglers: until no receiver has had a message for 300 ms (30 s at most).
    let quiet_until = Instant::now() + Duration::from_secs(30);
    let mut last = Instant::now();
    while last.elapsed() < Duration::from_millis(300) && Instant::now() < quiet_until {
        for r in &receivers {
            while let Ok(Some(_)) = r.try_recv() {
                last = Instant::now();
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    // Paced latency.
    let rate = if size > 4096 { 200.0 } else { 2000.0 };
    let count = ((secs * rate) as usize).clamp(100, 20_000);
    let stop = Arc::new(AtomicBool::new(false));
    let samplers: Vec<_> = receivers
        .iter()
        .map(|r| {
            let (r, stop) = (r.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(m)) = r.recv_timeout(Duration::from_millis(20)) {
                        if let (Some(t), Some(1)) = (m.get(prefix..prefix + 8), m.get(prefix + 8)) {
                            let sent = u64::from_le_bytes(t.try_into().unwrap_or([0; 8]));
                            let now = base.elapsed().as_nanos() as u64;
                            lat.push(now.saturating_sub(sent) as f64 / 1000.0);
                        }
                    }
                }
                lat
            })
        })
        .collect();
    let t0 = Instant::now();
    for i in 0..count {
        let due = t0 + Duration::from_secs_f64(i as f64 / rate);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let _ = publisher.publish(message(size, base, 1));
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<f64> = samplers.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| if lat.is_empty() { f64::NAN } else { lat[((lat.len() - 1) as f64 * p) as usize] };
    Ok(MsgResult {
        per_receiver_msgs_per_s: received as f64 / RECEIVERS as f64 / flood_secs,
        sent,
        received,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
    })
}

/// `cases`: any of `router`, `nats` (which fabrics; default both) and `messages`, `scl` (which
/// parts; default both).
pub fn run(secs: f64, cases: &[String], show_progress: bool) -> Result<Value> {
    let secs = secs.max(0.2);
    let has = |c: &str| cases.iter().any(|x| x == c);
    let fabrics = !has("router") && !has("nats");
    let parts = !has("messages") && !has("scl");
    let want = |fabric: &str, part: &str| (fabrics || has(fabric)) && (parts || has(part));
    let pb = if show_progress { super::progress(6, "bench fabric") } else { indicatif::ProgressBar::hidden() };
    let (router, raddr) = start_router()?;
    let (nats, naddr) = start_nats()?;
    let mut out = Map::new();
    let mut details = Map::new();
    for (b, broker) in [(Backend::Router(raddr), &router), (Backend::Nats(naddr), &nats)] {
        for size in SIZES.into_iter().filter(|_| want(b.key(), "messages")) {
            let r = messages(b, size, secs)?;
            let k =
                format!("{}_{}", b.key(), if size < 1024 { format!("{size}b") } else { format!("{}k", size / 1024) });
            out.insert(format!("msgs_per_s_{k}"), json!(r.per_receiver_msgs_per_s));
            out.insert(format!("p50_us_{k}"), json!(r.p50_us));
            out.insert(format!("p99_us_{k}"), json!(r.p99_us));
            details.insert(
                format!("messages_{k}"),
                json!({"sent": r.sent, "received_by_all_receivers": r.received,
                       "delivered_share": r.received as f64 / (r.sent.max(1) as f64 * RECEIVERS as f64)}),
            );
            pb.inc(1);
        }
        if !want(b.key(), "scl") {
            continue;
        }
        let broker_cpu0 = broker.cpu_seconds();
        let cpu0 = super::process_cpu_seconds();
        let r = scl::put_case_on(2, secs * 2.0, &|name, interest| b.endpoint(name, interest))?;
        let broker_cpu = broker.cpu_seconds() - broker_cpu0;
        let cpu = super::process_cpu_seconds() - cpu0;
        out.insert(format!("scl_puts_per_s_{}", b.key()), json!(r.puts_per_s));
        out.insert(format!("fabric_cpu_share_{}", b.key()), json!(broker_cpu / (broker_cpu + cpu).max(1e-9)));
        details.insert(
            format!("scl_{}", b.key()),
            json!({"broker_cpu_seconds": broker_cpu, "psl_cpu_seconds": cpu, "detail": r.detail}),
        );
        pb.inc(1);
    }
    pb.finish_and_clear();
    drop((router, nats));
    if let (Some(n), Some(r)) = (out.get("scl_puts_per_s_nats"), out.get("scl_puts_per_s_router")) {
        let ratio = n.as_f64().unwrap_or(0.0) / r.as_f64().unwrap_or(f64::NAN).max(1e-9);
        out.insert("ratio_nats_vs_router".into(), json!(ratio));
    }
    out.insert("goal_ratio".into(), json!(0.8));
    out.insert("goal_fabric_cpu_share".into(), json!(1.0 / 3.0));
    out.insert("receivers".into(), json!(RECEIVERS));
    out.insert("seconds_per_case".into(), json!(secs));
    out.insert("detail".into(), Value::Object(details));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}
