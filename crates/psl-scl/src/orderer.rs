//! The receive state machine: verified records in, records in per-writer `seq` order out.
//!
//! For each writer it keeps the next expected seq, the hashes of its applied records (to tell
//! a duplicate from an equivocation: every one by default, the newest
//! [`OrdererConfig::chain_window`] if that is set), a bounded hold-back buffer for records that
//! arrive early, and a *target*: the highest seq known to exist (from held records and SYNC
//! links). While the next seq is below the target there is a gap; a gap older than
//! `repair_after_ms` yields a repair request, repeated every `repair_retry_ms`; a gap with no
//! progress for `withholding_after_ms` is reported once as withholding. A gap is never skipped.

use crate::metrics::RejectReason;
use psl_capsule::{Link, Opened, Record, Verified};
use psl_crypto::Hash256;
use std::collections::{BTreeMap, VecDeque};

/// The orderer's bounds and timers (times in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrdererConfig {
    /// Most records held back across all writers; beyond it early records are dropped (and
    /// fetched again by repair).
    pub held_records_max: usize,
    /// Age of a gap before the first repair request.
    pub repair_after_ms: u64,
    /// Time between repeated requests for the same gap.
    pub repair_retry_ms: u64,
    /// Most seqs asked for in one request.
    pub repair_chunk: u64,
    /// Time without progress on a gap before the writer is reported as withholding.
    pub withholding_after_ms: u64,
    /// How long a writer must make no progress while a heads hint says it has more before the
    /// hint turns into a repair request. Hints report what a peer applied; a receiver that is
    /// merely behind (the records are in its queue) would otherwise ask, and every holder would
    /// answer to everyone: a repair storm that grows with the square of the number of nodes.
    pub hint_grace_ms: u64,
    /// Most bytes (encoded records) held back across all writers: a bound a writer with large
    /// records reaches long before `held_records_max`.
    pub held_bytes_max: usize,
    /// Most writers tracked only because a heads hint named them (no record of theirs seen
    /// yet). Hints are unauthenticated: beyond the bound, hints about new writers are ignored
    /// until older ones expire.
    pub hinted_writers_max: usize,
    /// How long a writer known only from hints is tracked without a record of its arriving.
    pub hinted_writer_ttl_ms: u64,
    /// How many applied hashes to keep per writer (in hashes, 32 bytes each): `None` (the
    /// default, what nodes use) keeps every one, so memory grows by 32 bytes a record applied;
    /// `Some(W)` keeps only the newest `W` of each writer (a capsule server:
    /// `psl_server::SERVER_CHAIN_WINDOW`), whose log already holds the rest.
    ///
    /// An applied seq older than the window has no hash here: [`Orderer::applied_hash`] returns
    /// `None`; a record for it is refused by [`Orderer::known`] and [`Orderer::deliver`] as
    /// `Duplicate` (or `StaleEpoch`, under the same epoch rule as inside the window) without
    /// comparing hashes, so no conflict is reported (its slot is durable already, and the
    /// store refuses a second record for a taken slot); [`Orderer::note_link`] compares
    /// nothing there. Equivocation evidence is therefore found only within the window. Held
    /// records, gaps, targets, expected hashes and heads are unaffected. `Some(0)` keeps no
    /// hash but the head.
    pub chain_window: Option<usize>,
}

impl Default for OrdererConfig {
    fn default() -> Self {
        OrdererConfig {
            held_records_max: 65_536,
            repair_after_ms: 40,
            repair_retry_ms: 150,
            repair_chunk: 512,
            withholding_after_ms: 5_000,
            hint_grace_ms: 250,
            held_bytes_max: 128 << 20,
            hinted_writers_max: 4096,
            hinted_writer_ttl_ms: 30_000,
            chain_window: None,
        }
    }
}

/// What the orderer holds and hands back: a verified record, opened (a node, which holds the
/// data key) or not (a capsule server, which verifies signatures only).
pub trait Chained {
    /// The signed record (header, chain link, encoded bytes).
    fn record(&self) -> &Record;
}

impl Chained for Verified<Opened> {
    fn record(&self) -> &Record {
        &self.record
    }
}

impl Chained for Verified<Record> {
    fn record(&self) -> &Record {
        self
    }
}

#[derive(Debug)]
struct WriterState<T> {
    next_seq: u64,
    head: Hash256,
    last_epoch: u64,
    /// Hashes of the newest applied seqs, oldest first, ending at `next_seq - 1`: every one
    /// (`chain_window: None`, 32 bytes a record; see `docs/protocol/scl.md` on bounds) or at
    /// most `chain_window`. The first is the hash of seq `next_seq - chain.len()`.
    chain: VecDeque<Hash256>,
    held: BTreeMap<u64, T>,
    /// Exclusive: seqs below it are known to exist.
    target: u64,
    /// Hashes a SYNC named for seqs not applied yet.
    expected: BTreeMap<u64, Hash256>,
    gap_since: Option<u64>,
    last_request: Option<u64>,
    last_hint_request: Option<u64>,
    /// A hint is outstanding since: (next seq then, time).
    hint_since: Option<(u64, u64)>,
    last_progress: u64,
    withholding_reported: bool,
    /// The next seq at which the last repair request was sent: a second request there (no
    /// progress since) goes to every holder, the first to the writer's own node only.
    asked_at: Option<u64>,
    /// After the origin failed to answer, requests for this writer go to every holder until
    /// this time (ms): a writer that is gone, or whose old records only the servers still
    /// hold, does not cost every chunk of a catch-up a second round.
    origin_quiet_until: u64,
}

