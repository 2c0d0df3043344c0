//! `psl chaos --byzantine`: a leaked writer key that goes on writing after its revocation.
//!
//! The runner holds the deployment's owner key (it made the capsule), so it can play the
//! attacker who stole one certified writer's key. One seed decides the attack ([`Plan`]); the
//! runner runs it beside the clients and the nemesis ([`attack`]), reads at the end what every
//! node, front end and capsule server holds of it ([`finals`]), and the checker asks
//! ([`super::checker`], check `byzantine`) that nothing the revocation covers was applied or stored.
//!
//! The attack, over the real fabric (the attacker's own TCP link to the router, under the
//! router's faults like every other link):
//!
//! 1. *Before the revocation.* Writer [`leaked_writer`] (node id [`LEAKED_NODE`], which no
//!    process of the deployment uses) gets a certificate from the application key and writes its
//!    Cert record (seq 0) and [`Plan::pre`] honest data records (`byz/pre/N`), re-published
//!    every [`REPUBLISH_MS`] until the revocation, so that losses are filled. It then signs
//!    [`Plan::withheld`] more records (`byz/post/wN`) and keeps them back.
//! 2. *The revocation*, at [`Plan::revoke_at_ms`]: `REVOKE <writer> <from_epoch> <from_seq>`,
//!    signed with the operator's control key, on the control interface of every coordinator that
//!    answers (the primary and the shadow: either may be the one running the epochs).
//!    `from_epoch` is the coordinator's epoch + 2 (the `REVOKE` default) and `from_seq` the seq
//!    right after the last record the attacker published (the first withheld one): the operator
//!    who learns of the leak knows the chain so far, as the FaaS leader knows its workers' heads
//!    at a RESET. Taking the default seq bound (the coordinator's next expected seq) instead
//!    would make the harness flaky, not stronger: a coordinator behind a lossy link can expect
//!    an earlier seq, and the revocation would then cover records the servers stored and acked
//!    before it existed (scl.md §7b, limit (b)), which the checker could not tell from a breach.
//!    The bounds are recorded as the `REVOKED` answers name them.
//! 3. *After it*, once every live server lists the revocation and every live node is past
//!    `from_epoch` (bounded wait; the outcome is recorded), until the end of the fault phase,
//!    one record every [`Plan::every_ms`], at most [`POST_MAX`]: the withheld records (signed
//!    before the revocation, published only now: the delayed-record attack, refused by the seq
//!    bound), new records continuing the chain that claim epoch 0 or `from_epoch - 1`
//!    (backdated: only the seq bound refuses them) or later epochs, equivocating copies (a
//!    second chain forked at the last published record, other values at the same seqs), and
//!    replays of the published records (duplicates, harmless).
//!
//! Every record carries two puts: `K` with a plain value (what nodes' `GET` shows) and `K/mc`
//! with a SecureCached item (what a front end's `get` shows). Every record the revocation
//! covers writes keys under `byz/post/`; every other under `byz/pre/`.
//!
//! Why the attacker waits for the revocation to be known before it sends what it covers: an
//! endpoint that has not learnt a revocation cannot apply it (scl.md §7b, limit (a)), and the
//! fabric reaches every endpoint at once. A process that restarts later must learn it by itself
//! (from the servers' log or the announcements) before it applies the attacker's records; that
//! is part of what this mode tests.

