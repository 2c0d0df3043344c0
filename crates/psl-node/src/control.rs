//! The node's control interface: a line protocol over TCP, for tests, scripts and people.
//!
//! ```text
//! HELLO                    -> HELLO psl-control/1 <nonce hex>   (this connection's nonce)
//! AUTH <n> <sig hex> <command line> -> the command's answer      (see "Authentication")
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
//!                             (a role holding the application key only, see [`ControlOptions`]:
//!                             revokes one writer of a certified capsule from that epoch (default
//!                             the node's epoch + 2) and from that seq of its chain (default the
//!                             next this node expects of it: whatever it has not applied yet is
//!                             refused too); the node announces the revocation and, running a
//!                             coordinator, carries it into the log)
//! REVOKE_BOUNDS <writer>   -> BOUNDS <writer> <from_epoch> <from_seq>
//!                             (REVOKE's defaults for that writer, for a revocation signed
//!                             elsewhere: the node's epoch + 2 and the next seq it expects)
//! REVOKE_SIGNED <revocation hex> -> REVOKED <writer> FROM <epoch> SEQ <seq> | ERROR <why>
//!                             (a revocation already signed by the application key, on the
//!                             operator's machine (`psl kv revoke`): checked against the
//!                             capsule (its name, its generation's application key) before the
//!                             node announces it and, running a coordinator, carries it into
//!                             the log; how a role whose keys came from the leader, which holds
//!                             no application key, revokes)
//! QUIT
//! ```
//!
//! # Authentication
//!
//! Every command that signs, revokes or returns plaintext (`PUT`, `DEL`, `GET`, `SYNC`,
//! `SYNC_DURABLE`, `PUT_DURABLE`, `DIGEST`, `DUMP`, `REVOKE`, `REVOKE_BOUNDS`, `REVOKE_SIGNED`)
//! runs only inside `AUTH`: its line
//! must carry a signature by the operator's control key ([`ControlOptions::operator`], the
//! public half; the secret half never leaves the operator) over
//! [`command_digest`]`(nonce, n, line)`, where `nonce` is this connection's 32 random bytes
//! (`HELLO`) and `n` counts this connection's accepted `AUTH` lines from 0. A recorded line is
//! useless on another connection (another nonce) and on this one (`n` has moved on), and a
//! connection taken over mid-way cannot inject (it cannot sign). A role given no operator key
//! refuses those commands. `STATS`, `KEYGEN`, `METRICS` (counters, what `psl status` reads),
//! `HELLO` and `QUIT` need no signature. A refused `AUTH` (bad signature, wrong `n`) is
//! answered `ERROR unauthenticated: ...` and the connection is closed.
//!
//! The channel is not encrypted: answers (`GET`'s values) cross it in the clear. Roles bind
//! it to loopback unless told otherwise; reach a remote one through an SSH tunnel.
//!
//! # Limits
//!
//! Lines are at most `LINE_BYTES_MAX` bytes; at most `CONNECTIONS_MAX` clients at once; a
//! connection on which nothing arrives for [`ControlOptions::idle_ms`] (default 30 s) is
//! answered `ERROR idle` and closed, and an answer the client does not read within as long
//! closes it too.

use crate::node::Node;
use psl_crypto::{Hash256, Signature, SigningKey, VerifyingKey};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest command line a client may send, in bytes (2 MiB); a longer one closes the connection.
pub const LINE_BYTES_MAX: usize = 2 << 20;
/// Most client connections served at once; further ones are refused.
pub const CONNECTIONS_MAX: usize = 64;
/// How long a connection may stay silent before it is closed, by default.
pub const IDLE_MS_DEFAULT: u64 = 30_000;
/// The protocol's name in `HELLO` and in every signed digest.
pub const PROTOCOL: &str = "psl-control/1";
/// Bytes of a connection's nonce.
pub const NONCE_BYTES: usize = 32;

