//! Home failover, the protocol: which front end of a group may decide the conditional commands
//! of each *slot* (the keys with `hash(key) mod n = s`) at each moment, decided by a majority
//! of the group, and what a new home must learn before it decides anything. Free of I/O and
//! of threads: requests and replies in, actions out, every time passed in as milliseconds of
//! the caller's monotonic clock. [`crate::failover`] drives it between front-end processes;
//! `tests/home_sim.rs` drives n members of this machine from a seed through message loss,
//! duplication, reordering, clock drift, pauses and crashes, and checks the invariants below
//! at every step.
//!
//! Every member of the group is an *acceptor* ([`Acceptor`]) and may be a *home* ([`Member`]).
//!
//! - **Leases.** A member becomes home of slot `s` by sending `Acquire(s, ballot, lease_ms,
//!   ceiling)` to every member; an acceptor grants it unless it holds an unexpired grant of
//!   `s` to another member (or has promised a higher ballot, or started less than a
//!   quarantine ago). The grant lasts `lease_ms` from when the acceptor received the request,
//!   on the acceptor's clock. The member is home once a majority has granted, until
//!   `t0 + holder_ms` on its own clock, where `t0` is when it *sent* the request and
//!   `holder_ms = lease_ms (1 - ρ) / (1 + ρ) - guard_ms` (ρ: the assumed bound on the rate
//!   difference of two members' monotonic clocks). Every acceptor of that majority refuses
//!   every other member until after the holder's lease has ended in real time, and any two
//!   majorities share an acceptor, so two members are never home of one slot at once.
//!   A home renews every `lease_ms / 4`.
//! - **Fences.** Each `Acquire` registers a *ceiling*: the home writes conditional results
//!   only with Lamport times below it (`psl_node::Node::write_below`, checked between the
//!   clock tick and the apply), and an acceptor keeps the highest ceiling it has seen. A new
//!   home learns the highest ceiling of its majority (which includes one that granted the
//!   previous home's last registration) and moves its node's clock past it before writing:
//!   every write of a later home is newer than every conditional write of an earlier one,
//!   even one that a paused earlier home makes after its lease has ended.
//! - **Hand-over of data.** A home answers a conditional write only after a majority has
//!   stored the write (key, version, value) for its slot (`Replicate`), and after checking
//!   that its lease still holds. A new home fetches the stored writes of its majority
//!   (`Entries`), waits for its node's SCL `sync()`, and rewrites the newest version of each
//!   key (keeping its CAS unique) before it serves. Acceptors drop a slot's writes once the
//!   home reports them covered by a SYNC (`Prune`: the home's writes up to Lamport time
//!   `upto`, after a `sync()` that began after it read `upto`), since the new home's own
//!   `sync()` then brings them.
//! - **Restarts.** An acceptor keeps everything in memory. A restarted one (a member that ran
//!   before, `HomeConfig::fresh` false) grants nothing for a quarantine longer than any lease
//!   it may have granted before, and its stored writes count for a new home only once it is
//!   *complete* for the slot: a home's `Prune` named its new instance (so every write
//!   acknowledged before the restart is covered by a SYNC). A candidate that a majority of
//!   complete acceptors grants fetches from them; one that *every* member grants fetches from
//!   all of them, complete or not, which finds every acknowledged write still held anywhere
//!   (after a restart of the whole group nothing else can be found), and its first `Prune`
//!   heals them all.
//!
//! The argument, with what it assumes and what availability it costs, is in
//! `docs/protocol/memcached.md` §6.1.

use psl_scl::Version;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Milliseconds on the caller's monotonic clock.
pub type Ms = u64;

/// Most members of a group (slot and member indices travel as `u16`; `psl up` caps at 255).
pub const MEMBERS_MAX: usize = 255;
/// Longest lease an acceptor grants.
pub const LEASE_MS_MAX: u64 = 600_000;
/// Bytes of stored writes one `Entries` page carries (a single larger write travels alone).
pub const PAGE_BYTES: usize = 512 << 10;

/// A ballot: `round << 16 | member`, so that no two members ever make the same one.
pub fn ballot(round: u64, member: usize) -> u64 {
    (round << 16) | member as u64
}

/// The member that made ballot `b`.
pub fn ballot_member(b: u64) -> usize {
    (b & 0xFFFF) as usize
}

fn ballot_round(b: u64) -> u64 {
    b >> 16
}

/// Settings of the protocol; every member of a group must use the same `lease_ms` bound and
/// drift assumption (an acceptor grants what a request asks, up to [`LEASE_MS_MAX`]).
#[derive(Debug, Clone)]
pub struct HomeConfig {
    /// Members of the group (at least 3: with 2, a majority is both).
    pub n: usize,
    /// This member's index.
    pub me: usize,
    /// How long an acceptor's grant lasts, from when it received the request.
    pub lease_ms: u64,
    /// Assumed bound on how much faster or slower one member's monotonic clock runs than
    /// another's, in millionths (10 000 = 1%).
    pub drift_ppm: u64,
    /// Subtracted from the holder's lease on top of the drift bound.
    pub guard_ms: u64,
    /// This member never ran before (its first incarnation): nothing to forget, no quarantine.
    pub fresh: bool,
    /// How far above its node's clock a home registers its ceiling.
    pub ceiling_headroom: u64,
    /// Bounds on the writes an acceptor stores per slot until they are pruned: at most this
    /// many keys (past it `Replicate` is refused as [`Refusal::Full`]) …
    pub slot_entries_max: usize,
    /// … and at most this many bytes (key, value and 48 bytes of overhead per write).
    pub slot_bytes_max: usize,
}

