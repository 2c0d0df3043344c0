//! Reads for other processes: a small TCP protocol on a capsule server's `--read` address, and
//! its client, including the freshness-checked fetch a restarting node recovers from.
//!
//! Requests are one ASCII line each (at most [`REQUEST_BYTES_MAX`] bytes); a connection may send
//! many. Every answer is `u32 count` (big-endian) then `count` frames of `u32 len | bytes`; an
//! error is `count = u32::MAX` then one frame holding the message.
//!
//! | request | answer frames |
//! | --- | --- |
//! | `HEADS` | one per writer: `u32 writer | u64 seq | [32] hash` of its newest durable record |
//! | `SYNC` | the newest SYNC record stored (0 or 1 frame) |
//! | `GET <hash hex>` | the record (0 or 1 frame) |
//! | `RANGE <writer> <from> <to>` | the writer's records `from ..= to` held (at most [`RANGE_RECORDS_MAX`]) |
//! | `PROOF <hash hex>` | a membership proof (`psl_capsule::MembershipProof` bytes) of the record |
//! | `CHECK` | one frame: JSON of the server's own end-to-end check of its store ([`RemoteCheck`]) |
//! | `CERTS` | the key statements the server knows (a certified capsule), as statement lists (a Cert record's body), up to 64 a frame |
//! | `STATS` | one frame: JSON of the server's counters (`Server::stats_json`: records, verified, refused, held, acks, repair requests, fabric messages dropped on a full queue, ...) |
//!
//! A client that reads a record whose writer's certificate it lacks asks `CERTS` once and tries
//! again: statements carry the application key's signature, so the server can only withhold
//! them, not forge them.
//!
//! `CHECK` is how an operator checks a running server (`psl capsule-server check --read`): the
//! server takes a consistent view of its store under its store lock (`DiskStore::check_view`),
//! releases the lock, and re-reads and re-verifies every frame the view covers against its own
//! index, while appends go on; at most one check runs at a time per server.
//!
//! The server is untrusted for what it answers: the client verifies every record with the
//! capsule's public keys, and [`fetch_fresh`] checks each server's view against the newest SYNC
//! known (`crate::check_fresh`), moving on to another server when one withholds;
//! [`fetch_quorum_within`] waits, bounded and with a log line per retry, until enough servers
//! are fresh.

use crate::freshness::{check_fresh, ServerView, Stale};
use psl_capsule::{KeyStatement, Kind, Link, MembershipProof, Record, Verified, Verifier};
use psl_crypto::Hash256;
use psl_store::DiskStore;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest request line.
pub const REQUEST_BYTES_MAX: usize = 256;
/// Most records one `RANGE` answer carries (the client asks again from where it stopped).
pub const RANGE_RECORDS_MAX: u64 = 1024;
/// Most concurrent read connections per server.
pub const CONNECTIONS_MAX: usize = 32;
/// Largest frame a client accepts.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Most frames in one answer a client accepts.
pub const ANSWER_FRAMES_MAX: usize = 1 << 16;
const _: () = assert!(RANGE_RECORDS_MAX as usize <= ANSWER_FRAMES_MAX);
/// Longest error message a server sends (a longer one is cut).
const ERROR_BYTES_MAX: usize = 64 << 10;
/// Most bytes of frames in one answer a client accepts: a server answers `RANGE` with fewer
/// records rather than more bytes (always at least one), and the client asks again from where
/// the answer stopped. Without it, one answer could hold 65,536 frames of 64 MiB.
pub const ANSWER_BYTES_MAX: usize = 64 << 20;
/// Most bytes of records one fetch from one server ([`fetch_fresh`] and its kin) gathers before
/// it gives up on that server: what a recovering node may buffer in memory from one answerer.
pub const FETCH_BYTES_MAX: usize = 2 << 30;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a read from a capsule server failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Connecting, sending or reading failed (timeouts of 10 s included), or the framing broke
    /// a bound.
    #[error("server {addr}: {what}: {source}")]
    Io {
        /// The server's read address.
        addr: SocketAddr,
        /// What was being done, e.g. `"connecting"`.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The server answered with an error message.
    #[error("server {addr} answered an error: {msg}")]
    Server {
        /// The server's read address.
        addr: SocketAddr,
        /// The server's message.
        msg: String,
    },
    /// The answer's frames do not decode or break the protocol (too many, out of order).
    #[error("server {addr} sent a malformed answer: {what}")]
    Malformed {
        /// The server's read address.
        addr: SocketAddr,
        /// What is wrong with the answer.
        what: String,
    },
    /// A record (or proof) the server sent does not verify with the capsule's public keys.
    #[error("server {addr} sent a record that does not verify: {what}")]
    Unverified {
        /// The server's read address.
        addr: SocketAddr,
        /// Why verification failed.
        what: String,
    },
    /// A fetch found too few servers with a fresh copy within its patience; the string says
    /// why each was passed over.
    #[error("no server holds a fresh copy: {0}")]
    NoFreshServer(String),
}

