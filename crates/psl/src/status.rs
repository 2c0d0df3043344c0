//! `psl status --config cluster.toml`: every role of every host, probed over the network
//! (in parallel, each probe bounded by `--timeout-ms`): health, epoch, lag and counters.
//!
//! - NATS servers: the monitoring endpoint's `/varz` (connections, messages and bytes in and
//!   out, slow consumers, routes, leaf nodes);
//! - KV coordinators and CapsuleDB: the control interface's `STATS` (epoch, records applied,
//!   rejections; it needs no operator key); lag = the newest epoch any of them reports minus
//!   its own. Their control interfaces listen on loopback unless `control_bind` says
//!   otherwise: those of other hosts are then shown `local` (probe them on their host);
//! - KV capsule servers: the read interface's heads; lag = records behind the most advanced
//!   server, summed over writers;
//! - workers: the control interface's `DEBUG`; the scheduler: its worker registry (`Status`);
//! - memcached front ends: `stats` (items, gets, sets);
//! - the leader, capsule hosts and the router: whether they accept a connection.
//!
//! Exit status 0 when every role answered, 1 otherwise.

use anyhow::Result;
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::ClusterConfig;

/// `psl status`: the cluster file to probe and how to report.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The cluster description.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Bound on each probe.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Nats,
    Router,
    Scheduler,
    Leader,
    CapsuleHost,
    CoordinatorHost,
    Worker,
    KvServer,
    Coordinator,
    CapsuleDb,
    Memcached,
}

struct Probe {
    host: String,
    role: String,
    kind: Kind,
    addr: SocketAddr,
    /// A loopback control interface of another host: not reachable from here by design.
    elsewhere: bool,
}

fn connect(addr: SocketAddr, t: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, t)?;
    s.set_read_timeout(Some(t))?;
    s.set_write_timeout(Some(t))?;
    Ok(s)
}

/// One line answered to one line sent (the node and worker control interfaces).
fn line_call(addr: SocketAddr, t: Duration, cmd: &str) -> Result<String> {
    let mut s = connect(addr, t)?;
    s.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(s.take(1 << 20)).read_line(&mut line)?;
    Ok(line.trim().to_string())
}

fn http_json(addr: SocketAddr, t: Duration, path: &str) -> Result<Value> {
    let mut s = connect(addr, t)?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut body = String::new();
    s.take(4 << 20).read_to_string(&mut body)?;
    let json = body.split_once("\r\n\r\n").map(|x| x.1).unwrap_or_default();
    Ok(serde_json::from_str(json)?)
}

/// The `STAT` lines named in `names` of a memcached `stats` reply (at most 1 MiB read), and
/// whether the reply ended with `END` (a server that closes early leaves it false).
pub fn memcached_stats_named(
    addr: SocketAddr,
    t: Duration,
    names: &[&str],
) -> Result<(std::collections::BTreeMap<String, String>, bool)> {
    let mut s = connect(addr, t)?;
    s.write_all(b"stats\r\n")?;
    let mut m = std::collections::BTreeMap::new();
    for line in BufReader::new(s.take(1 << 20)).lines() {
        let line = line?;
        if line.trim_end() == "END" {
            return Ok((m, true));
        }
        let mut w = line.split_whitespace();
        if let (Some("STAT"), Some(k), Some(v)) = (w.next(), w.next(), w.next()) {
            if names.contains(&k) {
                m.insert(k.to_string(), v.to_string());
            }
        }
    }
    Ok((m, false))
}

fn memcached_stats(addr: SocketAddr, t: Duration) -> Result<Value> {
    let names = ["curr_items", "cmd_get", "cmd_set", "get_hits", "get_misses", "curr_connections", "evictions"];
    let (stats, _) = memcached_stats_named(addr, t, &names)?;
    Ok(Value::Object(
        stats.into_iter().map(|(k, v)| (k, v.parse::<u64>().map(Value::from).unwrap_or_else(|_| v.into()))).collect(),
    ))
}

