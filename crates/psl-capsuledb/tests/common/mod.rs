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

/// A worker node whose memtable holds at most 64 keys and asks CapsuleDB (writer `db_writer`)
/// for what it evicted, with short answer timeouts (the answer-checking tests' worker).
pub fn bounded_worker_opts(db_writer: u32) -> psl_node::NodeOptions {
    psl_node::NodeOptions {
        node_id: 1,
        writers: 1,
        memtable_keys_max: Some(64),
        capsuledb: Some(db_writer),
        db_get_timeout: std::time::Duration::from_millis(800),
        db_get_retry: std::time::Duration::from_millis(200),
        ..psl_node::NodeOptions::default()
    }
    .shared_cores()
}

/// CapsuleDB's role (node 30000, writer `db_writer`) on `hub`, over one in-memory store.
pub fn start_role(
    meta: &SignedMetadata,
    app: &AppKey,
    hub: &psl_fabric::InProcHub,
    db_writer: u32,
    opts: psl_capsuledb::role::RoleOptions,
) -> psl_capsuledb::role::Role {
    let role_opts = psl_node::NodeOptions {
        node_id: 30_000,
        writers: 0,
        capsuledb_role: Some(4096),
        ..psl_node::NodeOptions::default()
    }
    .shared_cores();
    let keys = psl_node::NodeKeys::derive(meta, app, &role_opts).unwrap();
    let role_node = psl_node::Node::start(keys, Arc::new(hub.endpoint("capsuledb")), role_opts).unwrap();
    let stores: Vec<Arc<dyn BlockStore>> = vec![MemStore::new()];
    let author = Author::new(meta, app, db_writer).unwrap();
    let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
    let db = CapsuleDb::create(Config::default(), stores, verifier, author).unwrap();
    let role_keys = psl_capsuledb::role::RoleKeys {
        writer: db_writer,
        signing: app.writer(db_writer).unwrap(),
        data_key: app.data_key(),
    };
    psl_capsuledb::role::Role::start(role_node, db, role_keys, Vec::new(), opts).unwrap()
}