/// Serves reads from `store` on `listener` until `stop` is set (`stats` answers `STATS`). One
/// thread per connection, at most [`CONNECTIONS_MAX`].
pub fn serve(
    listener: TcpListener,
    store: Arc<Mutex<DiskStore>>,
    stop: Arc<AtomicBool>,
    stats: StatsFn,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let open = Arc::new(AtomicUsize::new(0));
    let checking = Arc::new(AtomicBool::new(false));
    while !stop.load(Ordering::Acquire) {
        match psl_fabric::accept_within(&listener, psl_fabric::accept::ACCEPT_WAIT) {
            Ok(None) => {}
            Ok(Some((s, peer))) => {
                if open.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                    tracing::warn!(%peer, "too many read connections; refusing one");
                    continue;
                }
                open.fetch_add(1, Ordering::AcqRel);
                let (store, stop, open, checking) = (store.clone(), stop.clone(), open.clone(), checking.clone());
                let stats = stats.clone();
                std::thread::Builder::new().name("srv-read".into()).spawn(move || {
                    if let Err(e) = connection(s, &store, &stop, &checking, &stats) {
                        tracing::debug!(%peer, "read connection ended: {e}");
                    }
                    open.fetch_sub(1, Ordering::AcqRel);
                })?;
            }
            Err(e) => {
                tracing::warn!("accepting a read connection: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

fn connection(
    s: TcpStream,
    store: &Mutex<DiskStore>,
    stop: &AtomicBool,
    checking: &AtomicBool,
    stats: &StatsFn,
) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut w = std::io::BufWriter::new(s.try_clone()?);
    let mut r = BufReader::new(s).take(0);
    let mut line = Vec::new();
    while !stop.load(Ordering::Acquire) {
        line.clear();
        r.set_limit(REQUEST_BYTES_MAX as u64 + 1);
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e),
        }
        if line.last() != Some(&b'\n') {
            write_answer(&mut w, Err("request line too long or cut".into()))?;
            return Ok(());
        }
        let req = String::from_utf8_lossy(&line).trim().to_string();
        let parsed = parse_request(&req);
        let answer = if parsed == Ok(Request::Check) {
            check(store, checking)
        } else if parsed == Ok(Request::Stats) {
            // Without the store lock: the counters take their own.
            Ok(vec![stats().to_string().into_bytes()])
        } else {
            let st = store.lock().unwrap_or_else(|p| p.into_inner());
            answer(&st, &req)
        };
        write_answer(&mut w, answer)?;
        w.flush()?;
    }
    Ok(())
}

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `HEADS`: each writer's newest durable record.
    Heads,
    /// `SYNC`: the newest SYNC record stored.
    Sync,
    /// `GET <hash>`: the record with this hash.
    Get(Hash256),
    /// Writer, from, to (inclusive; the answer holds at most [`RANGE_RECORDS_MAX`]).
    Range(u32, u64, u64),
    /// `PROOF <hash>`: a membership proof of the record with this hash.
    Proof(Hash256),
    /// `CHECK`: the server's own end-to-end check of its store ([`RemoteCheck`]).
    Check,
    /// `CERTS`: the key statements the server knows.
    Certs,
    /// `STATS`: the server's counters as JSON.
    Stats,
}

/// What answers `STATS`: the server's counters as JSON.
pub type StatsFn = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Parses one request line (without its newline). Never panics.
pub fn parse_request(req: &str) -> Result<Request, String> {
    if req.len() > REQUEST_BYTES_MAX {
        return Err(format!("request of {} bytes (at most {REQUEST_BYTES_MAX})", req.len()));
    }
    let parts: Vec<&str> = req.split_ascii_whitespace().collect();
    let hash = |s: &str| Hash256::from_hex(s).ok_or_else(|| format!("{s:?} is not a 64-digit hex hash"));
    let num = |s: &str| s.parse::<u64>().map_err(|_| format!("{s:?} is not a number"));
    match parts.as_slice() {
        ["HEADS"] => Ok(Request::Heads),
        ["SYNC"] => Ok(Request::Sync),
        ["GET", h] => Ok(Request::Get(hash(h)?)),
        ["RANGE", w, from, to] => {
            let w = u32::try_from(num(w)?).map_err(|_| "writer out of range".to_string())?;
            let (from, to) = (num(from)?, num(to)?);
            if to < from {
                return Err(format!("RANGE {from} {to}: to is below from"));
            }
            Ok(Request::Range(w, from, to))
        }
        ["PROOF", h] => Ok(Request::Proof(hash(h)?)),
        ["CHECK"] => Ok(Request::Check),
        ["CERTS"] => Ok(Request::Certs),
        ["STATS"] => Ok(Request::Stats),
        _ => Err(format!("unknown request {req:?}: HEADS, SYNC, GET h, RANGE w from to, PROOF h, CHECK, CERTS, STATS")),
    }
}

/// Reads one answer (`u32 count`, frames) from `r`: `Ok(Ok(frames))`, `Ok(Err(message))` for
/// an error answer, `Err` for I/O errors and malformed framing (too many frames, a frame
/// larger than [`FRAME_BYTES_MAX`], frames adding up to more than [`ANSWER_BYTES_MAX`]).
/// Never panics on any bytes, and never buffers more than [`ANSWER_BYTES_MAX`].
pub fn read_answer(r: &mut impl Read) -> std::io::Result<Result<Vec<Vec<u8>>, String>> {
    read_answer_within(r, ANSWER_BYTES_MAX)
}

/// [`read_answer`] with another bound on the answer's bytes.
pub fn read_answer_within(r: &mut impl Read, bytes_max: usize) -> std::io::Result<Result<Vec<Vec<u8>>, String>> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut u = [0u8; 4];
    r.read_exact(&mut u)?;
    let count = u32::from_be_bytes(u);
    let frames = if count == u32::MAX { 1 } else { count as usize };
    if frames > ANSWER_FRAMES_MAX {
        return Err(bad(format!("{count} frames")));
    }
    let mut out = Vec::with_capacity(frames.min(1024));
    let mut total = 0usize;
    for _ in 0..frames {
        r.read_exact(&mut u)?;
        let len = u32::from_be_bytes(u) as usize;
        if len > FRAME_BYTES_MAX {
            return Err(bad(format!("a frame of {len} bytes")));
        }
        total = total.saturating_add(len);
        if total > bytes_max {
            return Err(bad(format!("an answer of more than {bytes_max} bytes")));
        }
        let mut b = Vec::new();
        r.by_ref().take(len as u64).read_to_end(&mut b)?;
        if b.len() != len {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "answer cut inside a frame"));
        }
        out.push(b);
    }
    if count == u32::MAX {
        return Ok(Err(String::from_utf8_lossy(&out[0]).into_owned()));
    }
    Ok(Ok(out))
}

/// The frames of an answer, in order, up to `bytes_max` bytes in all (at least the first, which
/// is below [`FRAME_BYTES_MAX`] as every record is): what a client accepts in one answer.
fn cap_answer(frames: impl Iterator<Item = Vec<u8>>, bytes_max: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut total = 0usize;
    for f in frames {
        total = total.saturating_add(f.len());
        if total > bytes_max && !out.is_empty() {
            break;
        }
        out.push(f);
    }
    debug_assert!(
        out.len() <= 1 || out.iter().map(Vec::len).sum::<usize>() <= bytes_max,
        "a capped answer holds one frame, or frames within the bound"
    );
    out
}

