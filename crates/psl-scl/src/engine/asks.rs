//! [`Asks`]: a node's reads that its memtable could not answer and that went to CapsuleDB, from
//! the request to the answer its caller takes. CapsuleDB's answer is an engine event
//! ([`Asks::answer`]), taken in by the write path's rule ([`super::write::learn`]: the clock
//! passes the answer's version before the memtable shows it); [`ask_step`] is the caller's
//! policy while it waits (wait, ask again, give up).
//!
//! An answer is used only for a request still pending *for that exact key*, so an old answer
//! the fabric replays changes nothing; the first good answer for a key settles every request
//! of this node for it (it is fresh for all of them: [`super::write::learn`] refused it if it
//! was older than what the node evicted). At most [`ASKS_MAX`] requests wait at once.
//!
//! It holds no lock and does no I/O, and checks no signature: the runtime verifies CapsuleDB's
//! signature and every record an answer carries (`crate::dbwire::RecordCheck`) before it
//! hands an entry in, and keeps the table under a mutex its readers' threads share. The
//! simulator asks and answers through the same table.

use super::write;
use crate::memtable::{Memtable, Version};
use crate::LamportClock;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Most requests to CapsuleDB one node has waiting at once; a read beyond it fails at once
/// ([`AsksFull`]) rather than grow the table without bound.
pub const ASKS_MAX: usize = 65_536;

/// What CapsuleDB answered for a key: its newest version and value (`None`: a tombstone), or
/// `None` for a key never written.
pub type Answered = Option<(Version, Option<Arc<[u8]>>)>;

/// A request refused because [`ASKS_MAX`] are already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{ASKS_MAX} reads are already waiting for CapsuleDB on this node: refused, nothing was sent")]
pub struct AsksFull;

/// What one answered entry did ([`Asks::answer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// No request of this node named by the answer is pending for this key: ignored.
    NotAsked,
    /// Older than the frontier this node evicted under ([`Memtable::learn`]): refused; the
    /// waiters ask again.
    Stale,
    /// Taken in: the memtable learnt it, and this many requests for the key are answered.
    Settled(usize),
}

/// A node's requests to CapsuleDB waiting for an answer, and answers waiting for their caller.
#[derive(Debug, Default)]
pub struct Asks {
    /// Request id -> key, for requests still waiting.
    pending: FxHashMap<u64, Arc<[u8]>>,
    /// Request id -> what CapsuleDB answered, until its caller takes it.
    done: FxHashMap<u64, Answered>,
}

impl Asks {
    /// An empty table.
    pub fn new() -> Asks {
        Asks::default()
    }

    /// Registers request `req_id` (the caller's random id) for `key`.
    pub fn ask(&mut self, req_id: u64, key: &[u8]) -> Result<(), AsksFull> {
        if self.pending.len() + self.done.len() >= ASKS_MAX {
            return Err(AsksFull);
        }
        self.pending.insert(req_id, key.into());
        Ok(())
    }

    /// Whether request `req_id` still waits.
    pub fn is_pending(&self, req_id: u64) -> bool {
        self.pending.contains_key(&req_id)
    }

    /// Whether any of `req_ids` still waits (an answer worth verifying).
    pub fn any_pending(&self, req_ids: &[u64]) -> bool {
        req_ids.iter().any(|r| self.pending.contains_key(r))
    }

    /// Whether one of `req_ids` waits for exactly `key` (an entry worth checking).
    pub fn wants(&self, req_ids: &[u64], key: &[u8]) -> bool {
        req_ids.iter().any(|r| self.pending.get(r).is_some_and(|k| **k == *key))
    }

    /// CapsuleDB's verified answer `found` for `key`, to the requests `req_ids`, read at its
    /// index seq `index_seq`: learnt by `memtable` through the clock, and every request of
    /// this node for the key answered by it.
    pub fn answer(
        &mut self,
        req_ids: &[u64],
        key: &[u8],
        found: Answered,
        index_seq: u64,
        memtable: &Memtable,
        clock: &LamportClock,
    ) -> Answer {
        if !self.wants(req_ids, key) {
            return Answer::NotAsked;
        }
        if write::learn(memtable, clock, key, found.clone(), index_seq).is_none() {
            return Answer::Stale;
        }
        let mut settled = 0;
        let done = &mut self.done;
        self.pending.retain(|r, k| {
            if **k == *key {
                done.insert(*r, found.clone());
                settled += 1;
                false
            } else {
                true
            }
        });
        Answer::Settled(settled)
    }

