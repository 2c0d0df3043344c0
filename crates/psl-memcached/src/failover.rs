//! Home failover at run time: the thin I/O around [`crate::home::Member`] for one front end of
//! a group in several processes (`psl memcached --cluster … --peers A,B,C…`, three members or
//! more). The protocol and its argument are in [`crate::home`] and
//! `docs/protocol/memcached.md` §6; this module only carries its messages over the sealed peer
//! channel ([`crate::peer`]) and runs its steps:
//!
//! - a *driver* thread ticks the member every eighth of a lease (at most 125 ms: twice per
//!   renewal period, `lease_ms / 4`) and sends the acquisitions,
//!   renewals and releases it asks for (each request to every member at once through eight
//!   caller threads per member, bounded by the call timeout; the member's own acceptor answers
//!   in place);
//! - a *hand-over* thread per slot taken over: moves the node's clock past the ceiling, renews,
//!   fetches the stored writes of the granting members page by page, waits for the node's
//!   `sync()`, rewrites each key's newest stored version that the node does not already hold
//!   (keeping its CAS unique, [`FailoverHost::rewrite_held`]) and stores the rewrites on a majority;
//! - a *prune* thread: for each slot this member serves that has new writes, reads the node's
//!   Lamport clock, waits for a `sync()` and tells the acceptors they may drop what it covers;
//! - [`Failover::route`] and [`Failover::serve_forwarded`]: where a conditional command runs:
//!   here under the lease (a fenced write stored on a majority before it is answered, and
//!   answered only if the lease still holds), or at the member this one believes is home,
//!   which refuses it (`NotHome`, naming its own belief) when it is not.
//!
//! Every wait is bounded: a call by [`FailoverConfig::call_timeout`], a command by
//! [`FailoverConfig::route_timeout`] (then `SERVER_ERROR`, as for an unreachable home).

use crate::home::{Acquired, Action, Attempt, Ctl, CtlReply, Held, HomeConfig, Lease, Member, Ms, Refusal, Serve};
use crate::op::{Outcome, Rmw};
use crate::peer::{PeerClient, PeerConfig, PeerKey, Routed};
use crate::stats::Stats;
use parking_lot::Mutex;
use psl_node::Node;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The default home lease of `psl memcached`, `psl up` and `psl cluster` front ends.
pub const HOME_LEASE_MS_DEFAULT: u64 = 1000;
/// The members a group needs for failover (with two, a majority is both).
pub const MEMBERS_MIN: usize = 3;

/// Settings of home failover.
#[derive(Debug, Clone, Copy)]
pub struct FailoverConfig {
    /// How long an acceptor's grant lasts (`HomeConfig::lease_ms`). A dead home's slots move
    /// after about two leases.
    pub lease_ms: u64,
    /// This front end never ran before (no quarantine). A restarted one must say `false`.
    pub fresh: bool,
    /// Bound on one control call to a peer (connect, send, reply).
    pub call_timeout: Duration,
    /// Bound on finding a key's home and running a conditional command there.
    pub route_timeout: Duration,
    /// Bound on the node's `sync()` in a hand-over or a prune.
    pub sync_timeout: Duration,
}