/// Whether a client would read `frames` as an answer ([`read_answer`]'s bounds), and if not,
/// which bound it passes. The server checks every answer before it writes it.
fn fits_reader(frames: &[Vec<u8>]) -> Result<(), String> {
    if frames.len() > ANSWER_FRAMES_MAX {
        return Err(format!("{} frames, over the {ANSWER_FRAMES_MAX} a client reads", frames.len()));
    }
    let mut total = 0usize;
    for f in frames {
        if f.len() > FRAME_BYTES_MAX {
            return Err(format!("a frame of {} bytes, over the {FRAME_BYTES_MAX} a client reads", f.len()));
        }
        total = total.saturating_add(f.len());
    }
    if total > ANSWER_BYTES_MAX {
        return Err(format!("{total} bytes, over the {ANSWER_BYTES_MAX} a client reads in one answer"));
    }
    Ok(())
}

/// The frame of an answer that holds at most one (`GET`, `SYNC`, `PROOF`, `CHECK`, `STATS`):
/// the server never writes more, so more is malformed.
fn one_frame(addr: SocketAddr, req: &str, mut frames: Vec<Vec<u8>>) -> Result<Option<Vec<u8>>, ReadError> {
    if frames.len() > 1 {
        return Err(ReadError::Malformed { addr, what: format!("{req} answered {} frames (at most 1)", frames.len()) });
    }
    Ok(frames.pop())
}

/// A `HEADS` answer: one 44-byte entry per writer, writers strictly increasing (the server
/// writes its heads map in order, so a repeated or unordered writer is malformed).
fn decode_heads(addr: SocketAddr, frames: &[Vec<u8>]) -> Result<BTreeMap<u32, (u64, Hash256)>, ReadError> {
    let mut out = BTreeMap::new();
    for f in frames {
        let (w, s, h) = decode_heads_entry(f)
            .ok_or_else(|| ReadError::Malformed { addr, what: format!("a heads entry of {} bytes", f.len()) })?;
        if out.last_key_value().is_some_and(|(p, _)| *p >= w) {
            return Err(ReadError::Malformed {
                addr,
                what: format!("heads entry for writer {w} repeated or out of order"),
            });
        }
        out.insert(w, (s, h));
    }
    Ok(out)
}

/// A `RANGE writer next to` answer holds at most the records asked and at most
/// [`RANGE_RECORDS_MAX`].
fn check_range_count(addr: SocketAddr, writer: u32, next: u64, to: u64, n: usize) -> Result<(), ReadError> {
    let asked = (to - next).saturating_add(1).min(RANGE_RECORDS_MAX);
    if n as u64 > asked {
        return Err(ReadError::Malformed {
            addr,
            what: format!("RANGE {writer} {next} {to} answered {n} records, more than the {asked} asked"),
        });
    }
    Ok(())
}

/// Decodes one `HEADS` entry: (writer, seq, hash).
pub fn decode_heads_entry(f: &[u8]) -> Option<(u32, u64, Hash256)> {
    if f.len() != 44 {
        return None;
    }
    let w = u32::from_be_bytes(f[0..4].try_into().ok()?);
    let s = u64::from_be_bytes(f[4..12].try_into().ok()?);
    let h = Hash256(f[12..44].try_into().ok()?);
    Some((w, s, h))
}

fn answer(st: &DiskStore, req: &str) -> Result<Vec<Vec<u8>>, String> {
    match parse_request(req)? {
        Request::Heads => Ok(st
            .heads()
            .into_iter()
            .map(|(w, h)| {
                let mut b = Vec::with_capacity(44);
                b.extend_from_slice(&w.to_be_bytes());
                b.extend_from_slice(&h.seq.to_be_bytes());
                b.extend_from_slice(h.hash.as_bytes());
                assert_eq!(b.len(), 44, "a HEADS entry is what decode_heads_entry reads");
                b
            })
            .collect()),
        Request::Sync => {
            st.latest_sync().map(|r| r.map(|r| r.bytes().to_vec()).into_iter().collect()).map_err(|e| e.to_string())
        }
        Request::Get(h) => {
            st.get(&h).map(|r| r.map(|r| r.bytes().to_vec()).into_iter().collect()).map_err(|e| e.to_string())
        }
        Request::Range(w, from, to) => {
            let to = to.min(from.saturating_add(RANGE_RECORDS_MAX - 1));
            let frames = st
                .range(w, from, to.saturating_add(1))
                .map(|v| cap_answer(v.iter().map(|r| r.bytes().to_vec()), ANSWER_BYTES_MAX))
                .map_err(|e| e.to_string())?;
            // The client refuses more records than it asked for (`ReadClient::range`).
            assert!(frames.len() as u64 <= to - from + 1, "a RANGE answer holds at most the records asked");
            Ok(frames)
        }
        Request::Proof(target) => {
            let replica = st.to_replica().map_err(|e| e.to_string())?;
            MembershipProof::build(st.metadata(), &replica, target, None)
                .map(|p| vec![p.encode()])
                .map_err(|e| e.to_string())
        }
        Request::Check => Err("CHECK is answered without the store lock".into()),
        Request::Stats => Err("STATS is answered without the store lock".into()),
        Request::Certs => {
            let v = st.verifier();
            let certs = v.writer_certs().into_iter().map(KeyStatement::Cert);
            let revoked = v.revocations().into_iter().map(KeyStatement::Revoke);
            let all: Vec<KeyStatement> = certs.chain(revoked).collect();
            Ok(all.chunks(psl_capsule::certs::STATEMENTS_PER_RECORD_MAX).map(KeyStatement::encode_list).collect())
        }
    }
}

