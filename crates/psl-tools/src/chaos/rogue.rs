//! `psl chaos --byzantine`: a capsule server that lies to the processes that read from it.
//!
//! The rogue is a read endpoint (`psl_server::read`'s protocol) run by the harness, listed
//! first wherever a role reads from capsule servers: a restarted node's `--recover-from`,
//! CapsuleDB's `--servers`, and one of the recoveries of the final checks. It answers from one
//! honest server (another if that one is down), and lies the way one seed's [`Plan`] says:
//!
//! - *stale*: from [`Plan::freeze_at_ms`] on, it serves the capsule as it was then: the heads
//!   and the newest SYNC of that moment, and no record past a frozen head (a rolled-back or
//!   cut-off server; every record it serves is genuine);
//! - *forged*: it holds the leaked writer's whole chain as the attacker signs it
//!   ([`super::byzantine`]), the records the revocation covers included, claims it in `HEADS`,
//!   serves it in `RANGE` and `GET`, and leaves the revocation out of `CERTS` (statements can be
//!   withheld, not forged);
//! - in both modes, one `RANGE` answer in [`Plan::corrupt_every`] has a byte of one record
//!   flipped (a record that does not verify).
//!
//! Readers must skip it where it lies (a stale copy, a record that does not verify, a chain that
//! conflicts) and must never apply what the revocation covers: the `byzantine` check reads the
//! nodes, front ends and the rogue-fed recovery for that, and the usual checks (every
//! acknowledged write survives, recoveries hold every write) for the stale copies. What the
//! rogue did is counted ([`RogueLog`]), so that a seed in which nobody asked it anything shows
//! as such.

use super::schedule::Rng;
use psl_capsule::{KeyStatement, Limits, Record};
use psl_crypto::Hash256;
use psl_server::read::{decode_heads_entry, parse_request, read_answer, Request, RANGE_RECORDS_MAX};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most connections the rogue serves at once.
const CONNECTIONS_MAX: usize = 32;
/// Longest request line it reads.
const REQUEST_BYTES_MAX: u64 = 256;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// How the rogue lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    Stale,
    Forged,
    StaleAndForged,
}

impl Mode {
    fn stale(self) -> bool {
        matches!(self, Mode::Stale | Mode::StaleAndForged)
    }
    fn forged(self) -> bool {
        matches!(self, Mode::Forged | Mode::StaleAndForged)
    }
}

/// The rogue of one seed. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub mode: Mode,
    /// The honest server it answers from first.
    pub upstream: u8,
    /// When its copy freezes (stale modes), ms into the fault phase.
    pub freeze_at_ms: u64,
    /// One `RANGE` answer in this many has a flipped byte.
    pub corrupt_every: u32,
}

impl Plan {
    /// The plan of `seed` (its own stream: the schedule, the workload and the attack of a seed
    /// stay what they are without the rogue).
    pub fn generate(seed: u64, fault_ms: u64, servers: u8) -> Plan {
        let mut rng = Rng::new(seed ^ 0x0A6E_5E4F_0000_0000);
        Plan {
            mode: rng.pick(&[Mode::Stale, Mode::Forged, Mode::StaleAndForged]),
            upstream: rng.below(u64::from(servers.max(1))) as u8,
            freeze_at_ms: fault_ms * rng.range(10, 50) / 100,
            corrupt_every: rng.range(3, 9) as u32,
        }
    }
}

/// What the rogue did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RogueLog {
    pub plan: Option<Plan>,
    /// Requests answered, by kind.
    pub requests: BTreeMap<String, u64>,
    /// Whether (and when, ms into the fault phase) its copy froze.
    pub frozen_at_ms: Option<u64>,
    /// Answers the frozen copy changed (heads, SYNC, ranges or records withheld).
    pub stale_answers: u64,
    /// Records of the leaked writer it served from the attacker's own copy (those the
    /// revocation covers only once the attacker sends them too).
    pub leaked_records_served: u64,
    /// `HEADS` answers claiming the leaked writer's forged chain.
    pub forged_heads: u64,
    /// Revocations of the leaked writer left out of `CERTS` answers.
    pub revocations_withheld: u64,
    /// Records sent with a flipped byte.
    pub corrupted: u64,
    /// Requests it could not answer from any honest server.
    pub upstream_errors: u64,
}