impl<T> Default for WriterState<T> {
    fn default() -> Self {
        WriterState {
            next_seq: 0,
            head: Hash256::ZERO,
            last_epoch: 0,
            chain: VecDeque::new(),
            held: BTreeMap::new(),
            target: 0,
            expected: BTreeMap::new(),
            gap_since: None,
            last_request: None,
            last_hint_request: None,
            hint_since: None,
            last_progress: 0,
            withholding_reported: false,
            asked_at: None,
            origin_quiet_until: 0,
        }
    }
}

/// Where an applied seq stands against the hashes a writer's state keeps.
enum Applied {
    /// Not applied (at or beyond the next seq).
    No,
    /// Applied, with this hash.
    Hash(Hash256),
    /// Applied, but older than the window of hashes kept (`OrdererConfig::chain_window`).
    BelowWindow,
}

impl<T> WriterState<T> {
    /// The hash of applied `seq`, if it is still kept.
    fn applied(&self, seq: u64) -> Applied {
        if seq >= self.next_seq {
            return Applied::No;
        }
        let first = self.next_seq - self.chain.len() as u64;
        match seq.checked_sub(first) {
            Some(i) => Applied::Hash(self.chain[i as usize]),
            None => Applied::BelowWindow,
        }
    }

    /// Appends the hash of the record applied at `next_seq` (the caller then advances
    /// `next_seq`), dropping the oldest first while `window` is full, so the buffer never
    /// grows beyond `window` hashes.
    fn push_applied(&mut self, hash: Hash256, window: Option<usize>) {
        if let Some(w) = window {
            if w == 0 {
                return;
            }
            while self.chain.len() >= w {
                self.chain.pop_front();
            }
        }
        self.chain.push_back(hash);
    }
}

/// How long a writer whose node did not answer a repair request is asked through every holder
/// ([`Orderer::first_ask`]).
pub const ORIGIN_QUIET_MS: u64 = 5_000;

/// Evidence of equivocation: (writer, seq, hash already held, hash offered).
pub type Conflict = (u32, u64, Hash256, Hash256);

/// What happened to one verified record.
#[derive(Debug)]
pub struct Delivery<T = Verified<Opened>> {
    /// Records now ready, in order (the one given and any held ones it unblocked).
    pub ready: Vec<T>,
    /// Set when the record was not applied (and not held).
    pub rejected: Option<RejectReason>,
    /// Set when the record is being held for a predecessor.
    pub held: bool,
    /// Evidence of equivocation found on the way: the record given or a held one conflicting
    /// with what is applied, or an applied record conflicting with a hash a SYNC or EOE named.
    pub conflicts: Vec<Conflict>,
    /// Held records released by this delivery that turned out not to link, by reason.
    pub dropped: Vec<RejectReason>,
}

/// [`Orderer::tick_with_hints`]: ranges `(writer, from_seq, to_seq)` to ask peers for, and
/// ranges reported as withheld.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickWork {
    /// Ranges to request repair of, `to_seq` inclusive (gaps first, then hinted heads).
    pub repairs: Vec<(u32, u64, u64)>,
    /// Ranges of writers newly reported as withholding, `to_seq` inclusive.
    pub withholding: Vec<(u32, u64, u64)>,
}

/// Something the orderer asks its caller to do on a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrdererAction {
    /// Ask peers for `writer`'s records `from_seq..=to_seq` (at most `repair_chunk` seqs).
    Repair {
        /// The writer whose records are missing.
        writer: u32,
        /// The first missing seq (the writer's next expected).
        from_seq: u64,
        /// The last seq asked for (inclusive).
        to_seq: u64,
    },
    /// `writer` is withholding: `from_seq..=to_seq` are known to exist but made no progress for
    /// `withholding_after_ms` (reported once per stuck gap).
    Withholding {
        /// The writer reported.
        writer: u32,
        /// The first missing seq.
        from_seq: u64,
        /// The highest seq known to exist (inclusive).
        to_seq: u64,
    },
}

/// The receive state machine (see the module docs): per writer, next seq, applied hashes,
/// hold-back buffer and gap state; generic over what it holds ([`Chained`]).
#[derive(Debug)]
pub struct Orderer<T = Verified<Opened>> {
    cfg: OrdererConfig,
    writers: BTreeMap<u32, WriterState<T>>,
    held_total: usize,
    held_bytes: usize,
    /// Writers named by heads hints and not (yet) by any record: when first hinted, and when
    /// last asked for. Bounded by `hinted_writers_max`, expired after `hinted_writer_ttl_ms`.
    hinted_only: BTreeMap<u32, HintOnly>,
    current_epoch: u64,
}

/// A writer known only from hints.
#[derive(Debug, Clone, Copy)]
struct HintOnly {
    since: u64,
    last_request: Option<u64>,
}

impl<T> Default for Orderer<T> {
    fn default() -> Self {
        Orderer {
            cfg: OrdererConfig::default(),
            writers: BTreeMap::new(),
            held_total: 0,
            held_bytes: 0,
            hinted_only: BTreeMap::new(),
            current_epoch: 0,
        }
    }
}

impl<T: Chained> Orderer<T> {
    /// An empty orderer (no writer known, epoch 0) with these bounds and timers.
    pub fn new(cfg: OrdererConfig) -> Orderer<T> {
        Orderer { cfg, ..Default::default() }
    }

    /// Epoch of the newest SYNC applied.
    pub fn current_epoch(&self) -> u64 {
        self.current_epoch
    }

    pub(crate) fn set_epoch(&mut self, e: u64) {
        self.current_epoch = self.current_epoch.max(e);
    }

    /// Records held back across all writers (at most `held_records_max`).
    pub fn held_total(&self) -> usize {
        self.held_total
    }

    /// Bytes (encoded records) held back across all writers.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// How many writers this orderer keeps state for: those it saw a record of (or was told
    /// of by a link or a probe), and those only hints named.
    pub fn writers_tracked(&self) -> (usize, usize) {
        (self.writers.len(), self.hinted_only.len())
    }