impl HomeConfig {
    /// Settings for member `me` of `n` with leases of `lease_ms`, and the defaults for the
    /// rest: 1% drift, a guard of `lease_ms / 40` (at least 5 ms), a ceiling headroom of 2^32,
    /// 65 536 writes or 64 MiB stored per slot. Not checked: see [`HomeConfig::validate`].
    pub fn new(n: usize, me: usize, lease_ms: u64, fresh: bool) -> HomeConfig {
        HomeConfig {
            n,
            me,
            lease_ms,
            drift_ppm: 10_000,
            guard_ms: (lease_ms / 40).max(5),
            fresh,
            ceiling_headroom: 1 << 32,
            slot_entries_max: 1 << 16,
            slot_bytes_max: 64 << 20,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.n < 3 || self.n > MEMBERS_MAX {
            return Err(format!("home failover needs 3 to {MEMBERS_MAX} members, not {}", self.n));
        }
        if self.me >= self.n {
            return Err(format!("member {} of a group of {}", self.me, self.n));
        }
        if self.drift_ppm >= 100_000 {
            return Err(format!("drift bound {} ppm: at most 10% is supported", self.drift_ppm));
        }
        if self.lease_ms < 100 || self.lease_ms > LEASE_MS_MAX {
            return Err(format!("lease of {} ms: 100 ..= {LEASE_MS_MAX}", self.lease_ms));
        }
        if self.holder_ms() < self.lease_ms / 2 {
            return Err(format!("guard of {} ms leaves a lease of {} ms too little", self.guard_ms, self.lease_ms));
        }
        Ok(())
    }

    /// Grants needed to be home: more than half of the `n` members.
    pub fn majority(&self) -> usize {
        self.n / 2 + 1
    }

    /// How long after sending a request that a majority granted the holder is home:
    /// `lease_ms (1 - ρ) / (1 + ρ) - guard_ms`, rounded down.
    pub fn holder_ms(&self) -> u64 {
        let (l, d) = (self.lease_ms as u128, self.drift_ppm as u128);
        ((l * (1_000_000 - d) / (1_000_000 + d)) as u64).saturating_sub(self.guard_ms)
    }

    /// How long a restarted acceptor grants nothing: longer than any grant it may have made
    /// before it crashed could last in real time, `lease_ms (1 + ρ) / (1 - ρ) + guard_ms`.
    pub fn quarantine_ms(&self) -> u64 {
        let (l, d) = (self.lease_ms as u128, self.drift_ppm as u128);
        (l * (1_000_000 + d)).div_ceil(1_000_000 - d) as u64 + self.guard_ms
    }

    /// How often a home renews its lease: every quarter of `lease_ms` (at least 1 ms).
    pub fn renew_ms(&self) -> u64 {
        (self.lease_ms / 4).max(1)
    }

    /// A member not heard from for this long is presumed down (successors may take its slots).
    pub fn silence_ms(&self) -> u64 {
        self.lease_ms
    }

    /// A member takes over another's slot no sooner than this after it started.
    pub fn takeover_after_ms(&self) -> u64 {
        2 * self.lease_ms
    }

    fn retry_ms(&self) -> u64 {
        (self.renew_ms() / 2).max(10)
    }
}

/// A write stored for a slot: key, version and value (`None`: deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The item's key (at most 255 bytes travel on the wire).
    pub key: Vec<u8>,
    /// The record version `(lamport, writer)` the home wrote it at.
    pub version: Version,
    /// The encoded item, or `None` for a delete.
    pub value: Option<Arc<[u8]>>,
}

impl Held {
    /// Bytes it takes on the wire (key length byte, key, version, presence, value length, value).
    pub fn wire_len(&self) -> usize {
        1 + self.key.len() + 12 + 1 + self.value.as_ref().map_or(0, |v| 4 + v.len())
    }
}

/// A request between members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ctl {
    /// Grant me (the ballot's member) slot `slot` for `lease_ms`; `renew`: I hold it now.
    Acquire {
        /// The slot asked for.
        slot: u16,
        /// The requester's ballot ([`ballot`]); it names the requesting member.
        ballot: u64,
        /// How long the grant lasts on the acceptor's clock, in ms (1 to [`LEASE_MS_MAX`]).
        lease_ms: u32,
        /// The Lamport time below which the requester's conditional writes stay; the
        /// acceptor keeps the highest it has seen.
        ceiling: u64,
        /// The requester holds the lease now and extends it.
        renew: bool,
    },
    /// Store these writes of mine, made as home of `slot` under `ballot`.
    Replicate {
        /// The slot the writes belong to.
        slot: u16,
        /// The home's ballot; refused if a higher one was promised.
        ballot: u64,
        /// The writes; an acceptor keeps the newest version of each key.
        entries: Vec<Held>,
    },
    /// My writes up to Lamport time `upto` are covered by a SYNC; `instances`: the acceptor
    /// instances I knew before that sync began.
    Prune {
        /// The slot whose stored writes to drop.
        slot: u16,
        /// The home's ballot; refused if a higher one was promised.
        ballot: u64,
        /// Stored writes with a Lamport time up to this one are dropped.
        upto: u64,
        /// Acceptor instances the home knew before its sync began; an acceptor named here is
        /// complete for the slot from then on.
        instances: Vec<u64>,
    },
    /// I give up my grant of `slot` under `ballot` (I no longer use it).
    Release {
        /// The slot given up.
        slot: u16,
        /// The ballot of the grant given up (a grant under another ballot stays).
        ballot: u64,
    },
    /// The writes you store for `slot` with keys after `after`, in key order (to a member
    /// holding your grant under `ballot`).
    Entries {
        /// The slot whose stored writes to send.
        slot: u16,
        /// The ballot of the requester's grant here; refused as stale otherwise.
        ballot: u64,
        /// The last key of the previous page (`None`: from the first key).
        after: Option<Vec<u8>>,
    },
}

impl Ctl {
    /// The slot the request is about.
    pub fn slot(&self) -> u16 {
        match self {
            Ctl::Acquire { slot, .. }
            | Ctl::Replicate { slot, .. }
            | Ctl::Prune { slot, .. }
            | Ctl::Release { slot, .. }
            | Ctl::Entries { slot, .. } => *slot,
        }
    }

    /// The requester's ballot, which names the requesting member ([`ballot_member`]).
    pub fn ballot(&self) -> u64 {
        match self {
            Ctl::Acquire { ballot, .. }
            | Ctl::Replicate { ballot, .. }
            | Ctl::Prune { ballot, .. }
            | Ctl::Release { ballot, .. }
            | Ctl::Entries { ballot, .. } => *ballot,
        }
    }
}

/// Why an acceptor refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Restarted less than a quarantine ago.
    Starting,
    /// An unexpired grant to another member.
    Held,
    /// A higher ballot was promised (or the request names a ballot not granted here).
    Stale,
    /// The slot's stored writes are at their bound.
    Full,
    /// Not a slot or member of this group.
    Invalid,
}

/// An acceptor's answer. Every answer names the acceptor's instance (random per process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtlReply {
    /// `Acquire` granted.
    Granted {
        /// The highest ceiling this acceptor has seen for the slot (a new home moves its
        /// node's clock past the highest of its majority).
        ceiling: u64,
        /// This acceptor's stored writes of the slot include every acknowledged one it took
        /// part in ([`Acceptor::complete`]).
        complete: bool,
        /// The acceptor's instance.
        instance: u64,
    },
    /// The request was refused.
    Refused {
        /// Why.
        why: Refusal,
        /// The member holding an unexpired grant of the slot here, if any.
        holder: Option<u16>,
        /// The highest ballot promised for the slot here (0 for an invalid slot).
        promised: u64,
        /// The acceptor's instance.
        instance: u64,
    },
    /// `Replicate`, `Prune` or `Release` done.
    Ack {
        /// The acceptor's instance.
        instance: u64,
    },
    /// One page of the slot's stored writes, answering `Entries`.
    Page {
        /// Writes in key order, about [`PAGE_BYTES`] at most (a single larger write alone).
        entries: Vec<Held>,
        /// More writes follow: ask again after the last key of this page.
        more: bool,
        /// The acceptor's instance.
        instance: u64,
    },
}