fn probe(p: &Probe, t: Duration) -> Result<Value> {
    Ok(match p.kind {
        Kind::Nats => {
            let v = http_json(p.addr, t, "/varz")?;
            let pick = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
            json!({
                "server": pick("server_name"), "version": pick("version"),
                "connections": pick("connections"), "routes": pick("routes"), "leafnodes": pick("leafnodes"),
                "in_msgs": pick("in_msgs"), "out_msgs": pick("out_msgs"),
                "in_bytes": pick("in_bytes"), "out_bytes": pick("out_bytes"), "slow_consumers": pick("slow_consumers"),
            })
        }
        Kind::Router | Kind::Leader | Kind::CapsuleHost | Kind::CoordinatorHost => {
            connect(p.addr, t)?;
            json!({})
        }
        Kind::Scheduler => {
            use psl_faas::net::wire::{read_msg, write_msg, Msg};
            let mut s = connect(p.addr, t)?;
            write_msg(&mut s, &Msg::Status)?;
            match read_msg(&mut s)? {
                Msg::StatusReply { workers } => json!({
                    "workers": workers.len(),
                    "idle": workers.iter().filter(|w| w.idle).count(),
                }),
                m => anyhow::bail!("unexpected answer {}", m.name()),
            }
        }
        Kind::Worker => serde_json::from_str(&line_call(p.addr, t, "DEBUG")?)?,
        Kind::Coordinator | Kind::CapsuleDb => {
            let v: Value = serde_json::from_str(&line_call(p.addr, t, "STATS")?)?;
            let pick = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
            json!({
                "epoch": pick("epoch"), "records_applied": pick("records_applied"), "records_held": pick("records_held"),
                "syncs_applied": pick("syncs_applied"), "repair_requests_sent": pick("repair_requests_sent"),
                "withholding_reports": pick("withholding_reports"), "keys": pick("keys"),
            })
        }
        Kind::KvServer => {
            let mut c = psl_server::read::ReadClient::connect(p.addr)?;
            let heads = c.heads()?;
            let map: serde_json::Map<String, Value> =
                heads.iter().map(|(w, (seq, _))| (w.to_string(), Value::from(*seq))).collect();
            json!({ "writers": heads.len(), "records": heads.values().map(|(s, _)| s + 1).sum::<u64>(), "heads": map })
        }
        Kind::Memcached => memcached_stats(p.addr, t)?,
    })
}

fn probes(c: &ClusterConfig) -> Vec<Probe> {
    let host_of =
        |a: SocketAddr| c.hosts.iter().find(|h| h.address == a.ip()).map(|h| h.name.clone()).unwrap_or_default();
    let mut v = Vec::new();
    let mut add = |role: String, kind: Kind, addr: SocketAddr| {
        v.push(Probe { host: host_of(addr), role, kind, addr, elsewhere: false })
    };
    for (host, _, mon) in c.nats_servers() {
        let _ = host;
        add("nats-server".into(), Kind::Nats, mon);
    }
    if let Some(r) = c.router() {
        add("router".into(), Kind::Router, r);
    }
    if let Some(s) = c.scheduler() {
        add("scheduler".into(), Kind::Scheduler, s);
    }
    if let Some(l) = c.leader() {
        add("leader".into(), Kind::Leader, l);
    }
    for (id, a) in c.capsule_hosts() {
        add(format!("capsule-host {id}"), Kind::CapsuleHost, a);
    }
    for (id, _, a) in c.coordinator_hosts() {
        add(format!("coordinator-host {id}"), Kind::CoordinatorHost, a);
    }
    for (id, a) in c.workers() {
        add(format!("worker {id}"), Kind::Worker, a);
    }
    for (id, a) in c.kv_server_reads() {
        add(format!("kv-server {id}"), Kind::KvServer, a);
    }
    for (id, a, _) in c.memcached() {
        add(format!("memcached {id}"), Kind::Memcached, a);
    }
    // Control interfaces: on loopback, only this host's own are reachable.
    for h in &c.hosts {
        let mut add = |role: String, kind: Kind, addr: SocketAddr| {
            let elsewhere = addr.ip().is_loopback() && !is_this_host(h.address);
            v.push(Probe { host: h.name.clone(), role, kind, addr, elsewhere })
        };
        for r in &h.kv_coordinators {
            add(
                format!("kv-coordinator {r}"),
                Kind::Coordinator,
                h.control_at(c.ports.kv_coordinator_control + *r as u16),
            );
        }
        if h.capsuledb {
            add("capsuledb".into(), Kind::CapsuleDb, h.control_at(c.ports.capsuledb_control));
        }
    }
    v
}