    /// The next seq expected from `writer`.
    pub fn next_seq(&self, writer: u32) -> u64 {
        self.writers.get(&writer).map(|w| w.next_seq).unwrap_or(0)
    }

    /// The newest applied record of each writer.
    pub fn heads(&self) -> BTreeMap<u32, Link> {
        self.writers
            .iter()
            .filter(|(_, s)| s.next_seq > 0)
            .map(|(w, s)| (*w, Link { writer: *w, seq: s.next_seq - 1, hash: s.head }))
            .collect()
    }

    /// Hash of the applied record `(writer, seq)`. `None` if it is not applied, or if it is
    /// older than the writer's newest [`OrdererConfig::chain_window`] applied records.
    pub fn applied_hash(&self, writer: u32, seq: u64) -> Option<Hash256> {
        match self.writers.get(&writer)?.applied(seq) {
            Applied::Hash(h) => Some(h),
            Applied::No | Applied::BelowWindow => None,
        }
    }

    /// Whether every link's target has been applied.
    pub fn covers(&self, links: &[Link]) -> bool {
        links.iter().all(|l| self.next_seq(l.writer) > l.seq)
    }

    /// Whether any writer has a gap (records known to exist but not applied).
    pub fn has_gaps(&self) -> bool {
        self.writers.values().any(|w| w.next_seq < w.target)
    }

    /// Writers with a gap: (writer, next seq, target).
    pub fn gaps(&self) -> Vec<(u32, u64, u64)> {
        self.writers.iter().filter(|(_, s)| s.next_seq < s.target).map(|(w, s)| (*w, s.next_seq, s.target)).collect()
    }

    /// Before spending a signature check: is this record (by its hash) already applied or held?
    /// A record whose hash matches one we hold *is* that record, so it needs no verification.
    /// A record for an applied seq older than the [`OrdererConfig::chain_window`] is refused
    /// the same way without comparing hashes (its slot is taken; no evidence is looked for).
    pub fn known(&self, rec: &Record) -> Option<RejectReason> {
        let h = rec.header();
        let st = self.writers.get(&h.writer)?;
        let hash = rec.hash();
        let taken = match st.applied(h.seq) {
            Applied::Hash(a) => a == hash,
            Applied::BelowWindow => true,
            Applied::No => false,
        };
        if taken {
            return Some(if h.epoch < self.current_epoch { RejectReason::StaleEpoch } else { RejectReason::Duplicate });
        }
        if st.held.get(&h.seq).is_some_and(|x| x.record().hash() == hash) {
            return Some(RejectReason::Duplicate);
        }
        None
    }

    /// Takes a verified record. Returns the records it makes ready, in order.
    ///
    /// A record for an applied seq is a duplicate (or stale) if its hash is the applied one,
    /// evidence of equivocation if not; older than the [`OrdererConfig::chain_window`], where
    /// no hash is kept, it is refused as a duplicate (or stale) without a comparison and
    /// without a conflict.
    ///
    /// `recheck` is the apply-time check (`Verifier::recheck`): what may have changed since the
    /// record was verified, possibly on another thread, such as a revocation of its writer or
    /// the retirement of its key generation. It runs on the record given, before it is held or
    /// applied, and on every held record this one releases; a record it refuses is neither held
    /// nor made ready, and the writer's held records it refuses are dropped with it.
    pub fn deliver(&mut self, rec: T, now: u64, recheck: impl Fn(&Record) -> Option<RejectReason>) -> Delivery<T> {
        if let Some(reason) = recheck(rec.record()) {
            let writer = rec.record().header().writer;
            let mut out = Delivery {
                ready: Vec::new(),
                rejected: Some(reason),
                held: false,
                conflicts: Vec::new(),
                dropped: Vec::new(),
            };
            out.dropped = self.purge_writer(writer, &recheck);
            return out;
        }
        let h = rec.record().header();
        let (writer, seq, hash) = (h.writer, h.seq, rec.record().hash());
        let epoch = h.epoch;
        let current_epoch = self.current_epoch;
        self.hinted_only.remove(&writer);
        let st = self.writers.entry(writer).or_insert_with(|| WriterState { last_progress: now, ..Default::default() });
        let mut out =
            Delivery { ready: Vec::new(), rejected: None, held: false, conflicts: Vec::new(), dropped: Vec::new() };
        if seq < st.next_seq {
            match st.applied(seq) {
                Applied::Hash(applied) if applied != hash => {
                    out.rejected = Some(RejectReason::Equivocation);
                    out.conflicts.push((writer, seq, applied, hash));
                }
                // The same record, or one for a slot older than the window (taken, and durable
                // where a window is kept: nothing to compare it with).
                _ => {
                    out.rejected =
                        Some(if epoch < current_epoch { RejectReason::StaleEpoch } else { RejectReason::Duplicate });
                }
            }
            return out;
        }
        if seq > st.next_seq {
            st.target = st.target.max(seq + 1);
            if st.gap_since.is_none() {
                st.gap_since = Some(now);
            }
            match st.held.get(&seq) {
                Some(x) if x.record().hash() == hash => out.rejected = Some(RejectReason::Duplicate),
                Some(x) => {
                    out.rejected = Some(RejectReason::Equivocation);
                    out.conflicts.push((writer, seq, x.record().hash(), hash));
                }
                None if self.held_total >= self.cfg.held_records_max
                    || self.held_bytes + rec.record().bytes().len() > self.cfg.held_bytes_max =>
                {
                    out.rejected = Some(RejectReason::HoldFull)
                }
                None => {
                    self.held_bytes += rec.record().bytes().len();
                    st.held.insert(seq, rec);
                    self.held_total += 1;
                    out.held = true;
                }
            }
            return out;
        }
        // seq == next_seq: apply it and whatever it unblocks.
        let mut next = Some(rec);
        let window = self.cfg.chain_window;
        while let Some(r) = next.take() {
            match Self::accept(st, &r, now, window) {
                Ok(conflict) => {
                    out.conflicts.extend(conflict);
                    out.ready.push(r);
                }
                Err((reason, conflict)) => {
                    // The record given is refused: report it. A held record that turns out not
                    // to link is dropped and counted the same way (it was verified, so a
                    // conflict is evidence).
                    if out.ready.is_empty() {
                        out.rejected = Some(reason);
                    } else {
                        out.dropped.push(reason);
                    }
                    out.conflicts.extend(conflict);
                    break;
                }
            }
            if let Some(h) = st.held.remove(&st.next_seq) {
                self.held_total -= 1;
                self.held_bytes -= h.record().bytes().len();
                if let Some(reason) = recheck(h.record()) {
                    // Verified before a revocation (or a rotation) that now refuses it.
                    out.dropped.push(reason);
                    let (n, bytes, reasons) = Self::purge(st, &recheck);
                    self.held_total -= n;
                    self.held_bytes -= bytes;
                    out.dropped.extend(reasons);
                    break;
                }
                next = Some(h);
            }
        }
        if st.next_seq >= st.target {
            st.gap_since = None;
            st.last_request = None;
        }
        out
    }