impl CtlReply {
    /// The answering acceptor's instance (random per process start).
    pub fn instance(&self) -> u64 {
        match self {
            CtlReply::Granted { instance, .. }
            | CtlReply::Refused { instance, .. }
            | CtlReply::Ack { instance }
            | CtlReply::Page { instance, .. } => *instance,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Grant {
    ballot: u64,
    expires: Ms,
}

#[derive(Debug, Default)]
struct AccSlot {
    promised: u64,
    grant: Option<Grant>,
    ceiling: u64,
    entries: BTreeMap<Vec<u8>, StoredWrite>,
    bytes: usize,
    /// A home's prune named this instance: every write acknowledged before it started is covered.
    healed: bool,
    /// The slot's preferred member asked for it while another held it.
    yield_wanted: bool,
}

/// A stored write's version and value (`None`: deleted).
type StoredWrite = (Version, Option<Arc<[u8]>>);

fn entry_bytes(key: &[u8], value: &Option<Arc<[u8]>>) -> usize {
    key.len() + value.as_ref().map_or(0, |v| v.len()) + 48
}

/// One member's acceptor state: per slot the promised ballot, the grant, the highest ceiling
/// and the stored writes.
#[derive(Debug)]
pub struct Acceptor {
    cfg: HomeConfig,
    instance: u64,
    started: Ms,
    slots: Vec<AccSlot>,
}

impl Acceptor {
    /// An acceptor with no grants and no stored writes, started at `now` under the random
    /// `instance`; one that ran before (`cfg.fresh` false) is quarantined from `now` on.
    pub fn new(cfg: HomeConfig, instance: u64, now: Ms) -> Acceptor {
        let slots = (0..cfg.n).map(|_| AccSlot { healed: cfg.fresh, ..AccSlot::default() }).collect();
        Acceptor { cfg, instance, started: now, slots }
    }

    /// This acceptor's instance (random per process start), named in every answer.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Restarted less than a quarantine ago: grants nothing.
    pub fn starting(&self, now: Ms) -> bool {
        !self.cfg.fresh && now < self.started + self.cfg.quarantine_ms()
    }

    /// Whether this acceptor's stored writes of `slot` include every acknowledged one it took
    /// part in (see the module docs).
    pub fn complete(&self, slot: usize, now: Ms) -> bool {
        let s = &self.slots[slot];
        s.healed && !self.starting(now)
    }

    /// The member holding an unexpired grant of `slot` here.
    pub fn holder(&self, slot: usize, now: Ms) -> Option<usize> {
        self.slots[slot].grant.filter(|g| g.expires > now).map(|g| ballot_member(g.ballot))
    }

    /// The highest ballot promised for `slot` (0: none yet); lower ballots are refused.
    pub fn promised(&self, slot: usize) -> u64 {
        self.slots[slot].promised
    }

    /// Whether the slot's preferred member asked for it while another member held it here
    /// (cleared by the call).
    pub fn take_yield_wanted(&mut self, slot: usize) -> bool {
        std::mem::take(&mut self.slots[slot].yield_wanted)
    }

    /// Stored writes of `slot` (count, bytes).
    pub fn stored(&self, slot: usize) -> (usize, usize) {
        let s = &self.slots[slot];
        (s.entries.len(), s.bytes)
    }

    fn refuse(&self, slot: usize, why: Refusal, now: Ms) -> CtlReply {
        let (holder, promised) = match self.slots.get(slot) {
            Some(s) => (self.holder(slot, now).map(|h| h as u16), s.promised),
            None => (None, 0),
        };
        CtlReply::Refused { why, holder, promised, instance: self.instance }
    }

    /// Answers `Entries`: the next page of `slot`'s writes after `after`, to the grant holder.
    fn page(&self, now: Ms, slot: usize, ballot: u64, after: &Option<Vec<u8>>) -> CtlReply {
        let s = &self.slots[slot];
        if s.promised != ballot || s.grant.is_none_or(|g| g.ballot != ballot) {
            return self.refuse(slot, Refusal::Stale, now);
        }
        let lower = match after {
            Some(k) => std::ops::Bound::Excluded(k.clone()),
            None => std::ops::Bound::Unbounded,
        };
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut more = false;
        for (k, (v, val)) in s.entries.range((lower, std::ops::Bound::Unbounded)) {
            let h = Held { key: k.clone(), version: *v, value: val.clone() };
            if !out.is_empty() && bytes + h.wire_len() > PAGE_BYTES {
                more = true;
                break;
            }
            bytes += h.wire_len();
            out.push(h);
        }
        CtlReply::Page { entries: out, more, instance: self.instance }
    }

    /// Answers one request received at `now`.
    pub fn handle(&mut self, now: Ms, req: &Ctl) -> CtlReply {
        let slot = req.slot() as usize;
        let who = ballot_member(req.ballot());
        if slot >= self.cfg.n || who >= self.cfg.n {
            return self.refuse(usize::MAX, Refusal::Invalid, now);
        }
        let instance = self.instance;
        let starting = self.starting(now);
        let (entries_max, bytes_max) = (self.cfg.slot_entries_max, self.cfg.slot_bytes_max);
        match req {
            Ctl::Acquire { ballot, lease_ms, ceiling, .. } => {
                let s = &mut self.slots[slot];
                // Only ever raised: a higher ceiling makes a later home jump further, no harm.
                s.ceiling = s.ceiling.max(*ceiling);
                if *lease_ms as u64 > LEASE_MS_MAX || *lease_ms == 0 {
                    return self.refuse(slot, Refusal::Invalid, now);
                }
                if starting {
                    return self.refuse(slot, Refusal::Starting, now);
                }
                if s.grant.is_some_and(|g| g.expires > now && ballot_member(g.ballot) != who) {
                    if who == slot {
                        s.yield_wanted = true;
                    }
                    return self.refuse(slot, Refusal::Held, now);
                }
                if *ballot < s.promised {
                    return self.refuse(slot, Refusal::Stale, now);
                }
                s.promised = *ballot;
                s.grant = Some(Grant { ballot: *ballot, expires: now + *lease_ms as u64 });
                CtlReply::Granted { ceiling: s.ceiling, complete: self.complete(slot, now), instance }
            }
            Ctl::Replicate { ballot, entries, .. } => {
                let s = &mut self.slots[slot];
                if *ballot < s.promised {
                    return self.refuse(slot, Refusal::Stale, now);
                }
                let added: usize = entries.iter().map(|e| entry_bytes(&e.key, &e.value)).sum();
                if s.entries.len() + entries.len() > entries_max || s.bytes + added > bytes_max {
                    return self.refuse(slot, Refusal::Full, now);
                }
                for e in entries {
                    let b = entry_bytes(&e.key, &e.value);
                    match s.entries.get_mut(&e.key) {
                        Some(cur) if cur.0 >= e.version => {}
                        Some(cur) => {
                            s.bytes = s.bytes + b - entry_bytes(&e.key, &cur.1);
                            *cur = (e.version, e.value.clone());
                        }
                        None => {
                            s.bytes += b;
                            s.entries.insert(e.key.clone(), (e.version, e.value.clone()));
                        }
                    }
                }
                CtlReply::Ack { instance }
            }
            Ctl::Prune { ballot, upto, instances, .. } => {
                let s = &mut self.slots[slot];
                if *ballot < s.promised {
                    return self.refuse(slot, Refusal::Stale, now);
                }
                s.entries.retain(|_, (v, _)| v.lamport > *upto);
                s.bytes = s.entries.iter().map(|(k, (_, v))| entry_bytes(k, v)).sum();
                if instances.contains(&instance) {
                    s.healed = true;
                }
                CtlReply::Ack { instance }
            }
            Ctl::Release { ballot, .. } => {
                let s = &mut self.slots[slot];
                if s.grant.is_some_and(|g| g.ballot == *ballot) {
                    s.grant = None;
                }
                CtlReply::Ack { instance }
            }
            Ctl::Entries { ballot, after, .. } => self.page(now, slot, *ballot, after),
        }
    }
}

/// A lease this member holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The ballot the majority granted it under.
    pub ballot: u64,
    /// Home until then (this member's clock).
    pub valid_until: Ms,
    /// Conditional writes stay below this Lamport time (granted by a majority).
    pub ceiling: u64,
    /// The hand-over is done: the member decides the slot's commands.
    pub serving: bool,
    renewing: bool,
    last_renew: Ms,
    /// A renewal saw a higher promised ballot: the next one takes a new ballot.
    reballot: bool,
}

/// An `Acquire` in flight: new (`renew` false) or a renewal of a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// The slot asked for.
    pub slot: u16,
    /// This member's ballot for it.
    pub ballot: u64,
    /// When the request was sent (this member's clock).
    pub t0: Ms,
    /// The Lamport ceiling registered with it: the node's clock plus the configured headroom.
    pub ceiling: u64,
    /// A renewal of a lease this member holds.
    pub renew: bool,
}

impl Attempt {
    /// The `Acquire` to send to every member, asking for `lease_ms` (capped at
    /// [`LEASE_MS_MAX`]).
    pub fn request(&self, lease_ms: u64) -> Ctl {
        Ctl::Acquire {
            slot: self.slot,
            ballot: self.ballot,
            lease_ms: lease_ms.min(LEASE_MS_MAX) as u32,
            ceiling: self.ceiling,
            renew: self.renew,
        }
    }
}

/// What the runtime is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `attempt.request()` to every member (this one included) and feed the replies to
    /// [`Member::on_replies`] once a majority granted or the wait is over.
    Acquire(Attempt),
    /// Send `Release` to every member (after no command uses the lease any more).
    Release {
        /// The slot given up.
        slot: u16,
        /// The ballot of the lease given up.
        ballot: u64,
    },
}

