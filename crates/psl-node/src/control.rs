//! The node's control interface: a line protocol over TCP, for tests, scripts and people.
//!
//! ```text
//! PUT <key> <value...>     -> OK | ERROR <why>        (value: rest of the line)
//! DEL <key>                -> OK | ERROR <why>
//! GET <key>                -> VALUE <value> | NOT_FOUND | ERROR <why> (CapsuleDB unreachable)
//! SYNC [timeout_ms]        -> OK | ERROR <why>
//! SYNC_DURABLE [timeout_ms] -> OK | ERROR <why>       (every earlier write on f+1 servers' disks)
//! PUT_DURABLE <key> <value...> -> OK | ERROR <why>    (PUT, then SYNC_DURABLE with 30 s)
//! DIGEST                   -> DIGEST <hex>            (memtable digest)
//! DUMP                     -> one line of JSON: {key: [value, lamport, writer]}
//! STATS                    -> one line of JSON: counters and rejections by reason
//! KEYGEN                   -> one line of JSON: epoch, application key generations in force
//!                             and newest, the newest one's rotation epoch
//! METRICS                  -> Prometheus text, then a line "END"
//! REVOKE <writer> [<from_epoch> [<from_seq>]] -> REVOKED <writer> FROM <epoch> SEQ <seq> | ERROR <why>
//!                             (a role holding the application key only, see [`serve_with`]:
//!                             revokes one writer of a certified capsule from that epoch (default
//!                             the node's epoch + 2) and from that seq of its chain (default the
//!                             next this node expects of it: whatever it has not applied yet is
//!                             refused too); the node announces the revocation and, running a
//!                             coordinator, carries it into the log)
//! QUIT
//! ```
//! Lines are at most `LINE_BYTES_MAX` bytes; at most `CONNECTIONS_MAX` clients at once. The
//! interface is for a trusted operator on loopback: it hands out plaintext.

use crate::node::Node;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const LINE_BYTES_MAX: usize = 2 << 20;
pub const CONNECTIONS_MAX: usize = 64;

/// Signs a writer's revocation from an epoch (`REVOKE`): held by a role that holds the
/// application key (the leader's coordinator, or one started with `--owner`).
pub type Revoker = Arc<dyn Fn(u32, u64, u64) -> Result<psl_capsule::KeyStatement, String> + Send + Sync>;

/// Serves the control interface on `listener` until `stop` is set.
pub fn serve(node: Arc<Node>, listener: TcpListener, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    serve_with(node, listener, stop, None)
}

/// Like [`serve`], with `REVOKE` signed by `revoker`.
pub fn serve_with(
    node: Arc<Node>,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    revoker: Option<Revoker>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let live = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, _)) => {
                if live.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                    let mut s = s;
                    let _ = s.write_all(b"ERROR too many connections\n");
                    continue;
                }
                live.fetch_add(1, Ordering::AcqRel);
                let node = node.clone();
                let live = live.clone();
                let revoker = revoker.clone();
                std::thread::spawn(move || {
                    if let Err(e) = handle(&node, s, revoker.as_ref()) {
                        tracing::debug!("control connection: {e}");
                    }
                    live.fetch_sub(1, Ordering::AcqRel);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn handle(node: &Node, s: TcpStream, revoker: Option<&Revoker>) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    let mut w = std::io::BufWriter::new(s.try_clone()?);
    let mut r = BufReader::new(s.take(u64::MAX));
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = r.by_ref().take(LINE_BYTES_MAX as u64 + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > LINE_BYTES_MAX {
            w.write_all(b"ERROR line too long\n")?;
            w.flush()?;
            return Ok(());
        }
        while line.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
            line.pop();
        }
        let reply = command(node, &line, revoker);
        match reply {
            Reply::Line(l) => {
                w.write_all(l.as_bytes())?;
                w.write_all(b"\n")?;
            }
            Reply::Quit => {
                w.flush()?;
                return Ok(());
            }
        }
        // Flush only when no further request is already buffered (pipelining).
        if r.buffer().is_empty() {
            w.flush()?;
        }
    }
}

