//! The server's storage behind a trait, so that the seeded simulator can run the very same
//! commit path over a simulated disk that loses unsynced writes when it crashes.
//!
//! A group commit is two steps: [`Disk::write`] puts a batch on the medium (not yet durable),
//! [`Disk::sync`] makes everything written so far durable. [`commit_write`] and
//! [`commit_synced`] wrap them around [`ServerCore::take_batch`] and
//! [`ServerCore::on_persisted`]: the core hears `Ok` only after `sync` returned `Ok`, so no ack
//! precedes the fsync that covers it. The real runtime calls the two back to back
//! ([`commit_all`]); the simulator lets simulated time pass between them, and may crash the
//! server in between.

use crate::core::{Output, ServerCore};
use psl_capsule::{Record, Verified};
use psl_crypto::Hash256;
use psl_store::DiskStore;
use std::collections::BTreeMap;

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
    /// Writer `writer`'s chain hashes from seq 0.
    fn chain_hashes(&self, writer: u32) -> Vec<Hash256>;
    /// Writer `writer`'s records `from_seq ..= to_seq` (re-verified where the medium can rot).
    fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String>;
    /// The SYNC of the highest epoch stored.
    fn latest_sync(&self) -> Result<Option<Verified<Record>>, String>;
}

/// The real disk: `DiskStore::append` writes and fsyncs in one call (one write, one fsync per
/// batch), so `write` is already durable when it returns and `sync` has nothing left to do.
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
    fn chain_hashes(&self, writer: u32) -> Vec<Hash256> {
        DiskStore::chain_hashes(self, writer).to_vec()
    }
    fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String> {
        DiskStore::range(self, writer, from_seq, to_seq.saturating_add(1)).map_err(|e| e.to_string())
    }
    fn latest_sync(&self) -> Result<Option<Verified<Record>>, String> {
        DiskStore::latest_sync(self).map_err(|e| e.to_string())
    }
}

/// At start: adopt what the disk holds (it is durable by definition).
pub fn adopt(core: &mut ServerCore, disk: &dyn Disk, now: u64) {
    for (w, (_, epoch)) in disk.heads() {
        core.adopt(w, &disk.chain_hashes(w), epoch, now);
    }
    if let Ok(Some(s)) = disk.latest_sync() {
        core.adopt_sync(s.header().epoch, s.link());
    }
}

/// First half of a group commit: takes the next batch and writes it (not yet durable).
/// Returns `None` if there was nothing to commit, `Some(Ok(n))` if `n` records await the sync,
/// `Some(Err(outputs))` if the write failed (the core has been told; no ack will follow).
pub fn commit_write(core: &mut ServerCore, disk: &mut dyn Disk, now: u64) -> Option<Result<usize, Vec<Output>>> {
    let batch = core.take_batch()?;
    match disk.write(&batch) {
        Ok(n) => Some(Ok(n)),
        Err(e) => Some(Err(core.on_persisted(Err(e), now))),
    }
}

/// Second half: syncs, and only if that succeeded tells the core, which acks the batch.
pub fn commit_synced(core: &mut ServerCore, disk: &mut dyn Disk, written: usize, now: u64) -> Vec<Output> {
    let result = disk.sync().map(|()| written);
    core.on_persisted(result, now)
}

/// Every ready batch, each written and synced before its ack.
pub fn commit_all(core: &mut ServerCore, disk: &mut dyn Disk, now: u64) -> Vec<Output> {
    let mut out = Vec::new();
    while let Some(w) = commit_write(core, disk, now) {
        match w {
            Ok(n) => out.extend(commit_synced(core, disk, n, now)),
            Err(o) => out.extend(o),
        }
    }
    out
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