/// What an `Acquire` achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// A renewal: the lease is extended (and its ceiling raised).
    Renewed,
    /// A majority of complete acceptors granted a new lease: take the slot over. Move the
    /// node's clock past `ceiling`, renew (to register a ceiling above it), fetch the stored
    /// writes of `from`, `sync()`, rewrite the newest version of each, then
    /// [`Member::takeover_done`].
    TakeOver {
        /// The slot taken over.
        slot: u16,
        /// The ballot of the new lease.
        ballot: u64,
        /// The highest ceiling the granting acceptors reported (at least the attempt's own).
        ceiling: u64,
        /// The members whose stored writes to fetch.
        from: Vec<usize>,
    },
    /// Not granted; with `release`, some acceptors did grant: send them `Release`.
    Failed {
        /// Some acceptors granted: release their grants.
        release: bool,
    },
}

/// Whether this member may decide a slot's commands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// Home, serving, under this lease.
    Home(Lease),
    /// Home, but the hand-over is still running.
    TakingOver,
    /// Another member, perhaps the one named.
    Elsewhere(Option<usize>),
}

#[derive(Debug, Default, Clone)]
struct HomeSlot {
    lease: Option<Lease>,
    /// A new acquisition or a hand-over is in flight.
    busy: bool,
    next_try: Ms,
    hint: Option<usize>,
}

/// One member: its acceptor, and its side as a (would-be) home of each slot.
#[derive(Debug)]
pub struct Member {
    /// The group's settings and this member's index in it.
    pub cfg: HomeConfig,
    /// This member's acceptor, which answers every member's requests.
    pub acc: Acceptor,
    started: Ms,
    slots: Vec<HomeSlot>,
    heard: Vec<Option<Ms>>,
    instances: Vec<u64>,
    round: u64,
}

impl Member {
    /// A member that holds no lease yet, with its acceptor started at `now` under `instance`.
    pub fn new(cfg: HomeConfig, instance: u64, now: Ms) -> Member {
        let n = cfg.n;
        let mut instances = vec![0; n];
        instances[cfg.me] = instance;
        Member {
            acc: Acceptor::new(cfg.clone(), instance, now),
            started: now,
            slots: vec![HomeSlot::default(); n],
            heard: vec![None; n],
            instances,
            round: 0,
            cfg,
        }
    }

    /// Answers a request from another member (or this one), received at `now`.
    pub fn handle(&mut self, now: Ms, req: &Ctl) -> CtlReply {
        let who = ballot_member(req.ballot());
        if who < self.cfg.n && who != self.cfg.me {
            self.heard[who] = Some(now);
        }
        let r = self.acc.handle(now, req);
        if let CtlReply::Refused { promised, .. } = r {
            self.round = self.round.max(ballot_round(promised));
        }
        r
    }

    /// The instance of each member as last heard (0: unknown); this member's own included.
    pub fn instances(&self) -> Vec<u64> {
        self.instances.clone()
    }

    fn alive(&self, m: usize, now: Ms) -> bool {
        m == self.cfg.me || self.heard[m].is_some_and(|t| now < t + self.cfg.silence_ms())
    }

    fn next_ballot(&mut self, slot: usize) -> u64 {
        self.round = self.round.max(ballot_round(self.acc.promised(slot))) + 1;
        ballot(self.round, self.cfg.me)
    }

    /// Whether this member should try to become home of `slot` now (it holds no lease of it).
    fn eligible(&self, slot: usize, now: Ms) -> bool {
        let me = self.cfg.me;
        if slot == me {
            return !self.acc.starting(now);
        }
        if now < self.started + self.cfg.takeover_after_ms() || self.acc.holder(slot, now).is_some() {
            return false;
        }
        // Successors in order slot, slot + 1, …: only the first one alive tries.
        for k in 0..self.cfg.n {
            let m = (slot + k) % self.cfg.n;
            if m == me {
                return true;
            }
            if self.alive(m, now) {
                return false;
            }
        }
        false
    }