enum Reply {
    Line(String),
    Quit,
}

fn command(node: &Node, line: &[u8], revoker: Option<&Revoker>) -> Reply {
    let (cmd, rest) = split(line);
    let ok = |r: Result<(), crate::NodeError>| {
        Reply::Line(match r {
            Ok(()) => "OK".into(),
            Err(e) => format!("ERROR {e}"),
        })
    };
    match cmd.to_ascii_uppercase().as_slice() {
        b"PUT" => {
            let (k, v) = split(rest);
            if k.is_empty() {
                return Reply::Line("ERROR usage: PUT <key> <value>".into());
            }
            ok(node.put(k, v))
        }
        b"DEL" => ok(node.delete(rest)),
        b"GET" => Reply::Line(match node.try_get(rest) {
            Ok(Some(v)) => format!("VALUE {}", String::from_utf8_lossy(&v)),
            Ok(None) => "NOT_FOUND".into(),
            Err(e) => format!("ERROR {e}"),
        }),
        b"SYNC" => {
            let ms = std::str::from_utf8(rest).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(30_000u64);
            ok(node.sync(Duration::from_millis(ms)))
        }
        b"SYNC_DURABLE" => {
            let ms = std::str::from_utf8(rest).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(30_000u64);
            ok(node.sync_durable(Duration::from_millis(ms)))
        }
        b"PUT_DURABLE" => {
            let (k, v) = split(rest);
            if k.is_empty() {
                return Reply::Line("ERROR usage: PUT_DURABLE <key> <value>".into());
            }
            ok(node.put_durable(k, v, Duration::from_secs(30)))
        }
        b"DIGEST" => Reply::Line(format!("DIGEST {}", node.digest())),
        b"DUMP" => {
            let snap = node.memtable().snapshot();
            let m: serde_json::Map<String, serde_json::Value> = snap
                .into_iter()
                .filter_map(|(k, e)| {
                    e.value.map(|v| {
                        (
                            String::from_utf8_lossy(&k).into_owned(),
                            serde_json::json!([String::from_utf8_lossy(&v), e.version.lamport, e.version.writer]),
                        )
                    })
                })
                .collect();
            Reply::Line(serde_json::Value::Object(m).to_string())
        }
        b"STATS" => Reply::Line(stats_json(node).to_string()),
        b"KEYGEN" => Reply::Line(match node.rotation_state(std::time::Instant::now() + Duration::from_secs(5)) {
            Ok(st) => st.to_json().to_string(),
            Err(e) => format!("ERROR {e}"),
        }),
        b"METRICS" => Reply::Line(format!("{}END", node.render_metrics())),
        b"REVOKE" => Reply::Line(match revoke(node, rest, revoker) {
            Ok((w, e, q)) => format!("REVOKED {w} FROM {e} SEQ {q}"),
            Err(e) => format!("ERROR {e}"),
        }),
        b"QUIT" => Reply::Quit,
        _ => Reply::Line(format!("ERROR unknown command {:?}", String::from_utf8_lossy(cmd))),
    }
}

