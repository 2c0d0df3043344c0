#![allow(dead_code)]
//! Shared fixtures: a capsule, three writers and a coordinator, and helpers to poke at a
//! store's files.

use psl_capsule::{new_capsule, Author, Head, Limits, Record, SignedMetadata, Verified, Verifier, DEFAULT_COORDINATOR};
use psl_crypto::{AppKey, DataKey, Hash256, OwnerKey};
use psl_store::{DiskStore, FRAME_HEADER_LEN, LOG_FILE, METADATA_FILE};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub struct Fixture {
    pub owner: OwnerKey,
    pub app: AppKey,
    pub meta: SignedMetadata,
}

impl Fixture {
    pub fn new(seed: u8) -> Fixture {
        let owner = OwnerKey::from_seed(&[seed; 32]).unwrap();
        let app = owner.app(11).unwrap();
        let meta = new_capsule(&owner, 11, "store-fixture", 1_700_000_000_000, Limits::default()).unwrap();
        Fixture { owner, app, meta }
    }

    pub fn key(&self) -> Option<DataKey> {
        Some(self.app.data_key())
    }

    pub fn verifier(&self) -> Verifier {
        Verifier::new(self.meta.clone(), self.key())
    }

    pub fn author(&self, writer: u32) -> Author {
        Author::new(&self.meta, &self.app, writer).unwrap()
    }

    pub fn verify(&self, recs: Vec<Record>) -> Vec<Verified<Record>> {
        let v = self.verifier();
        recs.into_iter().map(|r| v.verify(r).unwrap()).collect()
    }

    /// Writers 1, 2, 3 write `before` records each (interleaved), the coordinator writes SYNC 1
    /// over their heads, then each writer writes `after` more records (interleaved), the first
    /// linking to the SYNC. Returned in writing order, which is a valid append order.
    pub fn history(&self, before: usize, after: usize) -> Vec<Verified<Record>> {
        let mut out = Vec::new();
        let mut authors: Vec<Author> = (1..=3).map(|w| self.author(w)).collect();
        let mut heads = vec![None; 3];
        for i in 0..before {
            for (j, a) in authors.iter_mut().enumerate() {
                let r = a.write_ops([(format!("k{i}"), Some(format!("v{}-{i}", a.writer())))]).unwrap();
                heads[j] = Some(r.link());
                out.push(r);
            }
        }
        let mut coord = self.author(DEFAULT_COORDINATOR);
        let sync = coord.write_sync(heads.into_iter().flatten().collect()).unwrap();
        for a in authors.iter_mut() {
            a.enter_epoch(sync.link(), 1);
        }
        out.push(sync);
        for i in 0..after {
            for a in authors.iter_mut() {
                out.push(a.write_ops([(format!("after{i}"), None::<Vec<u8>>)]).unwrap());
            }
        }
        self.verify(out)
    }
}

/// Each writer's heads if all of `recs` were stored.
pub fn expected_heads(recs: &[Verified<Record>]) -> BTreeMap<u32, Head> {
    let mut heads = BTreeMap::new();
    for r in recs {
        let h = r.header();
        let e = heads.entry(h.writer).or_insert(Head {
            writer: h.writer,
            seq: 0,
            hash: r.hash(),
            lamport: h.lamport,
            epoch: h.epoch,
        });
        if h.seq >= e.seq {
            *e = Head { writer: h.writer, seq: h.seq, hash: r.hash(), lamport: h.lamport, epoch: h.epoch };
        }
    }
    heads
}

/// Each writer's chain: hashes by seq.
pub fn chains(recs: &[Verified<Record>]) -> BTreeMap<u32, Vec<Hash256>> {
    let mut c: BTreeMap<u32, Vec<Hash256>> = BTreeMap::new();
    let mut sorted: Vec<&Verified<Record>> = recs.iter().collect();
    sorted.sort_by_key(|r| (r.header().writer, r.header().seq));
    for r in sorted {
        let v = c.entry(r.header().writer).or_default();
        assert_eq!(v.len() as u64, r.header().seq);
        v.push(r.hash());
    }
    c
}

pub fn log_path(dir: &Path) -> PathBuf {
    dir.join(LOG_FILE)
}

pub fn meta_path(dir: &Path) -> PathBuf {
    dir.join(METADATA_FILE)
}

/// Frame offsets of a log written from `recs` in this order.
pub fn frame_offsets(recs: &[Verified<Record>]) -> Vec<u64> {
    let mut off = 0;
    recs.iter()
        .map(|r| {
            let o = off;
            off += FRAME_HEADER_LEN + r.bytes().len() as u64;
            o
        })
        .collect()
}

/// A fresh temporary directory, on tmpfs (`/dev/shm`) when there is one: the crash tests
/// reopen thousands of logs, and on a real disk each open's fsync costs milliseconds.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(t) = tempfile::tempdir_in(shm) {
            return t;
        }
    }
    tempfile::tempdir().unwrap()
}

/// A store in a fresh temp dir holding `recs`, appended in batches of `batch`.
pub fn store_with(fx: &Fixture, recs: &[Verified<Record>], batch: usize) -> (tempfile::TempDir, DiskStore) {
    let tmp = scratch();
    let mut s = DiskStore::create(tmp.path().join("store"), fx.meta.clone(), fx.key()).unwrap();
    for b in recs.chunks(batch.max(1)) {
        s.append(b).unwrap();
    }
    (tmp, s)
}

/// Overwrites bytes of a file in place.
pub fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}

pub fn xor_byte(path: &Path, offset: u64, mask: u8) {
    let b = std::fs::read(path).unwrap()[offset as usize];
    patch(path, offset, &[b ^ mask]);
}
