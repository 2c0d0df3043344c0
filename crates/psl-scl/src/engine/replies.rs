//! The engine's side of the runtime's waiting callers: `sync()` and durable-sync barriers with
//! their deadlines, answered as [`Command::SyncAnswer`] and [`Command::DurableAnswer`], and the
//! own writers' flow windows, told what paces them at every tick and woken with
//! [`Command::WakeWriter`] when that moved. The runtime keeps only the reply channels (by
//! ticket) and the condition variables it notifies.

use super::{Command, NodeEngine};
use crate::window::Window;
use crate::{DurableTicket, SyncTicket};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most callers waiting on barriers at once; a barrier begun beyond it is answered at once as
/// not done (its caller sees a failed sync, never a false success).
pub const WAITERS_MAX: usize = 4096;

/// A writer's records this many windows behind the writer's newest stop pacing it (a peer that
/// far behind catches up by repair); within it a peer may lag one window before it slows it.
const PEER_LAG_WINDOWS_MAX: u64 = 64;

/// The barriers waited on and the windows paced.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    /// `sync()` callers: ticket, barrier, deadline (ms).
    syncs: Vec<(u64, SyncTicket, u64)>,
    /// Durable-sync callers: ticket, barrier, deadline (ms).
    durables: Vec<(u64, DurableTicket, u64)>,
    next_ticket: u64,
    /// The own writers' flow windows, shared with the runtime's `put`s and writer actors.
    windows: Vec<(u32, Arc<Window>)>,
}

impl NodeEngine {
    /// A caller waits for a `sync()` barrier ([`crate::NodeCore::begin_sync`]) until
    /// `deadline_ms`: returns its ticket, which a [`Command::SyncAnswer`] names once it is done
    /// or its deadline passed.
    pub fn begin_sync(&mut self, next_seqs: BTreeMap<u32, u64>, deadline_ms: u64) -> u64 {
        let ticket = self.next_ticket();
        if self.waiters.syncs.len() >= WAITERS_MAX {
            self.commands.push_back(Command::SyncAnswer { ticket, done: false });
        } else {
            let t = self.core.begin_sync(next_seqs);
            self.waiters.syncs.push((ticket, t, deadline_ms));
        }
        ticket
    }

    /// A caller waits for a durability barrier ([`crate::NodeCore::begin_durable`]) until
    /// `deadline_ms`: returns its ticket, which a [`Command::DurableAnswer`] names with the
    /// quorum's proof, or with where the barrier stood at the deadline.
    pub fn begin_durable(&mut self, next_seqs: BTreeMap<u32, u64>, deadline_ms: u64) -> u64 {
        let ticket = self.next_ticket();
        let t = self.core.begin_durable(next_seqs);
        if self.waiters.durables.len() >= WAITERS_MAX {
            let status = self.core.durable_status(&t);
            self.core.end_durable(&t);
            self.commands.push_back(Command::DurableAnswer { ticket, result: Err(status) });
        } else {
            self.waiters.durables.push((ticket, t, deadline_ms));
        }
        ticket
    }

    fn next_ticket(&mut self) -> u64 {
        let t = self.waiters.next_ticket;
        self.waiters.next_ticket += 1;
        t
    }

    /// Answers every barrier that is done, and every one whose deadline is at or before
    /// `now_ms` (a durable one with where it stood). The runtime calls it after each event.
    pub fn answer_waiters(&mut self, now_ms: u64) {
        let Self { core, waiters, commands, .. } = self;
        waiters.durables.retain(|(ticket, t, deadline)| {
            let result = match core.durable_proof(t) {
                Ok(proof) => Ok(proof),
                Err(status) if now_ms >= *deadline => Err(status),
                Err(_) => return true,
            };
            core.end_durable(t);
            commands.push_back(Command::DurableAnswer { ticket: *ticket, result });
            false
        });
        waiters.syncs.retain(|(ticket, t, deadline)| {
            let done = core.sync_done(t);
            if !done && now_ms < *deadline {
                return true;
            }
            if !done {
                core.cancel_sync(t);
            }
            commands.push_back(Command::SyncAnswer { ticket: *ticket, done });
            false
        });
    }

    /// Callers waiting on barriers.
    pub fn waiting(&self) -> usize {
        self.waiters.syncs.len() + self.waiters.durables.len()
    }

    /// Own writer `writer`'s flow window: at every tick the engine tells it how far what
    /// paces the writer holds its records ([`crate::NodeCore::flow_next`]), and wakes the
    /// writer ([`Command::WakeWriter`]) when that moved.
    pub fn pace_writer(&mut self, writer: u32, window: Arc<Window>) {
        self.waiters.windows.retain(|(w, _)| *w != writer);
        self.waiters.windows.push((writer, window));
    }

