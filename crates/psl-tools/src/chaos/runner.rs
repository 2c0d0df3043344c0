//! The process runner: starts the deployment as `psl` processes on loopback (each attached to
//! the fabric through a [`Proxy`] the nemesis can cut), runs the clients and the nemesis
//! concurrently, heals, and collects what the checker needs. It decides nothing: the schedule
//! and the workload come in, the history and the finals go out.
//!
//! Deployment: a router (with the schedule's fault rates), a primary and a shadow coordinator
//! (50 ms epochs), three capsule servers (n = 3, f = 1; each store on its own small tmpfs where
//! mounting is allowed, for the disk faults), CapsuleDB (on the servers and in a directory),
//! three nodes (durable writes on f + 1 servers; nodes 1 and 2 with memtables bounded to
//! [`NODE_KEYS_MAX`] keys, evicting to CapsuleDB), two SecureCached front ends (one peer group,
//! 1 MiB of item memory each, misses read through CapsuleDB).

use super::ctl::{control_key, Ctl};
use super::history::{
    CasEvent, CasOutcome, DurableEvent, Finals, History, KvState, Outcome, ReadEvent, VersionSeen, WriteEvent,
};
use super::proxy::Proxy;
use super::schedule::{Action, Proc, Schedule, Step};
use super::workload::{counter_key, Barrier, CasClient, KvOp, NodeClient, Workload};
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bound of nodes 1 and 2's memtables (node 0 is unbounded: its DUMP shows versions).
pub const NODE_KEYS_MAX: u64 = 128;
/// What the checker accepts of a bounded memtable at the end: the bound is soft (see
/// `psl_scl::Memtable`): it is enforced per shard (64 shards of 2 keys each here), only on an
/// insert or a raised CapsuleDB frontier, entries read since the last scan get a second chance,
/// and entries above CapsuleDB's published frontier are pinned until a block holds them. A
/// quarter of slack covers that; a memtable that does not evict at all holds every key of the
/// workload (200), far above it.
pub const NODE_KEYS_ACCEPTED: u64 = NODE_KEYS_MAX + NODE_KEYS_MAX / 4;
/// Peak resident memory any process may reach (a generous ceiling: a leak or an unbounded queue
/// under faults shows up far above it).
pub const RSS_KIB_MAX: u64 = 1 << 20;
/// Item memory of each front end, MiB.
const MC_MEMORY_MB: u64 = 1;
/// Size of each server's tmpfs.
const SERVER_FS_MB: u64 = 128;
/// How long a process may take to come up (a restarted node waits for fresh servers first).
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Bounds of the heal phase's waits.
const SETTLE: Duration = Duration::from_secs(60);

pub struct RunOpts {
    /// The `psl` binary to run.
    pub exe: PathBuf,
    /// This seed's directory (logs, stores, state).
    pub dir: PathBuf,
    /// Whether stores may live on tmpfs mounts (disk faults), probed once per run.
    pub tmpfs: bool,
    /// `--byzantine`: a leaked writer key attacks the revocation (see [`super::byzantine`]).
    pub byzantine: bool,
}