/// Whether `a` is an address of this machine (it can be bound here).
fn is_this_host(a: std::net::IpAddr) -> bool {
    a.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(a, 0)).is_ok()
}

/// Fills in each row's `lag` from what its peers report.
fn lags(rows: &mut [Value]) {
    let epochs: Vec<u64> = rows.iter().filter_map(|r| r["detail"]["epoch"].as_u64()).collect();
    if let Some(top) = epochs.iter().max() {
        for r in rows.iter_mut() {
            if let Some(e) = r["detail"]["epoch"].as_u64() {
                r["epoch"] = e.into();
                r["lag"] = format!("{} epochs", top - e).into();
            }
        }
    }
    let mut best: std::collections::BTreeMap<String, u64> = Default::default();
    for r in rows.iter().filter(|r| r["kind"] == "kv-server") {
        if let Some(h) = r["detail"]["heads"].as_object() {
            for (w, s) in h {
                let e = best.entry(w.clone()).or_default();
                *e = (*e).max(s.as_u64().unwrap_or(0) + 1);
            }
        }
    }
    for r in rows.iter_mut().filter(|r| r["kind"] == "kv-server" && r["health"] == "ok") {
        let h = r["detail"]["heads"].as_object().cloned().unwrap_or_default();
        let behind: u64 =
            best.iter().map(|(w, top)| top - h.get(w).and_then(|s| s.as_u64()).map_or(0, |s| s + 1)).sum();
        r["lag"] = format!("{behind} records").into();
    }
}

/// Runs `psl status`: probes every role of the cluster file in parallel and prints a table (or
/// JSON); exit 0 when every role answered, 1 otherwise.
pub fn run(a: StatusArgs) -> Result<i32> {
    let c = ClusterConfig::load(&a.config)?;
    let t = Duration::from_millis(a.timeout_ms.max(1));
    let ps = probes(&c);
    let results: Vec<(usize, Result<Value>)> = std::thread::scope(|s| {
        let hs: Vec<_> = ps
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.elsewhere)
            .map(|(i, p)| s.spawn(move || (i, probe(p, t))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or((usize::MAX, Err(anyhow::anyhow!("probe panicked"))))).collect()
    });
    let mut rows: Vec<Value> = results
        .into_iter()
        .filter(|(i, _)| *i < ps.len())
        .map(|(i, r)| {
            let p = &ps[i];
            let kind = match p.kind {
                Kind::KvServer => "kv-server",
                _ => "role",
            };
            match r {
                Ok(d) => json!({"host": p.host, "role": p.role, "kind": kind, "addr": p.addr.to_string(), "health": "ok", "epoch": null, "lag": null, "detail": d}),
                Err(e) => json!({"host": p.host, "role": p.role, "kind": kind, "addr": p.addr.to_string(), "health": "down", "epoch": null, "lag": null, "error": format!("{e:#}")}),
            }
        })
        .collect();
    rows.extend(ps.iter().filter(|p| p.elsewhere).map(|p| {
        json!({"host": p.host, "role": p.role, "kind": "role", "addr": p.addr.to_string(), "health": "local", "epoch": null, "lag": null,
               "error": "control interface on loopback: run psl status on its host"})
    }));
    lags(&mut rows);
    let down = rows.iter().filter(|r| r["health"] == "down").count();
    if a.json {
        println!("{}", json!({"roles": rows, "down": down}));
    } else {
        println!(
            "{:<12} {:<18} {:<22} {:<6} {:>8} {:<12} counters",
            "host", "role", "address", "health", "epoch", "lag"
        );
        for r in &rows {
            let counters = match r.get("detail") {
                Some(Value::Object(m)) => m
                    .iter()
                    .filter(|(k, v)| *k != "heads" && *k != "epoch" && !v.is_null() && !v.is_object())
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => r["error"].as_str().unwrap_or_default().to_string(),
            };
            let show = |v: &Value| match v {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            println!(
                "{:<12} {:<18} {:<22} {:<6} {:>8} {:<12} {}",
                show(&r["host"]),
                show(&r["role"]),
                show(&r["addr"]),
                show(&r["health"]),
                show(&r["epoch"]),
                show(&r["lag"]),
                counters
            );
        }
        println!("{} roles, {} down", rows.len(), down);
    }
    Ok(if down == 0 { 0 } else { 1 })
}