/// What a server's own check of its store found (`CHECK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCheck {
    /// Frames read from the log.
    pub frames: u64,
    /// Frames whose record verified.
    pub verified: u64,
    /// Records the server's index holds.
    pub records: u64,
    /// Bytes of the log checked (what the index described when the check began).
    pub checked_bytes: u64,
    /// Bytes the server appended while the check ran (not checked).
    pub appended_bytes: u64,
    /// Damage: every problem but a torn tail, one line each. Empty: clean.
    pub damage: Vec<String>,
    /// Bytes past the last whole frame (what a crash during an append leaves), if any.
    pub torn_tail: Option<String>,
    /// Records that link a record the server does not hold yet (lag, not damage; see
    /// `psl_store::CheckReport::lagging`).
    pub lagging: Vec<String>,
}

impl RemoteCheck {
    /// Whether the check found no damage (a torn tail and lagging records are not damage).
    pub fn is_clean(&self) -> bool {
        self.damage.is_empty()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "frames": self.frames, "verified": self.verified, "records": self.records,
            "checked_bytes": self.checked_bytes, "appended_bytes": self.appended_bytes,
            "damage": self.damage, "torn_tail": self.torn_tail, "lagging": self.lagging,
        })
    }

    fn from_json(v: &serde_json::Value) -> Option<RemoteCheck> {
        let n = |k: &str| v.get(k)?.as_u64();
        let lines = |k: &str| -> Option<Vec<String>> {
            v.get(k)?.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect()
        };
        Some(RemoteCheck {
            frames: n("frames")?,
            verified: n("verified")?,
            records: n("records")?,
            checked_bytes: n("checked_bytes")?,
            appended_bytes: n("appended_bytes")?,
            damage: lines("damage")?,
            torn_tail: match v.get("torn_tail")? {
                serde_json::Value::Null => None,
                t => Some(t.as_str()?.to_string()),
            },
            // Absent from servers older than the field: nothing to note.
            lagging: lines("lagging").unwrap_or_default(),
        })
    }
}

/// `CHECK`: a view taken under the store lock, checked without it; one at a time.
fn check(store: &Mutex<DiskStore>, checking: &AtomicBool) -> Result<Vec<Vec<u8>>, String> {
    if checking.swap(true, Ordering::AcqRel) {
        return Err("a check of this server's store is already running; try again when it ends".into());
    }
    let (view, records) = {
        let st = store.lock().unwrap_or_else(|p| p.into_inner());
        (st.check_view(), st.len() as u64)
    };
    let rep = view.check();
    checking.store(false, Ordering::Release);
    let rep = rep.map_err(|e| e.to_string())?;
    let out = RemoteCheck {
        frames: rep.frames,
        verified: rep.verified as u64,
        records,
        checked_bytes: rep.checked_bytes,
        appended_bytes: rep.appended_bytes,
        damage: rep.damage(),
        torn_tail: rep.torn_tail.as_ref().map(|t| t.to_string()),
        lagging: rep.lagging(),
    };
    Ok(vec![out.to_json().to_string().into_bytes()])
}

/// Writes an answer. One that a client would refuse ([`fits_reader`]: too many frames, a frame
/// or the whole too large) is sent as an error naming the bound instead.
fn write_answer(w: &mut impl Write, a: Result<Vec<Vec<u8>>, String>) -> std::io::Result<()> {
    let a = a.and_then(|f| match fits_reader(&f) {
        Ok(()) => Ok(f),
        Err(e) => {
            tracing::warn!("a read answer over the client's bounds: {e}");
            Err(format!("the answer would be {e}"))
        }
    });
    let frames = match a {
        Ok(f) => {
            w.write_all(&(f.len() as u32).to_be_bytes())?;
            f
        }
        Err(mut e) => {
            // Error messages are short; one that is not is cut well within the frame bound.
            if e.len() > ERROR_BYTES_MAX {
                let mut cut = ERROR_BYTES_MAX;
                while !e.is_char_boundary(cut) {
                    cut -= 1;
                }
                e.truncate(cut);
            }
            w.write_all(&u32::MAX.to_be_bytes())?;
            vec![e.into_bytes()]
        }
    };
    debug_assert!(fits_reader(&frames).is_ok(), "an answer within the client's bounds");
    for f in frames {
        w.write_all(&(f.len() as u32).to_be_bytes())?;
        w.write_all(&f)?;
    }
    Ok(())
}

/// A connection to one server's read address.
pub struct ReadClient {
    addr: SocketAddr,
    r: BufReader<TcpStream>,
    w: TcpStream,
    /// Whether this connection already asked for the server's key statements.
    certs_learnt: bool,
}