/// What one seed's run produced.
pub struct SeedRun {
    pub history: History,
    pub finals: Finals,
    /// What the nemesis did not do (disk faults without tmpfs), for the report.
    pub skipped: Vec<String>,
    pub mounts: Vec<PathBuf>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A free loopback port for a process started a moment later (below the ephemeral range: see
/// `psl_fabric::natsd::free_port`).
fn free_port() -> Result<SocketAddr> {
    Ok(psl_fabric::natsd::free_port(std::net::Ipv4Addr::LOCALHOST.into())?)
}

/// Whether this process may mount a tmpfs (root, and a kernel and container that allow it).
pub fn probe_tmpfs(dir: &Path) -> bool {
    let p = dir.join(".tmpfs-probe");
    if std::fs::create_dir_all(&p).is_err() {
        return false;
    }
    let ok = mount_tmpfs(&p, 1).is_ok();
    if ok {
        let _ = umount(&p);
    }
    let _ = std::fs::remove_dir(&p);
    ok
}

fn sh(cmd: &str, args: &[&str]) -> Result<()> {
    let o = Command::new(cmd).args(args).output().with_context(|| format!("running {cmd}"))?;
    if !o.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

fn mount_tmpfs(p: &Path, mb: u64) -> Result<()> {
    sh("mount", &["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs", &p.display().to_string()])
}

pub fn umount(p: &Path) -> Result<()> {
    sh("umount", &[&p.display().to_string()])
}

fn remount(p: &Path, ro: bool) -> Result<()> {
    sh("mount", &["-o", if ro { "remount,ro" } else { "remount,rw" }, &p.display().to_string()])
}

struct Running {
    child: Child,
}

/// A process the schedule restarted that has not said it is ready yet: the schedule goes on
/// meanwhile (a restart that waited for its process would hold back the steps after it, a
/// resume among them: a CapsuleDB restart waiting for servers, one of them paused until a later
/// step, would wait out its whole recovery timeout).
struct Starting {
    rx: Receiver<String>,
    ready: &'static str,
    deadline: Instant,
    log: PathBuf,
}

/// The deployment: processes, their addresses, their proxies.
struct Cluster {
    exe: PathBuf,
    dir: PathBuf,
    logs: PathBuf,
    t0: Instant,
    router: SocketAddr,
    router_faults: Vec<String>,
    proxies: BTreeMap<Proc, Proxy>,
    procs: Mutex<BTreeMap<Proc, Running>>,
    starting: Mutex<BTreeMap<Proc, Starting>>,
    /// Killed by the schedule, or allowed to die (a server whose disk is full).
    may_be_down: Mutex<BTreeSet<Proc>>,
    /// Servers whose disk the schedule filled and has not freed yet: they may exit (or fail to
    /// start) at any time until then, whatever else came up meanwhile (a restart that finishes
    /// after the fill must not make their exit unexpected: seed 1135).
    disk_full: Mutex<BTreeSet<Proc>>,
    unexpected: Mutex<Vec<String>>,
    /// Highest resident memory seen per process, KiB.
    rss: Mutex<BTreeMap<String, u64>>,
    server_read: Vec<SocketAddr>,
    node_ctl: Vec<SocketAddr>,
    /// The coordinators' control addresses (`REVOKE`, `--byzantine`).
    coord_ctl: Vec<SocketAddr>,
    mc_listen: Vec<SocketAddr>,
    mc_peer: Vec<SocketAddr>,
    capsuledb_writer: u32,
    shape_nodes: u8,
    /// `--byzantine`: the lying capsule server, listed first wherever roles read from servers.
    rogue: Option<super::rogue::Rogue>,
    /// `--byzantine`: what the attacker signs, shared with the rogue.
    leaked: Arc<Mutex<super::rogue::Leaked>>,
}

impl Cluster {
    fn s(p: &Path) -> String {
        p.display().to_string()
    }

    fn common(&self, role: &str, p: Proc) -> Vec<String> {
        vec![
            role.into(),
            "--capsule".into(),
            Self::s(&self.dir.join("c.capsule")),
            "--owner".into(),
            Self::s(&self.dir.join("owner.key")),
            "--router".into(),
            self.proxies[&p].addr().to_string(),
        ]
    }

    /// The read addresses a role is given: the rogue's first (`--byzantine`), then the servers'.
    fn reads(&self) -> String {
        self.rogue
            .iter()
            .map(|r| r.addr)
            .chain(self.server_read.iter().copied())
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The command line of `p` (`restart`: a node recovers from the servers).
    fn args(&self, p: Proc, restart: bool) -> (Vec<String>, &'static str) {
        match p {
            Proc::Router => {
                let mut a: Vec<String> = vec![
                    "router".into(),
                    "--listen".into(),
                    self.router.to_string(),
                    "--stats-every".into(),
                    "0".into(),
                ];
                a.extend(self.router_faults.iter().cloned());
                (a, "listening")
            }
            Proc::Coordinator(r) => {
                let mut a = self.common("coordinator", p);
                a.extend(["--epoch-ms", "50", "--eoe-timeout-ms", "200", "--rank"].map(String::from));
                a.push(r.to_string());
                a.extend(["--state".into(), Self::s(&self.dir.join(format!("coord{r}")))]);
                a.extend(["--control".into(), self.coord_ctl[r as usize].to_string()]);
                (a, "control")
            }
            Proc::Server(i) => {
                let mut a = self.common("capsule-server", p);
                a.extend(["--dir".into(), Self::s(&self.dir.join(format!("s{i}"))), "--id".into(), i.to_string()]);
                a.extend(["--n", "3", "--f", "1", "--verifiers", "1", "--read"].map(String::from));
                a.push(self.server_read[i as usize].to_string());
                (a, "reads")
            }
            Proc::CapsuleDb => {
                let mut a = self.common("capsuledb", p);
                a.extend(["--servers".into(), self.reads(), "--store".into(), Self::s(&self.dir.join("cdb"))]);
                a.extend(
                    ["--memtable-entries", "100", "--block-entries", "64", "--idle-flush-ms", "300"].map(String::from),
                );
                a.extend(["--recover-timeout-ms", "60000"].map(String::from));
                (a, "ready")
            }
            Proc::Node(i) => {
                let mut a = self.common("node", p);
                a.extend(["--id".into(), (u32::from(i) + 1).to_string()]);
                a.extend(["--state".into(), Self::s(&self.dir.join(format!("st{i}")))]);
                a.extend(["--servers".into(), "3".into(), "--capsuledb".into(), self.capsuledb_writer.to_string()]);
                a.extend(["--control".into(), self.node_ctl[i as usize].to_string()]);
                a.extend(["--writers", "1", "--verifiers", "1", "--recover-timeout-ms", "60000"].map(String::from));
                if i > 0 {
                    a.extend(["--memtable-keys-max".into(), NODE_KEYS_MAX.to_string()]);
                }
                if restart {
                    a.extend(["--recover-from".into(), self.reads()]);
                }
                (a, "control")
            }
            Proc::Memcached(i) => {
                let mut a = vec!["memcached".into(), "--listen".into(), self.mc_listen[i as usize].to_string()];
                a.extend(["--cluster".into(), self.proxies[&p].addr().to_string()]);
                a.extend(["--capsule".into(), Self::s(&self.dir.join("c.capsule"))]);
                a.extend(["--owner".into(), Self::s(&self.dir.join("owner.key"))]);
                a.extend(["--id".into(), (201 + u32::from(i)).to_string()]);
                a.extend(["--state".into(), Self::s(&self.dir.join(format!("mc{i}")))]);
                a.extend(["--capsuledb-writer".into(), self.capsuledb_writer.to_string()]);
                a.extend(["--memory-mb".into(), MC_MEMORY_MB.to_string()]);
                a.extend(["--peer-listen".into(), self.mc_peer[i as usize].to_string()]);
                let peers: Vec<String> = self.mc_peer.iter().map(|a| a.to_string()).collect();
                a.extend(["--peers".into(), peers.join(",")]);
                a.extend(["--writers", "1", "--verifiers", "1"].map(String::from));
                (a, "listening")
            }
        }
    }

    /// Starts `psl ARGS` with its output in `logs/NAME.log`; waits for the line `READY ...`.
    fn spawn_raw(&self, name: &str, args: &[String], ready: &str) -> Result<(Child, String)> {
        let (mut child, rx, log_path) = self.spawn_child(name, args)?;
        match wait_ready(&rx, ready, START_TIMEOUT, &mut child) {
            Ok(rest) => Ok((child, rest)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{name} did not come up: {e}; log {}: {}", log_path.display(), tail(&log_path, 6))
            }
        }
    }

    /// Starts a process; its stdout lines go to its log and to the returned channel.
    fn spawn_child(&self, name: &str, args: &[String]) -> Result<(Child, Receiver<String>, PathBuf)> {
        let log_path = self.logs.join(format!("{name}.log"));
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        writeln!(log, "=== t+{} ms: psl {}", self.t0.elapsed().as_millis(), args.join(" "))?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log.try_clone()?))
            .env("PSL_LOG", std::env::var("PSL_LOG").unwrap_or_else(|_| "warn".into()))
            // The operator's control public key: the roles run the clients' signed commands.
            .env("PSL_CONTROL_PUB", self.dir.join("control.pub"));
        psl::kids::die_with_parent(&mut cmd, libc::SIGKILL);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let out = child.stdout.take().context("child stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                let _ = tx.send(line);
            }
        });
        Ok((child, rx, log_path))
    }

    /// The schedule's restart: starts `p` and returns at once; [`Cluster::poll_starting`] says
    /// whether it came up. Until it has, an exit is the start's failure, not an unexpected one.
    fn restart_async(&self, p: Proc) -> Result<()> {
        let (args, ready) = self.args(p, true);
        lock(&self.may_be_down).insert(p);
        let (child, rx, log) = self.spawn_child(&p.to_string(), &args)?;
        lock(&self.procs).insert(p, Running { child });
        lock(&self.starting).insert(p, Starting { rx, ready, deadline: Instant::now() + START_TIMEOUT, log });
        Ok(())
    }

    /// Restarted processes that came up since the last call are running as usual again; those
    /// that exited or did not say they were ready in time are returned with why.
    fn poll_starting(&self) -> Vec<(String, String)> {
        let mut starting = lock(&self.starting);
        let mut done = Vec::new();
        let mut errors = Vec::new();
        for (p, st) in starting.iter() {
            let prefix = format!("{} ", st.ready);
            let mut ready = false;
            while let Ok(l) = st.rx.try_recv() {
                ready |= l.starts_with(&prefix);
            }
            let full = lock(&self.disk_full).contains(p);
            if ready {
                if !full {
                    lock(&self.may_be_down).remove(p);
                }
                done.push(*p);
                continue;
            }
            let exited = match lock(&self.procs).get_mut(p) {
                Some(r) => matches!(r.child.try_wait(), Ok(Some(_))),
                None => true,
            };
            if exited && full {
                // It failed on its full disk: freeing the disk restarts it.
                done.push(*p);
                continue;
            }
            let why = if exited {
                Some("exited".to_string())
            } else if Instant::now() > st.deadline {
                Some(format!("no '{}' line within {START_TIMEOUT:?}", st.ready))
            } else {
                None
            };
            if let Some(why) = why {
                errors.push((
                    format!("restart {p}"),
                    format!("{p} did not come up: {why}; log {}: {}", st.log.display(), tail(&st.log, 6)),
                ));
                done.push(*p);
            }
        }
        for p in done {
            starting.remove(&p);
        }
        errors
    }