use super::ctl::Ctl;
use super::schedule::Rng;
use anyhow::{bail, Context, Result};
use psl_capsule::{Author, KeyStatement, Record, SignedMetadata};
use psl_fabric::Fabric;
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Node id of the leaked writer: no process of the chaos deployment uses it (nodes 1 to 3,
/// front ends 201 up, recovery checks 100 up, CapsuleDB 30 000).
pub const LEAKED_NODE: u32 = 31_000;
/// Most records the attacker publishes after the revocation.
pub const POST_MAX: u32 = 300;
/// How often the records before the revocation are published again.
pub const REPUBLISH_MS: u64 = 300;
/// Bound of the wait for every live endpoint to know the revocation.
const KNOWN_WAIT: Duration = Duration::from_secs(8);
/// The attacker goes on at least this long after the wait for the revocation to be known, even
/// past the fault phase (a wait that took the rest of the phase would leave the seed vacuous).
const POST_MIN_MS: u64 = 1_000;
/// Bound of the tries to have the revocation signed.
const REVOKE_WAIT: Duration = Duration::from_secs(10);
/// Prefix of every key the attacker writes; of those the revocation covers.
pub const PREFIX: &str = "byz/";
pub const COVERED: &str = "byz/post/";

/// The leaked writer's index (`psl_scl::writer_index(LEAKED_NODE, 0, 1)`).
pub fn leaked_writer() -> u32 {
    (LEAKED_NODE << 16) | 1
}

/// The attack one seed decides. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub writer: u32,
    /// Honest data records before the revocation.
    pub pre: u32,
    /// Records signed before the revocation, published only after it.
    pub withheld: u32,
    /// When the revocation is issued, ms into the fault phase.
    pub revoke_at_ms: u64,
    /// One record every this many ms after the revocation.
    pub every_ms: u64,
}

impl Plan {
    /// The plan of `seed` for a fault phase of `fault_ms` (its own stream: the schedule and
    /// the workload of a seed are the same with and without `--byzantine`).
    pub fn generate(seed: u64, fault_ms: u64) -> Plan {
        let mut rng = Rng::new(seed ^ 0xB42A_171E_0000_0000);
        Plan {
            writer: leaked_writer(),
            pre: rng.range(3, 8) as u32,
            withheld: rng.range(1, 4) as u32,
            revoke_at_ms: fault_ms * rng.range(25, 40) / 100,
            every_ms: rng.range(10, 40),
        }
    }
}

/// Where the attacker reaches the deployment.
pub struct Env {
    /// The seed's directory: `c.capsule`, `owner.key`.
    pub dir: PathBuf,
    pub router: SocketAddr,
    pub coord_ctl: Vec<SocketAddr>,
    pub node_ctl: Vec<SocketAddr>,
    pub mc_listen: Vec<SocketAddr>,
    pub server_read: Vec<SocketAddr>,
    /// The fault phase's start and length: the attack ends with it.
    pub t0: Instant,
    pub fault_ms: u64,
    /// Every record the attacker signs, for the rogue capsule server to serve.
    pub leaked: Arc<Mutex<super::rogue::Leaked>>,
}

/// What the attacker did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AttackLog {
    pub plan: Option<Plan>,
    /// (from_epoch, from_seq) as the `REVOKED` answers name them; None: not revoked.
    pub revoked: Option<(u64, u64)>,
    /// Every `REVOKE` sent: (coordinator, answer or error).
    pub revoke_answers: Vec<(String, String)>,
    /// When the revocation was signed, ms into the fault phase.
    pub revoked_at_ms: Option<u64>,
    /// Whether every live endpoint was seen to know the revocation before the covered records
    /// went out, and which were not (a process down at the time is listed too).
    pub known_everywhere: bool,
    pub not_known: Vec<String>,
    /// Keys of records published before the revocation.
    pub pre_keys: Vec<String>,
    /// Keys of records the revocation covers that were published.
    pub post_keys: Vec<String>,
    /// Records published after the revocation, by kind.
    pub withheld_sent: u32,
    pub forged_sent: u32,
    pub equivocations_sent: u32,
    pub replays_sent: u32,
    /// What went wrong in the attack itself.
    pub errors: Vec<String>,
}

/// What the runner read of the attack after the heal.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ByzFinals {
    pub log: AttackLog,
    /// Per node or front end: the covered keys it shows, or why it could not be read.
    pub shown: Vec<(String, Result<Vec<String>, String>)>,
    /// Per node or front end: how many `byz/pre` keys it shows (they may stay: information).
    pub pre_shown: Vec<(String, usize)>,
    /// Per capsule server: the leaked writer's newest stored seq (None: nothing), or why not read.
    pub server_heads: Vec<(String, Result<Option<u64>, String>)>,
    /// Records refused as `revoked`, summed over the nodes' counters (evidence the defence ran).
    pub refused_revoked: u64,
    /// What the rogue capsule server did.
    pub rogue: Option<super::rogue::RogueLog>,
}

