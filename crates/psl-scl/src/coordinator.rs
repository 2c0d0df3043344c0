//! The coordinator's epoch state machine.
//!
//! Every `epoch_ms` the active coordinator writes an RTS (ready-to-sync) control record for
//! the next epoch `e` (or every `epoch_idle_ms` while nothing happens: see "Idle epochs"
//! below); every data writer answers with an EOE (end-of-epoch) control record,
//! the last record of its epoch; when all expected writers have answered, or `eoe_timeout_ms`
//! passed, the coordinator writes SYNC `e`, linking each writer's EOE (or, for a writer that did
//! not answer, its newest record the coordinator has applied).
//!
//! Epoch numbers are `term << 32 | counter`. The primary (rank 0) starts active in term 0;
//! shadows (rank r > 0) stay passive until no SYNC has been applied for
//! `takeover_after_epochs` epochs, then take the smallest term above the current one that is
//! congruent to their rank (so two coordinators never share a term, hence never an epoch
//! number), and a coordinator that applies a SYNC of a higher term than its own steps down.
//! Every node refuses a SYNC whose epoch is not above the one in force, so no node ever accepts
//! two SYNCs for one epoch. (A shadow of rank r waits `takeover_after_epochs × (1 + r)` epochs,
//! so that shadows take over one at a time, in rank order.)
//!
//! # Idle epochs
//!
//! An epoch costs every node and server a few signed records (RTS, one EOE per writer, SYNC),
//! their acks and hints, whether or not anything was written. So the coordinator keeps the
//! `epoch_ms` pace only while the capsule is *busy*: a record other than an RTS, an EOE or a
//! SYNC was applied since the coordinator opened its last epoch, or a node asked for an epoch
//! (a pending `sync()` barrier: `wire::Msg::EpochWanted`, see [`CoordinatorSm::on_activity`]).
//! Otherwise the next RTS waits `epoch_idle_ms` after the last SYNC. Activity during that wait
//! makes the RTS due at once (if `epoch_ms` has passed since the SYNC), so a write after a
//! quiet spell is linked by a SYNC as fast as under load.
//!
//! Shadows follow the same rule, so that an idle primary does not look dead: a shadow's
//! patience `P = takeover_after_epochs × epoch_ms × (1 + rank)` counts from the later of the
//! last SYNC and the first activity it saw since the last RTS; with no activity, from the last
//! SYNC plus `epoch_idle_ms`. A primary that dies while the capsule is idle is replaced as soon
//! as someone writes (or after `epoch_idle_ms + P`), which is when it matters.

use psl_capsule::Link;
use std::collections::BTreeMap;

/// The coordinator's timing and rank settings (times in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Epoch length in ms: the next RTS is due this long after its previous SYNC (or its start),
    /// while the capsule is busy.
    pub epoch_ms: u64,
    /// Epoch length in ms while the capsule is idle (nothing but epoch records applied since
    /// the last RTS); at least `epoch_ms` (a smaller value counts as `epoch_ms`).
    pub epoch_idle_ms: u64,
    /// How long (ms) after its RTS the coordinator waits for EOEs before writing SYNC anyway.
    pub eoe_timeout_ms: u64,
    /// Epochs without an applied SYNC before a shadow takes over.
    pub takeover_after_epochs: u64,
    /// 0 = primary; 1.. = shadows, in takeover order.
    pub rank: u8,
    /// Number of coordinator ranks in the capsule's policy.
    pub ranks: u8,
    /// Epochs a writer may miss its EOE before the coordinator stops waiting for it (its newest
    /// record is still linked).
    pub missed_eoe_max: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            epoch_ms: 100,
            epoch_idle_ms: EPOCH_IDLE_MS_DEFAULT,
            eoe_timeout_ms: 300,
            takeover_after_epochs: 5,
            rank: 0,
            ranks: 3,
            missed_eoe_max: 3,
        }
    }
}

/// The default [`CoordinatorConfig::epoch_idle_ms`]: an idle capsule closes an epoch every 2 s.
pub const EPOCH_IDLE_MS_DEFAULT: u64 = 10_000;

/// The coordinator term of an epoch number (its upper 32 bits).
pub fn epoch_term(epoch: u64) -> u64 {
    epoch >> 32
}

