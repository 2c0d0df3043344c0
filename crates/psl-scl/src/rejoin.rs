//! The rejoin handler: after a start, a node that owns a long-lived writer (a coordinator, whose
//! writer index has no incarnation) waits [`NodeConfig::rejoin_ms`](crate::NodeConfig::rejoin_ms)
//! and, if its own-chain log remembers a newest seq it signed, until it has applied its own
//! chain back through it, probing its peers meanwhile; then it resumes that chain after its
//! newest record ([`Output::Resume`](crate::Output::Resume)), never re-signing a seq. The
//! orderer and the probes stay with the [`NodeCore`](crate::NodeCore): it hands in what the
//! orderer applied and does what [`Rejoin::tick`] says.

use psl_capsule::{Head, Link, Record};

/// What a tick asks of the core, until the rejoin period is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RejoinStep {
    /// Nothing: rejoined long ago, or still waiting with no probe due.
    Idle,
    /// Still waiting: ask peers for the own writers' records.
    Probe,
    /// The rejoin period just ended: resume the own coordinator chain, if any
    /// ([`Rejoin::resume`]).
    Rejoined,
}

/// The rejoin period's clock, floor and the own coordinator chain's newest record.
#[derive(Debug)]
pub(crate) struct Rejoin {
    /// How long the period lasts at least, from the first tick.
    rejoin_ms: u64,
    /// This node's coordinator writer, if it is a coordinator.
    own_writer: Option<u32>,
    /// The newest record of the coordinator writer's chain this node applied or wrote: what
    /// a rejoin resumes from. Kept apart from the repair cache, which may have evicted it by
    /// the end of the rejoin (a bounded cache and a stream of data records).
    own_head: Option<Head>,
    /// When the first tick came (the rejoin period starts there), and whether it is over.
    started_at: Option<u64>,
    rejoined: bool,
    /// The coordinator writer's newest seq it ever signed, as its own-chain log remembers it: the
    /// rejoin period does not end before this node has applied its own chain through it.
    own_floor: Option<u64>,
    last_floor_log: u64,
    last_probe: Option<u64>,
}

impl Rejoin {
    pub(crate) fn new(rejoin_ms: u64, own_writer: Option<u32>) -> Rejoin {
        Rejoin {
            rejoin_ms,
            own_writer,
            own_head: None,
            started_at: None,
            rejoined: false,
            own_floor: None,
            last_floor_log: 0,
            last_probe: None,
        }
    }

    /// Whether the rejoin period is over (writers may write).
    pub(crate) fn rejoined(&self) -> bool {
        self.rejoined
    }

    /// The period lasts until the own coordinator chain is applied through `seq` (the highest
    /// such floor counts).
    pub(crate) fn hold_until(&mut self, seq: u64) {
        self.own_floor = Some(self.own_floor.map_or(seq, |s| s.max(seq)));
    }

    /// Notes `rec` as the newest of the coordinator's own chain, if it is of that chain.
    pub(crate) fn note_head(&mut self, rec: &Record) {
        let h = rec.header();
        if Some(h.writer) == self.own_writer && self.own_head.is_none_or(|o| h.seq > o.seq) {
            self.own_head =
                Some(Head { writer: h.writer, seq: h.seq, hash: rec.hash(), lamport: h.lamport, epoch: h.epoch });
        }
    }

    /// A tick at `now`: whether the period ends now, or a probe is due (every `retry_ms`).
    /// `applied_next` is the orderer's next seq of a writer (asked only of the own coordinator
    /// writer, once the delay is over and while a floor is set).
    pub(crate) fn tick(&mut self, now: u64, retry_ms: u64, applied_next: impl FnOnce(u32) -> u64) -> RejoinStep {
        if self.rejoined {
            return RejoinStep::Idle;
        }
        let start = *self.started_at.get_or_insert(now);
        if now.saturating_sub(start) >= self.rejoin_ms && self.own_floor_reached(now, applied_next) {
            self.rejoined = true;
            RejoinStep::Rejoined
        } else if self.last_probe.is_none_or(|t| now.saturating_sub(t) >= retry_ms) {
            self.last_probe = Some(now);
            RejoinStep::Probe
        } else {
            RejoinStep::Idle
        }
    }