    /// Drops `writer`'s held records that `recheck` refuses (a revocation or a rotation learnt
    /// after they were verified) and returns why, one reason a record. The writer's target
    /// shrinks to what is still known to exist, so no repair is asked for refused records.
    pub fn purge_writer(
        &mut self,
        writer: u32,
        recheck: &impl Fn(&Record) -> Option<RejectReason>,
    ) -> Vec<RejectReason> {
        let Some(st) = self.writers.get_mut(&writer) else { return Vec::new() };
        let (n, bytes, reasons) = Self::purge(st, recheck);
        self.held_total -= n;
        self.held_bytes -= bytes;
        reasons
    }

    /// [`Orderer::purge_writer`] for every writer (after a revocation is installed).
    pub fn purge_all(&mut self, recheck: &impl Fn(&Record) -> Option<RejectReason>) -> Vec<RejectReason> {
        let mut out = Vec::new();
        for st in self.writers.values_mut() {
            let (n, bytes, reasons) = Self::purge(st, recheck);
            self.held_total -= n;
            self.held_bytes -= bytes;
            out.extend(reasons);
        }
        out
    }

    fn purge(
        st: &mut WriterState<T>,
        recheck: &impl Fn(&Record) -> Option<RejectReason>,
    ) -> (usize, usize, Vec<RejectReason>) {
        let mut reasons = Vec::new();
        let mut bytes = 0;
        st.held.retain(|_, r| match recheck(r.record()) {
            Some(reason) => {
                reasons.push(reason);
                bytes += r.record().bytes().len();
                false
            }
            None => true,
        });
        if !reasons.is_empty() {
            let held_top = st.held.keys().next_back().map_or(0, |s| s + 1);
            let expected_top = st.expected.keys().next_back().map_or(0, |s| s + 1);
            st.target = st.next_seq.max(held_top).max(expected_top);
            if st.next_seq >= st.target {
                st.gap_since = None;
                st.last_request = None;
            }
        }
        (reasons.len(), bytes, reasons)
    }

    fn accept(
        st: &mut WriterState<T>,
        r: &T,
        now: u64,
        window: Option<usize>,
    ) -> Result<Option<Conflict>, (RejectReason, Option<Conflict>)> {
        let h = r.record().header();
        if h.seq > 0 && h.prev != st.head {
            return Err((RejectReason::Equivocation, Some((h.writer, h.seq - 1, st.head, h.prev))));
        }
        if h.epoch < st.last_epoch {
            return Err((RejectReason::EpochRegression, None));
        }
        let hash = r.record().hash();
        let conflict = st.expected.remove(&h.seq).filter(|e| *e != hash).map(|e| (h.writer, h.seq, e, hash));
        st.push_applied(hash, window);
        st.head = hash;
        st.next_seq += 1;
        st.last_epoch = h.epoch;
        st.last_progress = now;
        st.withholding_reported = false;
        st.target = st.target.max(st.next_seq);
        // Applied (it links to what came before), but a SYNC or EOE named another record here:
        // the writer equivocated. The caller reports the evidence.
        Ok(conflict)
    }

    /// Adopts a chain known to be sound (a capsule server's durable store, re-verified on open):
    /// writer `writer`'s chain is `next_seq` records long, `tail` holds the hashes of its newest
    /// records, oldest first, ending at seq `next_seq - 1` (so `tail[0]` is seq
    /// `next_seq - tail.len()`), and `last_epoch` is the newest record's epoch.
    ///
    /// Pass at least the newest [`OrdererConfig::chain_window`] hashes (the whole chain when it
    /// is `None`). More are trimmed to the window. Fewer are taken as given: the missing prefix
    /// is treated as older than the window (refused as duplicates, no hash compared, no
    /// `applied_hash`), with or without a window set.
    ///
    /// Only for a writer the orderer does not know yet, a chain of at least one record, and a
    /// `tail` of 1 ..= `next_seq` hashes (the newest is the head the next record must link to);
    /// returns `false`, adopting nothing, otherwise.
    pub fn adopt(&mut self, writer: u32, next_seq: u64, tail: &[Hash256], last_epoch: u64, now: u64) -> bool {
        let Some(head) = tail.last().copied() else { return false };
        if self.writers.contains_key(&writer) || tail.len() as u64 > next_seq {
            return false;
        }
        let keep = self.cfg.chain_window.map_or(tail.len(), |w| w.min(tail.len()));
        self.writers.insert(
            writer,
            WriterState {
                next_seq,
                head,
                last_epoch,
                chain: tail[tail.len() - keep..].iter().copied().collect(),
                target: next_seq,
                last_progress: now,
                ..Default::default()
            },
        );
        true
    }

