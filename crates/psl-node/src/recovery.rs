//! Recovery of a node that restarts empty: its memtable is rebuilt from the capsule servers
//! (not from peers), over their read interface (`psl_server::read`), before it rejoins.
//!
//! 1. [`fetch`] reads the whole capsule from a majority of the servers whose copies are fresh
//!    and agree (`psl_server::read::fetch_quorum_within`: each holds every record the newest
//!    verified SYNC any server offers links, proved by serving them; a withholding or lying
//!    server is skipped) and takes the union. It waits, bounded ([`Patience`]) and logging
//!    each retry, while fewer than a majority are fresh: a server one SYNC behind under a fast
//!    epoch clock, or one that was just restarted and is catching up by anti-entropy, becomes
//!    fresh within moments, and giving up at once would lose the node for nothing.
//! 2. [`next_incarnation_above`] picks an incarnation above every one of this node id that the
//!    servers have seen, so the restarted node never re-signs a (writer, seq) slot that an
//!    acknowledged record occupies.
//! 3. [`Preloaded`] wraps the node's fabric: the recovered records come out of it first, as
//!    ordinary record messages, so the node's own verify → order → apply path takes them (the
//!    fetcher is host side and not trusted: the core re-verifies everything).
//! 4. The caller waits ([`wait_applied`]) until the node applied them before it serves clients,
//!    so the Lamport clock is past every recovered write before the first new one.
//!
//! Why nothing acknowledged is lost or applied twice: an acknowledged write is on `f + 1`
//! servers, and the `f + 1` copies read overlap them in at least one, whichever round of the
//! wait each copy was read in (a server never loses what it fsync'd; the freshness check
//! additionally rejects copies that lack a record the newest SYNC links); applying is last-writer-wins by
//! version and duplicates are dropped by hash, so a record that arrives again (from the fetch
//! and later from a peer) changes nothing; and new writes use a new incarnation.

use bytes::Bytes;
use psl_capsule::{SignedMetadata, Verifier};
use psl_fabric::{Fabric, FabricError, FabricStats, Message};
use psl_scl::{Metrics, Msg};
pub use psl_server::read::Patience;
use psl_server::read::{fetch_quorum_within, ReadError};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the servers gave back.
#[derive(Debug)]
pub struct Recovery {
    /// Record messages, in chain order per writer, ready for [`Preloaded`].
    pub messages: Vec<Message>,
    /// The servers read from.
    pub servers: Vec<SocketAddr>,
    /// The servers passed over (unreachable, stale, lying), each with the last reason.
    pub skipped: Vec<(SocketAddr, String)>,
    /// The epoch of the newest SYNC known when the last copy was chosen, if any.
    pub newest_sync_epoch: Option<u64>,
    /// Rounds the fetch took (1: enough servers were fresh at once).
    pub rounds: u32,
    /// Highest incarnation of `node_id` found among the records, if any.
    pub incarnation_seen: Option<u32>,
}

/// Reads the capsule from the servers (see the module docs): the union of `need` fresh copies
/// (f + 1 of the deployment's 2f + 1 servers: [`quorum`]), so that every acknowledged write is
/// in it, waiting for them as `patience` allows. `node_id` is this node's id.
pub fn fetch(
    servers: &[SocketAddr],
    meta: &SignedMetadata,
    node_id: u32,
    need: usize,
    patience: Patience,
) -> Result<Recovery, ReadError> {
    let v = Verifier::new(meta.clone(), None);
    let got = fetch_quorum_within(servers, &v, None, need, patience)?;
    let capsule = meta.name();
    let mut incarnation_seen: Option<u32> = None;
    let mut messages = Vec::with_capacity(got.records.len());
    for r in &got.records {
        let w = r.header().writer;
        if w >> 16 == node_id {
            let inc = (w >> 4) & 0xfff;
            incarnation_seen = Some(incarnation_seen.map_or(inc, |i| i.max(inc)));
        }
        messages.push(Bytes::from(Msg::Record { capsule, bytes: r.shared_bytes() }.encode()));
    }
    Ok(Recovery {
        messages,
        servers: got.servers,
        skipped: got.skipped,
        newest_sync_epoch: got.newest_sync_epoch,
        rounds: got.rounds,
        incarnation_seen,
    })
}

/// Copies a recovery needs: a majority (f + 1) of the deployment's `n` servers, or of the
/// addresses listed when `n` is not known (0). Listing fewer servers than the deployment has
/// never lowers it: f + 1 copies are what overlap every write's f + 1 acks.
pub fn quorum(n: u32, listed: usize) -> usize {
    if n > 0 {
        n as usize / 2 + 1
    } else {
        listed / 2 + 1
    }
}

/// The incarnation to start with: above `from_state` (the local counter, if any) and above
/// every incarnation the servers hold records of.
pub fn next_incarnation_above(from_state: Option<u32>, seen: Option<u32>) -> u32 {
    match (from_state, seen) {
        (Some(s), Some(x)) => s.max(x + 1),
        (Some(s), None) => s,
        (None, Some(x)) => x + 1,
        (None, None) => 0,
    }
}

/// A fabric that hands out `first` before anything the inner fabric received.
pub struct Preloaded {
    first: Mutex<VecDeque<Message>>,
    inner: Arc<dyn Fabric>,
}

impl Preloaded {
    /// Wraps `inner`; `first` is handed out, in order, before anything `inner` receives.
    pub fn new(inner: Arc<dyn Fabric>, first: Vec<Message>) -> Preloaded {
        Preloaded { first: Mutex::new(first.into()), inner }
    }

    fn pop(&self) -> Option<Message> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }

    /// Messages not handed out yet.
    pub fn left(&self) -> usize {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Fabric for Preloaded {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        self.inner.publish(msg)
    }
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        match self.pop() {
            Some(m) => Ok(Some(m)),
            None => self.inner.recv_timeout(timeout),
        }
    }
    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        match self.pop() {
            Some(m) => Ok(Some(m)),
            None => self.inner.try_recv(),
        }
    }
    fn stats(&self) -> FabricStats {
        self.inner.stats()
    }
}

/// Waits (bounded) until the preloaded messages are handed out and the node applied at least
/// `records` records. Returns false on timeout.
pub fn wait_applied(pre: &Preloaded, metrics: &Metrics, records: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while pre.left() > 0 || Metrics::get(&metrics.records_applied) < records {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_is_a_majority_of_the_deployment() {
        assert_eq!(quorum(3, 3), 2);
        assert_eq!(quorum(3, 2), 2, "listing two of three servers still needs two copies");
        assert_eq!(quorum(3, 1), 2);
        assert_eq!(quorum(5, 5), 3);
        assert_eq!(quorum(0, 3), 2);
        assert_eq!(quorum(0, 1), 1);
    }

    #[test]
    fn incarnation_is_above_state_and_servers() {
        assert_eq!(next_incarnation_above(None, None), 0);
        assert_eq!(next_incarnation_above(Some(3), None), 3);
        assert_eq!(next_incarnation_above(None, Some(4)), 5);
        assert_eq!(next_incarnation_above(Some(3), Some(4)), 5);
        assert_eq!(next_incarnation_above(Some(9), Some(4)), 9);
    }
}
