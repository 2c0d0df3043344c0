//! The coordinator's epoch state machine.
//!
//! Every `epoch_ms` the active coordinator writes an RTS (ready-to-sync) control record for
//! the next epoch `e`; every data writer answers with an EOE (end-of-epoch) control record,
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

use psl_capsule::Link;
use std::collections::BTreeMap;

/// The coordinator's timing and rank settings (times in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Epoch length in ms: the next RTS is due this long after its previous SYNC (or its start).
    pub epoch_ms: u64,
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
            eoe_timeout_ms: 300,
            takeover_after_epochs: 5,
            rank: 0,
            ranks: 3,
            missed_eoe_max: 3,
        }
    }
}

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
    next_rts_at: u64,
    last_sync_at: u64,
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
            last_sync_at: now,
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
            let silent = now.saturating_sub(self.last_sync_at);
            let patience = self.cfg.takeover_after_epochs * self.cfg.epoch_ms * (1 + self.cfg.rank as u64);
            if self.cfg.rank > 0 && silent >= patience {
                let ranks = self.cfg.ranks.max(1) as u64;
                let mut t = self.term + 1;
                while t % ranks != self.cfg.rank as u64 % ranks {
                    t += 1;
                }
                tracing::warn!(rank = self.cfg.rank, term = t, silent_ms = silent, "shadow coordinator takes over");
                self.term = t;
                self.active = true;
                self.next_rts_at = now;
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
            }
        } else if now >= self.next_rts_at && self.hold_from.is_none_or(|h| self.next_epoch() < h) {
            let epoch = self.next_epoch();
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
        let cfg = CoordinatorConfig { epoch_ms: 10, eoe_timeout_ms: 5, ..CoordinatorConfig::default() };
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
}
