//! A seeded, deterministic simulation of home failover (`psl_memcached::home`): n members run
//! the real state machine (acceptor and home side) over a network that loses, duplicates,
//! delays and reorders messages and is cut into partitions, with clocks that drift within the
//! assumed bound, members frozen (like SIGSTOP) for up to several leases, and members killed
//! and restarted empty (a new instance, quarantined). A small model of the store stands for
//! SCL: each write is in the writer's memtable at once, published after a flush delay (lost
//! if the writer dies first, late if it is frozen), delivered to the others later, and a
//! `sync()` hands a member every write published before it began.
//!
//! Members serving a slot run `cas`-style increments of a few counters per slot (read, fenced
//! write, replicate to a majority, check the lease, acknowledge), the way `FrontEnd` does.
//! Checked at every simulated millisecond and at the end:
//! - no two members are home of one slot at the same real time;
//! - no two acknowledged increments start from the same CAS unique (no two STORED for one);
//! - no acknowledged increment is lost: after the faults stop and everything is delivered,
//!   each counter is at least every acknowledged value and the number of acknowledged ones;
//! - liveness: once the faults stop, every slot has a home again.
//!
//! A failure prints the seed; `HOME_SIM_SEED=S cargo test -p psl-memcached --test home_sim`
//! replays it (`HOME_SIM_SEEDS=N` runs more seeds).

use psl_memcached::home::{Acquired, Action, Attempt, Ctl, CtlReply, Held, HomeConfig, Member, Serve};
use psl_scl::Version;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

const LEASE_MS: u64 = 400;
const FAULTS_UNTIL: u64 = 20_000;
const END: u64 = 32_000;
const KEYS_PER_SLOT: usize = 3;

/// A counter's model value: the count and its CAS unique (the version that made it; a
/// rewrite by a new home keeps it, as `item::encode_keeping` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Val {
    count: u64,
    unique: Version,
}

fn enc(v: Val) -> Arc<[u8]> {
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(&v.count.to_le_bytes());
    b.extend_from_slice(&v.unique.lamport.to_le_bytes());
    b.extend_from_slice(&v.unique.writer.to_le_bytes());
    b.into()
}

fn dec(b: &[u8]) -> Val {
    Val {
        count: u64::from_le_bytes(b[0..8].try_into().unwrap()),
        unique: Version {
            lamport: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            writer: u32::from_le_bytes(b[16..20].try_into().unwrap()),
        },
    }
}

/// The newest stored write of a key a new home fetched: version and value (`None`: deleted).
type Newest = (Version, Option<Arc<[u8]>>);

#[derive(Debug, Clone)]
struct Write {
    key: Vec<u8>,
    version: Version,
    value: Arc<[u8]>,
}

#[derive(Debug, Clone)]
enum Msg {
    Req { from: usize, id: u64, ctl: Ctl },
    Rep { from: usize, id: u64, reply: CtlReply },
    Publish(Write),
}

/// What a member's outstanding request id belongs to.
#[derive(Debug, Clone)]
enum Waiter {
    Attempt(Attempt, Vec<(usize, CtlReply)>, u64),
    Replicate { acks: usize, refused: usize },
    Page,
    Ignore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpStep {
    Replicating,
}

#[derive(Debug, Clone)]
struct Op {
    slot: usize,
    ballot: u64,
    key: Vec<u8>,
    base: Val,
    wrote: Val,
    id: u64,
    deadline: u64,
    _step: OpStep,
}

#[derive(Debug, Clone)]
enum TkStep {
    Renewing,
    Fetching { pending: HashMap<u64, usize>, got: Vec<Held> },
    Syncing { until: u64, started: u64, got: Vec<Held> },
    Rewriting { id: u64 },
}

#[derive(Debug, Clone)]
struct Takeover {
    slot: usize,
    from: Vec<usize>,
    step: TkStep,
    deadline: u64,
}

struct Sim {
    rate: f64,
    offset: u64,
    alive: bool,
    frozen_until: u64,
    restart_at: u64,
    incarnation: u32,
    m: Member,
    lamport: u64,
    mem: BTreeMap<Vec<u8>, (Version, Arc<[u8]>)>,
    unpublished: Vec<(u64, Write)>,
    waiters: HashMap<u64, Waiter>,
    takeovers: Vec<Takeover>,
    op: Option<Op>,
    next_tick: u64,
    next_prune: u64,
    prune_sync: Option<(u64, u64, u64, Vec<u64>)>,
    dirty: bool,
    inbox: Vec<Msg>,
}

impl Sim {
    fn local(&self, real: u64) -> u64 {
        self.offset + (real as f64 * self.rate) as u64
    }