impl ReadClient {
    /// Connects to the read address `addr` (10 s timeout to connect, and per read and write).
    pub fn connect(addr: SocketAddr) -> Result<ReadClient, ReadError> {
        let io = |what| move |source| ReadError::Io { addr, what, source };
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(io("connecting"))?;
        s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io("setting a timeout"))?;
        s.set_write_timeout(Some(IO_TIMEOUT)).map_err(io("setting a timeout"))?;
        let w = s.try_clone().map_err(io("cloning the socket"))?;
        Ok(ReadClient { addr, r: BufReader::new(s), w, certs_learnt: false })
    }

    /// The server's read address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn ask(&mut self, req: &str) -> Result<Vec<Vec<u8>>, ReadError> {
        let addr = self.addr;
        self.w.write_all(format!("{req}\n").as_bytes()).map_err(|source| ReadError::Io {
            addr,
            what: "sending a request",
            source,
        })?;
        match read_answer(&mut self.r) {
            Ok(Ok(frames)) => Ok(frames),
            Ok(Err(msg)) => Err(ReadError::Server { addr, msg }),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                Err(ReadError::Malformed { addr, what: e.to_string() })
            }
            Err(source) => Err(ReadError::Io { addr, what: "reading an answer", source }),
        }
    }

    /// Verifies a record the server sent. If its writer's certificate is unknown here (a
    /// certified capsule), learns the server's statements once (`CERTS`) and tries again.
    fn record(&mut self, v: &Verifier, bytes: &[u8]) -> Result<Verified<Record>, ReadError> {
        match v.verify_bytes(bytes) {
            Err(e) if e.reason.wants_cert() && !self.certs_learnt => {
                self.certs_learnt = true;
                self.learn_certs(v)?;
                v.verify_bytes(bytes)
            }
            r => r,
        }
        .map_err(|e| ReadError::Unverified { addr: self.addr, what: e.to_string() })
    }

    /// Installs every key statement the server knows (`CERTS`) in `v`. Each is checked against
    /// the application key; a bad one makes the answer malformed. Returns how many were new.
    pub fn learn_certs(&mut self, v: &Verifier) -> Result<usize, ReadError> {
        let addr = self.addr;
        let mut new = 0;
        for s in self.statements()? {
            match v.install_statement(&s) {
                Ok(n) => new += n as usize,
                Err(e) => {
                    return Err(ReadError::Unverified {
                        addr,
                        what: format!("key statement for writer {}: {e}", s.writer()),
                    })
                }
            }
        }
        Ok(new)
    }

    /// The key statements the server knows (`CERTS`), decoded but NOT checked: a verifier checks
    /// each when it installs it.
    pub fn statements(&mut self) -> Result<Vec<KeyStatement>, ReadError> {
        let addr = self.addr;
        let mut out = Vec::new();
        for f in self.ask("CERTS")? {
            out.extend(
                KeyStatement::decode_list(&f)
                    .map_err(|e| ReadError::Malformed { addr, what: format!("a key statement: {e}") })?,
            );
        }
        Ok(out)
    }

    /// Each writer's newest durable record: writer -> (seq, hash). Unverified claims: use them
    /// to decide what to fetch, and verify what comes back.
    pub fn heads(&mut self) -> Result<BTreeMap<u32, (u64, Hash256)>, ReadError> {
        let f = self.ask("HEADS")?;
        decode_heads(self.addr, &f)
    }

    /// The newest SYNC the server stores, verified.
    pub fn latest_sync(&mut self, v: &Verifier) -> Result<Option<Verified<Record>>, ReadError> {
        let f = one_frame(self.addr, "SYNC", self.ask("SYNC")?)?;
        let r = f.map(|b| self.record(v, &b)).transpose()?;
        if r.as_ref().is_some_and(|r| r.header().kind != Kind::Sync) {
            return Err(ReadError::Malformed { addr: self.addr, what: "SYNC answered with another kind".into() });
        }
        Ok(r)
    }

    /// A record by hash, verified, and checked to be the one asked for.
    pub fn get(&mut self, v: &Verifier, hash: &Hash256) -> Result<Option<Verified<Record>>, ReadError> {
        let f = one_frame(self.addr, "GET", self.ask(&format!("GET {}", hash.to_hex()))?)?;
        let r = f.map(|b| self.record(v, &b)).transpose()?;
        if r.as_ref().is_some_and(|r| r.hash() != *hash) {
            return Err(ReadError::Malformed { addr: self.addr, what: format!("GET {hash} answered another record") });
        }
        Ok(r)
    }

    /// A record by hash as the server holds it, NOT verified: for a caller that runs its own,
    /// stricter checks on the bytes (CapsuleDB verifies, decrypts and compares every block
    /// with its index entry, and counts a copy that fails as altered).
    pub fn get_unverified(&mut self, hash: &Hash256) -> Result<Option<Vec<u8>>, ReadError> {
        one_frame(self.addr, "GET", self.ask(&format!("GET {}", hash.to_hex()))?)
    }

    /// Writer `writer`'s records `from ..= to`, verified, in chain order (several requests if
    /// needed). Stops early where the server holds no more.
    pub fn range(&mut self, v: &Verifier, writer: u32, from: u64, to: u64) -> Result<Vec<Verified<Record>>, ReadError> {
        let mut out: Vec<Verified<Record>> = Vec::new();
        let mut next = from;
        while next <= to {
            let f = self.ask(&format!("RANGE {writer} {next} {to}"))?;
            if f.is_empty() {
                break;
            }
            check_range_count(self.addr, writer, next, to, f.len())?;
            for b in f {
                let r = self.record(v, &b)?;
                let h = r.header();
                let prev_ok = match out.last() {
                    Some(p) => h.prev == p.hash(),
                    None => true,
                };
                if h.writer != writer || h.seq != next || !prev_ok {
                    return Err(ReadError::Malformed {
                        addr: self.addr,
                        what: format!(
                            "RANGE {writer} answered writer {} seq {} (expected seq {next})",
                            h.writer, h.seq
                        ),
                    });
                }
                out.push(r);
                next += 1;
            }
        }
        Ok(out)
    }

    /// The server's own end-to-end check of its store (`CHECK`; it re-reads the whole log, so
    /// it takes as long as reading it). Unverified, like every claim of a server: it tells an
    /// operator what the server found, nothing more.
    pub fn check(&mut self) -> Result<RemoteCheck, ReadError> {
        let addr = self.addr;
        let f = one_frame(addr, "CHECK", self.ask("CHECK")?)?;
        let b = f.ok_or_else(|| ReadError::Malformed { addr, what: "CHECK without a frame".into() })?;
        serde_json::from_slice::<serde_json::Value>(&b)
            .ok()
            .as_ref()
            .and_then(RemoteCheck::from_json)
            .ok_or_else(|| ReadError::Malformed { addr, what: "CHECK answered something that is not a check".into() })
    }

    /// The server's counters (`STATS`; unverified, for operators and benchmarks).
    pub fn stats(&mut self) -> Result<serde_json::Value, ReadError> {
        let addr = self.addr;
        let f = one_frame(addr, "STATS", self.ask("STATS")?)?;
        let b = f.ok_or_else(|| ReadError::Malformed { addr, what: "STATS without a frame".into() })?;
        serde_json::from_slice(&b).map_err(|e| ReadError::Malformed { addr, what: format!("STATS: {e}") })
    }

    /// A membership proof of record `hash`, checked against the capsule.
    pub fn proof(&mut self, v: &Verifier, hash: &Hash256) -> Result<MembershipProof, ReadError> {
        let addr = self.addr;
        let f = one_frame(addr, "PROOF", self.ask(&format!("PROOF {}", hash.to_hex()))?)?;
        let b = f.ok_or_else(|| ReadError::Malformed { addr, what: "PROOF without a frame".into() })?;
        let p = MembershipProof::decode(&b).map_err(|e| ReadError::Malformed { addr, what: e.to_string() })?;
        let o = p.verify(Some(v.name())).map_err(|e| ReadError::Unverified { addr, what: e.to_string() })?;
        if o.target.hash != *hash {
            return Err(ReadError::Malformed { addr, what: "proof of another record".into() });
        }
        Ok(p)
    }
}