    /// The schedule filled `p`'s disk: it may exit until [`Cluster::disk_freed`].
    fn disk_filled(&self, p: Proc) {
        lock(&self.disk_full).insert(p);
        lock(&self.may_be_down).insert(p);
    }

    fn disk_freed(&self, p: Proc) {
        lock(&self.disk_full).remove(&p);
    }

    fn starting_count(&self) -> usize {
        lock(&self.starting).len()
    }

    fn start(&self, p: Proc, restart: bool) -> Result<()> {
        let (args, ready) = self.args(p, restart);
        let (child, _) = self.spawn_raw(&p.to_string(), &args, ready)?;
        lock(&self.procs).insert(p, Running { child });
        lock(&self.may_be_down).remove(&p);
        Ok(())
    }

    fn pid(&self, p: Proc) -> Option<i32> {
        lock(&self.procs).get(&p).map(|r| r.child.id() as i32)
    }

    fn signal(&self, p: Proc, sig: i32) -> Result<()> {
        let pid = self.pid(p).with_context(|| format!("{p} is not running"))?;
        // SAFETY: kill(2) on our own child, not yet reaped (so its pid is not reused).
        if unsafe { libc::kill(pid, sig) } != 0 {
            bail!("signal {sig} to {p}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn kill(&self, p: Proc) -> Result<()> {
        lock(&self.may_be_down).insert(p);
        lock(&self.starting).remove(&p);
        let r = lock(&self.procs).remove(&p);
        match r {
            Some(mut r) => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                Ok(())
            }
            None => bail!("{p} was not running"),
        }
    }

    fn running(&self, p: Proc) -> bool {
        lock(&self.procs).contains_key(&p)
    }

    /// Reaps processes that exited; an exit the schedule did not cause is recorded. Samples
    /// resident memory.
    fn monitor(&self) {
        let mut procs = lock(&self.procs);
        let mut gone = Vec::new();
        for (p, r) in procs.iter_mut() {
            if let Ok(Some(st)) = r.child.try_wait() {
                gone.push((*p, st));
                continue;
            }
            if let Some(kib) = vm_kib(r.child.id(), "VmHWM:") {
                let mut rss = lock(&self.rss);
                let e = rss.entry(p.to_string()).or_default();
                *e = (*e).max(kib);
            }
        }
        for (p, st) in gone {
            procs.remove(&p);
            if !lock(&self.may_be_down).contains(&p) && !lock(&self.disk_full).contains(&p) {
                let log = self.logs.join(format!("{p}.log"));
                lock(&self.unexpected).push(format!(
                    "{p} exited at t+{} ms ({st}) although the schedule did not stop it; log {}: {}",
                    self.t0.elapsed().as_millis(),
                    log.display(),
                    tail(&log, 4)
                ));
                lock(&self.may_be_down).insert(p);
            }
        }
    }

    fn stop_all(&self) {
        let mut procs = lock(&self.procs);
        for (p, r) in procs.iter_mut() {
            lock(&self.may_be_down).insert(*p);
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        procs.clear();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn wait_ready(rx: &Receiver<String>, prefix: &str, within: Duration, child: &mut Child) -> Result<String> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            // Drain what it printed before it exited.
            while let Ok(l) = rx.try_recv() {
                if let Some(rest) = l.strip_prefix(&format!("{prefix} ")) {
                    return Ok(rest.trim().to_string());
                }
            }
            bail!("exited ({st})");
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => {
                if let Some(rest) = l.strip_prefix(&format!("{prefix} ")) {
                    return Ok(rest.trim().to_string());
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() > deadline {
                    bail!("no '{prefix} ...' line within {within:?}");
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let st = child.wait()?;
                bail!("exited ({st})");
            }
        }
    }
}

/// The last `n` lines of a file, joined.
fn tail(p: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

fn vm_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

// ---------------------------------------------------------------------------------------------
// Clients

fn parse_get(a: &str) -> Result<Option<String>, String> {
    if let Some(v) = a.strip_prefix("VALUE ") {
        Ok(Some(v.to_string()))
    } else if a == "NOT_FOUND" {
        Ok(None)
    } else {
        Err(a.to_string())
    }
}

fn ms(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

/// Connects to `addr`, retrying while `stop` is not set (bounded by `within`).
fn connect_retry(addr: SocketAddr, within: Duration, stop: &AtomicBool) -> Option<Ctl> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        if let Ok(c) = Ctl::connect(addr, Duration::from_secs(2)) {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Runs one node client's rounds; returns what it saw.
fn node_client(c: &NodeClient, ctl: &[SocketAddr], t0: Instant, stop: &AtomicBool) -> History {
    let mut h = History::default();
    let mut session = 0u32;
    let mut conn: Option<Ctl> = None;
    let mut index = 0usize;
    let me = ctl[c.node as usize];
    // After one 60 s wait for a node that did not come back, later rounds try only briefly (a
    // node down for good must not hold the run for a minute per round).
    let mut patience = Duration::from_secs(60);
    for r in &c.rounds {
        std::thread::sleep(Duration::from_millis(r.pause_ms));
        if conn.is_none() {
            conn = connect_retry(me, patience, stop);
            session += 1;
            patience = if conn.is_some() { Duration::from_secs(60) } else { Duration::from_secs(2) };
        }
        let Some(cn) = conn.as_mut() else { continue };
        // The writes, pipelined.
        let first = index;
        let lines: Vec<String> = r.writes.iter().map(KvOp::line).collect();
        let at = ms(t0);
        let mut broke = cn.send(&lines).is_err();
        for op in &r.writes {
            let outcome = if broke {
                Outcome::Unknown
            } else {
                match cn.line() {
                    Ok(a) if a == "OK" => Outcome::Ok,
                    Ok(_) => Outcome::Failed,
                    Err(_) => {
                        broke = true;
                        Outcome::Unknown
                    }
                }
            };
            h.writes.push(WriteEvent {
                client: c.id,
                session,
                index,
                key: op.key().to_string(),
                value: op.value().map(str::to_string),
                outcome,
                at_ms: at,
            });
            index += 1;
        }
        if broke {
            conn = None;
            continue;
        }
        let barrier = match r.barrier {
            Barrier::None => None,
            Barrier::Sync => Some("SYNC 20000"),
            Barrier::SyncDurable => Some("SYNC_DURABLE 20000"),
        };
        if let Some(b) = barrier {
            match cn.call(b) {
                Ok(a) if a == "OK" && r.barrier == Barrier::SyncDurable => {
                    h.durables.push(DurableEvent { client: c.id, session, upto: index, at_ms: ms(t0) });
                    // The versions of this round's writes that are still the node's newest.
                    if let Ok(d) = cn.call("DUMP") {
                        if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(&d) {
                            let mut last: BTreeMap<&str, &str> = BTreeMap::new();
                            for (i, op) in r.writes.iter().enumerate() {
                                if h.writes[first + i].outcome == Outcome::Ok {
                                    match op.value() {
                                        Some(v) => last.insert(op.key(), v),
                                        None => last.remove(op.key()),
                                    };
                                }
                            }
                            for (k, v) in last {
                                let e = &m.get(k);
                                if let Some(serde_json::Value::Array(a)) = e {
                                    if a.first().and_then(|x| x.as_str()) == Some(v) {
                                        h.versions.push(VersionSeen {
                                            key: k.into(),
                                            value: v.into(),
                                            lamport: a.get(1).and_then(|x| x.as_u64()).unwrap_or(0),
                                            writer: a.get(2).and_then(|x| x.as_u64()).unwrap_or(0) as u32,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    conn = None;
                    continue;
                }
            }
        }
        // Reads on the own node, in this session.
        for k in &r.own_reads {
            match cn.call(&format!("GET {k}")) {
                Ok(a) => h.reads.push(ReadEvent {
                    client: c.id,
                    session,
                    node: c.node,
                    own: true,
                    key: k.clone(),
                    got: parse_get(&a),
                    after_index: index,
                    at_ms: ms(t0),
                }),
                Err(_) => {
                    conn = None;
                    break;
                }
            }
        }
        // Reads on other nodes.
        for (n, k) in &r.cross_reads {
            let got = Ctl::connect(ctl[*n as usize], Duration::from_secs(1))
                .and_then(|mut o| {
                    o.w.set_read_timeout(Some(Duration::from_secs(5)))?;
                    o.call(&format!("GET {k}"))
                })
                .map_err(|e| e.to_string())
                .and_then(|a| parse_get(&a));
            h.reads.push(ReadEvent {
                client: c.id,
                session: u32::MAX,
                node: *n,
                own: false,
                key: k.clone(),
                got,
                after_index: index,
                at_ms: ms(t0),
            });
        }
    }
    h
}

/// A memcached text-protocol client.
struct Mc {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Mc {
    fn connect(addr: SocketAddr) -> std::io::Result<Mc> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        s.set_write_timeout(Some(Duration::from_secs(15)))?;
        Ok(Mc { r: BufReader::new(s.try_clone()?), w: s })
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut s = String::new();
        if self.r.read_line(&mut s)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(s.trim_end().to_string())
    }

    /// `gets`: Ok(Some((value, unique))), Ok(None) for a miss, Err(text) for an error line.
    fn gets(&mut self, key: &str) -> std::io::Result<Result<Option<(String, u64)>, String>> {
        self.w.write_all(format!("gets {key}\r\n").as_bytes())?;
        let head = self.line()?;
        if head == "END" {
            return Ok(Ok(None));
        }
        let p: Vec<&str> = head.split(' ').collect();
        if p.len() != 5 || p[0] != "VALUE" {
            return Ok(Err(head));
        }
        let len: usize = p[3].parse().map_err(|_| std::io::Error::other("bad length"))?;
        let unique: u64 = p[4].parse().map_err(|_| std::io::Error::other("bad unique"))?;
        let mut data = vec![0u8; len + 2];
        self.r.read_exact(&mut data)?;
        data.truncate(len);
        let end = self.line()?;
        if end != "END" {
            return Ok(Err(end));
        }
        Ok(Ok(Some((String::from_utf8_lossy(&data).into_owned(), unique))))
    }

    fn store(&mut self, cmd: &str, key: &str, value: &str, unique: Option<u64>) -> std::io::Result<String> {
        let u = unique.map(|u| format!(" {u}")).unwrap_or_default();
        self.w.write_all(format!("{cmd} {key} 0 0 {}{u}\r\n{value}\r\n", value.len()).as_bytes())?;
        self.line()
    }
}

fn cas_client(c: &CasClient, fronts: &[SocketAddr], stop: &AtomicBool) -> History {
    let mut h = History::default();
    let mut conn: Option<Mc> = None;
    let mut n = 0u32;
    for k in &c.increments {
        std::thread::sleep(Duration::from_millis(c.pause_ms));
        let key = counter_key(*k);
        for _attempt in 0..30 {
            if stop.load(Ordering::Relaxed) {
                return h;
            }
            if conn.is_none() {
                conn = Mc::connect(fronts[c.front as usize]).ok();
            }
            let Some(m) = conn.as_mut() else {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            };
            let (value, unique) = match m.gets(&key) {
                Ok(Ok(Some(x))) => x,
                Ok(_) => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(_) => {
                    conn = None;
                    continue;
                }
            };
            n += 1;
            let token = format!("t{}x{n}", c.id);
            let reply = m.store("cas", &key, &format!("{value},{token}"), Some(unique));
            let outcome = match reply.as_deref() {
                Ok("STORED") => CasOutcome::Stored,
                Ok("EXISTS") => CasOutcome::Exists,
                Ok("NOT_FOUND") => CasOutcome::NotFound,
                Ok(_) => CasOutcome::Unknown,
                Err(_) => {
                    conn = None;
                    CasOutcome::Unknown
                }
            };
            h.cas.push(CasEvent {
                client: c.id,
                front: c.front,
                key: key.clone(),
                read_value: value,
                read_unique: unique,
                token,
                outcome,
            });
            match outcome {
                CasOutcome::Stored | CasOutcome::Unknown => break,
                _ => std::thread::sleep(Duration::from_millis(30)),
            }
        }
    }
    h
}

// ---------------------------------------------------------------------------------------------
// The nemesis

struct Nemesis<'a> {
    cl: &'a Cluster,
    tmpfs: bool,
    errors: Vec<(String, String)>,
    skipped: Vec<String>,
    /// Servers whose disk is filled (the filler file).
    fillers: BTreeMap<u8, PathBuf>,
}

impl Nemesis<'_> {
    fn run(&mut self, steps: &[Step], stop: &AtomicBool) {
        for st in steps {
            let deadline = Instant::now() + Duration::from_millis(st.after_ms);
            while Instant::now() < deadline {
                self.cl.monitor();
                self.poll_starting();
                std::thread::sleep(Duration::from_millis(20).min(deadline.saturating_duration_since(Instant::now())));
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let t = self.cl.t0.elapsed().as_millis();
            tracing::info!("chaos t+{t} ms: {}", st.action);
            if let Err(e) = self.act(st.action) {
                self.errors.push((format!("t+{t} ms {}", st.action), format!("{e:#}")));
            }
            self.cl.monitor();
            self.poll_starting();
        }
        // The last restarts come up (or fail) before the schedule counts as done.
        while self.cl.starting_count() > 0 {
            self.cl.monitor();
            self.poll_starting();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn poll_starting(&mut self) {
        let t = self.cl.t0.elapsed().as_millis();
        for (what, why) in self.cl.poll_starting() {
            self.errors.push((format!("t+{t} ms {what}"), why));
        }
    }

    fn server_dir(&self, i: u8) -> PathBuf {
        self.cl.dir.join(format!("s{i}"))
    }

    fn wipe(&self, p: Proc) -> Result<()> {
        let dir = match p {
            Proc::Server(i) => self.server_dir(i),
            Proc::Node(i) => self.cl.dir.join(format!("st{i}")),
            Proc::CapsuleDb => self.cl.dir.join("cdb"),
            _ => return Ok(()),
        };
        // The directory may be a mount point: empty it rather than remove it.
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let path = e.path();
                let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            }
        }
        Ok(())
    }

    fn act(&mut self, a: Action) -> Result<()> {
        let cl = self.cl;
        match a {
            Action::Kill { proc } => cl.kill(proc),
            Action::Restart { proc, wipe } => {
                if wipe {
                    self.wipe(proc)?;
                }
                // A server whose store is still read-only (no tmpfs: skipped faults) is fine.
                cl.restart_async(proc)
            }
            Action::Pause { proc } => cl.signal(proc, libc::SIGSTOP),
            Action::Resume { proc } => cl.signal(proc, libc::SIGCONT),
            Action::Cut { proc } => {
                cl.proxies[&proc].cut();
                Ok(())
            }
            Action::Heal { proc } => {
                cl.proxies[&proc].heal();
                Ok(())
            }
            Action::AwaitCaughtUp { server } => self.await_caught_up(server),
            Action::FillDisk { server } => {
                if !self.tmpfs {
                    self.skipped.push(a.to_string());
                    return Ok(());
                }
                cl.disk_filled(Proc::Server(server));
                let f = self.server_dir(server).join("filler");
                fill(&f)?;
                self.fillers.insert(server, f);
                Ok(())
            }
            Action::FreeDisk { server } => {
                let Some(f) = self.fillers.remove(&server) else {
                    // The fill was skipped (no tmpfs): nothing to free.
                    return Ok(());
                };
                std::fs::remove_file(&f).with_context(|| format!("removing {}", f.display()))?;
                cl.disk_freed(Proc::Server(server));
                // A server whose group commit failed on the full disk acks nothing more until
                // it is restarted, and exits a moment later: restart it whether or not it has
                // exited yet (checking only for an exit raced with it, and left it down).
                let p = Proc::Server(server);
                cl.monitor();
                if cl.running(p) {
                    cl.kill(p)?;
                }
                tracing::info!("chaos: {p} after the full disk: restarting it");
                cl.restart_async(p)
            }
            Action::ReadOnly { server } => {
                if !self.tmpfs {
                    self.skipped.push(a.to_string());
                    return Ok(());
                }
                remount(&self.server_dir(server), true)
            }
            Action::ExpectStartFails { server } => {
                if !self.tmpfs {
                    self.skipped.push(a.to_string());
                    return Ok(());
                }
                let p = Proc::Server(server);
                let (args, ready) = cl.args(p, true);
                match cl.spawn_raw(&format!("{p}-readonly"), &args, ready) {
                    Ok((mut child, _)) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        bail!("the server started on a read-only store")
                    }
                    Err(e) => {
                        let msg = format!("{e:#}");
                        if !msg.contains("exited") {
                            bail!("the start on a read-only store did not fail cleanly: {msg}");
                        }
                        Ok(())
                    }
                }
            }
            Action::Writable { server } => {
                if !self.tmpfs {
                    return Ok(());
                }
                remount(&self.server_dir(server), false)
            }
        }
    }

    /// Waits until `server` holds every head the other live servers held when this began.
    fn await_caught_up(&mut self, server: u8) -> Result<()> {
        let cl = self.cl;
        let mut want: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, a) in cl.server_read.iter().enumerate() {
            if i as u8 == server || !cl.running(Proc::Server(i as u8)) {
                continue;
            }
            if let Ok(h) = psl_server::read::ReadClient::connect(*a).and_then(|mut c| c.heads()) {
                for (w, (s, _)) in h {
                    let e = want.entry(w).or_insert(s);
                    *e = (*e).max(s);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            cl.monitor();
            let have =
                psl_server::read::ReadClient::connect(cl.server_read[server as usize]).and_then(|mut c| c.heads());
            if let Ok(h) = &have {
                if want.iter().all(|(w, s)| h.get(w).is_some_and(|(hs, _)| hs >= s)) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("server{server} did not catch up within 120 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Fills the file system holding `f` (writes until it is full).
fn fill(f: &Path) -> Result<()> {
    let mut file = std::fs::File::create(f).with_context(|| format!("creating {}", f.display()))?;
    let chunk = vec![0u8; 1 << 20];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(e).context("filling the disk"),
        }
    }
    // The last partial chunk.
    loop {
        match file.write(&chunk[..4096]) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let _ = file.sync_all();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The run

/// Runs seed `sched.seed`: setup, clients and nemesis, heal, finals.
pub fn run(sched: &Schedule, wl: &Workload, o: &RunOpts) -> Result<SeedRun> {
    let dir = &o.dir;
    std::fs::create_dir_all(dir.join("logs"))?;
    let t0 = Instant::now();
    let psl = |args: &[&str]| -> Result<()> {
        let out = Command::new(&o.exe).args(args).current_dir(dir).output()?;
        if !out.status.success() {
            bail!("psl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    psl(&["keys", "new", "--out", "owner.key"])?;
    let control_pub = psl_node::control::operator_pub_text(&control_key().verifying_key());
    psl::util::write_atomic(&dir.join("control.pub"), control_pub.as_bytes(), 0o644)?;
    psl(&[
        "capsule",
        "new",
        "--owner",
        "owner.key",
        "--label",
        &format!("chaos-{}", sched.seed),
        "--out",
        "c.capsule",
    ])?;
    let shape = sched.shape;
    let router = free_port()?;
    let mut proxies = BTreeMap::new();
    let mut all: Vec<Proc> = Vec::new();
    all.extend((0..shape.servers).map(Proc::Server));
    all.extend((0..shape.coordinators).map(Proc::Coordinator));
    all.push(Proc::CapsuleDb);
    all.extend((0..shape.nodes).map(Proc::Node));
    all.extend((0..shape.memcached).map(Proc::Memcached));
    for p in &all {
        proxies.insert(*p, Proxy::spawn(Some(router))?);
    }
    let mut mounts = Vec::new();
    for i in 0..shape.servers {
        let d = dir.join(format!("s{i}"));
        std::fs::create_dir_all(&d)?;
        if o.tmpfs {
            mount_tmpfs(&d, SERVER_FS_MB)?;
            mounts.push(d);
        }
    }
    let cl = Cluster {
        exe: o.exe.clone(),
        dir: dir.clone(),
        logs: dir.join("logs"),
        t0,
        router,
        router_faults: sched.router.args(),
        proxies,
        procs: Mutex::new(BTreeMap::new()),
        starting: Mutex::new(BTreeMap::new()),
        may_be_down: Mutex::new(BTreeSet::new()),
        disk_full: Mutex::new(BTreeSet::new()),
        unexpected: Mutex::new(Vec::new()),
        rss: Mutex::new(BTreeMap::new()),
        server_read: (0..shape.servers).map(|_| free_port()).collect::<Result<_>>()?,
        node_ctl: (0..shape.nodes).map(|_| free_port()).collect::<Result<_>>()?,
        coord_ctl: (0..shape.coordinators).map(|_| free_port()).collect::<Result<_>>()?,
        mc_listen: (0..shape.memcached).map(|_| free_port()).collect::<Result<_>>()?,
        mc_peer: (0..shape.memcached).map(|_| free_port()).collect::<Result<_>>()?,
        capsuledb_writer: psl::capsuledb::db_writer(30_000)?,
        shape_nodes: shape.nodes,
        rogue: None,
        leaked: Arc::new(Mutex::new(super::rogue::Leaked::default())),
    };
    let mut cl = cl;
    if o.byzantine {
        let plan = super::rogue::Plan::generate(sched.seed, shape.fault_ms, shape.servers);
        let capsule = std::fs::read(dir.join("c.capsule")).context("reading c.capsule")?;
        let limits = psl_capsule::CapsuleFile::parse(&capsule).context("c.capsule")?.metadata.meta.policy.limits;
        cl.rogue = Some(super::rogue::Rogue::spawn(free_port()?, plan, &cl.server_read, cl.leaked.clone(), limits)?);
    }
    let result = run_cluster(&cl, sched, wl, o);
    cl.stop_all();
    let (history, finals, skipped) = result.inspect_err(|_| {
        // A seed that fails before its checks leaves no mounts behind either.
        for m in &mounts {
            let _ = umount(m);
        }
    })?;
    Ok(SeedRun { history, finals, skipped, mounts })
}

fn run_cluster(cl: &Cluster, sched: &Schedule, wl: &Workload, o: &RunOpts) -> Result<(History, Finals, Vec<String>)> {
    let shape = sched.shape;
    cl.start(Proc::Router, false)?;
    for i in 0..shape.servers {
        cl.start(Proc::Server(i), false)?;
    }
    for r in 0..shape.coordinators {
        cl.start(Proc::Coordinator(r), false)?;
    }
    cl.start(Proc::CapsuleDb, false)?;
    for i in 0..shape.nodes {
        cl.start(Proc::Node(i), false)?;
    }
    for i in 0..shape.memcached {
        cl.start(Proc::Memcached(i), false)?;
    }
    // The counters exist before the clients start.
    {
        let mut m = Mc::connect(cl.mc_listen[0])?;
        for k in 0..wl.counters {
            let a = m.store("set", &counter_key(k), "init", None)?;
            if a != "STORED" {
                bail!("setting {}: {a}", counter_key(k));
            }
        }
    }
    for f in &cl.mc_listen {
        let mut m = Mc::connect(*f)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        for k in 0..wl.counters {
            while !matches!(m.gets(&counter_key(k))?, Ok(Some(_))) {
                if Instant::now() > deadline {
                    bail!("front end {f} never saw {}", counter_key(k));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    tracing::info!("chaos seed {}: deployment up after {} ms", sched.seed, cl.t0.elapsed().as_millis());

    // Clients and nemesis, concurrently.
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    if let Some(r) = &cl.rogue {
        r.phase_started(t0);
    }
    let byz_env = byz_env(cl, t0, shape.fault_ms);
    let (history, nemesis) = std::thread::scope(|s| {
        let clients: Vec<_> =
            wl.node_clients.iter().map(|c| s.spawn(|| node_client(c, &cl.node_ctl, t0, &stop))).collect();
        let cas: Vec<_> = wl.cas_clients.iter().map(|c| s.spawn(|| cas_client(c, &cl.mc_listen, &stop))).collect();
        let attacker = o.byzantine.then(|| {
            s.spawn(|| {
                super::byzantine::attack(super::byzantine::Plan::generate(sched.seed, shape.fault_ms), &byz_env, &stop)
            })
        });
        let mut nem = Nemesis { cl, tmpfs: o.tmpfs, errors: Vec::new(), skipped: Vec::new(), fillers: BTreeMap::new() };
        nem.run(&sched.steps, &stop);
        let mut h = History::default();
        tracing::info!("chaos: schedule done (t+{} ms); waiting for the clients' rounds", cl.t0.elapsed().as_millis());
        // Clients finish their rounds (bounded: each round's waits are).
        for c in clients.into_iter().chain(cas) {
            while !c.is_finished() {
                cl.monitor();
                std::thread::sleep(Duration::from_millis(50));
            }
            h.merge(c.join().unwrap_or_default());
        }
        stop.store(true, Ordering::Relaxed);
        let byz = attacker.map(|a| a.join().unwrap_or_default());
        (h, (nem, byz))
    });
    let (nemesis, byz) = nemesis;
    let mut finals = Finals { nemesis_errors: nemesis.errors, ..Finals::default() };
    let skipped = nemesis.skipped;
    // Whatever is still down after the schedule (a process that died unexpectedly) comes back
    // for the checks; the death itself is already recorded.
    cl.monitor();
    for p in std::iter::once(Proc::Router)
        .chain((0..shape.servers).map(Proc::Server))
        .chain((0..shape.coordinators).map(Proc::Coordinator))
        .chain(std::iter::once(Proc::CapsuleDb))
        .chain((0..shape.nodes).map(Proc::Node))
        .chain((0..shape.memcached).map(Proc::Memcached))
    {
        if p.on_fabric() {
            cl.proxies[&p].heal();
        }
        if !cl.running(p) {
            if let Err(e) = cl.start(p, true) {
                finals.nemesis_errors.push((format!("restart {p} for the final checks"), format!("{e:#}")));
            }
        }
    }
    collect_finals(cl, wl, &mut finals, byz)?;
    finals.unexpected_exits = lock(&cl.unexpected).clone();
    Ok((history, finals, skipped))
}

/// Where the `--byzantine` attacker reaches the deployment.
fn byz_env(cl: &Cluster, t0: Instant, fault_ms: u64) -> super::byzantine::Env {
    super::byzantine::Env {
        dir: cl.dir.clone(),
        router: cl.router,
        coord_ctl: cl.coord_ctl.clone(),
        node_ctl: cl.node_ctl.clone(),
        mc_listen: cl.mc_listen.clone(),
        server_read: cl.server_read.clone(),
        t0,
        fault_ms,
        leaked: cl.leaked.clone(),
    }
}

/// Reads every key on `node` (pipelined GETs).
fn read_state(addr: SocketAddr, keys: &[String]) -> Result<KvState, String> {
    let mut c = Ctl::connect(addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let lines: Vec<String> = keys.iter().map(|k| format!("GET {k}")).collect();
    c.send(&lines).map_err(|e| e.to_string())?;
    let mut out = KvState::new();
    for k in keys {
        let a = c.line().map_err(|e| e.to_string())?;
        out.insert(k.clone(), parse_get(&a).map_err(|e| format!("GET {k}: {e}"))?);
    }
    Ok(out)
}

fn dump_versions(addr: SocketAddr) -> Result<(KvState, crate::chaos::history::Versions), String> {
    let mut c = Ctl::connect(addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let d = c.call("DUMP").map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&d).map_err(|e| e.to_string())?;
    let mut state = KvState::new();
    let mut vers = BTreeMap::new();
    for (k, e) in v.as_object().ok_or("DUMP is not an object")? {
        let val = e[0].as_str().unwrap_or_default().to_string();
        state.insert(k.clone(), Some(val.clone()));
        vers.insert(k.clone(), (val, e[1].as_u64().unwrap_or(0), e[2].as_u64().unwrap_or(0) as u32));
    }
    Ok((state, vers))
}

fn collect_finals(
    cl: &Cluster,
    wl: &Workload,
    fin: &mut Finals,
    byz: Option<super::byzantine::AttackLog>,
) -> Result<()> {
    let keys = wl.kv_keys();
    tracing::info!("chaos finals: settle (t+{} ms)", cl.t0.elapsed().as_millis());
    // Settle: the nodes converge (bounded); servers catch up with each other.
    let deadline = Instant::now() + SETTLE;
    let mut states;
    loop {
        cl.monitor();
        states = (0..cl.shape_nodes).map(|i| read_state(cl.node_ctl[i as usize], &keys)).collect::<Vec<_>>();
        let same = states.iter().all(|s| s.is_ok()) && states.windows(2).all(|w| w[0] == w[1]);
        if same || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    tracing::info!("chaos finals: liveness (t+{} ms)", cl.t0.elapsed().as_millis());
    // Liveness: every node makes a write durable after the heal.
    for i in 0..cl.shape_nodes {
        let r = Ctl::connect(cl.node_ctl[i as usize], Duration::from_secs(5))
            .and_then(|mut c| {
                c.call(&format!("PUT zlive-{i} ok"))?;
                c.call("SYNC_DURABLE 60000")
            })
            .map_err(|e| e.to_string());
        match r {
            Ok(a) if a == "OK" => {}
            Ok(a) => fin.stuck.push((format!("node{i}"), a)),
            Err(e) => fin.stuck.push((format!("node{i}"), e)),
        }
    }
    // Re-read after the liveness write (more settling for free).
    let states: Vec<_> = (0..cl.shape_nodes).map(|i| read_state(cl.node_ctl[i as usize], &keys)).collect();
    fin.nodes = states.into_iter().enumerate().map(|(i, s)| (format!("node{i}"), s)).collect();
    match dump_versions(cl.node_ctl[0]) {
        Ok((_, v)) => fin.versions = v.into_iter().filter(|(k, _)| keys.contains(k)).collect(),
        Err(e) => fin.nemesis_errors.push(("DUMP node0".into(), e)),
    }

    tracing::info!("chaos finals: counters (t+{} ms)", cl.t0.elapsed().as_millis());
    // Counters on every front end, once they agree (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut all = BTreeMap::new();
        for k in 0..wl.counters {
            let key = counter_key(k);
            let reads: Vec<(String, Result<Option<String>, String>)> = cl
                .mc_listen
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let r = Mc::connect(*a)
                        .and_then(|mut m| m.gets(&key))
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map(|o| o.map(|(v, _)| v)));
                    (format!("mc{i}"), r)
                })
                .collect();
            all.insert(key, reads);
        }
        let agree = all.values().all(|r| r.iter().all(|(_, x)| x.is_ok()) && r.windows(2).all(|w| w[0].1 == w[1].1));
        fin.counters = all;
        if agree || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    tracing::info!("chaos finals: memory (t+{} ms)", cl.t0.elapsed().as_millis());
    // Memory: the bounded memtables once CapsuleDB caught up; the front ends' item memory;
    // every process's peak resident memory.
    for i in 1..cl.shape_nodes {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut keys_now = 0;
        loop {
            if let Ok(s) =
                Ctl::connect(cl.node_ctl[i as usize], Duration::from_secs(5)).and_then(|mut c| c.call("STATS"))
            {
                keys_now =
                    serde_json::from_str::<serde_json::Value>(&s).ok().and_then(|v| v["keys"].as_u64()).unwrap_or(0);
            }
            if keys_now <= NODE_KEYS_ACCEPTED || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        fin.memory.push((format!("node{i}"), "memtable keys".into(), keys_now, NODE_KEYS_ACCEPTED));
    }
    for (i, a) in cl.mc_listen.iter().enumerate() {
        if let Ok(mut m) = Mc::connect(*a) {
            let _ = m.w.write_all(b"stats\r\n");
            let (mut bytes, mut limit) = (0, 0);
            while let Ok(l) = m.line() {
                if l == "END" {
                    break;
                }
                if let Some(v) = l.strip_prefix("STAT bytes ") {
                    bytes = v.parse().unwrap_or(0);
                }
                if let Some(v) = l.strip_prefix("STAT limit_maxbytes ") {
                    limit = v.parse().unwrap_or(0);
                }
            }
            fin.memory.push((format!("mc{i}"), "item bytes".into(), bytes, limit));
        }
    }
    cl.monitor();
    for (p, kib) in lock(&cl.rss).iter() {
        fin.memory.push((p.clone(), "peak rss KiB".into(), *kib, RSS_KIB_MAX));
    }

    tracing::info!("chaos finals: server contents (t+{} ms)", cl.t0.elapsed().as_millis());
    // What each server stores: every put in its records, decrypted.
    let meta = psl_store::read_metadata(cl.dir.join("s0")).context("reading the capsule's metadata")?;
    let owner = psl::util::read_owner_key(&cl.dir.join("owner.key"))?;
    let data_key = psl::util::data_key_for(&owner, &meta)?;
    let public = psl_capsule::Verifier::new(meta.clone(), None);
    let keyed = psl_capsule::Verifier::new(meta, Some(data_key));
    for (i, a) in cl.server_read.iter().enumerate() {
        fin.server_puts.push((format!("server{i}"), server_puts(*a, &public, &keyed)));
    }

    tracing::info!("chaos finals: recovered nodes (t+{} ms)", cl.t0.elapsed().as_millis());
    // Fresh nodes recovered from each f + 1 of the servers, on a black-hole fabric: what they
    // hold comes from those servers alone.
    let hole = Proxy::spawn(None)?;
    let n = cl.server_read.len();
    let mut pairs = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            pairs.push((a, b));
        }
    }
    for (j, (a, b)) in pairs.into_iter().enumerate() {
        let from = format!("{},{}", cl.server_read[a], cl.server_read[b]);
        let (got, _) = recover_node(cl, hole.addr(), &format!("recover-{a}{b}"), 100 + j, &from, &keys, &[])?;
        let (s, v) = got.map_or_else(|e| (Err(e), BTreeMap::new()), |(s, v)| (Ok(s), v));
        fin.recovered.push((format!("recovered from server{a},server{b}"), s, v));
    }
    // `--byzantine`: one more, with the rogue listed first: it must hold every write all the
    // same, and nothing the revocation covers.
    let mut rogue_fed = None;
    if let (Some(r), Some(log)) = (&cl.rogue, &byz) {
        let from = format!("{},{},{}", r.addr, cl.server_read[0], cl.server_read[1 % n]);
        let label = "recovered from the rogue,server0,server1".to_string();
        let (got, shown) = recover_node(cl, hole.addr(), "recover-rogue", 99, &from, &keys, &log.post_keys)?;
        let (s, v) = got.map_or_else(|e| (Err(e), BTreeMap::new()), |(s, v)| (Ok(s), v));
        fin.recovered.push((label.clone(), s, v));
        rogue_fed = shown.map(|sh| (label, sh));
    }

    if let Some(log) = byz {
        tracing::info!("chaos finals: byzantine (t+{} ms)", cl.t0.elapsed().as_millis());
        let mut b = super::byzantine::finals(&byz_env(cl, cl.t0, 0), log);
        b.shown.extend(rogue_fed);
        b.rogue = cl.rogue.as_ref().map(|r| r.log());
        fin.byzantine = Some(b);
    }
    tracing::info!("chaos finals: store checks (t+{} ms)", cl.t0.elapsed().as_millis());
    // Every store re-verifies: through each running server, then offline once stopped.
    for (i, a) in cl.server_read.iter().enumerate() {
        let out = Command::new(&cl.exe).args(["capsule-server", "check", "--read", &a.to_string()]).output()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().replace('\n', " | ");
        fin.stores.push((format!("server{i} (live, --read)"), out.status.success(), text));
    }
    for p in [Proc::CapsuleDb].into_iter().chain((0..cl.shape_nodes).map(Proc::Node)) {
        let _ = cl.kill(p);
    }
    std::thread::sleep(Duration::from_millis(300));
    // CapsuleDB's blocks and indexes are on the capsule servers as well as in its directory
    // store (a wiped CapsuleDB's directory lacks the blocks written before the wipe), so its
    // snapshots are checked against both, while the servers still run.
    let servers = cl.server_read.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(&cl.exe)
        .args([
            "capsuledb",
            "snapshots",
            "--capsule",
            "c.capsule",
            "--owner",
            "owner.key",
            "--store",
            "cdb",
            "--servers",
            &servers,
        ])
        .current_dir(&cl.dir)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).lines().count();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    // A directory store that never received an index (a wiped CapsuleDB that had not frozen
    // yet) has nothing to verify.
    let clean = out.status.success() || err.contains("no index recorded");
    fin.stores.push((
        "capsuledb snapshots (directory store and servers)".into(),
        clean,
        format!("{text} snapshots {err}"),
    ));
    cl.stop_all();
    for i in 0..cl.server_read.len() {
        let d = cl.dir.join(format!("s{i}"));
        let out =
            Command::new(&cl.exe).args(["capsule-server", "check", "--dir", &d.display().to_string()]).output()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().replace('\n', " | ");
        fin.stores.push((format!("server{i} (offline, --dir)"), out.status.success(), text));
    }
    Ok(())
}

/// What a recovered node holds: its state and versions of `keys`, and (when `covered` is not
/// empty) which of `covered` it shows.
type Recovered = (Result<(KvState, crate::chaos::history::Versions), String>, Option<Result<Vec<String>, String>>);

/// A fresh node (`id`) that recovers from the read addresses `from` on a black-hole fabric
/// (`hole`): what it holds comes from those servers alone. Stopped once read.
fn recover_node(
    cl: &Cluster,
    hole: SocketAddr,
    name: &str,
    id: usize,
    from: &str,
    keys: &[String],
    covered: &[String],
) -> Result<Recovered> {
    let ctl = free_port()?;
    let args: Vec<String> = [
        "node",
        "--capsule",
        "c.capsule",
        "--owner",
        "owner.key",
        "--router",
        &hole.to_string(),
        "--id",
        &id.to_string(),
        "--servers",
        "3",
        "--writers",
        "1",
        "--verifiers",
        "1",
        "--control",
        &ctl.to_string(),
        "--recover-timeout-ms",
        "60000",
        "--recover-from",
        from,
    ]
    .map(String::from)
    .to_vec();
    Ok(match cl.spawn_raw(name, &args, "control") {
        Ok((mut child, _)) => {
            let got = dump_versions(ctl).map(|(s, v)| {
                let s: KvState = keys.iter().map(|k| (k.clone(), s.get(k).cloned().flatten())).collect();
                (s, v.into_iter().filter(|(k, _)| keys.contains(k)).collect())
            });
            let shown = (!covered.is_empty()).then(|| super::byzantine::node_has(ctl, covered));
            let _ = child.kill();
            let _ = child.wait();
            (got, shown)
        }
        Err(e) => (Err(format!("{e:#}")), None),
    })
}

/// Every put (key, value) in the records `addr` stores, verified and decrypted.
fn server_puts(
    addr: SocketAddr,
    public: &psl_capsule::Verifier,
    keyed: &psl_capsule::Verifier,
) -> Result<HashSet<(String, String)>, String> {
    let mut c = psl_server::read::ReadClient::connect(addr).map_err(|e| e.to_string())?;
    let heads = c.heads().map_err(|e| e.to_string())?;
    let mut out = HashSet::new();
    for (w, (seq, _)) in heads {
        let recs = c.range(public, w, 0, seq).map_err(|e| e.to_string())?;
        for r in recs {
            if r.header().kind != psl_capsule::Kind::Data {
                continue;
            }
            if let Ok(psl_capsule::Body::Data(ops) | psl_capsule::Body::Atomic(ops)) = keyed.open(&r) {
                for op in ops {
                    if let psl_capsule::Action::Put(v) = op.action {
                        out.insert((
                            String::from_utf8_lossy(&op.key).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bare_cluster(dir: &Path) -> Cluster {
        Cluster {
            exe: PathBuf::from("psl"),
            dir: dir.to_path_buf(),
            logs: dir.to_path_buf(),
            t0: Instant::now(),
            router: ([127, 0, 0, 1], 9).into(),
            router_faults: Vec::new(),
            proxies: BTreeMap::new(),
            procs: Mutex::new(BTreeMap::new()),
            starting: Mutex::new(BTreeMap::new()),
            may_be_down: Mutex::new(BTreeSet::new()),
            disk_full: Mutex::new(BTreeSet::new()),
            unexpected: Mutex::new(Vec::new()),
            rss: Mutex::new(BTreeMap::new()),
            server_read: Vec::new(),
            node_ctl: Vec::new(),
            coord_ctl: Vec::new(),
            mc_listen: Vec::new(),
            mc_peer: Vec::new(),
            capsuledb_writer: 0,
            shape_nodes: 0,
            rogue: None,
            leaked: Arc::new(Mutex::new(super::super::rogue::Leaked::default())),
        }
    }

    /// A stand-in server process that says it is ready, then exits with status 2 (as a
    /// server whose group commit failed on a full disk does).
    fn starting_then_exiting(cl: &Cluster, p: Proc) -> std::sync::mpsc::Sender<String> {
        let child = Command::new("sh").args(["-c", "sleep 0.2; exit 2"]).spawn().expect("sh runs");
        let (tx, rx) = std::sync::mpsc::channel();
        lock(&cl.may_be_down).insert(p);
        lock(&cl.procs).insert(p, Running { child });
        let deadline = Instant::now() + Duration::from_secs(10);
        lock(&cl.starting).insert(p, Starting { rx, ready: "ready", deadline, log: cl.dir.join("x.log") });
        tx
    }

    fn wait_exit_seen(cl: &Cluster, p: Proc) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&cl.procs).contains_key(&p) {
            assert!(Instant::now() < deadline, "the stand-in did not exit");
            std::thread::sleep(Duration::from_millis(20));
            cl.monitor();
        }
    }

    #[test]
    fn a_filled_server_may_exit_even_when_its_restart_came_up_after_the_fill() {
        let t = tempfile::tempdir().unwrap();
        let cl = bare_cluster(t.path());
        let p = Proc::Server(0);
        // Seed 1135: a restart under way, then the fill, then the restart comes up.
        let tx = starting_then_exiting(&cl, p);
        cl.disk_filled(p);
        tx.send("ready 32768 records=330".into()).unwrap();
        assert!(cl.poll_starting().is_empty(), "it came up");
        wait_exit_seen(&cl, p);
        assert!(lock(&cl.unexpected).is_empty(), "{:?}", lock(&cl.unexpected));
        // A start that fails on the full disk is no failure of the restart either.
        let _tx = starting_then_exiting(&cl, p);
        std::thread::sleep(Duration::from_millis(400));
        assert!(cl.poll_starting().is_empty(), "an exit on a full disk is not a failed restart");
        // Once the disk is freed (and the server restarted), an exit is unexpected again.
        cl.disk_freed(p);
        let tx = starting_then_exiting(&cl, p);
        tx.send("ready 32768 records=330".into()).unwrap();
        assert!(cl.poll_starting().is_empty());
        wait_exit_seen(&cl, p);
        assert_eq!(lock(&cl.unexpected).len(), 1, "{:?}", lock(&cl.unexpected));
    }
}