    /// Timer: renewals, acquisitions, hand-backs. `lamport` is the node's clock now.
    pub fn tick(&mut self, now: Ms, lamport: u64) -> Vec<Action> {
        let mut out = Vec::new();
        let me = self.cfg.me;
        for s in 0..self.cfg.n {
            if let Some(l) = self.slots[s].lease {
                if now >= l.valid_until {
                    // Lapsed (renewals failed): not home any more. A hand-over still running
                    // learns it in `takeover_done`.
                    self.slots[s].lease = None;
                    self.slots[s].next_try = now;
                } else if s != me && l.serving && self.acc.take_yield_wanted(s) {
                    // The slot's preferred member is back and asks for it: hand it back.
                    self.slots[s].lease = None;
                    self.slots[s].next_try = now + self.cfg.lease_ms;
                    out.push(Action::Release { slot: s as u16, ballot: l.ballot });
                    continue;
                } else {
                    let due = now >= l.last_renew + self.cfg.renew_ms()
                        || lamport.saturating_add(self.cfg.ceiling_headroom / 2) >= l.ceiling;
                    if !l.renewing && due {
                        if let Some(a) = self.begin_renewal(s, now, lamport) {
                            out.push(Action::Acquire(a));
                        }
                    }
                    continue;
                }
            }
            let hs = &self.slots[s];
            if hs.busy || now < hs.next_try || !self.eligible(s, now) {
                continue;
            }
            let b = self.next_ballot(s);
            self.slots[s].busy = true;
            let ceiling = lamport.saturating_add(self.cfg.ceiling_headroom);
            out.push(Action::Acquire(Attempt { slot: s as u16, ballot: b, t0: now, ceiling, renew: false }));
        }
        out
    }

    /// When [`Member::tick`] next has something to do if nothing arrives before: the earliest
    /// renewal due or lease end of the slots held, and, for the slots not held, their retry
    /// time but at most a renewal period away (whether one of them becomes free to take
    /// depends on what the other members say and when they fell silent, which the next tick
    /// checks). A driver sleeps until then rather than polling (an idle home wakes once per
    /// renewal); a request that makes a tick due sooner (a yield wanted, a release) waits at
    /// most that long, as a ceiling renewal does.
    pub fn next_tick(&self, now: Ms) -> Ms {
        let poll = now + self.cfg.renew_ms();
        let mut next = poll;
        for hs in &self.slots {
            let due = match hs.lease {
                Some(l) if l.renewing => l.valid_until,
                Some(l) => (l.last_renew + self.cfg.renew_ms()).min(l.valid_until),
                // An acquisition or hand-over in flight: its end is not a timer; poll at half a
                // period, so that the first renewal after it is at most that late.
                None if hs.busy => now + self.cfg.renew_ms() / 2,
                None if hs.next_try > now => hs.next_try.min(poll),
                None => poll,
            };
            next = next.min(due);
        }
        next.max(now)
    }

    /// A renewal of the lease of `slot` now (from the timer, or because a write reached the
    /// ceiling, or to register a ceiling above a clock a hand-over moved). `None`: no valid
    /// lease, or a renewal is already in flight.
    pub fn begin_renewal(&mut self, slot: usize, now: Ms, lamport: u64) -> Option<Attempt> {
        let reballot = self.slots[slot].lease.is_some_and(|l| l.reballot);
        let new_ballot = if reballot { Some(self.next_ballot(slot)) } else { None };
        let headroom = self.cfg.ceiling_headroom;
        let l = self.slots[slot].lease.as_mut().filter(|l| now < l.valid_until && !l.renewing)?;
        l.renewing = true;
        l.reballot = false;
        Some(Attempt {
            slot: slot as u16,
            ballot: new_ballot.unwrap_or(l.ballot),
            t0: now,
            ceiling: lamport.saturating_add(headroom),
            renew: true,
        })
    }

    /// The replies to `attempt` (from distinct members; this one's included).
    pub fn on_replies(&mut self, now: Ms, attempt: &Attempt, replies: &[(usize, CtlReply)]) -> Acquired {
        let slot = attempt.slot as usize;
        let mut granted = Vec::new();
        let mut stale = false;
        for (m, r) in replies {
            if *m >= self.cfg.n {
                continue;
            }
            if *m != self.cfg.me {
                self.heard[*m] = Some(now);
            }
            self.instances[*m] = r.instance();
            match r {
                CtlReply::Granted { ceiling, complete, .. } => granted.push((*m, *ceiling, *complete)),
                CtlReply::Refused { holder, promised, .. } => {
                    self.round = self.round.max(ballot_round(*promised));
                    if *promised > attempt.ballot {
                        stale = true;
                    }
                    if let Some(h) = holder.map(|h| h as usize).filter(|h| *h < self.cfg.n && *h != self.cfg.me) {
                        self.slots[slot].hint = Some(h);
                    }
                }
                _ => {}
            }
        }
        let maj = self.cfg.majority();
        let holder_ms = self.cfg.holder_ms();
        let hs = &mut self.slots[slot];
        if attempt.renew {
            let Some(l) = hs.lease.as_mut() else { return Acquired::Failed { release: false } };
            l.renewing = false;
            if granted.len() >= maj && attempt.t0 < l.valid_until {
                l.valid_until = l.valid_until.max(attempt.t0 + holder_ms);
                l.ceiling = l.ceiling.max(attempt.ceiling);
                l.last_renew = attempt.t0;
                l.ballot = attempt.ballot;
                return Acquired::Renewed;
            }
            if stale {
                l.reballot = true;
            }
            // Never release after a failed renewal: the lease still rests on earlier grants.
            return Acquired::Failed { release: false };
        }
        // A majority of complete grantors, or every member (then all of them are read).
        let mut from: Vec<usize> = granted.iter().filter(|g| g.2).map(|g| g.0).collect();
        if from.len() < maj && granted.len() == self.cfg.n {
            from = granted.iter().map(|g| g.0).collect();
        }
        // Replies that come too late (the member was paused) give a lease already over.
        if from.len() >= maj && hs.lease.is_none() && now < attempt.t0 + holder_ms {
            hs.lease = Some(Lease {
                ballot: attempt.ballot,
                valid_until: attempt.t0 + holder_ms,
                ceiling: attempt.ceiling,
                serving: false,
                renewing: false,
                last_renew: attempt.t0,
                reballot: false,
            });
            hs.hint = None;
            let ceiling = granted.iter().map(|g| g.1).max().unwrap_or(0).max(attempt.ceiling);
            return Acquired::TakeOver { slot: attempt.slot, ballot: attempt.ballot, ceiling, from };
        }
        hs.busy = false;
        // Staggered by member index, so that two candidates do not keep colliding.
        hs.next_try = now + self.cfg.retry_ms() * (1 + (self.cfg.me % 4) as u64);
        Acquired::Failed { release: !granted.is_empty() }
    }