/// Signs a writer's revocation from an epoch (`REVOKE`): held by a role that holds the
/// application key (the leader's coordinator, or one started with `--owner`).
pub type Revoker = Arc<dyn Fn(u32, u64, u64) -> Result<psl_capsule::KeyStatement, String> + Send + Sync>;

/// How a control interface serves.
#[derive(Clone)]
pub struct ControlOptions {
    /// The operator's control public key: the commands that sign, revoke or return plaintext
    /// need its signature (`AUTH`). None: those commands are refused.
    pub operator: Option<VerifyingKey>,
    /// Signs `REVOKE`s: only a role that holds the application key has one.
    pub revoker: Option<Revoker>,
    /// A connection silent this long (and a client that does not read an answer this long)
    /// is closed.
    pub idle_ms: u64,
}

impl Default for ControlOptions {
    fn default() -> Self {
        ControlOptions { operator: None, revoker: None, idle_ms: IDLE_MS_DEFAULT }
    }
}

/// A malformed operator control key file.
#[derive(Debug, thiserror::Error)]
pub enum ControlKeyError {
    /// The secret key is not 64 hex digits of a valid secp256k1 secret.
    #[error("an operator control key is 64 hex digits (32 bytes)")]
    SecretMalformed,
    /// The public key is not 66 hex digits of a valid compressed secp256k1 point.
    #[error("an operator control public key is 66 hex digits (a compressed secp256k1 key)")]
    PublicMalformed,
}

/// A fresh operator control key.
pub fn generate_operator_key() -> SigningKey {
    loop {
        let mut b = zeroize::Zeroizing::new([0u8; 32]);
        rand::Rng::fill(&mut rand::rng(), &mut b[..]);
        if let Ok(k) = SigningKey::from_bytes(&b) {
            return k;
        }
    }
}

/// The operator control key's file text (secret: keep it mode 0600).
pub fn operator_key_text(key: &SigningKey) -> zeroize::Zeroizing<String> {
    // No unwiped intermediate: the hex goes into a wiped buffer with room for the newline.
    let mut text = zeroize::Zeroizing::new(String::with_capacity(65));
    text.push_str(&zeroize::Zeroizing::new(hex::encode(key.expose_secret_bytes().as_slice())));
    text.push('\n');
    text
}

/// Reads an operator control key from its file text.
pub fn operator_key_from_text(text: &str) -> Result<SigningKey, ControlKeyError> {
    let mut b = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(text.trim(), &mut b[..]).map_err(|_| ControlKeyError::SecretMalformed)?;
    SigningKey::from_bytes(&b).map_err(|_| ControlKeyError::SecretMalformed)
}

/// The operator control public key's file text (what roles get).
pub fn operator_pub_text(key: &VerifyingKey) -> String {
    format!("{}\n", hex::encode(key.to_bytes()))
}

/// Reads an operator control public key from its file text.
pub fn operator_pub_from_text(text: &str) -> Result<VerifyingKey, ControlKeyError> {
    let b = hex::decode(text.trim()).map_err(|_| ControlKeyError::PublicMalformed)?;
    VerifyingKey::from_bytes(&b).map_err(|_| ControlKeyError::PublicMalformed)
}

/// What the operator signs for one command: the protocol, the connection's nonce, the
/// command's number on the connection and its line (without the line end).
pub fn command_digest(nonce: &[u8; NONCE_BYTES], n: u64, line: &[u8]) -> Hash256 {
    psl_crypto::sha256(&[PROTOCOL.as_bytes(), b" command\0", nonce, &n.to_be_bytes(), line])
}

/// Serves the control interface on `listener` until `stop` is set, with no operator key:
/// only the counters (`STATS`, `KEYGEN`, `METRICS`) answer.
pub fn serve(node: Arc<Node>, listener: TcpListener, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    serve_opts(node, listener, stop, ControlOptions::default())
}

