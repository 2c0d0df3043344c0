#![allow(dead_code)]
//! Shared fixtures: a capsule with a few writers, a coordinator and a SYNC.

use psl_capsule::{new_capsule, Author, Limits, Record, SignedMetadata, Verifier, DEFAULT_COORDINATOR};
use psl_crypto::{AppKey, OwnerKey};

pub struct Fixture {
    pub owner: OwnerKey,
    pub app: AppKey,
    pub meta: SignedMetadata,
}

impl Fixture {
    pub fn new(seed: u8) -> Fixture {
        Self::with_limits(seed, Limits::default())
    }

    pub fn with_limits(seed: u8, limits: Limits) -> Fixture {
        let owner = OwnerKey::from_seed(&[seed; 32]).unwrap();
        let app = owner.app(11).unwrap();
        let meta = new_capsule(&owner, 11, "fixture", 1_700_000_000_000, limits).unwrap();
        Fixture { owner, app, meta }
    }

    pub fn verifier(&self) -> Verifier {
        Verifier::new(self.meta.clone(), Some(self.app.data_key()))
    }

    pub fn public_verifier(&self) -> Verifier {
        Verifier::new(self.meta.clone(), None)
    }

    pub fn author(&self, writer: u32) -> Author {
        Author::new(&self.meta, &self.app, writer).unwrap()
    }

    /// Writers 1, 2, 3 write two records each, the coordinator writes SYNC 1 over their heads,
    /// then each writer writes one more record linking to it: 10 records.
    pub fn small_history(&self) -> Vec<Record> {
        let mut out = Vec::new();
        let mut authors: Vec<Author> = (1..=3).map(|w| self.author(w)).collect();
        let mut heads = Vec::new();
        for a in authors.iter_mut() {
            for i in 0..2 {
                let r = a.write_ops([(format!("k{i}"), Some(format!("v{}-{i}", a.writer())))]).unwrap();
                if i == 1 {
                    heads.push(r.link());
                }
                out.push(r);
            }
        }
        let mut coord = self.author(DEFAULT_COORDINATOR);
        let sync = coord.write_sync(heads).unwrap();
        for a in authors.iter_mut() {
            a.enter_epoch(sync.link(), 1);
            out.push(a.write_ops([("after", None::<Vec<u8>>)]).unwrap());
        }
        out.insert(6, sync);
        out
    }
}
