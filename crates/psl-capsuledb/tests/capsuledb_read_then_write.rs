//! A key read through CapsuleDB, then written: the write must be newer than what was read.
//!
//! A node that joins after a key was written knows it only through CapsuleDB. Its Lamport
//! clock has not seen the record that wrote the key, so unless the answer moves the clock, its
//! next write of that key gets an *older* version than the one it just read: last writer wins
//! drops it everywhere, while the caller was told it was stored. SecureCached's `cas` at a
//! key's home is such a read-then-write; `psl chaos` seed 5 caught two `cas` on one unique both
//! answered STORED this way.
mod common;

use psl_capsule::{new_capsule, Limits};
use psl_capsuledb::role::RoleOptions;
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the first writer's clock starts: far above anything the reader sees on its own.
const AHEAD: u64 = 1_000_000;

#[test]
fn a_write_after_a_capsuledb_read_supersedes_what_was_read() {
    let owner = OwnerKey::from_seed(&[23; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "capsuledb-read-then-write", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();

    let role = common::start_role(&meta, &app, &hub, db_writer, RoleOptions::default());

    let node = |id: u32, name: &str| {
        let opts = NodeOptions {
            node_id: id,
            writers: 1,
            capsuledb: Some(db_writer),
            db_get_timeout: Duration::from_secs(20),
            ..NodeOptions::default()
        }
        .shared_cores();
        let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
        let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint(name));
        Node::start(keys, ep, opts).unwrap()
    };

    // The first writer's clock is far ahead (it has seen much more of the capsule).
    let a = node(1, "a");
    a.advance_clock(AHEAD);
    a.put(b"counter", b"init").unwrap();
    let read = a.entry(b"counter").unwrap().version;
    assert!(read.lamport > AHEAD);
    let deadline = Instant::now() + Duration::from_secs(20);
    while role.stats().applied.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < deadline, "CapsuleDB never applied the write");
        std::thread::sleep(Duration::from_millis(10));
    }

    // The second joins afterwards: SCL sends it no history, so it knows the key only through
    // CapsuleDB, and its clock is far below the version it will read.
    let b = node(2, "b");
    assert!(b.lamport() < AHEAD, "the reader's clock starts below the writer's: {}", b.lamport());
    assert_eq!(b.try_get(b"counter").unwrap().as_deref(), Some(&b"init"[..]));
    assert_eq!(b.entry(b"counter").unwrap().version, read, "the key was learned from CapsuleDB");
    assert!(b.db_stats().unwrap().answers.load(Ordering::Relaxed) >= 1, "read through CapsuleDB");
    assert!(b.lamport() >= read.lamport, "the answer moved the clock: {} < {}", b.lamport(), read.lamport);

    // The read-then-write: newer than what was read, here and on the first writer.
    b.put(b"counter", b"init,b").unwrap();
    let wrote = b.entry(b"counter").unwrap().version;
    assert!(wrote > read, "the write {wrote:?} is not newer than the read {read:?}");
    assert_eq!(b.get(b"counter").as_deref(), Some(&b"init,b"[..]));
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.get(b"counter").as_deref() != Some(&b"init,b"[..]) {
        assert!(Instant::now() < deadline, "the first writer never applied the newer write");
        std::thread::sleep(Duration::from_millis(10));
    }
    role.shutdown();
}