    /// Records one of this node's own records (sealed here, so trusted): advances the chain
    /// without going through verification. Must be called in seq order.
    pub fn advance_own(&mut self, rec: &Record, now: u64) {
        let h = rec.header();
        let st =
            self.writers.entry(h.writer).or_insert_with(|| WriterState { last_progress: now, ..Default::default() });
        assert_eq!(h.seq, st.next_seq, "own records are recorded in chain order");
        assert!(h.seq == 0 || h.prev == st.head, "own records extend the own chain");
        st.push_applied(rec.hash(), self.cfg.chain_window);
        st.head = rec.hash();
        st.next_seq += 1;
        st.last_epoch = h.epoch;
        st.last_progress = now;
        st.target = st.target.max(st.next_seq);
    }

    /// A SYNC (or EOE) says `link` exists: raise the writer's target, and compare hashes.
    /// Returns a conflict if the applied record at that seq differs. A link to an applied seq
    /// older than the [`OrdererConfig::chain_window`] is compared with nothing: `None`.
    pub fn note_link(&mut self, link: &Link, now: u64) -> Option<Conflict> {
        let st =
            self.writers.entry(link.writer).or_insert_with(|| WriterState { last_progress: now, ..Default::default() });
        match st.applied(link.seq) {
            Applied::Hash(applied) => {
                return (applied != link.hash).then_some((link.writer, link.seq, applied, link.hash));
            }
            Applied::BelowWindow => return None,
            Applied::No => {}
        }
        st.target = st.target.max(link.seq + 1);
        st.expected.insert(link.seq, link.hash);
        if st.gap_since.is_none() {
            st.gap_since = Some(now);
        }
        None
    }

    /// One tick's work for a replica (node or server): repair requests for old gaps and for
    /// hinted heads (at most `hint_budget` of the latter), and withholding reports (logged here).
    pub fn tick_with_hints(&mut self, hinted: &mut BTreeMap<u32, u64>, hint_budget: usize, now: u64) -> TickWork {
        let mut work = TickWork::default();
        for a in self.tick(now) {
            match a {
                OrdererAction::Repair { writer, from_seq, to_seq } => work.repairs.push((writer, from_seq, to_seq)),
                OrdererAction::Withholding { writer, from_seq, to_seq } => {
                    tracing::warn!(
                        writer,
                        from_seq,
                        to_seq,
                        "writer withholding: records known to exist cannot be obtained"
                    );
                    work.withholding.push((writer, from_seq, to_seq));
                }
            }
        }
        work.repairs.extend(self.requests_for_hints(hinted, hint_budget, now));
        work
    }