/// Like [`serve`], with `REVOKE` signed by `revoker` (still only for an authenticated caller:
/// with no operator key, never).
pub fn serve_with(
    node: Arc<Node>,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    revoker: Option<Revoker>,
) -> std::io::Result<()> {
    serve_opts(node, listener, stop, ControlOptions { revoker, ..ControlOptions::default() })
}

/// Serves the control interface on `listener` until `stop` is set, as `opts` says.
pub fn serve_opts(
    node: Arc<Node>,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    opts: ControlOptions,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let live = Arc::new(AtomicUsize::new(0));
    let opts = Arc::new(opts);
    while !stop.load(Ordering::Acquire) {
        match psl_fabric::accept_within(&listener, psl_fabric::accept::ACCEPT_WAIT) {
            Ok(None) => {}
            Ok(Some((s, peer))) => {
                if live.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                    let mut s = s;
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = s.write_all(b"ERROR too many connections\n");
                    continue;
                }
                live.fetch_add(1, Ordering::AcqRel);
                let node = node.clone();
                let live = live.clone();
                let opts = opts.clone();
                std::thread::spawn(move || {
                    if let Err(e) = handle(&node, s, &opts) {
                        tracing::debug!(%peer, "control connection: {e}");
                    }
                    live.fetch_sub(1, Ordering::AcqRel);
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One connection's authentication state.
struct Session {
    nonce: [u8; NONCE_BYTES],
    /// The number the next `AUTH` line must carry.
    next: u64,
}

fn handle(node: &Node, s: TcpStream, opts: &ControlOptions) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    let idle = Duration::from_millis(opts.idle_ms.max(1));
    s.set_read_timeout(Some(idle))?;
    s.set_write_timeout(Some(idle))?;
    let mut w = std::io::BufWriter::new(s.try_clone()?);
    let mut r = BufReader::new(s.take(u64::MAX));
    let mut line = Vec::new();
    let mut session = Session { nonce: rand::random(), next: 0 };
    loop {
        line.clear();
        let n = match r.by_ref().take(LINE_BYTES_MAX as u64 + 1).read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                let _ = w.write_all(format!("ERROR idle for {} ms: closing\n", opts.idle_ms).as_bytes());
                let _ = w.flush();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
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
        let reply = session_command(node, &line, opts, &mut session);
        match reply {
            Reply::Line(l) => {
                w.write_all(l.as_bytes())?;
                w.write_all(b"\n")?;
            }
            Reply::Close(l) => {
                w.write_all(l.as_bytes())?;
                w.write_all(b"\n")?;
                w.flush()?;
                return Ok(());
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

/// Whether `cmd` runs without the operator's signature: counters only.
fn open_command(cmd: &[u8]) -> bool {
    matches!(cmd.to_ascii_uppercase().as_slice(), b"STATS" | b"KEYGEN" | b"METRICS" | b"QUIT" | b"HELLO")
}

fn session_command(node: &Node, line: &[u8], opts: &ControlOptions, session: &mut Session) -> Reply {
    let (cmd, rest) = split(line);
    if cmd.eq_ignore_ascii_case(b"HELLO") {
        return Reply::Line(format!("HELLO {PROTOCOL} {}", hex::encode(session.nonce)));
    }
    if cmd.eq_ignore_ascii_case(b"AUTH") {
        return match authenticate(rest, opts, session) {
            Ok(inner) => command(node, inner, opts.revoker.as_ref()),
            Err(why) => {
                tracing::warn!("control: refused an AUTH line: {why}");
                Reply::Close(format!("ERROR unauthenticated: {why}"))
            }
        };
    }
    if !open_command(cmd) {
        let why = if opts.operator.is_some() {
            "needs the operator's signature (AUTH)"
        } else {
            "this role has no operator control key (--control-pub), so it runs no such command"
        };
        return Reply::Line(format!("ERROR unauthenticated: {} {why}", String::from_utf8_lossy(cmd)));
    }
    command(node, line, opts.revoker.as_ref())
}

/// Checks `AUTH <n> <sig hex> <line>`; returns the line.
fn authenticate<'a>(rest: &'a [u8], opts: &ControlOptions, session: &mut Session) -> Result<&'a [u8], String> {
    let operator = opts.operator.as_ref().ok_or("this role has no operator control key (--control-pub)")?;
    let usage = "usage: AUTH <n> <signature hex> <command>";
    let (n, rest) = split(rest);
    let (sig, inner) = split(rest);
    let n: u64 = std::str::from_utf8(n).ok().and_then(|n| n.parse().ok()).ok_or(usage)?;
    if n != session.next {
        return Err(format!("command number {n}, expected {} (a replay?)", session.next));
    }
    let mut sb = [0u8; psl_crypto::SIGNATURE_LEN];
    hex::decode_to_slice(sig, &mut sb).map_err(|_| usage.to_string())?;
    operator
        .verify(&command_digest(&session.nonce, n, inner), &Signature(sb))
        .map_err(|_| "not signed by the operator's control key for this connection".to_string())?;
    session.next += 1;
    Ok(inner)
}

enum Reply {
    Line(String),
    /// Answer, then close the connection.
    Close(String),
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
            Ok(st) => crate::msg::rotation_json(&st).to_string(),
            Err(e) => format!("ERROR {e}"),
        }),
        b"METRICS" => Reply::Line(format!("{}END", node.render_metrics())),
        b"REVOKE" => Reply::Line(match revoke(node, rest, revoker) {
            Ok((w, e, q)) => format!("REVOKED {w} FROM {e} SEQ {q}"),
            Err(e) => format!("ERROR {e}"),
        }),
        b"REVOKE_BOUNDS" => Reply::Line(match revoke_bounds(node, rest) {
            Ok((w, e, q)) => format!("BOUNDS {w} {e} {q}"),
            Err(e) => format!("ERROR {e}"),
        }),
        b"REVOKE_SIGNED" => Reply::Line(match revoke_signed(node, rest) {
            Ok((w, e, q)) => format!("REVOKED {w} FROM {e} SEQ {q}"),
            Err(e) => format!("ERROR {e}"),
        }),
        b"QUIT" => Reply::Quit,
        _ => Reply::Line(format!("ERROR unknown command {:?}", String::from_utf8_lossy(cmd))),
    }
}

/// What `REVOKE` answers on a role without the application key.
pub const NO_REVOKER: &str = "this process holds no application key (its keys came from the leader, or it signs \
     nothing but its own writers): it cannot sign a revocation. Sign it with the owner key on the operator's machine \
     and hand it over: `psl kv revoke --node ADDR --capsule FILE --owner KEY WRITER` (REVOKE_BOUNDS, then \
     REVOKE_SIGNED)";

fn revoke(node: &Node, rest: &[u8], revoker: Option<&Revoker>) -> Result<(u32, u64, u64), String> {
    let revoker = revoker.ok_or(NO_REVOKER)?;
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

/// `REVOKE_BOUNDS <writer>`: the bounds `REVOKE` would use by default.
fn revoke_bounds(node: &Node, rest: &[u8]) -> Result<(u32, u64, u64), String> {
    let usage = "usage: REVOKE_BOUNDS <writer>";
    let w: u32 = std::str::from_utf8(rest).ok().and_then(|t| t.trim().parse().ok()).ok_or(usage)?;
    let from = node.epoch().map_err(|e| e.to_string())? + 2;
    let from_seq = node.next_seq_of(w).map_err(|e| e.to_string())?;
    Ok((w, from, from_seq))
}

/// `REVOKE_SIGNED <hex>`: a revocation the application key signed elsewhere, checked against
/// this node's capsule before it is announced (and, on a coordinator, carried into the log).
fn revoke_signed(node: &Node, rest: &[u8]) -> Result<(u32, u64, u64), String> {
    let usage = "usage: REVOKE_SIGNED <revocation hex>";
    let text = std::str::from_utf8(rest).map_err(|_| usage)?.trim();
    if text.len() != 2 * psl_capsule::certs::REVOCATION_LEN {
        return Err(format!("a revocation is {} bytes; {usage}", psl_capsule::certs::REVOCATION_LEN));
    }
    let bytes = hex::decode(text).map_err(|_| usage.to_string())?;
    let r = psl_capsule::Revocation::decode(&bytes).map_err(|e| format!("not a revocation: {e}"))?;
    let (w, from, from_seq) = (r.writer, r.from_epoch, r.from_seq);
    let st = psl_capsule::KeyStatement::Revoke(r);
    node.check_statement(&st).map_err(|e| format!("revocation refused: {e}"))?;
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

/// A client of the control interface. Made with [`ControlClient::connect_as`], it signs every
/// command but `QUIT` with the operator's control key.
pub struct ControlClient {
    w: TcpStream,
    r: BufReader<TcpStream>,
    auth: Option<ClientSession>,
}

struct ClientSession {
    key: Arc<SigningKey>,
    nonce: [u8; NONCE_BYTES],
    next: u64,
}

impl ControlClient {
    /// An unauthenticated client: only `STATS`, `KEYGEN` and `METRICS` answer.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<ControlClient> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(ControlClient { r: BufReader::new(s.try_clone()?), w: s, auth: None })
    }

    /// A client that signs its commands with the operator's control key `key` (after `HELLO`).
    pub fn connect_as(addr: SocketAddr, timeout: Duration, key: Arc<SigningKey>) -> std::io::Result<ControlClient> {
        let mut c = ControlClient::connect(addr, timeout)?;
        let hello = c.raw_call("HELLO")?;
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unexpected greeting {hello:?}"));
        let nonce_hex = hello.strip_prefix(&format!("HELLO {PROTOCOL} ")).ok_or_else(bad)?;
        let mut nonce = [0u8; NONCE_BYTES];
        hex::decode_to_slice(nonce_hex.trim(), &mut nonce).map_err(|_| bad())?;
        c.auth = Some(ClientSession { key, nonce, next: 0 });
        Ok(c)
    }

    /// The line to send for `line`: signed when this client holds a key.
    fn wrap(&mut self, line: &str) -> String {
        match &mut self.auth {
            Some(a) if !line.trim().eq_ignore_ascii_case("QUIT") => {
                let sig = a.key.sign(&command_digest(&a.nonce, a.next, line.as_bytes()));
                let out = format!("AUTH {} {} {line}", a.next, hex::encode(sig.0));
                a.next += 1;
                out
            }
            _ => line.to_string(),
        }
    }

    fn raw_call(&mut self, line: &str) -> std::io::Result<String> {
        self.w.write_all(line.as_bytes())?;
        self.w.write_all(b"\n")?;
        self.read_line()
    }

    /// Sends one command and reads its one-line answer.
    pub fn call(&mut self, line: &str) -> std::io::Result<String> {
        let line = self.wrap(line);
        self.raw_call(&line)
    }

    /// Sends many commands before reading any answer (pipelining); returns the answers.
    pub fn pipeline(&mut self, lines: &[String]) -> std::io::Result<Vec<String>> {
        let mut buf = Vec::new();
        for l in lines {
            let l = self.wrap(l);
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
        let line = self.wrap("METRICS");
        self.w.write_all(line.as_bytes())?;
        self.w.write_all(b"\n")?;
        let mut out = String::new();
        loop {
            let l = self.read_line()?;
            if l == "END" {
                return Ok(out);
            }
            if l.starts_with("ERROR ") && out.is_empty() {
                return Err(std::io::Error::other(l));
            }
            out.push_str(&l);
            out.push('\n');
        }
    }
}