    /// Whether the own coordinator chain is applied through the persisted floor (if any).
    fn own_floor_reached(&mut self, now: u64, applied_next: impl FnOnce(u32) -> u64) -> bool {
        let (Some(floor), Some(w)) = (self.own_floor, self.own_writer) else { return true };
        let next = applied_next(w);
        if next > floor {
            return true;
        }
        if now.saturating_sub(self.last_floor_log) >= 1000 {
            self.last_floor_log = now;
            tracing::info!(
                writer = w,
                applied_next_seq = next,
                persisted_seq = floor,
                "rejoin: waiting to learn the coordinator's own chain back through its persisted newest seq"
            );
        }
        false
    }

    /// Once rejoined: the head to continue the own coordinator chain after, given `applied`,
    /// the orderer's newest applied link of that chain. `None` (logged) if the noted head is not
    /// that record, which cannot happen: every record the orderer advanced over was applied or
    /// written here, and noted. Writing on would re-sign its seqs.
    pub(crate) fn resume(&self, applied: &Link) -> Option<Head> {
        match self.own_head.filter(|h| h.seq == applied.seq && h.hash == applied.hash) {
            Some(head) => {
                tracing::info!(
                    writer = applied.writer,
                    seq = applied.seq,
                    "rejoined: continuing the coordinator's chain"
                );
                Some(head)
            }
            None => {
                tracing::error!(
                    writer = applied.writer,
                    seq = applied.seq,
                    "rejoined without the head of the coordinator's own chain"
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule, Author, Limits};
    use psl_crypto::{Hash256, OwnerKey};

    #[test]
    fn without_a_delay_or_floor_the_first_tick_rejoins() {
        let mut r = Rejoin::new(0, None);
        assert!(!r.rejoined());
        assert_eq!(r.tick(5, 100, |_| panic!("no floor: the orderer is not asked")), RejoinStep::Rejoined);
        assert!(r.rejoined());
        assert_eq!(r.tick(6, 100, |_| 0), RejoinStep::Idle);
    }

    #[test]
    fn the_delay_runs_from_the_first_tick_and_probes_every_retry_meanwhile() {
        let mut r = Rejoin::new(1_000, Some(7));
        assert_eq!(r.tick(500, 100, |_| 0), RejoinStep::Probe);
        assert_eq!(r.tick(599, 100, |_| 0), RejoinStep::Idle);
        assert_eq!(r.tick(600, 100, |_| 0), RejoinStep::Probe);
        assert_eq!(r.tick(1_499, 100, |_| 0), RejoinStep::Probe);
        assert_eq!(r.tick(1_500, 100, |_| 0), RejoinStep::Rejoined);
    }

    #[test]
    fn a_floor_holds_the_period_until_the_own_chain_is_applied_through_it() {
        let mut r = Rejoin::new(0, Some(7));
        r.hold_until(4);
        r.hold_until(2);
        let mut asked = Vec::new();
        assert_eq!(
            r.tick(0, 100, |w| {
                asked.push(w);
                4
            }),
            RejoinStep::Probe,
            "seqs 0..4 applied: seq 4 is still missing"
        );
        assert_eq!(asked, vec![7], "asked of the own coordinator writer");
        assert_eq!(r.tick(100, 100, |_| 5), RejoinStep::Rejoined);
    }

    #[test]
    fn the_resumed_head_is_the_newest_own_record_noted_and_only_if_it_is_the_applied_one() {
        let owner = OwnerKey::from_seed(&[22; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "rejoin", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let cw = meta.meta.policy.coordinator_at(0).unwrap();
        let mut own = Author::new(&meta, &app, cw).unwrap();
        let mut other = Author::new(&meta, &app, 0x10000).unwrap();
        let r0 = own
            .write_control(
                psl_capsule::Body::Control { code: psl_capsule::ControlCode::Rts, payload: vec![0; 8] },
                vec![],
            )
            .unwrap();
        let r1 = own
            .write_control(
                psl_capsule::Body::Control { code: psl_capsule::ControlCode::Rts, payload: vec![1; 8] },
                vec![],
            )
            .unwrap();
        let mut r = Rejoin::new(0, Some(cw));
        r.note_head(&r1);
        r.note_head(&r0);
        r.note_head(&other.write_ops([(b"k".to_vec(), None::<Vec<u8>>)]).unwrap());
        let head = r.resume(&r1.link()).expect("the newest own record");
        assert_eq!((head.writer, head.seq, head.hash), (cw, 1, r1.hash()));
        let forged = Link { writer: cw, seq: 1, hash: Hash256([9; 32]) };
        assert_eq!(r.resume(&forged), None, "another record at that seq: no resume");
        assert_eq!(r.resume(&r0.link()), None, "an older applied head: no resume");
    }
}
