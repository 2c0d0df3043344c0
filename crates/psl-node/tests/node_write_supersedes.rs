//! A local write is newer than every version of its key the node shows, even one its Lamport
//! clock never passed (a version the memtable got some other way): otherwise the write would be
//! sealed and sent, and applied nowhere (last writer wins), while its caller was told it was
//! stored.
use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::Version;
use std::sync::Arc;

#[test]
fn a_write_lands_above_a_version_the_clock_never_passed() {
    let owner = OwnerKey::from_seed(&[24; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "write-supersedes", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let opts = NodeOptions { node_id: 1, writers: 1, ..NodeOptions::default() }.shared_cores();
    let node = Node::start(NodeKeys::derive(&meta, &app, &opts).unwrap(), Arc::new(hub.endpoint("n")), opts).unwrap();

    let theirs = Version { lamport: 5_000_000, writer: 77 };
    assert!(node.memtable().apply(b"k", theirs, Some(Arc::from(&b"theirs"[..]))));
    assert!(node.lamport() < theirs.lamport, "the clock has not passed it");
    node.put(b"k", b"mine").unwrap();
    let mine = node.entry(b"k").unwrap().version;
    assert!(mine > theirs, "{mine:?} is not above {theirs:?}");
    assert_eq!(node.get(b"k").as_deref(), Some(&b"mine"[..]));
    // A fenced write gets the same treatment, and still respects its fence.
    let fenced = node.write_below(b"k", Some(b"fenced"), u64::MAX).unwrap();
    assert!(fenced > mine);
    assert!(matches!(node.write_below(b"k", Some(b"late"), fenced.lamport), Err(psl_node::NodeError::Fenced { .. })));
    assert_eq!(node.get(b"k").as_deref(), Some(&b"fenced"[..]));
}