fn revoke(node: &Node, rest: &[u8], revoker: Option<&Revoker>) -> Result<(u32, u64, u64), String> {
    let revoker = revoker.ok_or("this process holds no application key: it cannot sign a revocation")?;
    let usage = "usage: REVOKE <writer> [<from_epoch> [<from_seq>]]";
    let text = std::str::from_utf8(rest).map_err(|_| usage)?;
    let mut args = text.split_ascii_whitespace();
    let w: u32 = args.next().and_then(|a| a.parse().ok()).ok_or(usage)?;
    let mut num = |default: &dyn Fn() -> Result<u64, String>| match args.next() {
        Some(a) => a.parse::<u64>().map_err(|_| format!("{a:?} is not a number; {usage}")),
        None => default(),
    };
    let from = num(&|| node.epoch().map(|e| e + 2).map_err(|e| e.to_string()))?;
    let from_seq = num(&|| node.next_seq_of(w).map_err(|e| e.to_string()))?;
    let st = revoker(w, from, from_seq)?;
    node.add_statement(st, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    Ok((w, from, from_seq))
}

/// The node's counters as JSON.
pub fn stats_json(node: &Node) -> serde_json::Value {
    use psl_scl::{Metrics, RejectReason};
    let m = node.metrics();
    let rejected: serde_json::Map<String, serde_json::Value> =
        RejectReason::ALL.iter().map(|r| (r.name().to_string(), m.rejected(*r).into())).collect();
    serde_json::json!({
        "writers": node.writers(),
        "keys": node.memtable().len(),
        "lamport": node.lamport(),
        "epoch": Metrics::get(&m.epoch),
        "records_applied": Metrics::get(&m.records_applied),
        "ops_applied": Metrics::get(&m.ops_applied),
        "records_written": Metrics::get(&m.records_written),
        "ops_written": Metrics::get(&m.ops_written),
        "records_held": Metrics::get(&m.records_held),
        "repair_requests_sent": Metrics::get(&m.repair_requests_sent),
        "repair_records_sent": Metrics::get(&m.repair_records_sent),
        "syncs_applied": Metrics::get(&m.syncs_applied),
        "withholding_reports": Metrics::get(&m.withholding_reports),
        "repair_cache_bytes": Metrics::get(&m.repair_cache_bytes),
        "flow_waits": Metrics::get(&m.flow_waits),
        "flow_opened": Metrics::get(&m.flow_opened),
        "flow_unacked_ops": node.flow_unacked_ops(),
        "inbound_dropped": node.inbound_dropped(),
        "fabric_dropped_send_full": node.fabric_stats().dropped_send_full,
        "rejected": rejected,
    })
}

fn split(b: &[u8]) -> (&[u8], &[u8]) {
    match b.iter().position(|c| *c == b' ') {
        Some(i) => (&b[..i], &b[i + 1..]),
        None => (b, &[]),
    }
}

/// A client of the control interface.
pub struct ControlClient {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl ControlClient {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<ControlClient> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(ControlClient { r: BufReader::new(s.try_clone()?), w: s })
    }

    /// Sends one command and reads its one-line answer.
    pub fn call(&mut self, line: &str) -> std::io::Result<String> {
        self.w.write_all(line.as_bytes())?;
        self.w.write_all(b"\n")?;
        self.read_line()
    }

    /// Sends many commands before reading any answer (pipelining); returns the answers.
    pub fn pipeline(&mut self, lines: &[String]) -> std::io::Result<Vec<String>> {
        let mut buf = Vec::new();
        for l in lines {
            buf.extend_from_slice(l.as_bytes());
            buf.push(b'\n');
        }
        let w = self.w.try_clone()?;
        let writer = std::thread::spawn(move || {
            let mut w = w;
            w.write_all(&buf)
        });
        let mut out = Vec::with_capacity(lines.len());
        for _ in lines {
            out.push(self.read_line()?);
        }
        writer.join().map_err(|_| std::io::Error::other("writer thread panicked"))??;
        Ok(out)
    }

    fn read_line(&mut self) -> std::io::Result<String> {
        let mut s = String::new();
        if self.r.read_line(&mut s)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "node closed the connection"));
        }
        Ok(s.trim_end().to_string())
    }

    /// METRICS: reads until END.
    pub fn metrics(&mut self) -> std::io::Result<String> {
        self.w.write_all(b"METRICS\n")?;
        let mut out = String::new();
        loop {
            let l = self.read_line()?;
            if l == "END" {
                return Ok(out);
            }
            out.push_str(&l);
            out.push('\n');
        }
    }
}
