//! Forged, corrupted, replayed and equivocating records are refused, counted by reason, and
//! change no memtable.

use psl_capsule::{new_capsule, Author, Body, Draft, Limits, Op, Record};
use psl_crypto::{Hash256, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::{CoordinatorConfig, Metrics, Msg, RejectReason};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn bad_records_are_refused_and_counted_by_reason() {
    refused_and_counted(2);
}

/// The same, on a node without verify actors, whose core thread verifies every record.
#[test]
fn bad_records_are_refused_when_the_core_verifies() {
    refused_and_counted(0);
}

fn refused_and_counted(verifiers: usize) {
    let owner = OwnerKey::from_seed(&[7; 32]).unwrap();
    let app = owner.app(9).unwrap();
    let meta = new_capsule(&owner, 9, "rejections", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let copts = NodeOptions {
        node_id: 0x7000,
        writers: 0,
        coordinator: Some(CoordinatorConfig { epoch_ms: 20, eoe_timeout_ms: 100, ..CoordinatorConfig::default() }),
        ..NodeOptions::default()
    };
    let _coordinator =
        Node::start(NodeKeys::derive(&meta, &app, &copts).unwrap(), Arc::new(hub.endpoint("c")), copts).unwrap();
    let opts = NodeOptions { node_id: 1, writers: 1, verifiers, ..NodeOptions::default() };
    let victim = Node::start(NodeKeys::derive(&meta, &app, &opts).unwrap(), Arc::new(hub.endpoint("v")), opts).unwrap();
    let attacker = hub.endpoint("attacker");
    let name = meta.name();
    let send =
        |r: &Record| attacker.publish(Msg::Record { capsule: name, bytes: r.shared_bytes() }.encode().into()).unwrap();
    let m = victim.metrics().clone();

    // An honest record from a third writer (a compromised key would look the same), applied.
    let mut honest = Author::new(&meta, &app, 500).unwrap();
    let r0 = honest.write_ops([("honest", Some("1"))]).unwrap();
    send(&r0);
    wait_until("the honest record", || victim.get(b"honest").is_some());
    let before = victim.digest();

    // 1. Forged: claims writer 501, signed by writer 502's key.
    let forged = Draft {
        writer: 501,
        key_gen: 0,
        seq: 0,
        lamport: 1_000_000,
        epoch: 0,
        prev: Hash256::ZERO,
        links: vec![],
        body: Body::Data(vec![Op::put(1_000_000, "honest", "forged")]),
    }
    .seal(name, &meta.meta.policy.limits, &app.writer(502).unwrap(), &app.data_key())
    .unwrap();
    send(&forged);
    wait_until("the forged record to be refused", || m.rejected(RejectReason::Signature) >= 1);

    // 2. Corrupted: flip a byte in the body of a valid record.
    let good = honest.write_ops([("honest", Some("corrupted"))]).unwrap();
    let mut bytes = good.bytes().to_vec();
    let i = bytes.len() - 80;
    bytes[i] ^= 0x40;
    attacker.publish(Msg::Record { capsule: name, bytes: bytes.into() }.encode().into()).unwrap();
    wait_until("the corrupted record to be refused", || m.rejected(RejectReason::Signature) >= 2);

    // 3. Replay: once the epoch has moved past r0's, send r0 again.
    wait_until("two epochs", || Metrics::get(&m.epoch) >= 2);
    send(&r0);
    wait_until("the replay to be refused", || m.rejected(RejectReason::StaleEpoch) >= 1);

    // 4. Equivocation: a second, different record for writer 500's seq 0.
    let mut twin = Author::new(&meta, &app, 500).unwrap();
    let other = twin.write_ops([("honest", Some("equivocated"))]).unwrap();
    assert_eq!(other.header().seq, 0);
    send(&other);
    wait_until("the equivocation to be refused", || m.rejected(RejectReason::Equivocation) >= 1);

    // 5. Another capsule's record.
    let other_meta = new_capsule(&owner, 9, "another", 0, Limits::default()).unwrap();
    let foreign = Author::new(&other_meta, &app, 500).unwrap().write_ops([("honest", Some("foreign"))]).unwrap();
    attacker
        .publish(Msg::Record { capsule: other_meta.name(), bytes: foreign.shared_bytes() }.encode().into())
        .unwrap();
    wait_until("the foreign record to be refused", || m.rejected(RejectReason::Capsule) >= 1);

    // 6. A capsule server's key (servers sign acks, never records) cannot write data.
    let server_w = psl_scl::server_writer(1).unwrap();
    let by_server = Author::new(&meta, &app, server_w).unwrap().write_ops([("honest", Some("server"))]).unwrap();
    send(&by_server);
    wait_until("the server-signed record to be refused", || m.rejected(RejectReason::Writer) >= 1);

    // 7. Garbage.
    attacker.publish(vec![0xFFu8; 40].into()).unwrap();
    wait_until("garbage to be refused", || m.rejected(RejectReason::BadMessage) >= 1);

    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(victim.digest(), before, "no refused record changed the memtable");
    assert_eq!(victim.get(b"honest").as_deref(), Some(&b"1"[..]));
    let metrics = victim.render_metrics();
    assert!(metrics.contains("psl_node_rejected_total{reason=\"equivocation\"} 1"), "{metrics}");
}