    /// The answer to `req_id`, once it came (taken once).
    pub fn take(&mut self, req_id: u64) -> Option<Answered> {
        self.done.remove(&req_id)
    }

    /// Drops request `req_id` and any answer it has (its caller gave up or asks again).
    pub fn forget(&mut self, req_id: u64) {
        self.pending.remove(&req_id);
        self.done.remove(&req_id);
    }

    /// Requests waiting and answers not yet taken.
    pub fn len(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a caller waiting for CapsuleDB does next ([`ask_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskStep {
    /// Keep waiting for the answer, at most until this time.
    WaitUntil(u64),
    /// No answer by the resend time: ask again (a new request), unless the deadline comes
    /// first.
    AskAgain,
    /// The deadline passed with no answer: fail the read.
    GiveUp,
}

/// The policy of a read waiting for CapsuleDB at `now`, for a request sent at `sent_at`, asked
/// again every `retry` until `deadline` (any one unit of time, the caller's).
pub fn ask_step(now: u64, sent_at: u64, retry: u64, deadline: u64) -> AskStep {
    if now >= deadline {
        return AskStep::GiveUp;
    }
    let resend = sent_at.saturating_add(retry).min(deadline);
    if now >= resend {
        AskStep::AskAgain
    } else {
        AskStep::WaitUntil(resend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(lamport: u64) -> Version {
        Version { lamport, writer: 3 }
    }

    #[test]
    fn an_answer_settles_every_request_for_its_key_and_only_those() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let mut a = Asks::new();
        a.ask(1, b"k").expect("room");
        a.ask(2, b"k").expect("room");
        a.ask(3, b"other").expect("room");
        let found: Answered = Some((v(40), Some(Arc::from(&b"x"[..]))));
        // An answer naming request 3 for key k: 3 asked for another key.
        assert_eq!(a.answer(&[3], b"k", found.clone(), 0, &m, &c), Answer::NotAsked);
        assert_eq!(a.answer(&[1], b"k", found.clone(), 0, &m, &c), Answer::Settled(2));
        assert!(c.now() >= 40, "the clock passed the answer's version");
        assert_eq!(m.entry(b"k").map(|e| e.version), Some(v(40)));
        assert_eq!(a.take(2), Some(found.clone()), "request 2 is answered too");
        assert_eq!(a.take(2), None, "taken once");
        assert!(a.is_pending(3) && !a.is_pending(1));
        // The same answer replayed: no request waits for it any more.
        assert_eq!(a.answer(&[1, 2], b"k", found, 0, &m, &c), Answer::NotAsked);
        a.forget(1);
        a.forget(3);
        assert!(a.is_empty());
    }

    #[test]
    fn an_answer_older_than_the_evicted_frontier_is_refused_and_the_request_waits() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        // The node evicted k under CapsuleDB's frontier at its index seq 10.
        assert!(m.apply(b"k", v(5), Some(Arc::from(&b"x"[..]))));
        m.raise_floor(&[(3, 5)], 10);
        assert_eq!(m.evict_key(b"k"), crate::memtable::EvictKey::Evicted);
        let mut a = Asks::new();
        a.ask(1, b"k").expect("room");
        let found: Answered = Some((v(5), Some(Arc::from(&b"x"[..]))));
        assert_eq!(a.answer(&[1], b"k", found.clone(), 9, &m, &c), Answer::Stale);
        assert!(a.is_pending(1));
        assert_eq!(a.answer(&[1], b"k", found, 10, &m, &c), Answer::Settled(1));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut a = Asks::new();
        for r in 0..ASKS_MAX as u64 {
            a.ask(r, b"k").expect("room");
        }
        assert_eq!(a.ask(u64::MAX, b"k"), Err(AsksFull));
        a.forget(0);
        assert!(a.ask(u64::MAX, b"k").is_ok());
    }

    #[test]
    fn a_reader_waits_asks_again_and_gives_up_at_its_deadline() {
        assert_eq!(ask_step(0, 0, 100, 250), AskStep::WaitUntil(100));
        assert_eq!(ask_step(100, 0, 100, 250), AskStep::AskAgain);
        assert_eq!(ask_step(220, 200, 100, 250), AskStep::WaitUntil(250), "the deadline caps the wait");
        assert_eq!(ask_step(250, 200, 100, 250), AskStep::GiveUp);
    }
}
