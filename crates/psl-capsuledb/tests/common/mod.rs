#![allow(dead_code)]
use psl_capsule::{new_capsule, Author, Limits, SignedMetadata, Verifier};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore};
use psl_crypto::{AppKey, OwnerKey};
use std::sync::{Arc, OnceLock};

pub struct Keys {
    pub meta: SignedMetadata,
    pub app: AppKey,
}

pub fn keys() -> &'static Keys {
    static K: OnceLock<Keys> = OnceLock::new();
    K.get_or_init(|| {
        let owner = OwnerKey::from_seed(&[7; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "capsuledb-test", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        Keys { meta, app }
    })
}

pub fn verifier() -> Verifier {
    let k = keys();
    Verifier::new(k.meta.clone(), Some(k.app.data_key()))
}

pub fn author(seed: u64) -> Author {
    let k = keys();
    Author::new(&k.meta, &k.app, 1).unwrap().with_salt_seed(seed)
}

pub fn stores(v: &[&Arc<MemStore>]) -> Vec<Arc<dyn BlockStore>> {
    v.iter().map(|s| (*s).clone() as Arc<dyn BlockStore>).collect()
}

pub fn tiny() -> Config {
    Config {
        memtable_entries_max: 3,
        l0_blocks_max: 2,
        fanout: 2,
        block_entries_max: 3,
        cache_blocks_max: 4,
        drop_tombstones: true,
    }
}

pub fn create(config: Config, s: &[&Arc<MemStore>]) -> CapsuleDb {
    CapsuleDb::create(config, stores(s), verifier(), author(1)).unwrap()
}

pub fn reopen(config: Config, s: &[&Arc<MemStore>], newest: [u8; 32], seed: u64) -> CapsuleDb {
    CapsuleDb::open(config, stores(s), verifier(), author(seed), newest).unwrap()
}