    /// Turns hinted heads (writer -> seq, from heads hints) into at most `budget` repair
    /// requests, forgetting the hints already satisfied.
    pub fn requests_for_hints(
        &mut self,
        hinted: &mut BTreeMap<u32, u64>,
        budget: usize,
        now: u64,
    ) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        let pending: Vec<(u32, u64)> = hinted.iter().map(|(w, s)| (*w, *s)).collect();
        for (w, s) in pending {
            if out.len() >= budget {
                break;
            }
            if s < self.next_seq(w) {
                hinted.remove(&w);
                continue;
            }
            if let Some(OrdererAction::Repair { writer, from_seq, to_seq }) = self.hint(w, s, now) {
                out.push((writer, from_seq, to_seq));
            }
        }
        out
    }

    /// An unauthenticated hint that `writer` reached `seq`: ask for what we lack, once the
    /// writer made no progress for `hint_grace_ms` while hinted, then at most once per
    /// `repair_retry_ms` per writer, without creating a gap.
    pub fn hint(&mut self, writer: u32, seq: u64, now: u64) -> Option<OrdererAction> {
        let retry = self.cfg.repair_retry_ms;
        let chunk = self.cfg.repair_chunk;
        let grace = self.cfg.hint_grace_ms;
        let Some(st) = self.writers.get_mut(&writer) else {
            // A writer no record has named yet: tracked apart, bounded and expiring, so that
            // hints naming made-up writers cost a bounded table and nothing else.
            if !self.hinted_only.contains_key(&writer) && self.hinted_only.len() >= self.cfg.hinted_writers_max {
                return None;
            }
            let h = self.hinted_only.entry(writer).or_insert(HintOnly { since: now, last_request: None });
            if now.saturating_sub(h.since) < grace || h.last_request.is_some_and(|t| now.saturating_sub(t) < retry) {
                return None;
            }
            h.last_request = Some(now);
            return Some(OrdererAction::Repair { writer, from_seq: 0, to_seq: seq.min(chunk - 1) });
        };
        if seq < st.next_seq {
            st.hint_since = None;
            return None;
        }
        let (at, since) = *st.hint_since.get_or_insert((st.next_seq, now));
        if at != st.next_seq {
            // Progress since the hint: the records are arriving; start the grace again.
            st.hint_since = Some((st.next_seq, now));
            return None;
        }
        if now.saturating_sub(since) < grace || st.last_hint_request.is_some_and(|t| now.saturating_sub(t) < retry) {
            return None;
        }
        st.last_hint_request = Some(now);
        Some(OrdererAction::Repair { writer, from_seq: st.next_seq, to_seq: seq.min(st.next_seq + chunk - 1) })
    }

    /// Whether a repair request for `writer` from `from_seq` is the first one there (no request
    /// since the chain last reached `from_seq`): then only the writer's own node should answer
    /// it; a second one (the origin did not answer within `repair_retry_ms`: down, or its
    /// repair cache evicted them) goes to every holder. Every holder answering every request
    /// multiplies the repair traffic by the number of holders, which under load fills the
    /// receive queues again (a repair storm).
    /// After a second request, the writer's requests go to every holder for
    /// [`ORIGIN_QUIET_MS`].
    pub fn first_ask(&mut self, writer: u32, from_seq: u64, now: u64) -> bool {
        let Some(st) = self.writers.get_mut(&writer) else { return false };
        let again = st.asked_at == Some(from_seq);
        st.asked_at = Some(from_seq);
        if again {
            st.origin_quiet_until = now + ORIGIN_QUIET_MS;
        }
        !again && now >= st.origin_quiet_until
    }

    /// Asks for the records of `writer` from its next seq on, whether or not a gap is known
    /// (a restarted node learning its own writers' chains back).
    pub fn probe(&mut self, writer: u32, now: u64) -> OrdererAction {
        let st = self.writers.entry(writer).or_insert_with(|| WriterState { last_progress: now, ..Default::default() });
        OrdererAction::Repair { writer, from_seq: st.next_seq, to_seq: st.next_seq + self.cfg.repair_chunk - 1 }
    }

    /// Time passes: repair requests for old gaps, withholding reports for stuck ones.
    pub fn tick(&mut self, now: u64) -> Vec<OrdererAction> {
        let mut out = Vec::new();
        let ttl = self.cfg.hinted_writer_ttl_ms;
        self.hinted_only.retain(|_, h| now.saturating_sub(h.since) < ttl);
        for (w, st) in self.writers.iter_mut() {
            if st.next_seq >= st.target {
                continue;
            }
            let since = *st.gap_since.get_or_insert(now);
            // A later record held back means the missing one was lost (each sender's messages
            // arrive in order): ask soon. A gap known only from a link (SYNC, EOE) may be a
            // record still queued for this receiver: ask only if the writer made no progress
            // for the hint grace, so a receiver that is merely behind does not start a storm.
            let wait = if st.held.is_empty() {
                self.cfg.hint_grace_ms.max(self.cfg.repair_after_ms)
            } else {
                self.cfg.repair_after_ms
            };
            if now.saturating_sub(since.max(st.last_progress)) < wait {
                continue;
            }
            if st.last_request.is_none_or(|t| now.saturating_sub(t) >= self.cfg.repair_retry_ms) {
                st.last_request = Some(now);
                let to = (st.target - 1).min(st.next_seq + self.cfg.repair_chunk - 1);
                out.push(OrdererAction::Repair { writer: *w, from_seq: st.next_seq, to_seq: to });
            }
            let stuck_since = st.last_progress.max(since);
            if !st.withholding_reported && now.saturating_sub(stuck_since) >= self.cfg.withholding_after_ms {
                st.withholding_reported = true;
                out.push(OrdererAction::Withholding { writer: *w, from_seq: st.next_seq, to_seq: st.target - 1 });
            }
        }
        out
    }

    /// Forgets everything (RESET).
    pub fn clear(&mut self) {
        self.writers.clear();
        self.held_total = 0;
        self.held_bytes = 0;
        self.hinted_only.clear();
        self.current_epoch = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule, Author, Limits, Verifier};
    use psl_crypto::OwnerKey;

    fn no_recheck(_: &Record) -> Option<RejectReason> {
        None
    }

    /// One writer's chain of `n` verified records, and what makes more records for it.
    struct Chain {
        meta: psl_capsule::SignedMetadata,
        app: psl_crypto::AppKey,
        v: Verifier,
        writer: u32,
        recs: Vec<Verified<Record>>,
    }

    impl Chain {
        fn new(n: usize) -> Chain {
            let owner = OwnerKey::from_seed(&[7; 32]).unwrap();
            let meta = new_capsule(&owner, 1, "orderer-window", 0, Limits::default()).unwrap();
            let app = owner.app(1).unwrap();
            let v = Verifier::new(meta.clone(), None);
            let writer = 0x10002;
            let mut a = Author::new(&meta, &app, writer).unwrap();
            let recs =
                (0..n).map(|i| v.verify(a.write_ops([(format!("k{i}"), Some("v"))]).unwrap()).unwrap()).collect();
            Chain { meta, app, v, writer, recs }
        }

        /// A second, validly signed record for `seq` (after the same predecessor): equivocation.
        fn other_at(&self, seq: u64) -> Verified<Record> {
            let mut a = Author::new(&self.meta, &self.app, self.writer).unwrap();
            if seq > 0 {
                let p = &self.recs[seq as usize - 1];
                let h = p.header();
                a.resume(&psl_capsule::Head {
                    writer: self.writer,
                    seq: h.seq,
                    hash: p.hash(),
                    lamport: h.lamport,
                    epoch: h.epoch,
                });
            }
            let r = self.v.verify(a.write_ops([("forged", Some("x"))]).unwrap()).unwrap();
            assert_eq!(r.header().seq, seq);
            assert_ne!(r.hash(), self.recs[seq as usize].hash());
            r
        }

        fn hashes(&self) -> Vec<Hash256> {
            self.recs.iter().map(|r| r.hash()).collect()
        }
    }

    fn windowed(w: usize) -> Orderer<Verified<Record>> {
        Orderer::new(OrdererConfig { chain_window: Some(w), ..OrdererConfig::default() })
    }

    fn deliver_all(o: &mut Orderer<Verified<Record>>, recs: &[Verified<Record>]) {
        for r in recs {
            let d = o.deliver(r.clone(), 0, no_recheck);
            assert_eq!((d.ready.len(), d.rejected), (1, None));
        }
    }

    fn kept(o: &Orderer<Verified<Record>>, writer: u32) -> usize {
        o.writers[&writer].chain.len()
    }

    #[test]
    fn a_chain_window_keeps_only_the_newest_hashes() {
        let c = Chain::new(10);
        let mut o = windowed(4);
        deliver_all(&mut o, &c.recs);
        assert_eq!(kept(&o, c.writer), 4);
        assert!(o.writers[&c.writer].chain.capacity() < 8, "the buffer does not grow past the window");
        for (seq, r) in c.recs.iter().enumerate() {
            let want = (seq >= 6).then(|| r.hash());
            assert_eq!(o.applied_hash(c.writer, seq as u64), want, "seq {seq}");
        }
        assert_eq!(o.applied_hash(c.writer, 10), None, "not applied");
        assert_eq!(o.next_seq(c.writer), 10);
        assert_eq!(o.heads()[&c.writer], c.recs[9].link());
        assert!(!o.has_gaps());
        // Own records (a node's) keep the window too.
        let mut own = windowed(3);
        for r in &c.recs {
            own.advance_own(r, 0);
        }
        assert_eq!(kept(&own, c.writer), 3);
        assert_eq!(own.applied_hash(c.writer, 6), None);
        assert_eq!(own.applied_hash(c.writer, 7), Some(c.recs[7].hash()));
        // A window of 0 keeps the head only, and the chain still links.
        let mut none = windowed(0);
        deliver_all(&mut none, &c.recs);
        assert_eq!(kept(&none, c.writer), 0);
        assert_eq!(none.applied_hash(c.writer, 9), None);
        assert_eq!(none.heads()[&c.writer].hash, c.recs[9].hash());
    }

    #[test]
    fn a_record_below_the_window_is_refused_as_a_duplicate_without_a_conflict() {
        let c = Chain::new(10);
        let mut o = windowed(4);
        deliver_all(&mut o, &c.recs);
        let forged = c.other_at(2);
        for r in [&c.recs[2], &forged] {
            assert_eq!(o.known(r), Some(RejectReason::Duplicate));
            let d = o.deliver(r.clone(), 1, no_recheck);
            assert_eq!(d.rejected, Some(RejectReason::Duplicate));
            assert!(d.conflicts.is_empty() && d.ready.is_empty() && !d.held);
        }
        // The same epoch rule as inside the window: a copy from an older epoch is stale.
        o.set_epoch(1);
        for r in [&c.recs[2], &forged] {
            assert_eq!(o.known(r), Some(RejectReason::StaleEpoch));
            let d = o.deliver(r.clone(), 2, no_recheck);
            assert_eq!(d.rejected, Some(RejectReason::StaleEpoch));
            assert!(d.conflicts.is_empty());
        }
        assert_eq!(o.next_seq(c.writer), 10);
    }

    #[test]
    fn equivocation_inside_the_window_is_still_a_conflict() {
        let c = Chain::new(10);
        let mut o = windowed(4);
        deliver_all(&mut o, &c.recs);
        assert_eq!(o.known(&c.recs[8]), Some(RejectReason::Duplicate));
        let forged = c.other_at(8);
        assert_eq!(o.known(&forged), None, "a different record inside the window is verified, then compared");
        let d = o.deliver(forged.clone(), 1, no_recheck);
        assert_eq!(d.rejected, Some(RejectReason::Equivocation));
        assert_eq!(d.conflicts, vec![(c.writer, 8, c.recs[8].hash(), forged.hash())]);
        // The oldest seq of the window is still inside it.
        let d = o.deliver(c.other_at(6), 1, no_recheck);
        assert_eq!(d.rejected, Some(RejectReason::Equivocation));
        assert_eq!(d.conflicts.len(), 1);
    }

    #[test]
    fn a_link_below_the_window_is_compared_with_nothing() {
        let c = Chain::new(10);
        let mut o = windowed(4);
        deliver_all(&mut o, &c.recs);
        let bogus = Hash256([9; 32]);
        assert_eq!(o.note_link(&Link { writer: c.writer, seq: 2, hash: bogus }, 1), None);
        assert_eq!(o.note_link(&Link { writer: c.writer, seq: 5, hash: c.recs[5].hash() }, 1), None);
        assert_eq!(
            o.note_link(&Link { writer: c.writer, seq: 8, hash: bogus }, 1),
            Some((c.writer, 8, c.recs[8].hash(), bogus)),
            "inside the window a link naming another record is evidence"
        );
        assert_eq!(o.note_link(&c.recs[8].link(), 1), None);
        assert!(!o.has_gaps(), "links to applied seqs raise no target");
    }

    #[test]
    fn adopting_a_tail_then_delivering_the_next_seq_works() {
        let c = Chain::new(12);
        let hashes = c.hashes();
        let epoch = c.recs[9].header().epoch;
        let mut o = windowed(4);
        assert!(!o.adopt(c.writer, 10, &[], epoch, 0), "no head to link to");
        assert!(!o.adopt(c.writer, 3, &hashes[..4], epoch, 0), "a tail longer than the chain");
        assert!(o.adopt(c.writer, 10, &hashes[6..10], epoch, 0));
        assert!(!o.adopt(c.writer, 10, &hashes[6..10], epoch, 0), "a writer already known");
        assert_eq!((o.next_seq(c.writer), kept(&o, c.writer)), (10, 4));
        assert_eq!(o.heads()[&c.writer], c.recs[9].link());
        assert_eq!(o.applied_hash(c.writer, 6), Some(hashes[6]));
        assert_eq!(o.applied_hash(c.writer, 5), None);
        // The next seq links to the adopted head and is applied; the one after it too.
        let d = o.deliver(c.recs[10].clone(), 1, no_recheck);
        assert_eq!((d.ready.len(), d.rejected), (1, None));
        deliver_all(&mut o, &c.recs[11..]);
        assert_eq!((o.next_seq(c.writer), kept(&o, c.writer)), (12, 4));
        assert_eq!(o.applied_hash(c.writer, 7), None, "slid out of the window");
        // Old seqs: below the window a duplicate, inside it compared.
        let d = o.deliver(c.other_at(3), 2, no_recheck);
        assert_eq!((d.rejected, d.conflicts.len()), (Some(RejectReason::Duplicate), 0));
        let d = o.deliver(c.other_at(9), 2, no_recheck);
        assert_eq!((d.rejected, d.conflicts.len()), (Some(RejectReason::Equivocation), 1));
        // A tail longer than the window is trimmed to it.
        let mut t = windowed(4);
        assert!(t.adopt(c.writer, 12, &hashes, epoch, 0));
        assert_eq!(kept(&t, c.writer), 4);
        assert_eq!(t.applied_hash(c.writer, 8), Some(hashes[8]));
        assert_eq!(t.applied_hash(c.writer, 7), None);
    }

    #[test]
    fn without_a_window_every_hash_is_kept_as_before() {
        let c = Chain::new(10);
        let mut o: Orderer<Verified<Record>> = Orderer::new(OrdererConfig::default());
        assert_eq!(OrdererConfig::default().chain_window, None);
        deliver_all(&mut o, &c.recs);
        assert_eq!(kept(&o, c.writer), 10);
        assert_eq!(o.applied_hash(c.writer, 0), Some(c.recs[0].hash()));
        let forged = c.other_at(2);
        assert_eq!(o.known(&forged), None);
        let d = o.deliver(forged.clone(), 1, no_recheck);
        assert_eq!(d.rejected, Some(RejectReason::Equivocation));
        assert_eq!(d.conflicts, vec![(c.writer, 2, c.recs[2].hash(), forged.hash())]);
        let bogus = Hash256([9; 32]);
        assert!(o.note_link(&Link { writer: c.writer, seq: 0, hash: bogus }, 1).is_some());
        // Adopting the whole chain keeps every hash.
        let mut a: Orderer<Verified<Record>> = Orderer::new(OrdererConfig::default());
        assert!(a.adopt(c.writer, 10, &c.hashes(), 0, 0));
        assert_eq!(kept(&a, c.writer), 10);
        assert_eq!(a.applied_hash(c.writer, 0), Some(c.recs[0].hash()));
        // A shorter tail: the missing prefix is outside the hashes kept, as below a window.
        let mut s: Orderer<Verified<Record>> = Orderer::new(OrdererConfig::default());
        assert!(s.adopt(c.writer, 10, &c.hashes()[7..], 0, 0));
        assert_eq!(s.applied_hash(c.writer, 6), None);
        let d = s.deliver(c.other_at(2), 1, no_recheck);
        assert_eq!((d.rejected, d.conflicts.len()), (Some(RejectReason::Duplicate), 0));
    }

    /// Heads hints are unauthenticated: the attacker names a new made-up writer in every hint.
    /// The orderer's state for writers known only from hints stays bounded and expires, and
    /// an honest writer's hint and records are still served.
    #[test]
    fn adversary_hints_naming_made_up_writers_cost_bounded_state_that_expires() {
        let cfg = OrdererConfig::default();
        let mut o: Orderer<Verified<Record>> = Orderer::new(cfg);
        let honest = 0x10000;
        assert!(o.hint(honest, 3, 0).is_none(), "within the grace");
        for w in 0..200_000u32 {
            o.hint(0x20000 + w, 1_000_000, 1 + (w as u64 % 100));
        }
        let (writers, hinted) = o.writers_tracked();
        assert_eq!(writers, 0, "hints create no per-writer chain state");
        assert!(hinted <= cfg.hinted_writers_max, "{hinted} hinted writers tracked");
        // The honest writer, hinted before the flood, is still asked for after the grace.
        let ask = o.hint(honest, 3, cfg.hint_grace_ms + 1);
        assert_eq!(ask, Some(OrdererAction::Repair { writer: honest, from_seq: 0, to_seq: 3 }));
        // Hinted-only state expires.
        o.tick(cfg.hinted_writer_ttl_ms + 200);
        assert_eq!(o.writers_tracked(), (0, 0));
        // And records still flow.
        let owner = OwnerKey::from_seed(&[5; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "orderer-hints", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let v = Verifier::new(meta.clone(), None);
        let mut a = Author::new(&meta, &app, honest).unwrap();
        let r = v.verify(a.write_ops([("k", Some("v"))]).unwrap()).unwrap();
        assert_eq!(o.deliver(r, cfg.hinted_writer_ttl_ms + 300, no_recheck).ready.len(), 1);
    }

    /// A writer (one with a valid key: a compromised one) sends large records out of order to
    /// fill the hold-back: it stops at its byte bound, and the records it holds are released in
    /// order once the gap fills.
    #[test]
    fn adversary_large_early_records_fill_the_hold_only_to_its_byte_bound() {
        let cfg = OrdererConfig { held_bytes_max: 4 << 20, ..OrdererConfig::default() };
        let mut o: Orderer<Verified<Record>> = Orderer::new(cfg);
        let owner = OwnerKey::from_seed(&[6; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "orderer-bytes", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let v = Verifier::new(meta.clone(), None);
        let mut a = Author::new(&meta, &app, 0x10001).unwrap();
        let big = vec![9u8; 512 * 1024];
        let first = v.verify(a.write_ops([("k0", Some(big.as_slice()))]).unwrap()).unwrap();
        let mut full = 0;
        for i in 1..20 {
            let r = v.verify(a.write_ops([(format!("k{i}"), Some(big.as_slice()))]).unwrap()).unwrap();
            let d = o.deliver(r, 0, no_recheck);
            full += (d.rejected == Some(RejectReason::HoldFull)) as usize;
            assert!(o.held_bytes() <= cfg.held_bytes_max);
        }
        assert!(full > 0, "the bound was reached");
        let held = o.held_total();
        let d = o.deliver(first, 1, no_recheck);
        assert_eq!(d.ready.len(), held + 1, "the held records follow the first, in order");
        assert_eq!((o.held_total(), o.held_bytes()), (0, 0));
    }
}