    /// Tick step: the paced windows take what a quorum, a live CapsuleDB and the pacing peers
    /// now hold; a window that moved wakes its writer.
    /// Whether anyone waits on the engine's clock: a `sync()` or durable-sync caller, or a
    /// writer with ops outstanding in its flow window (a stalled peer stops pacing it after a
    /// time, with no message to say so).
    pub(super) fn anyone_waits(&self) -> bool {
        !self.waiters.syncs.is_empty()
            || !self.waiters.durables.is_empty()
            || self.waiters.windows.iter().any(|(_, w)| w.window_ops > 0 && w.unacked_ops() > 0)
    }

    pub(super) fn pace_windows(&mut self) {
        for (writer, w) in &self.waiters.windows {
            if w.window_ops == 0 {
                continue;
            }
            let stall_ms = w.stall.as_millis() as u64;
            let slack = w.window_records as u64;
            let next = self.core.flow_next(*writer, stall_ms, slack, PEER_LAG_WINDOWS_MAX * slack);
            if w.acked(next) {
                self.commands.push_back(Command::WakeWriter { writer: *writer });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::FlowOptions;
    use crate::{LamportClock, Memtable, Metrics, NodeConfig, NodeCore};
    use psl_capsule::{new_capsule, Author, Limits, Verifier};
    use psl_crypto::OwnerKey;
    use std::time::Duration;

    const W: u32 = 0x30000;

    fn engine(servers: u32) -> (NodeEngine, Author) {
        let owner = OwnerKey::from_seed(&[41; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "replies", 1, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let core = NodeCore::new(
            Arc::new(Verifier::new(meta.clone(), Some(app.data_key()))),
            Arc::new(Memtable::new()),
            Arc::new(LamportClock::new(0)),
            Arc::new(Metrics::default()),
            [W],
            None,
            NodeConfig { servers, ..NodeConfig::default() },
        );
        (NodeEngine::new(core, None, false), Author::new(&meta, &app, W).unwrap())
    }

    fn answers(e: &mut NodeEngine) -> Vec<Command> {
        std::iter::from_fn(|| e.next_command())
            .filter(|c| {
                matches!(c, Command::SyncAnswer { .. } | Command::DurableAnswer { .. } | Command::WakeWriter { .. })
            })
            .collect()
    }

    #[test]
    fn a_barrier_is_answered_when_done_or_at_its_deadline_never_before() {
        let (mut e, _) = engine(3);
        // Nothing to make durable: the proof is there at once.
        let now_ok = e.begin_durable(BTreeMap::new(), 100);
        // A record no server has acked: answered with its status at the deadline, not before.
        let late = e.begin_durable(BTreeMap::from([(W, 1)]), 100);
        let sync = e.begin_sync(BTreeMap::from([(W, 1)]), 100);
        e.answer_waiters(0);
        let got = answers(&mut e);
        assert!(matches!(got[..], [Command::DurableAnswer { ticket, result: Ok(_) }] if ticket == now_ok), "{got:?}");
        e.answer_waiters(99);
        assert!(answers(&mut e).is_empty());
        assert_eq!(e.waiting(), 2);
        e.answer_waiters(100);
        let got = answers(&mut e);
        assert!(got.iter().any(|c| matches!(c, Command::DurableAnswer { ticket, result: Err(_) } if *ticket == late)));
        assert!(got.iter().any(|c| matches!(c, Command::SyncAnswer { ticket, done: false } if *ticket == sync)));
        assert_eq!(e.waiting(), 0);
    }

    #[test]
    fn callers_beyond_the_bound_are_answered_at_once_as_failed() {
        let (mut e, _) = engine(3);
        for _ in 0..WAITERS_MAX {
            e.begin_sync(BTreeMap::from([(W, 1)]), u64::MAX);
        }
        assert!(answers(&mut e).is_empty());
        let over = e.begin_sync(BTreeMap::from([(W, 1)]), u64::MAX);
        assert!(matches!(answers(&mut e)[..], [Command::SyncAnswer { ticket, done: false }] if ticket == over));
        assert_eq!(e.waiting(), WAITERS_MAX);
    }

    #[test]
    fn a_paced_window_takes_what_paces_its_writer_and_wakes_it_when_that_moved() {
        // No servers, no CapsuleDB, no peers: the writer's own chain paces it.
        let (mut e, mut author) = engine(0);
        let w = Arc::new(Window::new(FlowOptions { window_ops: 8, window_records: 4, stall: Duration::from_secs(1) }));
        e.pace_writer(W, w.clone());
        let r = w.reserve(3);
        let rec = author.write_ops([("a", Some("1")), ("b", Some("2")), ("c", Some("3"))]).unwrap();
        w.sealed(r, author.next_seq());
        assert_eq!(w.unacked_ops(), 3);
        e.on_local(rec, None, 3, 1);
        e.on_tick(10);
        assert!(matches!(answers(&mut e)[..], [Command::WakeWriter { writer: W }]));
        assert_eq!(w.unacked_ops(), 0);
        e.on_tick(20);
        assert!(answers(&mut e).is_empty(), "a window that did not move wakes no one");
    }
}