/// What the coordinator wants written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinatorAction {
    /// Write an RTS (ready-to-sync) control record opening epoch `epoch`.
    WriteRts {
        /// The epoch being opened (`term << 32 | counter`).
        epoch: u64,
    },
    /// Write a SYNC control record closing epoch `epoch`.
    WriteSync {
        /// The epoch being closed.
        epoch: u64,
        /// The links to include, sorted by writer: each writer's EOE, or its newest applied record.
        heads: Vec<Link>,
    },
}

#[derive(Debug)]
struct Collecting {
    epoch: u64,
    deadline: u64,
    eoes: BTreeMap<u32, Link>,
}

/// One coordinator's epoch state machine (primary or shadow): fed EOEs, SYNCs and time, it
/// returns the RTS/SYNC records to write.
#[derive(Debug)]
pub struct CoordinatorSm {
    cfg: CoordinatorConfig,
    active: bool,
    term: u64,
    /// Newest epoch applied (any coordinator's SYNC) or written by us.
    epoch: u64,
    collecting: Option<Collecting>,
    /// When the next RTS is due while busy (`epoch_ms` after the last SYNC).
    next_rts_at: u64,
    /// When the next RTS is due while idle (`epoch_idle_ms` after the last SYNC).
    idle_rts_at: u64,
    last_sync_at: u64,
    /// Since this time (ms), something other than epoch records happened, and no RTS was
    /// opened (or, on a passive coordinator, seen) since; `None`: idle.
    busy_since: Option<u64>,
    /// Epochs keep the busy pace until the coordinator's epoch reaches this (a revocation or a
    /// key rotation takes effect at an epoch, which should come soon, not after idle epochs).
    busy_until_epoch: u64,
    /// Data writers and how many EOEs in a row each has missed.
    writers: BTreeMap<u32, u32>,
    /// Do not open an epoch at or after this one (a key rotation takes effect there and this
    /// coordinator does not hold its key under the new generation yet).
    hold_from: Option<u64>,
}

impl CoordinatorSm {
    /// A coordinator at epoch 0, term 0, active iff `cfg.rank == 0`; `now` is the time in ms (its
    /// first RTS is due `epoch_ms` later).
    pub fn new(cfg: CoordinatorConfig, now: u64) -> CoordinatorSm {
        CoordinatorSm {
            active: cfg.rank == 0,
            term: 0,
            epoch: 0,
            collecting: None,
            next_rts_at: now + cfg.epoch_ms,
            idle_rts_at: now + cfg.epoch_ms,
            last_sync_at: now,
            // A coordinator that starts closes its first epoch at the busy pace.
            busy_since: Some(now),
            busy_until_epoch: 0,
            writers: BTreeMap::new(),
            hold_from: None,
            cfg,
        }
    }

    /// Holds the epoch clock before epoch `epoch` (`None`: no hold). A SYNC of an epoch at or
    /// after a key rotation's must be signed under the new generation, so a coordinator that
    /// lacks that key waits for it rather than write a SYNC every node would refuse.
    pub fn hold_from(&mut self, epoch: Option<u64>) {
        if epoch != self.hold_from {
            if let Some(e) = epoch {
                tracing::info!(rank = self.cfg.rank, hold_from = e, "coordinator waits for its rotated key");
            }
            self.hold_from = epoch;
        }
    }