/// What [`fetch_fresh`] got.
#[derive(Debug)]
pub struct Fetched {
    /// The union of the copies read, verified, in chain order per writer.
    pub records: Vec<Verified<Record>>,
    /// The servers read from (fresh copies that agree).
    pub servers: Vec<SocketAddr>,
    /// Servers passed over, and why (unreachable, stale, lying): the last reason for each
    /// server not read from.
    pub skipped: Vec<(SocketAddr, String)>,
    /// The epoch of the newest SYNC known when the last copy was chosen.
    pub newest_sync_epoch: Option<u64>,
    /// Rounds it took (1: every copy needed was fresh at once).
    pub rounds: u32,
}

/// How long a fetch waits for enough fresh copies. A server that is catching up (restarted,
/// or one SYNC behind under a fast epoch clock) becomes fresh within moments; giving up at the
/// first look would refuse a healthy deployment. Each round reads every server not yet used
/// again, against the newest SYNC known by then; between rounds the wait doubles from
/// `retry_first` up to `retry_max`, and a line is logged (`tracing` warn) per retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// Give up once this much time has passed since the first round (zero: one round only).
    pub within: Duration,
    /// The wait before the second round (doubled after each further round).
    pub retry_first: Duration,
    /// The longest wait between two rounds.
    pub retry_max: Duration,
}

impl Patience {
    /// One round, no retry.
    pub const ONCE: Patience =
        Patience { within: Duration::ZERO, retry_first: Duration::from_millis(100), retry_max: Duration::from_secs(1) };

    /// Retries for up to `within`, from 100 ms between rounds doubling to 1 s.
    pub fn within(within: Duration) -> Patience {
        Patience { within, ..Patience::ONCE }
    }
}

/// Reads a whole capsule from the first server in `servers` whose copy is fresh: it holds
/// every record that the newest verified SYNC any of them (or `known`, the reader's own newest
/// SYNC) offers links (`crate::check_fresh`). A server that withholds (stale prefix), lies (a
/// record that does not verify or link) or cannot be reached is skipped. One round only: see
/// [`fetch_quorum_within`] to wait.
pub fn fetch_fresh(
    servers: &[SocketAddr],
    v: &Verifier,
    known: Option<(u64, Vec<Link>)>,
) -> Result<Fetched, ReadError> {
    fetch_quorum_within(servers, v, known, 1, Patience::ONCE)
}

/// Like [`fetch_fresh`], but reads `need` fresh copies and returns their union. With
/// `need = f + 1` of `2f + 1` servers this holds every acknowledged durable write, including
/// those newer than the newest SYNC (which freshness cannot vouch for): the f + 1 servers that
/// acked a write and the f + 1 read overlap in at least one. Copies must agree (one chain per
/// writer, one a prefix of the other); a copy that conflicts is skipped. One round only.
pub fn fetch_quorum(
    servers: &[SocketAddr],
    v: &Verifier,
    known: Option<(u64, Vec<Link>)>,
    need: usize,
) -> Result<Fetched, ReadError> {
    fetch_quorum_within(servers, v, known, need, Patience::ONCE)
}

/// [`fetch_quorum`], waiting (bounded by `patience`) until `need` servers hold fresh copies.
///
/// Why the union is still complete when copies are taken in different rounds: every copy is
/// read after the call began, and a server never loses what it fsync'd, so any f + 1 copies
/// overlap the f + 1 servers that acked a write before the call; and every copy is checked
/// against the same SYNC, the newest known in the first round that knew one, so the union
/// covers that SYNC too. The target is pinned there on purpose: under a live coordinator the
/// newest SYNC moves every epoch, and a server that is catching up by anti-entropy (just
/// restarted, or slow) would never reach a moving target, and the wait would end at its
/// deadline for nothing (`psl chaos` seed 1000). A later SYNC vouches only for writes made
/// after the call began, which recovery does not promise. The error after the deadline names
/// what it waited for and, per server, why it was not used.
pub fn fetch_quorum_within(
    servers: &[SocketAddr],
    v: &Verifier,
    known: Option<(u64, Vec<Link>)>,
    need: usize,
    patience: Patience,
) -> Result<Fetched, ReadError> {
    let need = need.max(1);
    let started = std::time::Instant::now();
    let deadline = started + patience.within;
    let mut wait = patience.retry_first.max(Duration::from_millis(1));
    let mut newest = known;
    let mut chains: BTreeMap<u32, Vec<Verified<Record>>> = BTreeMap::new();
    let mut used: Vec<SocketAddr> = Vec::new();
    // The last reason each server was not used.
    let mut why: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let mut rounds = 0u32;
    loop {
        rounds += 1;
        let mut clients = Vec::new();
        for a in servers.iter().filter(|a| !used.contains(a)) {
            match ReadClient::connect(*a).and_then(|mut c| c.latest_sync(v).map(|s| (c, s))) {
                Ok((c, s)) => {
                    // The target moves only until a round has found one (see above).
                    if let Some(s) = s.filter(|_| rounds == 1 || newest.is_none()) {
                        let e = s.header().epoch;
                        if newest.as_ref().is_none_or(|(ne, _)| e > *ne) {
                            newest = Some((e, s.header().links.clone()));
                        }
                    }
                    clients.push(c);
                }
                Err(e) => {
                    why.insert(*a, e.to_string());
                }
            }
        }
        for mut c in clients {
            if used.len() >= need {
                break;
            }
            match fetch_from(&mut c, v, newest.as_ref()) {
                Ok(records) => match merge_copy(&mut chains, records) {
                    Ok(()) => {
                        why.remove(&c.addr());
                        used.push(c.addr());
                    }
                    Err(w) => {
                        tracing::warn!(server = %c.addr(), writer = w, "copy conflicts with another server's");
                        why.insert(c.addr(), format!("writer {w}: its chain conflicts with another server's"));
                    }
                },
                Err(e) => {
                    why.insert(c.addr(), e.to_string());
                }
            }
        }
        let epoch = newest.as_ref().map(|(e, _)| *e);
        if used.len() >= need {
            return Ok(Fetched {
                records: chains.into_values().flatten().collect(),
                servers: used,
                skipped: why.into_iter().collect(),
                newest_sync_epoch: epoch,
                rounds,
            });
        }
        let reasons: Vec<String> = why.iter().map(|(a, e)| format!("{a}: {e}")).collect();
        let now = std::time::Instant::now();
        if now + wait > deadline {
            let waited = if rounds > 1 {
                format!(" after waiting {} ms ({rounds} rounds)", now.duration_since(started).as_millis())
            } else {
                String::new()
            };
            let sync = epoch.map_or("no SYNC known".to_string(), |e| format!("the newest SYNC, epoch {e:#x}"));
            return Err(ReadError::NoFreshServer(format!(
                "{} fresh copies of the {need} needed{waited} (a fresh copy holds every record {sync} links, \
                 and the copies read must agree); {}",
                used.len(),
                reasons.join("; ")
            )));
        }
        tracing::warn!(
            round = rounds,
            fresh = used.len(),
            need,
            newest_sync_epoch = epoch.map(|e| format!("{e:#x}")).unwrap_or_else(|| "none".into()),
            left_ms = deadline.saturating_duration_since(now).as_millis() as u64,
            "waiting for fresh capsule servers ({} of {need} so far); retrying in {} ms: {}",
            used.len(),
            wait.as_millis(),
            reasons.join("; ")
        );
        std::thread::sleep(wait);
        wait = (wait * 2).min(patience.retry_max.max(patience.retry_first));
    }
}