    fn writer(&self, me: usize) -> u32 {
        (me as u32) << 16 | self.incarnation
    }
}

struct World {
    rng: StdRng,
    seed: u64,
    now: u64,
    n: usize,
    sims: Vec<Sim>,
    net: BTreeMap<(u64, u64), (usize, Msg)>,
    seq: u64,
    next_id: u64,
    published: Vec<(u64, Write)>,
    acked: Vec<(usize, Vec<u8>, Val, Val)>,
    partition: Option<(Vec<bool>, u64)>,
    loss: f64,
    delay_max: u64,
    drift_ppm: u64,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = if rng.random_bool(0.5) { 3 } else { 5 };
        let drift_ppm = 10_000;
        let mut sims = Vec::new();
        for me in 0..n {
            let rate = 1.0 + (rng.random::<f64>() * 2.0 - 1.0) * drift_ppm as f64 * 0.99 / 1e6;
            let offset = rng.random_range(0..1_000_000u64);
            let cfg = HomeConfig::new(n, me, LEASE_MS, true);
            let local = offset;
            sims.push(Sim {
                rate,
                offset,
                alive: true,
                frozen_until: 0,
                restart_at: 0,
                incarnation: 0,
                m: Member::new(cfg, rng.random(), local),
                lamport: 0,
                mem: BTreeMap::new(),
                unpublished: Vec::new(),
                waiters: HashMap::new(),
                takeovers: Vec::new(),
                op: None,
                next_tick: 0,
                next_prune: 0,
                prune_sync: None,
                dirty: false,
                inbox: Vec::new(),
            });
        }
        let loss = rng.random_range(0.0..0.25);
        let delay_max = rng.random_range(1..30);
        World {
            rng,
            seed,
            now: 0,
            n,
            sims,
            net: BTreeMap::new(),
            seq: 0,
            next_id: 1,
            published: Vec::new(),
            acked: Vec::new(),
            partition: None,
            loss,
            delay_max,
            drift_ppm,
        }
    }

    fn faulty(&self) -> bool {
        self.now < FAULTS_UNTIL
    }