    /// Whether this coordinator currently drives epochs (the primary, or a shadow that took over).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The highest term seen: its own, or that of the newest SYNC applied.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.cfg
    }

    /// A data writer exists (it wrote a record we applied).
    pub fn observe_writer(&mut self, w: u32) {
        self.writers.entry(w).or_insert(0);
    }

    /// Something that needs an epoch happened at `now`: a record other than an RTS, an EOE or a
    /// SYNC was applied, or a node asked for an epoch (it waits on a `sync()` barrier). Until
    /// the next RTS, epochs keep the `epoch_ms` pace.
    pub fn on_activity(&mut self, now: u64) {
        self.busy_since.get_or_insert(now);
    }

    /// Something takes effect at `epoch` (a revocation's or a key rotation's first epoch):
    /// epochs keep the busy pace until this coordinator's epoch reaches `epoch`.
    pub fn keep_busy_until(&mut self, epoch: u64) {
        self.busy_until_epoch = self.busy_until_epoch.max(epoch);
    }

    /// An RTS (any coordinator's) was applied. A passive coordinator starts its idle count
    /// there, as the active one did when it opened the epoch.
    pub fn on_rts(&mut self) {
        if !self.active {
            self.busy_since = None;
        }
    }

    /// Whether the capsule is busy (see the module docs): epochs keep the `epoch_ms` pace.
    pub fn is_busy(&self) -> bool {
        self.busy_since.is_some() || self.epoch < self.busy_until_epoch
    }

    /// The shadow's patience, `takeover_after_epochs × epoch_ms × (1 + rank)`.
    fn patience(&self) -> u64 {
        self.cfg.takeover_after_epochs * self.cfg.epoch_ms * (1 + self.cfg.rank as u64)
    }

    fn idle_ms(&self) -> u64 {
        self.cfg.epoch_idle_ms.max(self.cfg.epoch_ms)
    }

    /// When a passive shadow takes over if no SYNC comes first (see the module docs).
    fn takeover_at(&self) -> u64 {
        let idle = self.last_sync_at + self.idle_ms() + self.patience();
        let since = self.busy_since.or((self.epoch < self.busy_until_epoch).then_some(self.last_sync_at));
        match since {
            Some(t) => idle.min(self.last_sync_at.max(t) + self.patience()),
            None => idle,
        }
    }

    /// When the active coordinator opens its next epoch, if no activity comes first.
    fn rts_due_at(&self) -> u64 {
        if self.is_busy() {
            self.next_rts_at
        } else {
            self.idle_rts_at
        }
    }

    /// The earliest time (ms) at which [`CoordinatorSm::tick`] may act, with no new event
    /// before it: the runtime need not tick for the coordinator's sake before then. `None`:
    /// never (a passive primary).
    pub fn next_due(&self) -> Option<u64> {
        if self.active {
            Some(match &self.collecting {
                Some(c) => c.deadline,
                None => self.rts_due_at(),
            })
        } else if self.cfg.rank > 0 {
            Some(self.takeover_at())
        } else {
            None
        }
    }

    /// An EOE of `epoch` from `link.writer`.
    pub fn on_eoe(&mut self, epoch: u64, link: Link) {
        self.observe_writer(link.writer);
        if let Some(c) = &mut self.collecting {
            if c.epoch == epoch {
                c.eoes.insert(link.writer, link);
            }
        }
    }

    /// A SYNC of `epoch` was applied (ours or another coordinator's).
    pub fn on_sync(&mut self, epoch: u64, now: u64) {
        if epoch > self.epoch {
            self.epoch = epoch;
        }
        self.last_sync_at = now;
        if epoch_term(epoch) > self.term && self.active {
            tracing::info!(
                rank = self.cfg.rank,
                term = self.term,
                new_term = epoch_term(epoch),
                "coordinator steps down"
            );
            self.active = false;
            self.collecting = None;
        }
        self.term = self.term.max(epoch_term(epoch));
        if let Some(c) = &self.collecting {
            if c.epoch <= self.epoch && c.epoch != epoch {
                // Someone else closed a newer epoch while we were collecting.
                self.collecting = None;
            }
        }
    }

    fn next_epoch(&self) -> u64 {
        let counter = (self.epoch & 0xffff_ffff) + 1;
        (self.term << 32) | counter
    }

    /// Time passes. `heads` gives the newest applied record of every writer.
    ///
    /// `links_max` bounds the SYNC's links (the capsule's `links_per_record_max`): writers that
    /// answered come first, then the others by how recently they answered.
    pub fn tick(&mut self, now: u64, heads: &BTreeMap<u32, Link>, links_max: usize) -> Vec<CoordinatorAction> {
        let mut out = Vec::new();
        if !self.active {
            if self.cfg.rank > 0 && now >= self.takeover_at() {
                let silent = now.saturating_sub(self.last_sync_at);
                let ranks = self.cfg.ranks.max(1) as u64;
                let mut t = self.term + 1;
                while t % ranks != self.cfg.rank as u64 % ranks {
                    t += 1;
                }
                tracing::warn!(rank = self.cfg.rank, term = t, silent_ms = silent, "shadow coordinator takes over");
                self.term = t;
                self.active = true;
                self.next_rts_at = now;
                self.busy_since.get_or_insert(now);
            } else {
                return out;
            }
        }
        if let Some(c) = &self.collecting {
            let all = self
                .writers
                .iter()
                .filter(|(_, missed)| **missed < self.cfg.missed_eoe_max)
                .all(|(w, _)| c.eoes.contains_key(w));
            if all || now >= c.deadline {
                let c = self.collecting.take().expect("checked above");
                for (w, missed) in self.writers.iter_mut() {
                    if c.eoes.contains_key(w) {
                        *missed = 0;
                    } else {
                        *missed = missed.saturating_add(1);
                    }
                }
                // A writer silent for many epochs (a crashed incarnation) has had its newest
                // record linked by earlier SYNCs; stop carrying it.
                let forget = self.cfg.missed_eoe_max.saturating_mul(4).max(8);
                self.writers.retain(|_, missed| *missed < forget);
                let mut order: Vec<(u32, u32)> = self.writers.iter().map(|(w, m)| (*m, *w)).collect();
                order.sort();
                let mut links: Vec<Link> = order
                    .into_iter()
                    .filter_map(|(_, w)| c.eoes.get(&w).or_else(|| heads.get(&w)).copied())
                    .take(links_max)
                    .collect();
                links.sort_by_key(|l| l.writer);
                out.push(CoordinatorAction::WriteSync { epoch: c.epoch, heads: links });
                self.epoch = self.epoch.max(c.epoch);
                self.next_rts_at = now + self.cfg.epoch_ms;
                self.idle_rts_at = now + self.idle_ms();
            }
        } else if now >= self.rts_due_at() && self.hold_from.is_none_or(|h| self.next_epoch() < h) {
            let epoch = self.next_epoch();
            // What happens from here on needs the next epoch.
            self.busy_since = None;
            self.collecting =
                Some(Collecting { epoch, deadline: now + self.cfg.eoe_timeout_ms, eoes: BTreeMap::new() });
            out.push(CoordinatorAction::WriteRts { epoch });
        }
        out
    }

    /// Forgets everything but the configuration.
    pub fn reset(&mut self, now: u64) {
        *self = CoordinatorSm::new(self.cfg, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_stops_the_epoch_clock_before_the_rotation_epoch() {
        let cfg =
            CoordinatorConfig { epoch_ms: 10, epoch_idle_ms: 10, eoe_timeout_ms: 5, ..CoordinatorConfig::default() };
        let mut c = CoordinatorSm::new(cfg, 0);
        let heads = BTreeMap::new();
        c.hold_from(Some(2));
        let mut epochs = Vec::new();
        for t in (0..200).step_by(5) {
            for a in c.tick(t, &heads, 16) {
                if let CoordinatorAction::WriteSync { epoch, .. } = a {
                    c.on_sync(epoch, t);
                    epochs.push(epoch);
                }
            }
        }
        assert_eq!(epochs, vec![1], "epoch 2 needs the rotated key");
        c.hold_from(None);
        for t in (200..260).step_by(5) {
            for a in c.tick(t, &heads, 16) {
                if let CoordinatorAction::WriteSync { epoch, .. } = a {
                    c.on_sync(epoch, t);
                    epochs.push(epoch);
                }
            }
        }
        assert!(epochs.len() > 2 && epochs[1] == 2, "{epochs:?}");
    }

    /// Drives `c` from `from` to `to` (ms, step 5), applying its own SYNCs and the RTSs of
    /// `rts_seen_by` (passive peers); returns the epochs closed.
    fn run(c: &mut CoordinatorSm, from: u64, to: u64, activity: &[u64]) -> Vec<(u64, u64)> {
        let heads = BTreeMap::new();
        let mut closed = Vec::new();
        for t in (from..to).step_by(5) {
            if activity.contains(&t) {
                c.on_activity(t);
            }
            for a in c.tick(t, &heads, 16) {
                if let CoordinatorAction::WriteSync { epoch, .. } = a {
                    c.on_sync(epoch, t);
                    closed.push((t, epoch));
                }
            }
        }
        closed
    }

    #[test]
    fn an_idle_capsule_closes_epochs_at_the_idle_pace_and_activity_brings_the_busy_pace_back() {
        let cfg = CoordinatorConfig { epoch_ms: 100, epoch_idle_ms: 2_000, eoe_timeout_ms: 20, ..Default::default() };
        let mut c = CoordinatorSm::new(cfg, 0);
        // Busy at the start: the first epoch closes after epoch_ms (+ the EOE wait: no writers).
        let first = run(&mut c, 0, 10_000, &[]);
        assert!(first[0].0 <= 130, "{first:?}");
        // Then idle: one epoch per epoch_idle_ms.
        let gaps: Vec<u64> = first.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(gaps.iter().all(|g| (2_000..=2_050).contains(g)), "{gaps:?}");
        // A write in the middle of an idle wait: its SYNC follows within epoch_ms + the EOE
        // wait, not at the end of the idle epoch.
        let write_at = 10_500;
        let after = run(&mut c, 10_000, 20_000, &[write_at - (write_at % 5)]);
        let sync = after.iter().find(|(t, _)| *t >= write_at).unwrap().0;
        assert!(sync - write_at <= 60, "the write waited {} ms for its SYNC", sync - write_at);
        // Activity while an epoch is open makes the next one busy too.
        let mut c = CoordinatorSm::new(cfg, 0);
        let heads = BTreeMap::new();
        assert!(c.tick(100, &heads, 16).iter().any(|a| matches!(a, CoordinatorAction::WriteRts { .. })));
        c.on_activity(105);
        let closed = run(&mut c, 110, 400, &[]);
        assert!(closed.len() >= 2 && closed[1].0 - closed[0].0 <= 150, "{closed:?}");
    }

    #[test]
    fn a_shadow_waits_out_an_idle_primary_but_not_a_dead_one_that_misses_a_write() {
        let cfg = CoordinatorConfig {
            epoch_ms: 100,
            epoch_idle_ms: 2_000,
            eoe_timeout_ms: 20,
            rank: 1,
            ..Default::default()
        };
        let heads = BTreeMap::new();
        let takes_over = |c: &mut CoordinatorSm, t: u64| {
            c.tick(t, &heads, 16).iter().any(|a| matches!(a, CoordinatorAction::WriteRts { .. }))
        };
        // A live, idle primary: an RTS and a SYNC every 2 s. The shadow never takes over.
        let mut s = CoordinatorSm::new(cfg, 0);
        s.on_rts();
        s.on_sync(1, 120);
        for t in (120..20_000).step_by(5) {
            if t % 2_000 == 100 {
                s.on_rts();
            }
            if t % 2_000 == 120 {
                s.on_sync((t / 2_000) + 2, t);
            }
            assert!(!takes_over(&mut s, t), "took over an idle primary at {t}");
        }
        // The primary died idle: nobody cares until someone writes; then the shadow takes over
        // after its patience (2 × 5 epochs of 100 ms), counted from the write.
        let mut s = CoordinatorSm::new(cfg, 0);
        s.on_rts();
        s.on_sync(1, 120);
        assert_eq!(s.next_due(), Some(120 + 2_000 + 1_000));
        s.on_activity(700);
        assert_eq!(s.next_due(), Some(700 + 1_000));
        assert!(!takes_over(&mut s, 1_695));
        assert!(takes_over(&mut s, 1_700));
        assert!(s.is_active());
        // With no write at all, it takes over after the idle epoch and its patience.
        let mut s = CoordinatorSm::new(cfg, 0);
        s.on_rts();
        s.on_sync(1, 120);
        assert!(!takes_over(&mut s, 3_115));
        assert!(takes_over(&mut s, 3_120));
    }

    #[test]
    fn an_epoch_something_takes_effect_at_comes_at_the_busy_pace() {
        let cfg = CoordinatorConfig { epoch_ms: 100, epoch_idle_ms: 10_000, eoe_timeout_ms: 20, ..Default::default() };
        let mut c = CoordinatorSm::new(cfg, 0);
        // Idle after the first epoch.
        let closed = run(&mut c, 0, 5_000, &[]);
        assert_eq!(closed.len(), 1, "{closed:?}");
        // A revocation from epoch 4 on: epochs 2, 3 and 4 come at the busy pace, then idle again.
        c.keep_busy_until(4 + 1);
        assert!(c.is_busy());
        let closed = run(&mut c, 5_000, 9_000, &[]);
        let epochs: Vec<u64> = closed.iter().map(|(_, e)| *e).collect();
        assert_eq!(epochs, vec![2, 3, 4, 5], "{closed:?}");
        assert!(closed.last().unwrap().0 < 5_600, "{closed:?}");
        assert!(!c.is_busy());
    }
}