    /// The hand-over of `slot` finished (`ok`) or failed. Returns a release to send when the
    /// member is not (or no longer) home.
    pub fn takeover_done(&mut self, now: Ms, slot: usize, ok: bool) -> Option<Action> {
        let hs = &mut self.slots[slot];
        hs.busy = false;
        match hs.lease.as_mut() {
            Some(l) if ok && now < l.valid_until => {
                l.serving = true;
                None
            }
            Some(l) => {
                let b = l.ballot;
                hs.lease = None;
                hs.next_try = now + self.cfg.retry_ms();
                Some(Action::Release { slot: slot as u16, ballot: b })
            }
            None => None,
        }
    }

    /// Gives up the lease of `slot` (e.g. before stopping). Returns the release to send.
    pub fn give_up(&mut self, slot: usize) -> Option<Action> {
        let l = self.slots[slot].lease.take()?;
        Some(Action::Release { slot: slot as u16, ballot: l.ballot })
    }

    /// Whether this member decides `slot`'s commands at `now`.
    pub fn serve(&self, slot: usize, now: Ms) -> Serve {
        match self.slots[slot].lease {
            Some(l) if now < l.valid_until && l.serving => Serve::Home(l),
            Some(l) if now < l.valid_until => Serve::TakingOver,
            _ => Serve::Elsewhere(self.acc.holder(slot, now).filter(|h| *h != self.cfg.me).or(self.slots[slot].hint)),
        }
    }

    /// The lease of `slot` this member holds (valid or not, serving or still taking over).
    pub fn lease(&self, slot: usize) -> Option<Lease> {
        self.slots[slot].lease
    }

    /// Whether the lease under `ballot` still holds at `now` (checked after a write, before
    /// its answer).
    pub fn still_home(&self, slot: usize, ballot: u64, now: Ms) -> bool {
        matches!(self.serve(slot, now), Serve::Home(l) if l.ballot == ballot)
    }

    /// Remembers where a slot's home was said to be.
    pub fn note_hint(&mut self, slot: usize, hint: Option<usize>) {
        if let Some(h) = hint.filter(|h| *h < self.cfg.n && *h != self.cfg.me) {
            self.slots[slot].hint = Some(h);
        }
    }

    /// Forgets a hint that named `m` (it could not be reached, or said it is not home).
    pub fn forget_hint(&mut self, slot: usize, m: usize) {
        if self.slots[slot].hint == Some(m) {
            self.slots[slot].hint = None;
        }
    }

    /// One line on `slot` as this member sees it (for logs and failing simulations).
    pub fn describe_slot(&self, slot: usize, now: Ms) -> String {
        let a = &self.acc.slots[slot];
        let h = &self.slots[slot];
        format!(
            "slot {slot} member {}: lease {:?} busy {} next_try {} hint {:?} | acceptor promised {} grant {:?} ceiling {} stored {} healed {} starting {} complete {} eligible {}",
            self.cfg.me,
            h.lease,
            h.busy,
            h.next_try,
            h.hint,
            a.promised,
            a.grant.map(|g| (ballot_member(g.ballot), g.ballot, g.expires)),
            a.ceiling,
            a.entries.len(),
            a.healed,
            self.acc.starting(now),
            self.acc.complete(slot, now),
            self.eligible(slot, now),
        )
    }