    fn cut(&self, a: usize, b: usize) -> bool {
        matches!(&self.partition, Some((side, _)) if side[a] != side[b])
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        if self.faulty() && (self.rng.random_bool(self.loss) || self.cut(from, to)) {
            return;
        }
        let copies = if self.faulty() && self.rng.random_bool(0.05) { 2 } else { 1 };
        for _ in 0..copies {
            let d = 1 + self.rng.random_range(0..self.delay_max);
            self.seq += 1;
            self.net.insert((self.now + d, self.seq), (to, msg.clone()));
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn broadcast(&mut self, me: usize, ctl: Ctl, waiter: Waiter) -> u64 {
        let id = self.id();
        let local = self.sims[me].local(self.now);
        let own = self.sims[me].m.handle(local, &ctl);
        self.sims[me].waiters.insert(id, waiter);
        self.on_reply(me, me, id, own);
        for to in 0..self.n {
            if to != me {
                self.send(me, to, Msg::Req { from: me, id, ctl: ctl.clone() });
            }
        }
        id
    }

    fn write(&mut self, me: usize, key: &[u8], value: Arc<[u8]>, below: u64) -> Option<Version> {
        let s = &mut self.sims[me];
        s.lamport += 1;
        if s.lamport >= below {
            return None;
        }
        let version = Version { lamport: s.lamport, writer: s.writer(me) };
        apply(&mut s.mem, key, version, value.clone());
        let at = self.now + self.rng.random_range(1..6);
        self.sims[me].unpublished.push((at, Write { key: key.to_vec(), version, value }));
        Some(version)
    }

    fn publish_due(&mut self, me: usize, force: bool) {
        let now = self.now;
        let due: Vec<Write> = {
            let s = &mut self.sims[me];
            let (d, keep): (Vec<_>, Vec<_>) = s.unpublished.drain(..).partition(|(at, _)| force || *at <= now);
            s.unpublished = keep;
            d.into_iter().map(|(_, w)| w).collect()
        };
        for w in due {
            self.published.push((now, w.clone()));
            for to in 0..self.n {
                if to != me {
                    // SCL repairs: a published record reaches every live member eventually.
                    let d = 1 + self.rng.random_range(0..self.delay_max * 3);
                    self.seq += 1;
                    self.net.insert((now + d, self.seq), (to, Msg::Publish(w.clone())));
                }
            }
        }
    }

    fn on_reply(&mut self, me: usize, from: usize, id: u64, reply: CtlReply) {
        let Some(w) = self.sims[me].waiters.get_mut(&id) else { return };
        match w {
            Waiter::Attempt(_, replies, _) => {
                if !replies.iter().any(|(f, _)| *f == from) {
                    replies.push((from, reply));
                }
            }
            Waiter::Replicate { acks, refused } => match reply {
                CtlReply::Ack { .. } => *acks += 1,
                _ => *refused += 1,
            },
            Waiter::Page => {
                let CtlReply::Page { entries, more, .. } = reply else {
                    self.fail_takeovers_fetching(me, id);
                    return;
                };
                self.on_page(me, from, id, entries, more);
            }
            Waiter::Ignore => {}
        }
    }

    fn fail_takeovers_fetching(&mut self, me: usize, id: u64) {
        for t in self.sims[me].takeovers.iter_mut() {
            if let TkStep::Fetching { pending, .. } = &t.step {
                if pending.contains_key(&id) {
                    t.deadline = 0;
                }
            }
        }
    }

    fn on_page(&mut self, me: usize, from: usize, id: u64, entries: Vec<Held>, more: bool) {
        let Some(ti) = self.sims[me]
            .takeovers
            .iter()
            .position(|t| matches!(&t.step, TkStep::Fetching { pending, .. } if pending.contains_key(&id)))
        else {
            return;
        };
        let slot = self.sims[me].takeovers[ti].slot;
        let last = entries.last().map(|h| h.key.clone());
        if let TkStep::Fetching { pending, got } = &mut self.sims[me].takeovers[ti].step {
            pending.remove(&id);
            got.extend(entries);
        }
        self.sims[me].waiters.remove(&id);
        if more {
            let Some(ballot) = self.lease_ballot(me, slot) else { return };
            let nid = self.id();
            if let TkStep::Fetching { pending, .. } = &mut self.sims[me].takeovers[ti].step {
                pending.insert(nid, from);
            }
            self.sims[me].waiters.insert(nid, Waiter::Page);
            let ctl = Ctl::Entries { slot: slot as u16, ballot, after: last };
            if from == me {
                let local = self.sims[me].local(self.now);
                let r = self.sims[me].m.handle(local, &ctl);
                self.on_reply(me, me, nid, r);
            } else {
                self.send(me, from, Msg::Req { from: me, id: nid, ctl });
            }
        }
    }

    fn lease_ballot(&self, me: usize, slot: usize) -> Option<u64> {
        self.sims[me].m.lease(slot).map(|l| l.ballot)
    }

    fn deliver(&mut self) {
        let now = self.now;
        let due: Vec<(u64, u64)> = self.net.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
        for k in due {
            let (to, msg) = self.net.remove(&k).unwrap();
            if !self.sims[to].alive {
                continue;
            }
            if self.sims[to].frozen_until > now {
                self.sims[to].inbox.push(msg);
                continue;
            }
            self.handle_msg(to, msg);
        }
    }

    fn handle_msg(&mut self, to: usize, msg: Msg) {
        match msg {
            Msg::Req { from, id, ctl } => {
                let local = self.sims[to].local(self.now);
                let reply = self.sims[to].m.handle(local, &ctl);
                self.send(to, from, Msg::Rep { from: to, id, reply });
            }
            Msg::Rep { from, id, reply } => self.on_reply(to, from, id, reply),
            Msg::Publish(w) => {
                let s = &mut self.sims[to];
                s.lamport = s.lamport.max(w.version.lamport);
                apply(&mut s.mem, &w.key, w.version, w.value);
            }
        }
    }

    fn step_member(&mut self, me: usize) {
        let local = self.sims[me].local(self.now);
        self.publish_due(me, false);
        // Attempts: answered once a majority granted, or at their deadline.
        let maj = self.sims[me].m.cfg.majority();
        let ready: Vec<u64> = self.sims[me]
            .waiters
            .iter()
            .filter_map(|(id, w)| match w {
                Waiter::Attempt(a, r, deadline) => {
                    let granted = r.iter().filter(|(_, x)| matches!(x, CtlReply::Granted { .. })).count();
                    let complete =
                        r.iter().filter(|(_, x)| matches!(x, CtlReply::Granted { complete: true, .. })).count();
                    let enough = if a.renew { granted >= maj } else { complete >= maj };
                    (enough || r.len() == self.n || local >= *deadline).then_some(*id)
                }
                _ => None,
            })
            .collect();
        for id in ready {
            let Some(Waiter::Attempt(a, replies, _)) = self.sims[me].waiters.remove(&id) else { continue };
            let got = self.sims[me].m.on_replies(local, &a, &replies);
            self.after_acquire(me, &a, got);
        }
        if local >= self.sims[me].next_tick {
            self.sims[me].next_tick = local + 10;
            let lamport = self.sims[me].lamport;
            let acts = self.sims[me].m.tick(local, lamport);
            for act in acts {
                self.act(me, act);
            }
        }
        self.step_takeovers(me);
        self.step_op(me);
        self.step_prune(me);
    }

    fn act(&mut self, me: usize, act: Action) {
        let local = self.sims[me].local(self.now);
        match act {
            Action::Acquire(a) => {
                self.broadcast(me, a.request(LEASE_MS), Waiter::Attempt(a, Vec::new(), local + LEASE_MS / 8));
            }
            Action::Release { slot, ballot } => {
                // The runtime releases only once no command uses the lease: an op in flight
                // under it fails its lease check first.
                if let Some(op) = &self.sims[me].op {
                    if op.slot == slot as usize && op.ballot == ballot {
                        self.sims[me].op = None;
                    }
                }
                self.broadcast(me, Ctl::Release { slot, ballot }, Waiter::Ignore);
            }
        }
    }

    fn after_acquire(&mut self, me: usize, a: &Attempt, got: Acquired) {
        let local = self.sims[me].local(self.now);
        match got {
            Acquired::TakeOver { slot, ceiling, from, .. } => {
                let s = &mut self.sims[me];
                s.lamport = s.lamport.max(ceiling);
                let lamport = s.lamport;
                let r = s.m.begin_renewal(slot as usize, local, lamport).expect("a fresh lease renews");
                self.broadcast(me, r.request(LEASE_MS), Waiter::Attempt(r, Vec::new(), local + LEASE_MS / 8));
                self.sims[me].takeovers.push(Takeover {
                    slot: slot as usize,
                    from,
                    step: TkStep::Renewing,
                    deadline: local + LEASE_MS * 3,
                });
            }
            Acquired::Renewed => {
                if let Some(t) = self.sims[me].takeovers.iter_mut().find(|t| t.slot == a.slot as usize) {
                    if matches!(t.step, TkStep::Renewing) {
                        t.step = TkStep::Fetching { pending: HashMap::new(), got: Vec::new() };
                        let (slot, from) = (t.slot, t.from.clone());
                        let ballot = a.ballot;
                        for f in from {
                            let id = self.id();
                            if let TkStep::Fetching { pending, .. } =
                                &mut self.sims[me].takeovers.iter_mut().find(|t| t.slot == slot).unwrap().step
                            {
                                pending.insert(id, f);
                            }
                            self.sims[me].waiters.insert(id, Waiter::Page);
                            let ctl = Ctl::Entries { slot: slot as u16, ballot, after: None };
                            if f == me {
                                let r = self.sims[me].m.handle(local, &ctl);
                                self.on_reply(me, me, id, r);
                            } else {
                                self.send(me, f, Msg::Req { from: me, id, ctl });
                            }
                        }
                    }
                }
            }
            Acquired::Failed { release } => {
                if let Some(ti) = self.sims[me].takeovers.iter().position(|t| t.slot == a.slot as usize) {
                    if matches!(self.sims[me].takeovers[ti].step, TkStep::Renewing) {
                        self.sims[me].takeovers[ti].deadline = 0;
                    }
                }
                if release {
                    self.broadcast(me, Ctl::Release { slot: a.slot, ballot: a.ballot }, Waiter::Ignore);
                }
            }
        }
    }

    fn step_takeovers(&mut self, me: usize) {
        let local = self.sims[me].local(self.now);
        let mut i = 0;
        while i < self.sims[me].takeovers.len() {
            let t = self.sims[me].takeovers[i].clone();
            let done = |w: &mut World, ok: bool| {
                w.sims[me].takeovers.remove(i);
                if let Some(act) = w.sims[me].m.takeover_done(local, t.slot, ok) {
                    w.act(me, act);
                }
            };
            if local >= t.deadline {
                done(self, false);
                continue;
            }
            match t.step {
                TkStep::Fetching { pending, got } if pending.is_empty() => {
                    // sync(): flushes this member's writes, then, some time later, hands it
                    // every write published before it began.
                    self.publish_due(me, true);
                    let until = self.now + self.rng.random_range(20..150);
                    self.sims[me].takeovers[i].step = TkStep::Syncing { until, started: self.now, got };
                }
                TkStep::Syncing { until, started, got } if self.now >= until => {
                    for (at, w) in self.published.clone() {
                        if at < started {
                            let s = &mut self.sims[me];
                            s.lamport = s.lamport.max(w.version.lamport);
                            apply(&mut s.mem, &w.key, w.version, w.value);
                        }
                    }
                    // Rewrite the newest version of every stored key, keeping its unique.
                    let mut newest: BTreeMap<Vec<u8>, Newest> = BTreeMap::new();
                    for h in got {
                        let e = newest.entry(h.key.clone()).or_insert((h.version, h.value.clone()));
                        if h.version > e.0 {
                            *e = (h.version, h.value.clone());
                        }
                    }
                    let Serve::TakingOver = self.sims[me].m.serve(t.slot, local) else {
                        done(self, false);
                        continue;
                    };
                    let Some(ceiling) = self.ceiling_of(me, t.slot) else {
                        done(self, false);
                        continue;
                    };
                    let ballot = self.sims[me].m.lease(t.slot).map_or(0, |l| l.ballot);
                    let mut rewrites = Vec::new();
                    let mut fenced = false;
                    for (k, (v, val)) in newest {
                        let cur = self.sims[me].mem.get(&k).cloned();
                        let value = match cur {
                            Some((cv, cval)) if cv > v => cval,
                            _ => val.expect("the model never deletes"),
                        };
                        match self.write(me, &k, value.clone(), ceiling) {
                            Some(version) => rewrites.push(Held { key: k, version, value: Some(value) }),
                            None => fenced = true,
                        }
                    }
                    if fenced {
                        done(self, false);
                        continue;
                    }
                    self.sims[me].dirty = true;
                    let id = self.broadcast(
                        me,
                        Ctl::Replicate { slot: t.slot as u16, ballot, entries: rewrites },
                        Waiter::Replicate { acks: 0, refused: 0 },
                    );
                    self.sims[me].takeovers[i].step = TkStep::Rewriting { id };
                }
                TkStep::Rewriting { id } => {
                    let Some(Waiter::Replicate { acks, refused }) = self.sims[me].waiters.get(&id).cloned() else {
                        done(self, false);
                        continue;
                    };
                    let maj = self.sims[me].m.cfg.majority();
                    if acks >= maj {
                        self.sims[me].waiters.remove(&id);
                        done(self, true);
                        continue;
                    }
                    if refused > self.n - maj {
                        self.sims[me].waiters.remove(&id);
                        done(self, false);
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn ceiling_of(&self, me: usize, slot: usize) -> Option<u64> {
        self.sims[me].m.lease(slot).map(|l| l.ceiling)
    }

    fn step_op(&mut self, me: usize) {
        let local = self.sims[me].local(self.now);
        if let Some(op) = self.sims[me].op.clone() {
            let Some(Waiter::Replicate { acks, refused }) = self.sims[me].waiters.get(&op.id).cloned() else {
                self.sims[me].op = None;
                return;
            };
            let maj = self.sims[me].m.cfg.majority();
            if acks >= maj {
                self.sims[me].waiters.remove(&op.id);
                self.sims[me].op = None;
                // The lease check after the write, before the answer.
                if self.sims[me].m.still_home(op.slot, op.ballot, local) {
                    self.acked.push((op.slot, op.key.clone(), op.base, op.wrote));
                }
            } else if refused > self.n - maj || local >= op.deadline {
                self.sims[me].waiters.remove(&op.id);
                self.sims[me].op = None;
            }
            return;
        }
        if !self.rng.random_bool(0.2) {
            return;
        }
        let serving = self.sims[me].m.serving(local);
        if serving.is_empty() {
            return;
        }
        let (slot, lease) = serving[self.rng.random_range(0..serving.len())];
        let key = format!("s{slot}k{}", self.rng.random_range(0..KEYS_PER_SLOT)).into_bytes();
        let base = self.sims[me]
            .mem
            .get(&key)
            .map(|(_, v)| dec(v))
            .unwrap_or(Val { count: 0, unique: Version { lamport: 0, writer: 0 } });
        // The fenced write: its unique is its own version.
        let lamport_next = self.sims[me].lamport + 1;
        let wr = self.sims[me].writer(me);
        let wrote = Val { count: base.count + 1, unique: Version { lamport: lamport_next, writer: wr } };
        let Some(version) = self.write(me, &key, enc(wrote), lease.ceiling) else {
            let lamport = self.sims[me].lamport;
            if let Some(a) = self.sims[me].m.begin_renewal(slot, local, lamport) {
                self.broadcast(me, a.request(LEASE_MS), Waiter::Attempt(a, Vec::new(), local + LEASE_MS / 8));
            }
            return;
        };
        assert_eq!(version, wrote.unique);
        self.sims[me].dirty = true;
        let id = self.broadcast(
            me,
            Ctl::Replicate {
                slot: slot as u16,
                ballot: lease.ballot,
                entries: vec![Held { key: key.clone(), version, value: Some(enc(wrote)) }],
            },
            Waiter::Replicate { acks: 0, refused: 0 },
        );
        self.sims[me].op = Some(Op {
            slot,
            ballot: lease.ballot,
            key,
            base,
            wrote,
            id,
            deadline: local + 100,
            _step: OpStep::Replicating,
        });
    }

    fn step_prune(&mut self, me: usize) {
        let local = self.sims[me].local(self.now);
        if let Some((until, upto, started, instances)) = self.sims[me].prune_sync.clone() {
            let _ = started;
            if self.now >= until {
                self.sims[me].prune_sync = None;
                for (slot, lease) in self.sims[me].m.serving(local) {
                    let ctl =
                        Ctl::Prune { slot: slot as u16, ballot: lease.ballot, upto, instances: instances.clone() };
                    self.broadcast(me, ctl, Waiter::Ignore);
                }
            }
            return;
        }
        if local < self.sims[me].next_prune || !self.sims[me].dirty {
            return;
        }
        self.sims[me].next_prune = local + 60;
        self.sims[me].dirty = false;
        let instances = self.sims[me].m.instances();
        let upto = self.sims[me].lamport;
        self.publish_due(me, true);
        let until = self.now + self.rng.random_range(20..150);
        self.sims[me].prune_sync = Some((until, upto, self.now, instances));
    }

    fn faults(&mut self) {
        if !self.faulty() {
            if let Some((_, _)) = self.partition.take() {}
            return;
        }
        if let Some((_, until)) = &self.partition {
            if self.now >= *until {
                self.partition = None;
            }
        } else if self.rng.random_bool(0.0004) {
            let side: Vec<bool> = (0..self.n).map(|_| self.rng.random_bool(0.5)).collect();
            let until = self.now + self.rng.random_range(200..3000);
            self.partition = Some((side, until));
        }
        for me in 0..self.n {
            let down = self.sims.iter().filter(|s| !s.alive || s.frozen_until > self.now).count();
            let s = &self.sims[me];
            if !s.alive || s.frozen_until > self.now {
                continue;
            }
            if down < self.n / 2 && self.rng.random_bool(0.0002) {
                // Frozen (SIGSTOP) for up to three leases; its clock runs on.
                self.sims[me].frozen_until = self.now + self.rng.random_range(50..3 * LEASE_MS);
            } else if down < self.n / 2 && self.kill_keeps_a_complete_majority(me) && self.rng.random_bool(0.0001) {
                // Killed: everything in memory is gone, unpublished writes too.
                let s = &mut self.sims[me];
                s.alive = false;
                s.restart_at = self.now + self.rng.random_range(10..2000);
            }
        }
    }

    /// The protocol's assumption (memcached.md §6): for every slot, a majority of the group's
    /// acceptors still holds every write acknowledged for it (is complete). Memory-only
    /// acceptors that lose a majority at once leave a slot without a home until an operator
    /// steps in; the schedule kills a member only while the others keep such a majority.
    fn kill_keeps_a_complete_majority(&self, me: usize) -> bool {
        let need = self.n / 2 + 1;
        (0..self.n).all(|slot| {
            let complete = (0..self.n)
                .filter(|&m| m != me)
                .filter(|&m| {
                    let s = &self.sims[m];
                    s.alive && s.m.acc.complete(slot, s.local(self.now))
                })
                .count();
            complete >= need
        })
    }

    fn restarts_and_resumes(&mut self) {
        for me in 0..self.n {
            if !self.sims[me].alive && self.now >= self.sims[me].restart_at {
                let instance = self.rng.random();
                let s = &mut self.sims[me];
                s.alive = true;
                s.incarnation += 1;
                let local = s.local(self.now);
                s.m = Member::new(HomeConfig::new(self.n, me, LEASE_MS, false), instance, local);
                s.lamport = 0;
                s.mem.clear();
                s.unpublished.clear();
                s.waiters.clear();
                s.takeovers.clear();
                s.op = None;
                s.prune_sync = None;
                s.inbox.clear();
                s.next_tick = 0;
            }
            if self.sims[me].alive && self.sims[me].frozen_until != 0 && self.sims[me].frozen_until <= self.now {
                self.sims[me].frozen_until = 0;
                let inbox = std::mem::take(&mut self.sims[me].inbox);
                for m in inbox {
                    self.handle_msg(me, m);
                }
            }
        }
    }

    fn check_exclusive(&self) {
        for slot in 0..self.n {
            let homes: Vec<usize> = (0..self.n)
                .filter(|m| self.sims[*m].alive)
                .filter(|m| matches!(self.sims[*m].m.serve(slot, self.sims[*m].local(self.now)), Serve::Home(_)))
                .collect();
            assert!(
                homes.len() <= 1,
                "seed {}: at {} ms members {homes:?} are all home of slot {slot}",
                self.seed,
                self.now
            );
        }
    }

    fn run(&mut self) {
        while self.now < END {
            self.now += 1;
            self.faults();
            self.restarts_and_resumes();
            self.deliver();
            for me in 0..self.n {
                if self.sims[me].alive && self.sims[me].frozen_until <= self.now {
                    self.step_member(me);
                }
            }
            self.check_exclusive();
        }
        self.check_end();
    }

    fn check_end(&mut self) {
        let seed = self.seed;
        // Liveness: every slot has a home once the faults have stopped.
        for slot in 0..self.n {
            let homes = (0..self.n)
                .filter(|m| matches!(self.sims[*m].m.serve(slot, self.sims[*m].local(self.now)), Serve::Home(_)))
                .count();
            if homes != 1 && std::env::var("HOME_SIM_TRACE").is_ok() {
                for m in 0..self.n {
                    let s = &self.sims[m];
                    eprintln!(
                        "member {m} alive {} local {} takeovers {:?}\n  {}",
                        s.alive,
                        s.local(self.now),
                        s.takeovers,
                        s.m.describe_slot(slot, s.local(self.now))
                    );
                }
            }
            assert_eq!(
                homes,
                1,
                "seed {seed}: slot {slot} has no home {} ms after the faults stopped",
                END - FAULTS_UNTIL
            );
        }
        // Everything published reaches everyone.
        for me in 0..self.n {
            self.publish_due(me, true);
        }
        let mut final_mem: BTreeMap<Vec<u8>, (Version, Arc<[u8]>)> = BTreeMap::new();
        for (_, w) in &self.published {
            apply(&mut final_mem, &w.key, w.version, w.value.clone());
        }
        let mut seen = std::collections::HashSet::new();
        let mut per_key: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
        for (_, key, base, wrote) in &self.acked {
            assert!(
                seen.insert((key.clone(), base.unique)),
                "seed {seed}: two acknowledged increments of {} from one unique {:?}",
                String::from_utf8_lossy(key),
                base.unique
            );
            per_key.entry(key.clone()).or_default().push(wrote.count);
        }
        for (key, counts) in per_key {
            let fin = final_mem.get(&key).map(|(_, v)| dec(v).count).unwrap_or(0);
            let max = *counts.iter().max().unwrap();
            let mut sorted = counts.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                counts.len(),
                "seed {seed}: {} acknowledged twice with one value",
                String::from_utf8_lossy(&key)
            );
            assert!(
                fin >= max && fin >= counts.len() as u64,
                "seed {seed}: {} ends at {fin}, below its {} acknowledged increments (max {max}): an update was lost",
                String::from_utf8_lossy(&key),
                counts.len()
            );
        }
        let _ = self.drift_ppm;
    }
}

fn apply(mem: &mut BTreeMap<Vec<u8>, (Version, Arc<[u8]>)>, key: &[u8], v: Version, value: Arc<[u8]>) {
    match mem.get(key) {
        Some((cur, _)) if *cur >= v => {}
        _ => {
            mem.insert(key.to_vec(), (v, value));
        }
    }
}

#[test]
fn home_failover_under_loss_reordering_drift_pauses_and_crashes_keeps_one_home_and_every_acknowledged_write() {
    let seeds: Vec<u64> = match std::env::var("HOME_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("HOME_SIM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("HOME_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
            (0..n).collect()
        }
    };
    let mut acked = 0;
    let mut kills = 0;
    for seed in seeds {
        let mut w = World::new(seed);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run()));
        if let Err(e) = r {
            eprintln!("home_sim failed; replay: HOME_SIM_SEED={seed} cargo test -p psl-memcached --test home_sim");
            std::panic::resume_unwind(e);
        }
        acked += w.acked.len();
        kills += w.sims.iter().map(|s| s.incarnation as usize).sum::<usize>();
    }
    assert!(acked > 1000, "the workload ran ({acked} acknowledged increments)");
    assert!(kills > 0, "the schedule killed members ({kills} restarts)");
    eprintln!("home_sim: {acked} acknowledged increments, {kills} kills and restarts");
}