impl RogueLog {
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.plan.map(|p| p.mode),
            "requests": self.requests.values().sum::<u64>(),
            "frozen_at_ms": self.frozen_at_ms,
            "stale_answers": self.stale_answers,
            "leaked_records": self.leaked_records_served,
            "forged_heads": self.forged_heads,
            "revocations_withheld": self.revocations_withheld,
            "corrupted": self.corrupted,
        })
    }
}

/// The leaked writer's records as the attacker signs them, shared with the rogue: its main
/// chain in seq order from seq 0, and the equivocating fork's records.
#[derive(Default)]
pub struct Leaked {
    pub writer: u32,
    pub chain: Vec<Record>,
    pub fork: Vec<Record>,
    /// Until the attacker sends what the revocation covers: the seq from which it is held back
    /// (the rogue serves none of those records, nor the fork, before the attacker does).
    pub hold_from_seq: Option<u64>,
}

impl Leaked {
    /// The part of the main chain the rogue may serve now.
    fn served(&self) -> &[Record] {
        let n = match self.hold_from_seq {
            Some(s) => self.chain.iter().take_while(|r| r.header().seq < s).count(),
            None => self.chain.len(),
        };
        &self.chain[..n]
    }

    fn fork_served(&self) -> &[Record] {
        if self.hold_from_seq.is_some() {
            &[]
        } else {
            &self.fork
        }
    }
}

/// A copy frozen at one moment.
struct Frozen {
    heads: BTreeMap<u32, (u64, Hash256)>,
    sync: Vec<Vec<u8>>,
}

