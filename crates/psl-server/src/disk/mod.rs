//! The server's storage behind a trait, so that the seeded simulator can run the very same
//! commit path over a simulated disk that loses unsynced writes when it crashes.
//!
//! A group commit is two steps: [`Disk::write`] puts a batch on the medium (not yet durable),
//! [`Disk::sync`] makes everything written so far durable. [`commit_write`] and
//! [`commit_synced`] wrap them around [`ServerCore::take_batch`] and
//! [`ServerCore::on_synced`]. Only the disk layer makes a [`Synced`] (the sync path of its
//! `medium` module), the proof `on_synced` and the server's ack builder need, and only once
//! `sync` returned `Ok`, so no ack precedes the fsync that covers it. The real runtime calls the two back to back ([`commit_all`]); the
//! simulator lets simulated time pass between them, and may crash the server in between.

pub(crate) mod medium;

use crate::core::{Output, ServerCore};
pub use medium::{Disk, FsyncPolicy, Synced};

/// At start: adopt what the disk holds (it is durable by definition): each writer's chain
/// length and its newest hashes, as many as the core's orderer keeps
/// ([`ServerCore::adopt_tail_len`]), and the newest SYNC. Fails if a chain cannot be read.
pub fn adopt(core: &mut ServerCore, disk: &dyn Disk, now: u64) -> Result<(), String> {
    let n = core.adopt_tail_len();
    for (w, (_, epoch)) in disk.heads() {
        let (next_seq, tail) = disk.chain_tail(w, n).map_err(|e| format!("writer {w}'s chain: {e}"))?;
        core.adopt(w, next_seq, &tail, epoch, now);
    }
    if let Ok(Some(s)) = disk.latest_sync() {
        core.adopt_sync(s.header().epoch, s.link());
    }
    Ok(())
}

/// First half of a group commit: takes the next batch and writes it (not yet durable).
/// Returns `None` if there was nothing to commit, `Some(Ok(n))` if `n` records await the sync,
/// `Some(Err(outputs))` if the write failed (the core has been told; no ack will follow).
/// `now` is unused (the signature matches [`commit_synced`]).
pub fn commit_write(core: &mut ServerCore, disk: &mut dyn Disk, _now: u64) -> Option<Result<usize, Vec<Output>>> {
    let batch = core.take_batch()?;
    match disk.write(&batch) {
        Ok(n) => Some(Ok(n)),
        Err(e) => Some(Err(core.on_commit_failed(e))),
    }
}