/// Merges one server's copy into `chains` (keeping each writer's longest chain), or names a
/// writer whose chain in that copy conflicts with one already held (and then merges nothing).
fn merge_copy(chains: &mut BTreeMap<u32, Vec<Verified<Record>>>, records: Vec<Verified<Record>>) -> Result<(), u32> {
    let mut theirs: BTreeMap<u32, Vec<Verified<Record>>> = BTreeMap::new();
    for r in records {
        theirs.entry(r.header().writer).or_default().push(r);
    }
    let conflict = theirs.iter().find(|(w, c2)| {
        chains.get(w).is_some_and(|c1| {
            let n = c1.len().min(c2.len());
            n > 0 && c1[n - 1].hash() != c2[n - 1].hash()
        })
    });
    if let Some((w, _)) = conflict {
        return Err(*w);
    }
    for (w, c2) in theirs {
        let e = chains.entry(w).or_default();
        if c2.len() > e.len() {
            *e = c2;
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("stale: {0}")]
    Stale(#[from] Stale),
}

fn fetch_from(
    c: &mut ReadClient,
    v: &Verifier,
    newest: Option<&(u64, Vec<Link>)>,
) -> Result<Vec<Verified<Record>>, FetchError> {
    let heads = c.heads()?;
    let mut records = Vec::new();
    let mut at: BTreeMap<(u32, u64), Hash256> = BTreeMap::new();
    let mut bytes = 0usize;
    for (w, (seq, hash)) in &heads {
        let chain = c.range(v, *w, 0, *seq)?;
        bytes = bytes.saturating_add(chain.iter().map(|r| r.bytes().len()).sum::<usize>());
        if bytes > FETCH_BYTES_MAX {
            return Err(ReadError::Malformed {
                addr: c.addr(),
                what: format!("the records it holds pass the fetch bound of {FETCH_BYTES_MAX} bytes"),
            }
            .into());
        }
        if chain.len() as u64 != seq + 1 || chain.last().map(|r| r.hash()) != Some(*hash) {
            return Err(ReadError::Malformed {
                addr: c.addr(),
                what: format!("writer {w}: heads say seq {seq} but the range holds {} records", chain.len()),
            }
            .into());
        }
        for r in &chain {
            at.insert((r.header().writer, r.header().seq), r.hash());
        }
        records.extend(chain);
    }
    if let Some((_, links)) = newest {
        // Every slot up to each head was read and verified above, so `hash_at` knows each one:
        // the server proves it holds what the SYNC links.
        let hash_at = |w: u32, s: u64| at.get(&(w, s)).copied();
        check_fresh(&ServerView { heads: &heads, hash_at: &hash_at }, links)?;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_parse() {
        let h = Hash256([3; 32]);
        assert_eq!(parse_request("HEADS"), Ok(Request::Heads));
        assert_eq!(parse_request(" SYNC "), Ok(Request::Sync));
        assert_eq!(parse_request(&format!("GET {}", h.to_hex())), Ok(Request::Get(h)));
        assert_eq!(parse_request(&format!("PROOF {}", h.to_hex())), Ok(Request::Proof(h)));
        assert_eq!(parse_request("RANGE 65536 0 9"), Ok(Request::Range(65536, 0, 9)));
        assert_eq!(parse_request("CHECK"), Ok(Request::Check));
        assert_eq!(parse_request("STATS"), Ok(Request::Stats));
        for bad in ["", "GET zz", "RANGE 1 5 4", "RANGE 4294967296 0 1", "RANGE 1 0", "HEADS x", "DROP", "CHECK x"] {
            assert!(parse_request(bad).is_err(), "{bad:?}");
        }
        assert!(parse_request(&"H".repeat(REQUEST_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn answers_round_trip() {
        for a in [Ok(vec![b"one".to_vec(), Vec::new(), vec![7; 44]]), Ok(Vec::new()), Err("no".to_string())] {
            let mut buf = Vec::new();
            write_answer(&mut buf, a.clone()).unwrap();
            assert_eq!(read_answer(&mut &buf[..]).unwrap(), a);
        }
        let mut e = vec![0u8; 44];
        e[3] = 9;
        e[11] = 4;
        assert_eq!(decode_heads_entry(&e), Some((9, 4, Hash256::ZERO)));
        assert_eq!(decode_heads_entry(&e[..43]), None);
        // A huge frame length is refused before any allocation.
        let mut huge = 1u32.to_be_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(read_answer(&mut &huge[..]).is_err());
    }

    /// A hostile server answers with frames that each pass the frame bound but add up to more
    /// than one answer may hold: the client stops reading at the bound. An honest server cuts
    /// a RANGE answer at the same bound instead, and the client asks again from there.
    #[test]
    fn adversary_an_answer_too_large_in_all_is_refused_before_it_is_buffered() {
        let frame = 1u32 << 20;
        let count = 9u32;
        let mut hostile = count.to_be_bytes().to_vec();
        for _ in 0..count {
            hostile.extend_from_slice(&frame.to_be_bytes());
            hostile.extend(std::iter::repeat_n(0u8, frame as usize));
        }
        let err = read_answer_within(&mut &hostile[..], 8 << 20).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("more than"), "{err}");
        // Within the bound, the same answer reads.
        assert_eq!(read_answer_within(&mut &hostile[..], 9 << 20).unwrap().unwrap().len(), 9);
        // The server side: an answer cut at the bound, never empty.
        let frames = (0..9).map(|_| vec![1u8; frame as usize]);
        assert_eq!(cap_answer(frames, 8 << 20).len(), 8);
        assert_eq!(cap_answer(std::iter::once(vec![0u8; 100]), 10).len(), 1);
        const { assert!(ANSWER_BYTES_MAX >= FRAME_BYTES_MAX) };
    }

    fn addr() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    fn malformed(r: Result<impl std::fmt::Debug, ReadError>, what: &str) {
        match r {
            Err(ReadError::Malformed { what: w, .. }) => assert!(w.contains(what), "{what}: {w}"),
            other => panic!("{what}: expected a malformed answer, got {other:?}"),
        }
    }

    #[test]
    fn answers_of_one_frame_refuse_more() {
        assert_eq!(one_frame(addr(), "GET", Vec::new()).unwrap(), None);
        assert_eq!(one_frame(addr(), "GET", vec![b"r".to_vec()]).unwrap(), Some(b"r".to_vec()));
        malformed(one_frame(addr(), "SYNC", vec![b"a".to_vec(), b"b".to_vec()]), "SYNC answered 2 frames");
    }

    #[test]
    fn heads_answers_refuse_bad_sizes_and_repeated_or_unordered_writers() {
        let entry = |w: u32, s: u64| {
            let mut b = w.to_be_bytes().to_vec();
            b.extend_from_slice(&s.to_be_bytes());
            b.extend_from_slice(&[5; 32]);
            b
        };
        let ok = decode_heads(addr(), &[entry(1, 4), entry(7, 0)]).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[&7], (0, Hash256([5; 32])));
        malformed(decode_heads(addr(), &[entry(1, 4), entry(1, 9)]), "writer 1 repeated or out of order");
        malformed(decode_heads(addr(), &[entry(7, 4), entry(1, 9)]), "writer 1 repeated or out of order");
        malformed(decode_heads(addr(), &[entry(1, 4)[..43].to_vec()]), "a heads entry of 43 bytes");
    }

    #[test]
    fn range_answers_hold_at_most_what_was_asked() {
        check_range_count(addr(), 3, 5, 9, 5).unwrap();
        check_range_count(addr(), 3, 0, u64::MAX, RANGE_RECORDS_MAX as usize).unwrap();
        malformed(check_range_count(addr(), 3, 5, 9, 6), "answered 6 records, more than the 5 asked");
        malformed(check_range_count(addr(), 3, 0, u64::MAX, RANGE_RECORDS_MAX as usize + 1), "more than the 1024");
    }

    /// The server checks an answer against the client's bounds before it writes it: one over
    /// them goes out as an error the client reads, never as bytes it refuses.
    #[test]
    fn an_answer_over_the_client_bounds_is_written_as_an_error() {
        let mut buf = Vec::new();
        write_answer(&mut buf, Ok(vec![Vec::new(); ANSWER_FRAMES_MAX + 1])).unwrap();
        let msg = read_answer(&mut &buf[..]).unwrap().unwrap_err();
        assert!(msg.contains("65537 frames"), "{msg}");
        let mut buf = Vec::new();
        write_answer(&mut buf, Ok(vec![Vec::new(); ANSWER_FRAMES_MAX])).unwrap();
        assert_eq!(read_answer(&mut &buf[..]).unwrap().unwrap().len(), ANSWER_FRAMES_MAX);
        assert!(fits_reader(&[vec![0; 16], vec![0; 16]]).is_ok());
        // A long error message is cut, not sent as a frame the client cannot place.
        let mut buf = Vec::new();
        write_answer(&mut buf, Err("é".repeat(ERROR_BYTES_MAX))).unwrap();
        let msg = read_answer(&mut &buf[..]).unwrap().unwrap_err();
        assert!(msg.len() <= ERROR_BYTES_MAX && msg.starts_with('é'), "{}", msg.len());
    }

    #[test]
    fn check_answers_round_trip() {
        let c = RemoteCheck {
            frames: 9,
            verified: 8,
            records: 8,
            checked_bytes: 4096,
            appended_bytes: 100,
            damage: vec!["frame 3: bad".into()],
            torn_tail: Some("torn".into()),
            lagging: vec!["record 00 (writer 1, seq 2): link-missing".into()],
        };
        assert_eq!(RemoteCheck::from_json(&c.to_json()), Some(c.clone()));
        let c = RemoteCheck { damage: vec![], torn_tail: None, ..c };
        assert!(c.is_clean(), "lag is not damage");
        assert!(c.is_clean());
        assert_eq!(RemoteCheck::from_json(&c.to_json()), Some(c));
        assert_eq!(RemoteCheck::from_json(&serde_json::json!({"frames": 1})), None);
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(&String::from_utf8_lossy(&data));
            if let Ok(Ok(frames)) = read_answer(&mut &data[..]) {
                for f in &frames {
                    prop_assert!(f.len() <= data.len());
                    let _ = decode_heads_entry(f);
                }
            }
        }
    }
}