struct Shared {
    plan: Plan,
    upstreams: Vec<SocketAddr>,
    leaked: Arc<Mutex<Leaked>>,
    /// The fault phase's start (set by the runner), the clock of `freeze_at_ms`.
    phase_t0: Mutex<Option<Instant>>,
    frozen: Mutex<Option<Frozen>>,
    log: Mutex<RogueLog>,
    ranges: AtomicUsize,
    stop: AtomicBool,
    limits: Limits,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running rogue: its address, its thread.
pub struct Rogue {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Rogue {
    /// Listens on `addr` and answers from `servers` (the honest read addresses).
    pub fn spawn(
        addr: SocketAddr,
        plan: Plan,
        servers: &[SocketAddr],
        leaked: Arc<Mutex<Leaked>>,
        limits: Limits,
    ) -> std::io::Result<Rogue> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let n = servers.len().max(1);
        let upstreams = (0..servers.len()).map(|i| servers[(usize::from(plan.upstream) + i) % n]).collect();
        let shared = Arc::new(Shared {
            plan,
            upstreams,
            leaked,
            phase_t0: Mutex::new(None),
            frozen: Mutex::new(None),
            log: Mutex::new(RogueLog { plan: Some(plan), ..RogueLog::default() }),
            ranges: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            limits,
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new().name("chaos-rogue".into()).spawn(move || accept_loop(listener, sh))?;
        Ok(Rogue { addr, shared, thread: Some(thread) })
    }

    /// The fault phase starts now: `freeze_at_ms` counts from here.
    pub fn phase_started(&self, t0: Instant) {
        *lock(&self.shared.phase_t0) = Some(t0);
    }

    /// What it did so far.
    pub fn log(&self) -> RogueLog {
        lock(&self.shared.log).clone()
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !sh.stop.load(Ordering::Relaxed) {
        maybe_freeze(&sh);
        match listener.accept() {
            Ok((s, _)) => {
                if open.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                    continue;
                }
                open.fetch_add(1, Ordering::AcqRel);
                let (sh, open) = (sh.clone(), open.clone());
                let spawned = std::thread::Builder::new().name("chaos-rogue-conn".into()).spawn(move || {
                    let _ = connection(s, &sh);
                    open.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    // The connection was dropped with the closure; nothing else to undo but
                    // the count, which the closure would have.
                    tracing::warn!("chaos rogue: could not start a connection thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Freezes the copy once its time has come (stale modes): the upstream's heads and newest SYNC
/// of that moment. Tried again on the next call if no honest server answers.
fn maybe_freeze(sh: &Shared) {
    if !sh.plan.mode.stale() || lock(&sh.frozen).is_some() {
        return;
    }
    let Some(t0) = *lock(&sh.phase_t0) else { return };
    let at = t0.elapsed().as_millis() as u64;
    if at < sh.plan.freeze_at_ms {
        return;
    }
    let Ok(heads) = ask_upstream(sh, "HEADS") else { return };
    let Ok(sync) = ask_upstream(sh, "SYNC") else { return };
    let heads = heads.iter().filter_map(|f| decode_heads_entry(f)).map(|(w, s, h)| (w, (s, h))).collect();
    *lock(&sh.frozen) = Some(Frozen { heads, sync });
    lock(&sh.log).frozen_at_ms = Some(at);
    tracing::info!("chaos rogue: copy frozen {at} ms into the fault phase");
}

/// One request to the first honest server that answers: its frames, or its error message.
fn ask_upstream(sh: &Shared, req: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut last = String::from("no capsule server to read from");
    for a in &sh.upstreams {
        match ask_one(*a, req) {
            Ok(Ok(frames)) => return Ok(frames),
            Ok(Err(msg)) => return Err(msg),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    lock(&sh.log).upstream_errors += 1;
    Err(last)
}

fn ask_one(addr: SocketAddr, req: &str) -> std::io::Result<Result<Vec<Vec<u8>>, String>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.write_all(format!("{req}\n").as_bytes())?;
    read_answer(&mut BufReader::new(s))
}

fn write_answer(w: &mut impl Write, a: &Result<Vec<Vec<u8>>, String>) -> std::io::Result<()> {
    let err;
    let frames: &[Vec<u8>] = match a {
        Ok(f) => {
            w.write_all(&(f.len() as u32).to_be_bytes())?;
            f
        }
        Err(e) => {
            w.write_all(&u32::MAX.to_be_bytes())?;
            err = [e.as_bytes().to_vec()];
            &err
        }
    };
    for f in frames {
        w.write_all(&(f.len() as u32).to_be_bytes())?;
        w.write_all(f)?;
    }
    w.flush()
}

fn connection(s: TcpStream, sh: &Shared) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut w = std::io::BufWriter::new(s.try_clone()?);
    let mut r = BufReader::new(s).take(0);
    let mut line = Vec::new();
    let mut idle_since = Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        line.clear();
        r.set_limit(REQUEST_BYTES_MAX + 1);
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if idle_since.elapsed() > Duration::from_secs(30) {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e),
        }
        idle_since = Instant::now();
        if line.last() != Some(&b'\n') {
            return write_answer(&mut w, &Err("request line too long or cut".into()));
        }
        let req = String::from_utf8_lossy(&line).trim().to_string();
        maybe_freeze(sh);
        let a = answer(sh, &req);
        write_answer(&mut w, &a)?;
    }
    Ok(())
}

fn kind(r: &Request) -> &'static str {
    match r {
        Request::Heads => "HEADS",
        Request::Sync => "SYNC",
        Request::Get(_) => "GET",
        Request::Range(..) => "RANGE",
        Request::Proof(_) => "PROOF",
        Request::Check => "CHECK",
        Request::Certs => "CERTS",
        Request::Stats => "STATS",
    }
}

fn heads_entry(w: u32, seq: u64, h: &Hash256) -> Vec<u8> {
    let mut f = Vec::with_capacity(44);
    f.extend_from_slice(&w.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&h.0);
    f
}

/// The rogue's answer to one request line.
fn answer(sh: &Shared, req: &str) -> Result<Vec<Vec<u8>>, String> {
    let parsed = parse_request(req)?;
    *lock(&sh.log).requests.entry(kind(&parsed).into()).or_default() += 1;
    let forged = sh.plan.mode.forged();
    match parsed {
        Request::Heads => {
            let frozen = lock(&sh.frozen).as_ref().map(|f| f.heads.clone());
            let mut heads: BTreeMap<u32, (u64, Hash256)> = match frozen {
                Some(h) => {
                    lock(&sh.log).stale_answers += 1;
                    h
                }
                None => ask_upstream(sh, "HEADS")?
                    .iter()
                    .filter_map(|f| decode_heads_entry(f))
                    .map(|(w, s, h)| (w, (s, h)))
                    .collect(),
            };
            if forged {
                let l = lock(&sh.leaked);
                if let Some(last) = l.served().last() {
                    let seq = last.header().seq;
                    if heads.get(&l.writer).is_none_or(|(s, _)| *s < seq) {
                        heads.insert(l.writer, (seq, last.hash()));
                        lock(&sh.log).forged_heads += 1;
                    }
                }
            }
            Ok(heads.iter().map(|(w, (s, h))| heads_entry(*w, *s, h)).collect())
        }
        Request::Sync => {
            let frozen = lock(&sh.frozen).as_ref().map(|f| f.sync.clone());
            match frozen {
                Some(sync) => {
                    lock(&sh.log).stale_answers += 1;
                    Ok(sync)
                }
                None => ask_upstream(sh, "SYNC"),
            }
        }
        Request::Range(w, from, to) => {
            if forged {
                let l = lock(&sh.leaked);
                if w == l.writer && !l.served().is_empty() {
                    let end = to.min(from.saturating_add(RANGE_RECORDS_MAX - 1));
                    let out: Vec<Vec<u8>> = l
                        .served()
                        .iter()
                        .filter(|r| (from..=end).contains(&r.header().seq))
                        .map(|r| r.bytes().to_vec())
                        .collect();
                    lock(&sh.log).leaked_records_served += out.len() as u64;
                    return Ok(out);
                }
            }
            let frozen = lock(&sh.frozen).as_ref().map(|f| f.heads.get(&w).map(|(s, _)| *s));
            let to = match frozen {
                Some(head) => match head {
                    Some(h) if h >= from => {
                        if h < to {
                            lock(&sh.log).stale_answers += 1;
                        }
                        h.min(to)
                    }
                    _ => {
                        lock(&sh.log).stale_answers += 1;
                        return Ok(Vec::new());
                    }
                },
                None => to,
            };
            let mut frames = ask_upstream(sh, &format!("RANGE {w} {from} {to}"))?;
            let n = sh.ranges.fetch_add(1, Ordering::Relaxed) + 1;
            if !frames.is_empty() && n.is_multiple_of(sh.plan.corrupt_every.max(1) as usize) {
                let i = n % frames.len();
                let f = &mut frames[i];
                if !f.is_empty() {
                    let at = f.len() / 2;
                    f[at] ^= 0x20;
                    lock(&sh.log).corrupted += 1;
                }
            }
            Ok(frames)
        }
        Request::Get(h) => {
            if forged {
                let l = lock(&sh.leaked);
                if let Some(r) = l.served().iter().chain(l.fork_served()).find(|r| r.hash() == h) {
                    lock(&sh.log).leaked_records_served += 1;
                    return Ok(vec![r.bytes().to_vec()]);
                }
            }
            let frames = ask_upstream(sh, req)?;
            if let Some(f) = lock(&sh.frozen).as_ref() {
                // A record past a frozen head is withheld.
                let past = frames.first().and_then(|b| Record::decode(b, &sh.limits).ok()).is_some_and(|r| {
                    let hd = r.header();
                    f.heads.get(&hd.writer).is_none_or(|(s, _)| hd.seq > *s)
                });
                if past {
                    lock(&sh.log).stale_answers += 1;
                    return Ok(Vec::new());
                }
            }
            Ok(frames)
        }
        Request::Certs => {
            let frames = ask_upstream(sh, "CERTS")?;
            if !forged {
                return Ok(frames);
            }
            let writer = lock(&sh.leaked).writer;
            let mut out = Vec::new();
            for f in frames {
                let Ok(list) = KeyStatement::decode_list(&f) else {
                    out.push(f);
                    continue;
                };
                let before = list.len();
                let kept: Vec<KeyStatement> = list
                    .into_iter()
                    .filter(|s| !(matches!(s, KeyStatement::Revoke(_)) && s.writer() == writer))
                    .collect();
                lock(&sh.log).revocations_withheld += (before - kept.len()) as u64;
                if !kept.is_empty() {
                    out.push(KeyStatement::encode_list(&kept));
                }
            }
            Ok(out)
        }
        Request::Proof(_) | Request::Check | Request::Stats => ask_upstream(sh, req),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_the_rogue() {
        assert_eq!(Plan::generate(9, 12_000, 3), Plan::generate(9, 12_000, 3));
        let modes: std::collections::BTreeSet<String> =
            (0..60).map(|s| format!("{:?}", Plan::generate(s, 12_000, 3).mode)).collect();
        assert_eq!(modes.len(), 3, "every mode comes up: {modes:?}");
        for s in 0..60 {
            let p = Plan::generate(s, 12_000, 3);
            assert!(p.upstream < 3 && p.corrupt_every >= 3, "{p:?}");
            assert!((1_200..=6_000).contains(&p.freeze_at_ms), "{p:?}");
        }
    }
}