    /// Slots this member serves now.
    pub fn serving(&self, now: Ms) -> Vec<(usize, Lease)> {
        (0..self.cfg.n)
            .filter_map(|s| match self.serve(s, now) {
                Serve::Home(l) => Some((s, l)),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n: usize, me: usize) -> HomeConfig {
        HomeConfig::new(n, me, 1000, true)
    }

    fn v(l: u64) -> Version {
        Version { lamport: l, writer: 7 }
    }

    fn held(k: &str, l: u64) -> Held {
        Held { key: k.as_bytes().to_vec(), version: v(l), value: Some(Arc::from(&b"x"[..])) }
    }

    /// Runs the attempt against `accs` (member index = position) at `now`.
    fn run(m: &mut Member, accs: &mut [&mut Acceptor], a: &Attempt, now: Ms) -> Acquired {
        let req = a.request(m.cfg.lease_ms);
        let replies: Vec<(usize, CtlReply)> =
            accs.iter_mut().enumerate().map(|(i, x)| (i, x.handle(now, &req))).collect();
        m.on_replies(now, a, &replies)
    }

    #[test]
    fn timings_follow_the_drift_bound() {
        let c = HomeConfig::new(3, 0, 2000, false);
        c.validate().unwrap();
        assert_eq!(c.holder_ms(), 2000 * 990_000 / 1_010_000 - 50);
        assert!(c.quarantine_ms() > 2000 * 101 / 100);
        assert!(HomeConfig::new(2, 0, 2000, false).validate().is_err());
        let mut bad = c.clone();
        bad.drift_ppm = 200_000;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn an_acceptor_grants_one_member_at_a_time_until_the_grant_expires_or_is_released() {
        let mut a = Acceptor::new(cfg(3, 0), 11, 0);
        let acq = |b, renew| Ctl::Acquire { slot: 1, ballot: b, lease_ms: 1000, ceiling: 5, renew };
        assert!(matches!(
            a.handle(10, &acq(ballot(1, 1), false)),
            CtlReply::Granted { ceiling: 5, complete: true, .. }
        ));
        assert_eq!(a.holder(1, 10), Some(1));
        // Member 2, even with a higher ballot, waits for the grant to expire.
        match a.handle(500, &acq(ballot(9, 2), false)) {
            CtlReply::Refused { why: Refusal::Held, holder: Some(1), .. } => {}
            r => panic!("{r:?}"),
        }
        // The holder renews (same ballot), which moves the expiry.
        assert!(matches!(a.handle(900, &acq(ballot(1, 1), true)), CtlReply::Granted { .. }));
        assert!(matches!(a.handle(1500, &acq(ballot(9, 2), false)), CtlReply::Refused { why: Refusal::Held, .. }));
        assert!(matches!(a.handle(1901, &acq(ballot(9, 2), false)), CtlReply::Granted { .. }));
        // Member 1's old ballot is stale now, for acquisitions and for writes.
        assert!(matches!(a.handle(3000, &acq(ballot(1, 1), false)), CtlReply::Refused { why: Refusal::Stale, .. }));
        let rep = Ctl::Replicate { slot: 1, ballot: ballot(1, 1), entries: vec![held("k", 3)] };
        assert!(matches!(a.handle(3000, &rep), CtlReply::Refused { why: Refusal::Stale, .. }));
        assert_eq!(a.stored(1).0, 0);
        // A release of the current grant frees the slot at once.
        a.handle(3000, &Ctl::Release { slot: 1, ballot: ballot(9, 2) });
        assert_eq!(a.holder(1, 3000), None);
        // Garbage slots and members are refused, not panicked on.
        let bad = Ctl::Acquire { slot: 7, ballot: ballot(1, 1), lease_ms: 10, ceiling: 0, renew: false };
        assert!(matches!(a.handle(0, &bad), CtlReply::Refused { why: Refusal::Invalid, .. }));
        let bad = Ctl::Release { slot: 0, ballot: ballot(1, 300) };
        assert!(matches!(a.handle(0, &bad), CtlReply::Refused { why: Refusal::Invalid, .. }));
    }

    #[test]
    fn stored_writes_keep_the_newest_version_page_in_key_order_and_prune_below_a_watermark() {
        let mut a = Acceptor::new(cfg(3, 0), 11, 0);
        let b = ballot(1, 2);
        a.handle(0, &Ctl::Acquire { slot: 2, ballot: b, lease_ms: 1000, ceiling: 0, renew: false });
        let rep = |e| Ctl::Replicate { slot: 2, ballot: b, entries: e };
        a.handle(1, &rep(vec![held("b", 5), held("a", 9), held("c", 2)]));
        a.handle(1, &rep(vec![held("b", 4), held("c", 20)]));
        fn page(a: &mut Acceptor, b: u64, after: Option<&str>) -> (Vec<Held>, bool) {
            match a.handle(2, &Ctl::Entries { slot: 2, ballot: b, after: after.map(|s| s.as_bytes().to_vec()) }) {
                CtlReply::Page { entries, more, .. } => (entries, more),
                r => panic!("{r:?}"),
            }
        }
        let (e, more) = page(&mut a, b, None);
        assert!(!more);
        assert_eq!(
            e.iter().map(|h| (h.key.clone(), h.version.lamport)).collect::<Vec<_>>(),
            vec![(b"a".to_vec(), 9), (b"b".to_vec(), 5), (b"c".to_vec(), 20)]
        );
        assert_eq!(page(&mut a, b, Some("a")).0.len(), 2);
        // Only the member holding the grant under that ballot may read them.
        assert!(matches!(
            a.handle(2, &Ctl::Entries { slot: 2, ballot: ballot(1, 1), after: None }),
            CtlReply::Refused { .. }
        ));
        a.handle(3, &Ctl::Prune { slot: 2, ballot: b, upto: 9, instances: vec![] });
        assert_eq!(page(&mut a, b, None).0.len(), 1);
        assert_eq!(a.stored(2).0, 1);
        // Bounded: past the limit, writes are refused (the home then fails the command).
        let mut small = cfg(3, 0);
        small.slot_entries_max = 2;
        let mut a = Acceptor::new(small, 1, 0);
        let rep =
            Ctl::Replicate { slot: 0, ballot: ballot(1, 0), entries: vec![held("x", 1), held("y", 1), held("z", 1)] };
        assert!(matches!(a.handle(0, &rep), CtlReply::Refused { why: Refusal::Full, .. }));
    }

    #[test]
    fn pages_split_large_writes() {
        let mut a = Acceptor::new(cfg(3, 0), 11, 0);
        let b = ballot(1, 0);
        a.handle(0, &Ctl::Acquire { slot: 0, ballot: b, lease_ms: 1000, ceiling: 0, renew: false });
        let big: Arc<[u8]> = vec![7u8; 300 << 10].into();
        let entries = (0..4)
            .map(|i| Held { key: format!("k{i}").into_bytes(), version: v(i + 1), value: Some(big.clone()) })
            .collect();
        a.handle(1, &Ctl::Replicate { slot: 0, ballot: b, entries });
        let mut after = None;
        let mut seen = 0;
        let mut pages = 0;
        loop {
            let CtlReply::Page { entries, more, .. } =
                a.handle(2, &Ctl::Entries { slot: 0, ballot: b, after: after.clone() })
            else {
                panic!()
            };
            assert!(entries.iter().map(Held::wire_len).sum::<usize>() <= PAGE_BYTES || entries.len() == 1);
            seen += entries.len();
            pages += 1;
            after = entries.last().map(|h| h.key.clone());
            if !more {
                break;
            }
        }
        assert_eq!((seen, pages), (4, 4));
    }

    #[test]
    fn a_restarted_acceptor_grants_nothing_during_quarantine_and_heals_when_a_prune_names_it() {
        let c = HomeConfig::new(3, 1, 1000, false);
        let q = c.quarantine_ms();
        let mut a = Acceptor::new(c, 42, 100);
        let acq = Ctl::Acquire { slot: 0, ballot: ballot(3, 0), lease_ms: 1000, ceiling: 77, renew: true };
        assert!(matches!(a.handle(200, &acq), CtlReply::Refused { why: Refusal::Starting, instance: 42, .. }));
        // It still learned the ceiling; it is complete for no slot until a prune names it.
        assert!(!a.complete(0, 100 + q));
        assert!(!a.complete(2, 100 + q));
        match a.handle(100 + q, &acq) {
            CtlReply::Granted { ceiling: 77, complete: false, .. } => {}
            r => panic!("{r:?}"),
        }
        a.handle(100 + q, &Ctl::Prune { slot: 0, ballot: ballot(3, 0), upto: 0, instances: vec![1, 2] });
        assert!(!a.complete(0, 100 + q));
        a.handle(100 + q, &Ctl::Prune { slot: 0, ballot: ballot(3, 0), upto: 0, instances: vec![1, 42] });
        assert!(a.complete(0, 100 + q));
    }

    #[test]
    fn a_member_takes_its_own_slot_then_a_successor_takes_it_over_after_silence_and_hands_it_back() {
        let mut m0 = Member::new(cfg(3, 0), 100, 0);
        let mut m1 = Member::new(cfg(3, 1), 101, 0);
        let mut a2 = Acceptor::new(cfg(3, 2), 102, 0);
        // Member 0 acquires slot 0.
        let acts = m0.tick(0, 10);
        let Some(Action::Acquire(a)) = acts.iter().find(|a| matches!(a, Action::Acquire(x) if x.slot == 0)).cloned()
        else {
            panic!("{acts:?}")
        };
        let got = {
            let req = a.request(1000);
            let r0 = m0.handle(0, &req);
            let r1 = m1.handle(0, &req);
            let r2 = a2.handle(0, &req);
            m0.on_replies(0, &a, &[(0, r0), (1, r1), (2, r2)])
        };
        let Acquired::TakeOver { slot: 0, ceiling, from, .. } = got else { panic!("{got:?}") };
        assert_eq!(ceiling, 10 + (1 << 32));
        assert_eq!(from.len(), 3);
        assert_eq!(m0.serve(0, 1), Serve::TakingOver);
        assert_eq!(m0.takeover_done(1, 0, true), None);
        let Serve::Home(lease) = m0.serve(0, 1) else { panic!() };
        assert!(m0.still_home(0, lease.ballot, 1));
        assert!(!m0.still_home(0, lease.ballot, m0.cfg.holder_ms()));
        // Member 1 sees member 0's grant and does not compete, even much later while 0 is heard.
        assert!(matches!(m1.serve(0, 5), Serve::Elsewhere(Some(0))));
        // Member 0 goes silent. After the grants expire and the silence, 1 takes slot 0 over.
        let t = 5000;
        let acts = m1.tick(t, 50);
        let a = acts
            .iter()
            .find_map(|x| match x {
                Action::Acquire(a) if a.slot == 0 => Some(*a),
                _ => None,
            })
            .expect("member 1 takes slot 0 over");
        assert!(a.ballot > lease.ballot);
        let req = a.request(1000);
        let r1 = m1.handle(t, &req);
        let r2 = a2.handle(t, &req);
        let got = m1.on_replies(t, &a, &[(1, r1), (2, r2)]);
        let Acquired::TakeOver { ceiling, .. } = got else { panic!("{got:?}") };
        assert!(ceiling >= lease.ceiling, "the new home learns the old ceiling");
        m1.takeover_done(t + 1, 0, true);
        assert!(matches!(m1.serve(0, t + 2), Serve::Home(_)));
        // The old home wakes up: its lease has lapsed, it is not home, it learns who is.
        assert!(matches!(m0.serve(0, t + 2), Serve::Elsewhere(_)));
        let acts = m0.tick(t + 2, 60);
        let a = acts
            .iter()
            .find_map(|x| match x {
                Action::Acquire(a) if a.slot == 0 => Some(*a),
                _ => None,
            })
            .expect("member 0 asks for its slot back");
        let req = a.request(1000);
        let r1 = m1.handle(t + 2, &req);
        let r2 = a2.handle(t + 2, &req);
        let r0 = m0.handle(t + 2, &req);
        assert!(matches!(m0.on_replies(t + 2, &a, &[(0, r0), (1, r1), (2, r2)]), Acquired::Failed { release: true }));
        assert!(matches!(m0.serve(0, t + 3), Serve::Elsewhere(Some(1))));
        // Member 1 hands it back: stops at once and releases.
        let acts = m1.tick(t + 3, 70);
        assert!(acts.iter().any(|a| matches!(a, Action::Release { slot: 0, .. })), "{acts:?}");
        assert!(matches!(m1.serve(0, t + 3), Serve::Elsewhere(_)));
    }

    #[test]
    fn a_driver_that_sleeps_until_next_tick_renews_in_time_and_wakes_once_per_renewal() {
        let mut m = Member::new(cfg(3, 0), 1, 0);
        let mut own = Acceptor::new(cfg(3, 0), 1, 0);
        let mut a1 = Acceptor::new(cfg(3, 1), 2, 0);
        let mut a2 = Acceptor::new(cfg(3, 2), 3, 0);
        let renew = m.cfg.renew_ms();
        let (mut now, mut wakes, mut renewals) = (0, 0, 0);
        while now < 10_000 {
            wakes += 1;
            // Members 1 and 2 are alive and home of their own slots: member 0 hears their
            // renewals, so it never competes for their slots.
            for s in 1..3u16 {
                m.handle(
                    now,
                    &Ctl::Acquire { slot: s, ballot: ballot(1, s as usize), lease_ms: 1000, ceiling: 0, renew: true },
                );
            }
            for act in m.tick(now, 1) {
                let Action::Acquire(a) = act else { panic!("{act:?}") };
                assert_eq!(a.slot, 0, "only its own slot");
                match run(&mut m, &mut [&mut own, &mut a1, &mut a2], &a, now) {
                    Acquired::TakeOver { .. } => assert_eq!(m.takeover_done(now, 0, true), None),
                    Acquired::Renewed => renewals += 1,
                    r => panic!("{r:?} at {now}"),
                }
            }
            assert!(matches!(m.serve(0, now), Serve::Home(_)), "home at {now}");
            let next = m.next_tick(now);
            assert!(next > now && next <= now + renew, "next tick {next} at {now}");
            // Asleep until then: still home the whole time.
            assert!(matches!(m.serve(0, next), Serve::Home(_)), "home until {next}");
            now = next;
        }
        // About one wake per renewal: 4 a second for a 1 s lease, where a fixed tick of half
        // a renewal period woke 8 times.
        assert!(renewals >= 10_000 / renew - 1, "{renewals} renewals");
        assert!(wakes <= 10_000 / renew + 2, "{wakes} wakes in 10 s");
        // A renewal in flight: the next tick is no later than a period away, nor the lease end.
        let r = m.begin_renewal(0, now, 1).unwrap();
        let Serve::Home(l) = m.serve(0, now) else { panic!() };
        assert!(m.next_tick(now) <= (now + renew).min(l.valid_until));
        assert_eq!(run(&mut m, &mut [&mut own, &mut a1, &mut a2], &r, now), Acquired::Renewed);
        // A member holding nothing polls once a renewal period.
        let idle = Member::new(cfg(3, 1), 9, 0);
        assert_eq!(idle.next_tick(500), 500 + renew);
    }

    #[test]
    fn a_renewal_extends_only_a_lease_still_valid_and_never_releases() {
        let mut m = Member::new(cfg(3, 0), 1, 0);
        let mut a1 = Acceptor::new(cfg(3, 1), 2, 0);
        let mut a2 = Acceptor::new(cfg(3, 2), 3, 0);
        let acts = m.tick(0, 1);
        let Some(Action::Acquire(a)) = acts.first().cloned() else { panic!() };
        let mut own = Acceptor::new(cfg(3, 0), 1, 0);
        assert!(matches!(run(&mut m, &mut [&mut own, &mut a1, &mut a2], &a, 0), Acquired::TakeOver { .. }));
        m.takeover_done(0, 0, true);
        let r = m.begin_renewal(0, 300, 2).unwrap();
        assert!(m.begin_renewal(0, 300, 2).is_none(), "one renewal at a time");
        // Only one acceptor answers: not renewed, but still home until the first lease ends.
        let req = r.request(1000);
        let rep = a1.handle(300, &req);
        assert_eq!(m.on_replies(300, &r, &[(1, rep)]), Acquired::Failed { release: false });
        assert!(matches!(m.serve(0, 900), Serve::Home(_)));
        let r = m.begin_renewal(0, 400, 2).unwrap();
        assert_eq!(run(&mut m, &mut [&mut own, &mut a1, &mut a2], &r, 400), Acquired::Renewed);
        let Serve::Home(l) = m.serve(0, 1200) else { panic!() };
        assert_eq!(l.valid_until, 400 + m.cfg.holder_ms());
    }
}
