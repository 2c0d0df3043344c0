//! Application key rotation through running nodes (threads, rings, in-process fabric): a
//! coordinator and three nodes under continuous load. Mid-load the owner's certificate goes to
//! the coordinator first (which then holds the epoch clock below the rotation epoch), then each
//! node gets its writers' new keys, then the coordinator its own. Writes before and after the
//! rotation converge; records of both generations verify; after the rotation epoch a record
//! sealed with a retired writer key is refused everywhere as `retired-key` and no memtable
//! changes.

mod common;

use common::Observer;
use psl_capsule::{new_capsule, Author, Kind, Limits, Link, RotationCert, Verifier};
use psl_crypto::OwnerKey;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions, NodeRotation};
use psl_scl::{Metrics, Msg, RejectReason};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const APP: u32 = 3;
const NEW_APP: u32 = 4;

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn epoch(n: &Node) -> u64 {
    Metrics::get(&n.metrics().epoch)
}

#[test]
fn rotation_mid_load_converges_and_retires_the_old_key() {
    let owner = OwnerKey::from_seed(&[42; 32]).unwrap();
    let app = owner.app(APP).unwrap();
    let meta = new_capsule(&owner, APP, "node-rotation", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let limits = meta.meta.policy.limits;

    // An untrusted observer keeps every record on the fabric.
    let observer = Observer::start(&hub, limits);
    let seen = observer.seen.clone();

    let coordinator_writer = meta.meta.policy.coordinator_at(0).unwrap();
    let coordinator = common::start_coordinator(&hub, &meta, &app, 20);
    let mut nodes = Vec::new();
    for id in 1..=3u32 {
        let opts = NodeOptions { node_id: id, writers: 2, ..NodeOptions::default() };
        let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
        nodes.push(Arc::new(Node::start(keys, Arc::new(hub.endpoint(format!("node{id}"))), opts).unwrap()));
    }

    // Continuous load: each node writes its own keys until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let loaders: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (n, stop) = (n.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut k = 0u32;
                while !stop.load(Ordering::Acquire) {
                    n.put(format!("n{i}-{k}").as_bytes(), format!("v{k}").as_bytes()).unwrap();
                    k += 1;
                    if k.is_multiple_of(50) {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                k
            })
        })
        .collect();
    wait_until("the first epochs", Duration::from_secs(10), || nodes.iter().all(|n| epoch(n) >= 3));
    std::thread::sleep(Duration::from_millis(150));

    // The leader's part: a certificate for generation 1, four epochs ahead.
    let now = coordinator.rotation_state(Instant::now() + Duration::from_secs(5)).unwrap();
    assert_eq!((now.key_gen_newest, now.key_gen_in_force), (0, 0));
    let from_epoch = now.epoch + 4;
    let cert = RotationCert::issue(&owner, &meta, 1, NEW_APP, from_epoch).unwrap();
    let new_app = owner.app(NEW_APP).unwrap();
    let t = Duration::from_secs(5);
    // 1. The coordinator's node learns the certificate, not yet its key: it holds below R.
    let st = coordinator
        .install_rotation(
            NodeRotation {
                cert: cert.clone(),
                data_key: Some(new_app.data_key()),
                writers: Vec::new(),
                coordinator: None,
                refuse_if_begun: true,
                certs: Vec::new(),
            },
            t,
        )
        .unwrap();
    assert_eq!((st.key_gen_newest, st.from_epoch, st.coordinator_key_gen), (1, from_epoch, Some(0)));
    std::thread::sleep(Duration::from_millis(200)); // ten epochs' time
    assert!(epoch(&coordinator) < from_epoch, "the coordinator must hold below the rotation epoch");
    // A worker's key for a writer of another node is refused, as is a data key of another generation.
    let wrong = NodeRotation {
        cert: cert.clone(),
        data_key: Some(new_app.data_key()),
        writers: vec![(
            psl_scl::writer_index(2, 0, 0).unwrap(),
            new_app.writer(psl_scl::writer_index(2, 0, 0).unwrap()).unwrap(),
        )],
        coordinator: None,
        refuse_if_begun: false,
        certs: Vec::new(),
    };
    assert!(nodes[0].install_rotation(wrong, t).is_err());
    // 2. Each node: the certificate, the new data key and its own writers' keys.
    for n in &nodes {
        let writers = n.writers().into_iter().map(|w| (w, new_app.writer(w).unwrap())).collect();
        let st = n
            .install_rotation(
                NodeRotation {
                    cert: cert.clone(),
                    data_key: Some(new_app.data_key()),
                    writers,
                    coordinator: None,
                    refuse_if_begun: false,
                    certs: Vec::new(),
                },
                t,
            )
            .unwrap();
        assert_eq!(st.key_gen_newest, 1);
        assert_eq!(st.key_gen_in_force, 0, "not in force before its epoch");
    }
    // 3. The coordinator's key: the epoch clock runs on, into generation 1.
    coordinator
        .install_rotation(
            NodeRotation {
                cert: cert.clone(),
                data_key: Some(new_app.data_key()),
                writers: Vec::new(),
                coordinator: Some(new_app.writer(coordinator_writer).unwrap()),
                refuse_if_begun: false,
                certs: Vec::new(),
            },
            t,
        )
        .unwrap();
    wait_until("the rotation epoch everywhere", Duration::from_secs(10), || {
        nodes.iter().all(|n| epoch(n) >= from_epoch + 2) && epoch(&coordinator) >= from_epoch + 2
    });
    std::thread::sleep(Duration::from_millis(150)); // load under the new generation
    stop.store(true, Ordering::Release);
    let written: Vec<u32> = loaders.into_iter().map(|h| h.join().unwrap()).collect();
    for n in &nodes {
        n.sync(Duration::from_secs(20)).expect("sync after the rotation");
    }
    coordinator.sync(Duration::from_secs(20)).ok();
    wait_until("the coordinator's replica", Duration::from_secs(10), || coordinator.digest() == nodes[0].digest());

    // Converged, every write present, generation 1 in force everywhere, nothing refused.
    let snap = nodes[0].memtable().snapshot();
    for n in &nodes[1..] {
        assert_eq!(n.memtable().snapshot(), snap, "memtables differ after the rotation");
    }
    for (i, k) in written.iter().enumerate() {
        for j in [0, k / 2, k - 1] {
            assert_eq!(
                nodes[(i + 1) % 3].get(format!("n{i}-{j}").as_bytes()).as_deref(),
                Some(format!("v{j}").as_bytes())
            );
        }
    }
    for n in nodes.iter().map(|n| n.as_ref()).chain([&coordinator]) {
        let st = n.rotation_state(Instant::now() + t).unwrap();
        assert_eq!((st.key_gen_newest, st.key_gen_in_force), (1, 1), "{st:?}");
        let m = n.metrics();
        for r in
            [RejectReason::RetiredKey, RejectReason::Signature, RejectReason::KeyGeneration, RejectReason::Equivocation]
        {
            assert_eq!(m.rejected(r), 0, "{} on a node before any forgery", r.name());
        }
        assert_eq!(Metrics::get(&m.key_gen), 1);
    }

    // The control interface's KEYGEN line shows the generation in force.
    {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop_ctl = Arc::new(AtomicBool::new(false));
        let (n, st) = (nodes[1].clone(), stop_ctl.clone());
        let ctl = std::thread::spawn(move || psl_node::control::serve(n, listener, st));
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"KEYGEN\n").unwrap();
        let mut line = String::new();
        BufReader::new(c.try_clone().unwrap()).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!((v["key_gen_in_force"].as_u64(), v["from_epoch"].as_u64()), (Some(1), Some(from_epoch)), "{v}");
        c.write_all(b"QUIT\n").unwrap();
        drop(c);
        stop_ctl.store(true, Ordering::Release);
        ctl.join().unwrap().unwrap();
    }

    // Records of both generations were written, and all of them verify with the certificate.
    let records = seen.lock().clone();
    let v = Verifier::new(meta.clone(), Some(app.data_key()));
    assert!(v.install_rotation(&cert, Some(new_app.data_key())).unwrap());
    let mut data_by_gen = [0usize; 2];
    for r in &records {
        let h = r.header().clone();
        assert!(v.verify_open(r.clone()).is_ok(), "record writer {} seq {} gen {}", h.writer, h.seq, h.key_gen);
        if h.kind == Kind::Data {
            data_by_gen[h.key_gen as usize] += 1;
            assert_eq!(h.key_gen == 1, h.epoch >= from_epoch, "generation by epoch");
        }
    }
    assert!(data_by_gen[0] > 0 && data_by_gen[1] > 0, "data records by generation: {data_by_gen:?}");
    let sync_r = records
        .iter()
        .find(|r| r.header().kind == Kind::Sync && r.header().epoch == from_epoch)
        .expect("the SYNC of the rotation epoch");
    assert_eq!(sync_r.header().key_gen, 1, "the SYNC of the rotation epoch is under the new key");

    // A retired-key holder signs a record after the rotation epoch, on a fresh writer index
    // (which would otherwise be accepted: seq 0, linking the real SYNC of that epoch).
    let digests: Vec<_> = nodes.iter().map(|n| n.digest()).collect();
    let w = psl_scl::writer_index(9, 0, 0).unwrap();
    let mut forger = Author::new(&meta, &app, w).unwrap();
    let sh = sync_r.header();
    forger.enter_epoch(Link { writer: sh.writer, seq: sh.seq, hash: sync_r.hash() }, sh.epoch);
    let forged = forger.write_ops([("forged", Some("by the retired key"))]).unwrap();
    assert_eq!(forged.header().key_gen, 0);
    let raw = hub.endpoint("forger");
    raw.publish(Msg::Record { capsule: meta.name(), bytes: forged.shared_bytes() }.encode().into()).unwrap();
    wait_until("the forged record refused everywhere", Duration::from_secs(5), || {
        nodes.iter().all(|n| n.metrics().rejected(RejectReason::RetiredKey) >= 1)
            && coordinator.metrics().rejected(RejectReason::RetiredKey) >= 1
    });
    std::thread::sleep(Duration::from_millis(100));
    for (n, d) in nodes.iter().zip(&digests) {
        assert_eq!(n.digest(), *d, "a memtable changed");
        assert_eq!(n.get(b"forged"), None);
    }

    observer.stop();
    for n in nodes {
        Arc::try_unwrap(n).unwrap().shutdown();
    }
    coordinator.shutdown();
}