/// Second half: syncs, and only if that succeeded hands the core the [`Synced`] proof, with
/// which it acks the batch.
pub fn commit_synced(core: &mut ServerCore, disk: &mut dyn Disk, written: usize, now: u64) -> Vec<Output> {
    match medium::sync(disk) {
        Ok(synced) => core.on_synced(synced, written, now),
        Err(e) => core.on_commit_failed(e),
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::ServerConfig;
    use psl_capsule::{new_capsule_with, Author, Limits, Record, Verified, Verifier, WriterKeys};
    use psl_crypto::{Hash256, OwnerKey};
    use psl_scl::Msg;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// An in-memory disk: `write` keeps a batch in a volatile list, `sync` moves it to the
    /// durable one. That move is this store's durability point (a crash would lose only the
    /// volatile list), so it is where its sync path ends. With `fail_sync`, every sync fails.
    #[derive(Default)]
    pub(crate) struct MemDisk {
        pub(crate) written: Vec<Verified<Record>>,
        pub(crate) durable: Vec<Verified<Record>>,
        pub(crate) fail_sync: bool,
    }

    impl Disk for MemDisk {
        fn write(&mut self, batch: &[Verified<Record>]) -> Result<usize, String> {
            self.written.extend(batch.iter().cloned());
            Ok(batch.len())
        }
        fn sync(&mut self) -> Result<(), String> {
            if self.fail_sync {
                return Err("fsync: input/output error".into());
            }
            self.durable.append(&mut self.written);
            Ok(())
        }
        fn heads(&self) -> BTreeMap<u32, (u64, u64)> {
            let mut h = BTreeMap::new();
            for r in &self.durable {
                h.insert(r.header().writer, (r.header().seq + 1, r.header().epoch));
            }
            h
        }
        fn chain_tail(&self, writer: u32, n: usize) -> Result<(u64, Vec<Hash256>), String> {
            let chain: Vec<Hash256> =
                self.durable.iter().filter(|r| r.header().writer == writer).map(|r| r.hash()).collect();
            Ok((chain.len() as u64, chain[chain.len().saturating_sub(n)..].to_vec()))
        }
        fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String> {
            let w =
                |r: &&Verified<Record>| r.header().writer == writer && (from_seq..=to_seq).contains(&r.header().seq);
            Ok(self.durable.iter().filter(w).cloned().collect())
        }
        fn latest_sync(&self) -> Result<Option<Verified<Record>>, String> {
            Ok(None)
        }
    }

    /// A server core that has ordered `n` records of one writer, ready for a group commit.
    fn core_with_records(n: usize) -> ServerCore {
        let owner = OwnerKey::from_seed(&[43; 32]).unwrap();
        let app = owner.app(2).unwrap();
        let meta = new_capsule_with(&owner, 2, "synced-token", 0, Limits::default(), WriterKeys::Derived).unwrap();
        let verifier = Arc::new(Verifier::new(meta.clone(), None));
        let me = psl_scl::server_writer(0).unwrap();
        let mut core = ServerCore::new(verifier.clone(), app.writer(me).unwrap(), me, ServerConfig::default());
        let mut a = Author::new(&meta, &app, 0x10009).unwrap();
        for i in 0..n {
            let k = format!("k{i}");
            let r = verifier.verify(a.write_ops([(k.as_str(), Some("v"))]).unwrap()).unwrap();
            assert!(core.on_verified(r, 0).is_empty());
        }
        core
    }

    /// The (from, to) of every ack entry in `out`.
    pub(crate) fn acked(out: &[Output]) -> Vec<(u64, u64)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Publish(b) => match Msg::decode(b) {
                    Ok(Msg::Ack(a)) => Some(a.entries.iter().map(|e| (e.from_seq, e.to_seq)).collect::<Vec<_>>()),
                    _ => None,
                },
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn a_batch_is_acked_only_after_the_sync_that_covers_it() {
        let mut core = core_with_records(3);
        let mut disk = MemDisk::default();
        let Some(Ok(n)) = commit_write(&mut core, &mut disk, 1) else { panic!("a batch to write") };
        assert_eq!((n, disk.written.len(), disk.durable.len()), (3, 3, 0));
        // Written, not synced: however much time passes, no ack (not even a re-ack).
        assert!(acked(&core.on_tick(1_000)).is_empty());
        let out = commit_synced(&mut core, &mut disk, n, 1_001);
        assert_eq!(disk.durable.len(), 3);
        assert_eq!(acked(&out), vec![(0, 2)]);
        assert_eq!(core.stats.acks_sent, 1);
        // Re-acks repeat the durable head under the newest proof.
        assert_eq!(acked(&core.on_tick(1_300)), vec![(2, 2)]);
    }

    #[test]
    fn a_failed_sync_produces_no_ack_ever() {
        let mut core = core_with_records(3);
        let mut disk = MemDisk { fail_sync: true, ..MemDisk::default() };
        let out = commit_all(&mut core, &mut disk, 1);
        assert!(acked(&out).is_empty(), "acked a batch whose sync failed");
        assert!(matches!(&out[..], [Output::Fatal(_)]), "{out:?}");
        assert_eq!((disk.written.len(), disk.durable.len()), (3, 0));
        assert!(core.failed().is_some());
        assert_eq!(core.stats.acks_sent, 0);
        // The server stops: no later batch, no re-ack.
        assert!(core.take_batch().is_none());
        assert!(acked(&core.on_tick(1_000)).is_empty());
        assert!(core.durable().is_empty());
    }
}
