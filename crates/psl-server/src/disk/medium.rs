//! The medium under a capsule server: the [`Disk`] trait (write, then sync), the real
//! store's implementation of it, the [`Synced`] proof that only this layer's sync path makes,
//! and the [`FsyncPolicy`]. Below the server core: the core names `Synced` and never imports
//! the commit path that drives it (`disk`).

use psl_capsule::{Record, Verified};
use psl_crypto::Hash256;
use psl_store::DiskStore;
use std::collections::BTreeMap;

/// Proof that a batch is durable: [`Disk::sync`] returned `Ok` after the [`Disk::write`] that
/// put it down, so it survives a crash. A capsule server's ack says exactly that, so building
/// one needs this proof (`ServerCore::on_synced` takes it by value; re-acks borrow the newest).
///
/// Only the disk layer makes one: its field is private, it has no public constructor, and it
/// is made only by this module's sync path, right after the medium's sync returned `Ok` (the
/// commit path, `disk::commit_synced`, runs it). It is neither `Clone` nor `Default`. Outside
/// the disk layer it cannot be made:
///
/// ```compile_fail,E0451
/// let forged = psl_server::disk::Synced { _durable: () };
/// ```
///
/// ```compile_fail,E0277
/// let forged: psl_server::disk::Synced = Default::default();
/// ```
#[derive(Debug)]
pub struct Synced {
    _durable: (),
}

/// The disk layer's sync path, for every [`Disk`]: the medium's `sync`, then the proof. Each
/// backend's `sync` is its durability point: the real store's fsync (in its `append`, see
/// `impl Disk for DiskStore`), or the simulator's disk moving what was written out of the
/// cache a crash empties.
pub(super) fn sync(disk: &mut dyn Disk) -> Result<Synced, String> {
    disk.sync()?;
    Ok(Synced { _durable: () })
}

/// What a capsule server needs from its storage. Everything returned is durable (synced),
/// except what [`Disk::write`] put there since the last [`Disk::sync`].
pub trait Disk {
    /// Writes a batch (in chain order per writer) without making it durable. Returns the
    /// number of records taken (new plus already stored).
    fn write(&mut self, batch: &[Verified<Record>]) -> Result<usize, String>;
    /// Makes everything written so far durable.
    fn sync(&mut self) -> Result<(), String>;
    /// Each writer's chain length and newest epoch (what is stored in chain order from seq 0).
    fn heads(&self) -> BTreeMap<u32, (u64, u64)>;
    /// Writer `writer`'s chain length (its next seq) and the hashes of its newest `n` records,
    /// oldest first (all of them if the chain is shorter; `n = usize::MAX` asks for the whole
    /// chain): what a server's orderer keeps of it at start (`ServerCore::adopt_tail_len`).
    fn chain_tail(&self, writer: u32, n: usize) -> Result<(u64, Vec<Hash256>), String>;
    /// Writer `writer`'s records `from_seq ..= to_seq` (re-verified where the medium can rot).
    fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String>;
    /// The SYNC of the highest epoch stored.
    fn latest_sync(&self) -> Result<Option<Verified<Record>>, String>;
}

/// The real disk: `DiskStore::append` writes and fsyncs in one call (one write, one fsync per
/// batch), so `write` is already durable when it returns and `sync` has nothing left to do but
/// check that the store has not failed since (a [`Synced`] is made after both returned `Ok`).
impl Disk for DiskStore {
    fn write(&mut self, batch: &[Verified<Record>]) -> Result<usize, String> {
        self.append(batch).map(|o| o.appended + o.duplicates).map_err(|e| e.to_string())
    }
    fn sync(&mut self) -> Result<(), String> {
        self.writable().map_err(|e| e.to_string())
    }
    fn heads(&self) -> BTreeMap<u32, (u64, u64)> {
        DiskStore::heads(self).into_iter().map(|(w, h)| (w, (h.seq + 1, h.epoch))).collect()
    }
    fn chain_tail(&self, writer: u32, n: usize) -> Result<(u64, Vec<Hash256>), String> {
        DiskStore::chain_tail(self, writer, n).map_err(|e| e.to_string())
    }
    fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String> {
        DiskStore::range(self, writer, from_seq, to_seq.saturating_add(1)).map_err(|e| e.to_string())
    }
    fn latest_sync(&self) -> Result<Option<Verified<Record>>, String> {
        DiskStore::latest_sync(self).map_err(|e| e.to_string())
    }
}

/// How a server makes batches durable. Every policy acks a record only after the fsync that
/// covers it; they trade latency against the number of fsyncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// One record per write + fsync. Lowest latency for a single idle writer, lowest throughput:
    /// every record pays a whole fsync.
    Always,
    /// Group commit (default): whatever arrived while the previous fsync ran goes into the next
    /// one (up to the batch bound). Throughput grows with load; latency is about one fsync.
    Group,
    /// Group commit at most every N ms: fewer, larger fsyncs (less disk wear, more throughput on
    /// slow disks), at up to N ms more ack latency; more unacked records are lost on a crash
    /// (they are fetched again from peers and nodes by anti-entropy).
    IntervalMs(u64),
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "group" => Ok(FsyncPolicy::Group),
            other => match other.strip_prefix("interval-ms=").or_else(|| other.strip_prefix("interval-ms:")) {
                Some(n) => n
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .map(FsyncPolicy::IntervalMs)
                    .ok_or_else(|| format!("interval-ms wants 1 to 10000 ms, got {n:?}")),
                None => Err(format!("unknown fsync policy {other:?}: use always, group or interval-ms=N")),
            },
        }
    }
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::Always => write!(f, "always"),
            FsyncPolicy::Group => write!(f, "group"),
            FsyncPolicy::IntervalMs(n) => write!(f, "interval-ms={n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_policies_parse_and_print() {
        for s in ["always", "group", "interval-ms=5"] {
            let p: FsyncPolicy = s.parse().expect("valid");
            assert_eq!(p.to_string(), s);
        }
        assert_eq!("interval-ms:7".parse::<FsyncPolicy>(), Ok(FsyncPolicy::IntervalMs(7)));
        assert!("interval-ms=0".parse::<FsyncPolicy>().is_err());
        assert!("never".parse::<FsyncPolicy>().is_err());
    }
}