impl FailoverConfig {
    /// Settings for leases of `lease_ms`: control calls bounded by a quarter lease (between
    /// 20 ms and `peer_timeout`), commands by the larger of `peer_timeout` and four leases,
    /// `sync()` by 10 s.
    pub fn new(lease_ms: u64, fresh: bool, peer_timeout: Duration) -> FailoverConfig {
        let lease = Duration::from_millis(lease_ms);
        FailoverConfig {
            lease_ms,
            fresh,
            call_timeout: (lease / 4).clamp(Duration::from_millis(20), peer_timeout.max(Duration::from_millis(20))),
            route_timeout: peer_timeout.max(lease * 4),
            sync_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters of home failover (in `stats` as `psl_home_*`).
#[derive(Debug, Default)]
pub struct FailoverStats {
    /// Hand-overs completed: slots this member began to serve (its own slot included).
    pub takeovers: AtomicU64,
    /// Hand-overs that failed (a fetch, `sync()` or rewrite did not complete); the lease is
    /// released and the slot tried again later.
    pub takeovers_failed: AtomicU64,
    /// Writes of earlier homes rewritten during hand-overs.
    pub rewrites: AtomicU64,
    /// Forwarded commands refused as `NotHome` by the member believed home.
    pub redirects: AtomicU64,
    /// Home writes (or hand-over rewrites) not stored on a majority of acceptors in time: the
    /// command fails with `SERVER_ERROR` (the hand-over fails).
    pub replicate_failures: AtomicU64,
    /// Commands whose lease ended before their answer (answered with `SERVER_ERROR`).
    pub lease_lost: AtomicU64,
    /// `Prune` requests sent to the acceptors.
    pub prunes: AtomicU64,
}

/// The front end that failover works for, as this module sees it. The front end
/// (`store::FrontEnd`) implements it; the trait lives here so that failover does not depend on
/// the store that starts it.
pub trait FailoverHost: Send + Sync {
    /// The node whose Lamport clock and `sync()` hand-overs and prunes use.
    fn node(&self) -> &Arc<Node>;
    /// The front end's counters (forwarded commands and their failures).
    fn stats(&self) -> &Stats;
    /// Runs `op` here as home of `slot` under `lease`: its write fenced below the lease's
    /// ceiling, stored on a majority of the group's acceptors (`Failover::replicate`), and
    /// answered only if the lease still holds then (`Failover::still_home`).
    fn rmw_home(&self, f: &Failover, key: &[u8], op: Rmw<'_>, slot: usize, lease: Lease) -> Outcome;
    /// A hand-over's rewrite of a write an earlier home acknowledged: if this node holds no
    /// newer version of the key, writes the same value again below `below`, keeping its CAS
    /// unique, and returns the write made.
    fn rewrite_held(&self, h: &Held, below: u64) -> Result<Option<Held>, String>;
}

/// One front end's side of home failover.
pub struct Failover {
    n: usize,
    me: usize,
    cfg: FailoverConfig,
    member: Mutex<Member>,
    epoch: Instant,
    /// Control requests to each member (`None` at this one), bounded by the call timeout.
    peers: Vec<Option<Arc<PeerClient>>>,
    /// Per member, the queue of its callers: [`CALLERS_PER_PEER`] threads that send control
    /// requests to it and hand the replies back (`None` at this one).
    callers: Vec<Option<crossbeam_channel::Sender<Call>>>,
    /// Forwarded commands to each member, bounded by the front end's peer timeout.
    forward: Vec<Option<Arc<PeerClient>>>,
    fe: Weak<dyn FailoverHost>,
    stop: AtomicBool,
    /// Per slot: writes made as its home since the last prune began.
    dirty: Vec<AtomicBool>,
    /// Wakes the prune thread when a slot turns dirty, and on [`Failover::stop`]
    /// (the mutex guards nothing: it orders a waiter's check of `dirty` before the
    /// notification, so none is lost).
    wake: (Mutex<()>, parking_lot::Condvar),
    /// This member's failover counters.
    pub stats: FailoverStats,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Failover(member {} of {})", self.me, self.n)
    }
}

/// Replies gathered for one request: `(member, reply)`.
type Replies = Vec<(usize, CtlReply)>;

/// A control request for one member's callers, and where its reply goes.
type Call = (Ctl, std::sync::mpsc::Sender<(usize, std::io::Result<CtlReply>)>);

/// Caller threads per member: concurrent conditional commands replicate in parallel.
const CALLERS_PER_PEER: usize = 8;
/// Requests queued per member before a broadcast counts it as not answering.
const CALLS_QUEUED_MAX: usize = 1024;
/// The driver's shortest and longest sleep between ticks (the longest bounds how late it
/// notices a request that made a tick due, such as a yield wanted or a release).
const DRIVER_SLEEP_MIN_MS: u64 = 2;
const DRIVER_SLEEP_MAX_MS: u64 = 250;

impl Failover {
    /// Member `me` of the group `peers` (the same list on every member, three or more). Starts
    /// the driver and prune threads; they stop when the front end is dropped or on
    /// [`Failover::stop`].
    pub fn start<F: FailoverHost + 'static>(
        fe: &Arc<F>,
        peers: &[SocketAddr],
        me: usize,
        key: PeerKey,
        peer_cfg: PeerConfig,
        cfg: FailoverConfig,
    ) -> Result<Arc<Failover>, String> {
        let n = peers.len();
        let instance = loop {
            let i: u64 = rand::random();
            if i != 0 {
                break i;
            }
        };
        let hc = HomeConfig::new(n, me, cfg.lease_ms, cfg.fresh);
        hc.validate()?;
        let epoch = Instant::now();
        let ctl_cfg = PeerConfig { timeout: cfg.call_timeout };
        let client = |c: PeerConfig| -> Vec<Option<Arc<PeerClient>>> {
            peers
                .iter()
                .enumerate()
                .map(|(i, a)| (i != me).then(|| Arc::new(PeerClient::new(*a, key.clone(), c))))
                .collect()
        };
        let ctl_peers = client(ctl_cfg);
        // Per member, its callers: they end once the member is dropped (its queue's sender
        // with it).
        let mut callers = vec![None; n];
        for (i, p) in ctl_peers.iter().enumerate() {
            let Some(p) = p.clone() else { continue };
            let (tx, rx) = crossbeam_channel::bounded::<Call>(CALLS_QUEUED_MAX);
            for _ in 0..CALLERS_PER_PEER {
                let (rx, p) = (rx.clone(), p.clone());
                std::thread::Builder::new()
                    .name("memcached-home-call".into())
                    .spawn(move || {
                        while let Ok((req, reply)) = rx.recv() {
                            let _ = reply.send((i, p.call_ctl(&req)));
                        }
                    })
                    .map_err(|e| format!("spawning a home caller: {e}"))?;
            }
            callers[i] = Some(tx);
        }
        let host: Weak<F> = Arc::downgrade(fe);
        let host: Weak<dyn FailoverHost> = host;
        let f = Arc::new(Failover {
            n,
            me,
            cfg,
            member: Mutex::new(Member::new(hc, instance, 0)),
            epoch,
            peers: ctl_peers,
            callers,
            forward: client(peer_cfg),
            fe: host,
            stop: AtomicBool::new(false),
            dirty: (0..n).map(|_| AtomicBool::new(false)).collect(),
            wake: (Mutex::new(()), parking_lot::Condvar::new()),
            stats: FailoverStats::default(),
        });
        let d = f.clone();
        std::thread::Builder::new()
            .name("memcached-home".into())
            .spawn(move || d.drive())
            .map_err(|e| format!("spawning the home driver: {e}"))?;
        let p = f.clone();
        std::thread::Builder::new()
            .name("memcached-home-prune".into())
            .spawn(move || p.prune_loop())
            .map_err(|e| format!("spawning the home pruner: {e}"))?;
        tracing::info!(me, n, lease_ms = cfg.lease_ms, fresh = cfg.fresh, instance, "home failover on");
        Ok(f)
    }

    /// Stops the threads (they end within a tick); the leases lapse on their own.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.notify();
    }

    fn notify(&self) {
        let _ordered = self.wake.0.lock();
        self.wake.1.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.fe.strong_count() == 0
    }

    fn now(&self) -> Ms {
        self.epoch.elapsed().as_millis() as Ms
    }

    /// The slot of `key`: `hash(key) mod n`, as the static homes.
    pub fn slot_of(&self, key: &[u8]) -> usize {
        (crate::lru::key_hash(key) % self.n as u64) as usize
    }

    /// Members of the group (`n`, the length of the peer list).
    pub fn members(&self) -> usize {
        self.n
    }

    /// Slots this member is home of now.
    pub fn serving(&self) -> usize {
        self.member.lock().serving(self.now()).len()
    }

    /// A control request from a peer, answered by this member's acceptor.
    pub fn handle(&self, req: &Ctl) -> CtlReply {
        let now = self.now();
        self.member.lock().handle(now, req)
    }

    // -----------------------------------------------------------------------------------------
    // Requests to every member

    /// Sends `req` to every member (this one's acceptor answers in place) and gathers replies
    /// until `enough` says so, every member has answered, or the call timeout has passed.
    fn broadcast(&self, req: &Ctl, enough: impl Fn(&Replies) -> bool) -> Replies {
        let own = self.handle(req);
        let mut got = vec![(self.me, own)];
        if enough(&got) {
            return got;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let mut asked = 0;
        for c in self.callers.iter().flatten() {
            // A member whose queue is full is as good as one that does not answer.
            if c.try_send((req.clone(), tx.clone())).is_ok() {
                asked += 1;
            }
        }
        drop(tx);
        let deadline = Instant::now() + self.cfg.call_timeout + Duration::from_millis(5);
        for _ in 0..asked {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, Ok(r))) => {
                    got.push((i, r));
                    if enough(&got) {
                        break;
                    }
                }
                Ok((i, Err(e))) => tracing::trace!(member = i, "home control call: {e}"),
                Err(_) => break,
            }
        }
        got
    }

    fn majority(&self) -> usize {
        self.n / 2 + 1
    }

    /// Runs an acquisition or renewal to its end; a takeover continues on its own thread.
    fn acquire(self: &Arc<Self>, at: Attempt) -> Acquired {
        let req = at.request(self.cfg.lease_ms);
        let maj = self.majority();
        let replies = self.broadcast(&req, |rs| {
            let granted = |complete_only: bool| {
                rs.iter()
                    .filter(|(_, r)| matches!(r, CtlReply::Granted { complete, .. } if *complete || !complete_only))
                    .count()
            };
            if at.renew {
                granted(false) >= maj
            } else {
                granted(true) >= maj
            }
        });
        let got = self.member.lock().on_replies(self.now(), &at, &replies);
        match &got {
            Acquired::TakeOver { slot, ballot, ceiling, from } => {
                let (me, slot, ballot, ceiling, from) = (self.clone(), *slot as usize, *ballot, *ceiling, from.clone());
                tracing::info!(slot, ballot, ceiling, ?from, "taking over a home slot");
                let spawned = std::thread::Builder::new()
                    .name("memcached-home-takeover".into())
                    .spawn(move || me.take_over(slot, ballot, ceiling, from));
                if spawned.is_err() {
                    let act = self.member.lock().takeover_done(self.now(), slot, false);
                    self.act(act);
                }
            }
            Acquired::Failed { release: true } => {
                self.broadcast(&Ctl::Release { slot: at.slot, ballot: at.ballot }, |_| false);
            }
            _ => {}
        }
        got
    }

    fn act(self: &Arc<Self>, a: Option<Action>) {
        match a {
            Some(Action::Acquire(at)) => {
                self.acquire(at);
            }
            Some(Action::Release { slot, ballot }) => {
                tracing::info!(slot, ballot, "releasing a home slot");
                self.broadcast(&Ctl::Release { slot, ballot }, |_| false);
            }
            None => {}
        }
    }

    /// The driver: ticks the member and runs what it asks for.
    fn drive(self: Arc<Self>) {
        // The driver sleeps until the member's next timer (`Member::next_tick`: an idle home
        // wakes once per renewal, 4 times a second, where a fixed tick of half a renewal
        // period woke it 8 times), and at least every `DRIVER_SLEEP_MAX_MS` to notice a stop.
        while !self.stopped() {
            let Some(fe) = self.fe.upgrade() else { return };
            let lamport = fe.node().lamport();
            drop(fe);
            let acts = self.member.lock().tick(self.now(), lamport);
            for a in acts {
                self.act(Some(a));
            }
            let now = self.now();
            let next = self.member.lock().next_tick(now);
            let ms = next.saturating_sub(now).clamp(DRIVER_SLEEP_MIN_MS, DRIVER_SLEEP_MAX_MS);
            std::thread::sleep(Duration::from_millis(ms));
        }
        // Hand the slots back at once rather than letting them lapse.
        for s in 0..self.n {
            let a = self.member.lock().give_up(s);
            self.act(a);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Hand-over

    fn take_over(self: Arc<Self>, slot: usize, ballot: u64, ceiling: u64, from: Vec<usize>) {
        let t = Instant::now();
        let ok = match self.hand_over(slot, ceiling, &from) {
            Ok(rewrites) => {
                self.stats.takeovers.fetch_add(1, Ordering::Relaxed);
                let ms = t.elapsed().as_millis() as u64;
                if slot == self.me {
                    tracing::info!(slot, ballot, rewrites, ms, "home of its own slot");
                } else {
                    // Another member's slot: that member stopped renewing (down, paused or cut off).
                    tracing::warn!(slot, ballot, rewrites, ms, "took over another front end's home slot");
                }
                true
            }
            Err(e) => {
                self.stats.takeovers_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(slot, ballot, "hand-over of a home slot failed: {e}");
                false
            }
        };
        let act = self.member.lock().takeover_done(self.now(), slot, ok);
        self.act(act);
    }

    fn hand_over(self: &Arc<Self>, slot: usize, ceiling: u64, from: &[usize]) -> Result<usize, String> {
        let fe = self.fe.upgrade().ok_or("front end gone")?;
        let node = fe.node().clone();
        // Every write of this home is newer than every conditional write of the earlier ones.
        node.advance_clock(ceiling);
        let at = self
            .member
            .lock()
            .begin_renewal(slot, self.now(), node.lamport())
            .ok_or("the lease lapsed before its first renewal")?;
        if self.acquire(at) != Acquired::Renewed {
            return Err("the renewal registering the new ceiling was not granted".into());
        }
        let lease = self.member.lock().lease(slot).ok_or("the lease lapsed")?;
        // The writes the granting acceptors store for the slot, newest version per key.
        let mut newest: BTreeMap<Vec<u8>, Held> = BTreeMap::new();
        for &m in from {
            let (mut after, mut prev_last): (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
            loop {
                let req = Ctl::Entries { slot: slot as u16, ballot: lease.ballot, after: after.take() };
                let r = if m == self.me {
                    self.handle(&req)
                } else {
                    let p = self.peers[m].as_ref().ok_or("no peer")?;
                    p.call_ctl(&req).map_err(|e| format!("fetching slot {slot}'s writes from member {m}: {e}"))?
                };
                let CtlReply::Page { entries, more, .. } = r else {
                    return Err(format!("member {m} refused to hand over slot {slot}'s writes: {r:?}"));
                };
                let last = entries.last().map(|h| h.key.clone());
                // Pages come in key order, each after the last: one that does not move on
                // (a broken peer) would never end the loop.
                if let (Some(prev), Some(first)) = (&prev_last, entries.first()) {
                    if first.key <= *prev {
                        return Err(format!("member {m} sent slot {slot}'s writes out of key order"));
                    }
                }
                prev_last = last.clone();
                for h in entries {
                    match newest.get(&h.key) {
                        Some(o) if o.version >= h.version => {}
                        _ => {
                            newest.insert(h.key.clone(), h);
                        }
                    }
                }
                if !more || last.is_none() {
                    break;
                }
                after = last;
            }
        }
        // Everything any node had written before now, applied here.
        node.sync(self.cfg.sync_timeout).map_err(|e| format!("sync before serving slot {slot}: {e}"))?;
        let mut rewrites = Vec::new();
        for h in newest.into_values() {
            if let Some(w) = fe.rewrite_held(&h, lease.ceiling)? {
                rewrites.push(w);
            }
        }
        let n = rewrites.len();
        if !rewrites.is_empty() {
            self.stats.rewrites.fetch_add(n as u64, Ordering::Relaxed);
            self.dirty[slot].store(true, Ordering::Release);
            if !self.replicate(slot, lease.ballot, rewrites) {
                return Err("the rewrites were not stored on a majority".into());
            }
        }
        Ok(n)
    }

    // -----------------------------------------------------------------------------------------
    // Writes of a home

    /// Stores `entries`, written as home of `slot` under `ballot`, on a majority of acceptors.
    pub(crate) fn replicate(&self, slot: usize, ballot: u64, entries: Vec<Held>) -> bool {
        let maj = self.majority();
        let req = Ctl::Replicate { slot: slot as u16, ballot, entries };
        let acks = |rs: &Replies| rs.iter().filter(|(_, r)| matches!(r, CtlReply::Ack { .. })).count();
        let rs = self.broadcast(&req, |rs| acks(rs) >= maj);
        let ok = acks(&rs) >= maj;
        if !ok {
            self.stats.replicate_failures.fetch_add(1, Ordering::Relaxed);
            if rs.iter().any(|(_, r)| matches!(r, CtlReply::Refused { why: Refusal::Full, .. })) {
                tracing::warn!(slot, "acceptors' stored writes for this slot are at their bound; waiting for a prune");
            }
        }
        ok
    }

    /// Whether the lease under `ballot` still holds (checked after a write, before its answer).
    pub(crate) fn still_home(&self, slot: usize, ballot: u64) -> bool {
        let ok = self.member.lock().still_home(slot, ballot, self.now());
        if !ok {
            self.stats.lease_lost.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// A write as home of `slot`: the next prune covers it. Wakes the prune thread when the
    /// slot was clean (once per prune period at most, so the write path rarely locks).
    pub(crate) fn mark_dirty(&self, slot: usize) {
        if !self.dirty[slot].swap(true, Ordering::AcqRel) {
            self.notify();
        }
    }

    /// Every `lease_ms / 4` while slots served get writes; asleep while none does (an idle
    /// front end's prune thread does not wake, and one that wakes lets a period's writes
    /// gather before it prunes).
    fn prune_loop(self: Arc<Self>) {
        let every = Duration::from_millis((self.cfg.lease_ms / 4).max(5));
        while !self.stopped() {
            {
                let mut g = self.wake.0.lock();
                while !self.stopped() && !self.dirty.iter().any(|d| d.load(Ordering::Acquire)) {
                    // The timeout only bounds how long a front end dropped without `stop`
                    // keeps this thread.
                    self.wake.1.wait_for(&mut g, Duration::from_secs(5));
                }
            }
            if self.stopped() {
                return;
            }
            std::thread::sleep(every);
            let served: Vec<(usize, Lease)> = self.member.lock().serving(self.now());
            let due: Vec<(usize, Lease)> =
                served.into_iter().filter(|(s, _)| self.dirty[*s].swap(false, Ordering::AcqRel)).collect();
            if due.is_empty() {
                continue;
            }
            let Some(fe) = self.fe.upgrade() else { return };
            let node = fe.node().clone();
            drop(fe);
            let instances = self.member.lock().instances();
            let upto = node.lamport();
            if let Err(e) = node.sync(self.cfg.sync_timeout) {
                tracing::debug!("prune sync: {e}");
                for (s, _) in &due {
                    self.dirty[*s].store(true, Ordering::Release);
                }
                continue;
            }
            for (slot, lease) in due {
                let req = Ctl::Prune { slot: slot as u16, ballot: lease.ballot, upto, instances: instances.clone() };
                self.broadcast(&req, |_| false);
                self.stats.prunes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Routing

    /// Runs a conditional command where its slot's home is: here under the lease, or forwarded
    /// to the member believed home (following its `NotHome` hints, and the next members when
    /// one cannot be reached), within [`FailoverConfig::route_timeout`].
    pub fn route(&self, fe: &dyn FailoverHost, key: &[u8], op: Rmw<'_>) -> Outcome {
        let slot = self.slot_of(key);
        let deadline = Instant::now() + self.cfg.route_timeout;
        let mut next = slot;
        let mut why = String::from("no member is home of this key's slot yet");
        loop {
            let serve = self.member.lock().serve(slot, self.now());
            match serve {
                Serve::Home(lease) => return fe.rmw_home(self, key, op, slot, lease),
                Serve::TakingOver => why = "this key's slot is being handed over".into(),
                Serve::Elsewhere(hint) => {
                    let target = hint.unwrap_or(next);
                    if target == self.me {
                        next = (next + 1) % self.n;
                    } else if let Some(p) = &self.forward[target] {
                        Stats::inc(&fe.stats().forwarded);
                        match p.call_routed(key, &op) {
                            Routed::Done(Outcome::Unavailable(e)) => {
                                why = e;
                                next = (target + 1) % self.n;
                                self.member.lock().forget_hint(slot, target);
                            }
                            Routed::Done(o) => return o,
                            Routed::NotHome(h) => {
                                self.stats.redirects.fetch_add(1, Ordering::Relaxed);
                                why = format!("member {target} is not this key's home");
                                match h.map(usize::from).filter(|h| *h < self.n && *h != target) {
                                    Some(h) => self.member.lock().note_hint(slot, Some(h)),
                                    None => {
                                        self.member.lock().forget_hint(slot, target);
                                        next = (target + 1) % self.n;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                Stats::inc(&fe.stats().forward_failures);
                return Outcome::Unavailable(format!("home front end of this key unavailable: {why}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A command forwarded by a peer: run here if this member is the slot's home now, or
    /// refused with the member it believes is.
    pub fn serve_forwarded(&self, fe: &dyn FailoverHost, key: &[u8], op: Rmw<'_>) -> Routed {
        let slot = self.slot_of(key);
        // A hand-over about to finish: wait a little rather than bounce the command.
        let until = Instant::now() + Duration::from_millis(self.cfg.lease_ms.min(500));
        loop {
            let serve = self.member.lock().serve(slot, self.now());
            match serve {
                Serve::Home(lease) => return Routed::Done(fe.rmw_home(self, key, op, slot, lease)),
                Serve::TakingOver if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Serve::TakingOver => return Routed::NotHome(Some(self.me as u16)),
                Serve::Elsewhere(h) => return Routed::NotHome(h.map(|h| h as u16)),
            }
        }
    }
}