impl ByzFinals {
    /// A one-line summary for the seed's report.
    pub fn summary(&self) -> serde_json::Value {
        let l = &self.log;
        serde_json::json!({
            "writer": l.plan.map(|p| p.writer),
            "revoked": l.revoked.map(|(e, s)| serde_json::json!({"from_epoch": e, "from_seq": s})),
            "known_everywhere": l.known_everywhere,
            "pre": l.pre_keys.len(),
            "withheld": l.withheld_sent,
            "forged": l.forged_sent,
            "equivocations": l.equivocations_sent,
            "replays": l.replays_sent,
            "refused_revoked": self.refused_revoked,
            "pre_applied": self.pre_shown.iter().map(|(_, n)| n).sum::<usize>(),
            "rogue": self.rogue.as_ref().map(|r| r.summary()),
            "errors": l.errors,
        })
    }
}

fn ms(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

/// A data record of two puts: `key` (plain) and `key/mc` (a SecureCached item).
fn put(a: &mut Author, key: &str) -> Result<Record> {
    let val = key.replace('/', "-");
    let item = psl_memcached::item::encode(0, 0, psl::util::now_ms() * 1000, &[val.as_bytes()]);
    let rec = a.write_ops([
        (key.to_string().into_bytes(), Some(val.into_bytes())),
        (format!("{key}/mc").into_bytes(), Some(item)),
    ])?;
    Ok(rec)
}

fn head_of(r: &Record) -> psl_capsule::Head {
    let h = r.header();
    psl_capsule::Head { writer: h.writer, seq: h.seq, hash: r.hash(), lamport: h.lamport, epoch: h.epoch }
}

struct Link {
    ep: psl_fabric::TcpEndpoint,
    name: psl_capsule::CapsuleName,
}

impl Link {
    fn send(&self, r: &Record) {
        let m = psl_scl::Msg::Record { capsule: self.name, bytes: r.shared_bytes() }.encode();
        // Best effort, as any fabric publish: a record lost here is a record lost on the wire.
        let _ = self.ep.publish(m.into());
    }

    /// Discards what arrived (the attacker answers nothing), bounded per call.
    fn drain(&self) {
        for _ in 0..10_000 {
            if !matches!(self.ep.try_recv(), Ok(Some(_))) {
                break;
            }
        }
    }
}

fn load(dir: &std::path::Path) -> Result<(SignedMetadata, psl_crypto::AppKey)> {
    let bytes = std::fs::read(dir.join("c.capsule")).context("reading c.capsule")?;
    let f = psl_capsule::CapsuleFile::parse(&bytes).context("c.capsule")?;
    let owner = psl::util::read_owner_key(&dir.join("owner.key"))?;
    let app = owner.app(f.metadata.meta.app_index)?;
    Ok((f.metadata, app))
}

/// Sleeps until `t` ms into the fault phase (or `stop`), draining the link.
fn sleep_until(env: &Env, link: &Link, t: u64, stop: &AtomicBool) {
    while ms(env.t0) < t && !stop.load(Ordering::Relaxed) {
        link.drain();
        std::thread::sleep(Duration::from_millis(10).min(Duration::from_millis(t.saturating_sub(ms(env.t0)))));
    }
}

fn ctl(addr: SocketAddr) -> std::io::Result<Ctl> {
    let c = Ctl::connect(addr, Duration::from_secs(2))?;
    // A paused process answers nothing: give up on it quickly.
    c.w.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(c)
}

fn stats(addr: SocketAddr) -> Result<serde_json::Value, String> {
    let a = ctl(addr).and_then(|mut c| c.call("STATS")).map_err(|e| e.to_string())?;
    serde_json::from_str(&a).map_err(|e| format!("STATS {a:?}: {e}"))
}

/// Runs the attack of `plan` until the end of the fault phase or `stop`.
pub fn attack(plan: Plan, env: &Env, stop: &AtomicBool) -> AttackLog {
    let mut log = AttackLog { plan: Some(plan), ..AttackLog::default() };
    if let Err(e) = attack_inner(plan, env, stop, &mut log) {
        log.errors.push(format!("{e:#}"));
    }
    tracing::info!(
        "chaos byzantine: revoked {:?}; sent {} withheld, {} forged, {} equivocating, {} replays",
        log.revoked,
        log.withheld_sent,
        log.forged_sent,
        log.equivocations_sent,
        log.replays_sent
    );
    log
}

fn attack_inner(plan: Plan, env: &Env, stop: &AtomicBool, log: &mut AttackLog) -> Result<()> {
    let (meta, app) = load(&env.dir)?;
    if meta.meta.policy.writer_keys != psl_capsule::WriterKeys::Certified {
        bail!("the chaos capsule does not certify writer keys: no revocation to attack");
    }
    let w = plan.writer;
    let cfg = psl_fabric::TcpConfig {
        name: "chaos-attacker".into(),
        queue_msgs_max: 256,
        queue_bytes_max: 4 << 20,
        ..psl_fabric::TcpConfig::default()
    };
    let ep = psl_fabric::TcpEndpoint::connect(env.router, cfg).context("attaching the attacker to the router")?;
    let link = Link { ep, name: meta.name() };

    // 1. Before the revocation: a certified writer, honest records, withheld ones.
    let mut a = Author::new(&meta, &app, w)?;
    let mut published: Vec<Record> = Vec::new();
    published.push(a.write_own_cert().context("a certified writer has a certificate")??);
    for i in 0..plan.pre {
        let key = format!("{PREFIX}pre/{i}");
        published.push(put(&mut a, &key)?);
        log.pre_keys.push(key);
    }
    let leak = |r: &Record, fork: bool| {
        let mut l = env.leaked.lock().unwrap_or_else(|p| p.into_inner());
        l.writer = w;
        if fork {
            l.fork.push(r.clone())
        } else {
            l.chain.push(r.clone())
        }
    };
    for r in &published {
        leak(r, false);
    }
    let last_published = head_of(published.last().context("at least the Cert record")?);
    let from_seq = a.next_seq();
    // The rogue serves nothing the revocation will cover until the revocation is known (the
    // reason the attacker itself waits, above).
    env.leaked.lock().unwrap_or_else(|p| p.into_inner()).hold_from_seq = Some(from_seq);
    let mut withheld = Vec::new();
    for i in 0..plan.withheld {
        let r = put(&mut a, &format!("{COVERED}w{i}"))?;
        leak(&r, false);
        withheld.push((format!("{COVERED}w{i}"), r));
    }
    // The attacker's chain head (to move its claimed epoch: `Author::resume`).
    let mut a_head = withheld.last().map_or(last_published, |(_, r)| head_of(r));
    while ms(env.t0) < plan.revoke_at_ms && !stop.load(Ordering::Relaxed) {
        for r in &published {
            link.send(r);
        }
        let next = (ms(env.t0) + REPUBLISH_MS).min(plan.revoke_at_ms);
        sleep_until(env, &link, next, stop);
    }
    if stop.load(Ordering::Relaxed) {
        return Ok(());
    }

    // 2. The revocation, on every coordinator that answers.
    let deadline = Instant::now() + REVOKE_WAIT;
    let mut bounds: Option<(u64, u64)> = None;
    while bounds.is_none() && Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        for (r, addr) in env.coord_ctl.iter().enumerate() {
            let who = format!("coord{r}");
            // The epoch bound: the coordinator's epoch + 2 (the REVOKE default), fixed by the
            // first that answers so that every coordinator signs the same bounds.
            let from_epoch = match bounds {
                Some((e, _)) => e,
                None => match stats(*addr).map(|s| s["epoch"].as_u64()) {
                    Ok(Some(e)) => e + 2,
                    Ok(None) => continue,
                    Err(e) => {
                        log.revoke_answers.push((who, format!("STATS: {e}")));
                        continue;
                    }
                },
            };
            let line = format!("REVOKE {w} {from_epoch} {from_seq}");
            let answer = ctl(*addr).and_then(|mut c| c.call(&line)).map_err(|e| e.to_string());
            if let Ok(a) = &answer {
                let p: Vec<&str> = a.split_whitespace().collect();
                if let ["REVOKED", _, "FROM", e, "SEQ", s] = p[..] {
                    if let (Ok(e), Ok(s)) = (e.parse(), s.parse()) {
                        bounds.get_or_insert((e, s));
                    }
                }
            }
            log.revoke_answers.push((who, answer.unwrap_or_else(|e| format!("error: {e}"))));
        }
        if bounds.is_none() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let Some((from_epoch, from_seq)) = bounds else {
        bail!("no coordinator signed the revocation within {REVOKE_WAIT:?}");
    };
    log.revoked = Some((from_epoch, from_seq));
    log.revoked_at_ms = Some(ms(env.t0));
    tracing::info!("chaos byzantine: writer {w} revoked from epoch {from_epoch}, seq {from_seq}");

    // Every live endpoint knows it (bounded).
    let deadline = Instant::now() + KNOWN_WAIT;
    loop {
        link.drain();
        let mut missing = Vec::new();
        for (i, addr) in env.server_read.iter().enumerate() {
            let knows = psl_server::read::ReadClient::connect(*addr).and_then(|mut c| c.statements()).map(|st| {
                st.iter().any(|s| matches!(s, KeyStatement::Revoke(r) if r.writer == w && r.from_seq == from_seq))
            });
            if !matches!(knows, Ok(true)) {
                missing.push(format!("server{i}"));
            }
        }
        for (i, addr) in env.node_ctl.iter().enumerate() {
            if !stats(*addr).is_ok_and(|s| s["epoch"].as_u64().is_some_and(|e| e > from_epoch)) {
                missing.push(format!("node{i}"));
            }
        }
        if missing.is_empty() || Instant::now() > deadline || stop.load(Ordering::Relaxed) {
            log.known_everywhere = missing.is_empty();
            log.not_known = missing;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // 3. After it: withheld, forged, equivocating, replayed records (the rogue too).
    env.leaked.lock().unwrap_or_else(|p| p.into_inner()).hold_from_seq = None;
    let mut fork = Author::new(&meta, &app, w)?;
    fork.resume(&last_published);
    let mut withheld = withheld.into_iter();
    let mut sent = 0u32;
    let mut n = 0u32;
    let min_end = ms(env.t0) + POST_MIN_MS;
    while sent < POST_MAX && (ms(env.t0) < min_end || (ms(env.t0) < env.fault_ms && !stop.load(Ordering::Relaxed))) {
        let kind = sent % 4;
        if kind == 0 || (kind == 1 && withheld.len() > 0) {
            if let Some((key, r)) = withheld.next() {
                link.send(&r);
                log.post_keys.push(key);
                log.withheld_sent += 1;
                sent += 1;
                continue;
            }
        }
        match kind {
            0 | 1 => {
                // Continuing the chain: backdated to epoch 0, then to just before the
                // revocation's epoch, then at and after it (epochs never go down in a chain).
                let claim = match n % 3 {
                    0 => 0,
                    1 => from_epoch.saturating_sub(1),
                    _ => from_epoch + u64::from(n),
                };
                if claim > a.epoch() {
                    // No SYNC link needed: the epoch is the writer's claim.
                    a.resume(&psl_capsule::Head { epoch: claim, ..a_head });
                }
                let key = format!("{COVERED}f{n}");
                let r = put(&mut a, &key)?;
                leak(&r, false);
                a_head = head_of(&r);
                link.send(&r);
                log.post_keys.push(key);
                log.forged_sent += 1;
                n += 1;
            }
            2 => {
                let key = format!("{COVERED}e{}", log.equivocations_sent);
                let r = put(&mut fork, &key)?;
                leak(&r, true);
                link.send(&r);
                log.post_keys.push(key);
                log.equivocations_sent += 1;
            }
            _ => {
                let r = &published[(sent as usize / 4) % published.len()];
                link.send(r);
                log.replays_sent += 1;
            }
        }
        sent += 1;
        let next = ms(env.t0) + plan.every_ms;
        sleep_until(env, &link, next, &AtomicBool::new(false));
    }
    if log.withheld_sent + log.forged_sent == 0 {
        bail!("nothing was sent after the revocation");
    }
    Ok(())
}

/// The keys of `keys` front end `addr` shows (a `get` of each `K/mc`).
fn mc_has(addr: SocketAddr, keys: &[String]) -> Result<Vec<String>, String> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut found = Vec::new();
    for k in keys {
        w.write_all(format!("get {k}/mc\r\n").as_bytes()).map_err(|e| e.to_string())?;
        let mut line = String::new();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("closed".into());
        }
        let line = line.trim_end();
        if line == "END" {
            continue;
        }
        let p: Vec<&str> = line.split(' ').collect();
        let len: usize = match p[..] {
            ["VALUE", _, _, len, ..] => len.parse().map_err(|_| format!("get {k}: {line:?}"))?,
            _ => return Err(format!("get {k}/mc: {line:?}")),
        };
        if len > 1 << 20 {
            return Err(format!("get {k}/mc: {len} bytes"));
        }
        let mut data = vec![0u8; len + 2];
        r.read_exact(&mut data).map_err(|e| e.to_string())?;
        let mut end = String::new();
        r.read_line(&mut end).map_err(|e| e.to_string())?;
        found.push(k.clone());
    }
    Ok(found)
}

/// The keys of `keys` node `addr` shows (`GET`, through CapsuleDB for an evicted key).
pub(super) fn node_has(addr: SocketAddr, keys: &[String]) -> Result<Vec<String>, String> {
    let mut c = Ctl::connect(addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    for k in keys {
        let a = c.call(&format!("GET {k}")).map_err(|e| e.to_string())?;
        if a.starts_with("VALUE ") {
            found.push(k.clone());
        } else if a != "NOT_FOUND" {
            return Err(format!("GET {k}: {a}"));
        }
    }
    Ok(found)
}

/// Reads what every node, front end and server holds of the attack (after the heal).
pub fn finals(env: &Env, log: AttackLog) -> ByzFinals {
    let mut f = ByzFinals::default();
    let post = &log.post_keys;
    let pre = &log.pre_keys;
    for (i, a) in env.node_ctl.iter().enumerate() {
        f.shown.push((format!("node{i}"), node_has(*a, post)));
        f.pre_shown.push((format!("node{i}"), node_has(*a, pre).map_or(0, |v| v.len())));
        if let Ok(s) = stats(*a) {
            f.refused_revoked += s["rejected"]["revoked"].as_u64().unwrap_or(0);
        }
    }
    for (i, a) in env.mc_listen.iter().enumerate() {
        f.shown.push((format!("mc{i}"), mc_has(*a, post)));
        f.pre_shown.push((format!("mc{i}"), mc_has(*a, pre).map_or(0, |v| v.len())));
    }
    let w = log.plan.map_or(leaked_writer(), |p| p.writer);
    for (i, a) in env.server_read.iter().enumerate() {
        let h = psl_server::read::ReadClient::connect(*a)
            .and_then(|mut c| c.heads())
            .map(|h| h.get(&w).map(|(s, _)| *s))
            .map_err(|e| e.to_string());
        f.server_heads.push((format!("server{i}"), h));
    }
    f.log = log;
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_the_attack() {
        assert_eq!(Plan::generate(7, 3000), Plan::generate(7, 3000));
        let p = Plan::generate(7, 3000);
        assert!(p.revoke_at_ms >= 750 && p.revoke_at_ms <= 1200, "{p:?}");
        assert!(p.pre >= 3 && p.withheld >= 1);
        assert_eq!(p.writer >> 16, LEAKED_NODE);
        assert_eq!(Some(p.writer), psl_scl::writer_index(LEAKED_NODE, 0, 1));
    }
}
