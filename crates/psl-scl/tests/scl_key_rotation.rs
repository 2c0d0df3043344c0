//! Application key rotation end to end over the pure engines: a coordinator and three data
//! nodes (each a `NodeCore` with its writers' `Author`s) on a lossless in-test network.
//!
//! Writes before the rotation are accepted; the owner-signed certificate reaches the nodes from
//! the leader (and, for one node, only through the `Rotate` record in the log); from the
//! rotation epoch on, writers sign under the new generation and SYNCs name the new key; a
//! record signed with the retired key after the rotation epoch is refused and counted as
//! `retired-key` on every node, without touching any memtable; all nodes converge.

use psl_capsule::{
    new_capsule, Author, Body, ControlCode, Limits, Op, Record, RotationCert, SignedMetadata, Verifier,
    DEFAULT_COORDINATOR,
};
use psl_crypto::{AppKey, OwnerKey};
use psl_scl::node::epoch_payload;
use psl_scl::{
    CoordinatorConfig, CoordinatorSm, LamportClock, Memtable, Metrics, Msg, NodeConfig, NodeCore, Output, RejectReason,
};
use std::collections::VecDeque;
use std::sync::Arc;

const APP: u32 = 11;
const NEW_APP: u32 = 12;

struct TestNode {
    core: NodeCore,
    verifier: Arc<Verifier>,
    memtable: Arc<Memtable>,
    clock: Arc<LamportClock>,
    metrics: Arc<Metrics>,
    authors: Vec<Author>,
    coordinator: Option<Author>,
}

impl TestNode {
    fn new(meta: &SignedMetadata, app: &AppKey, writers: &[u32], coordinator: bool) -> TestNode {
        let verifier = Arc::new(Verifier::new(meta.clone(), Some(app.data_key())));
        let memtable = Arc::new(Memtable::new());
        let clock = Arc::new(LamportClock::new(0));
        let metrics = Arc::new(Metrics::default());
        let coord = coordinator.then(|| {
            let cfg = CoordinatorConfig { epoch_ms: 20, eoe_timeout_ms: 60, rank: 0, ranks: 3, ..Default::default() };
            (DEFAULT_COORDINATOR, CoordinatorSm::new(cfg, 0))
        });
        let core = NodeCore::new(
            verifier.clone(),
            memtable.clone(),
            clock.clone(),
            metrics.clone(),
            writers.iter().copied(),
            coord,
            NodeConfig::default(),
        );
        TestNode {
            core,
            verifier,
            memtable,
            clock,
            metrics,
            authors: writers.iter().map(|w| Author::new(meta, app, *w).unwrap()).collect(),
            coordinator: coordinator.then(|| Author::new(meta, app, DEFAULT_COORDINATOR).unwrap()),
        }
    }

    fn put(&mut self, key: &str, value: &str, now: u64, net: &mut Vec<Vec<u8>>) {
        let lamport = self.clock.tick();
        let op = Op::put(lamport, key, value);
        let w = self.authors[0].writer();
        self.memtable.apply(key.as_bytes(), psl_scl::Version { lamport, writer: w }, Some(Arc::from(value.as_bytes())));
        let body = Body::Data(vec![op.clone()]);
        let rec = self.authors[0].write_stamped(vec![op]).unwrap();
        let out = self.core.on_local_record(rec, &body, now);
        self.outputs(out, now, net);
    }

    fn local(&mut self, rec: Record, body: &Body, now: u64, net: &mut Vec<Vec<u8>>) {
        let out = self.core.on_local_record(rec, body, now);
        self.outputs(out, now, net);
    }

    fn outputs(&mut self, out: Vec<Output>, now: u64, net: &mut Vec<Vec<u8>>) {
        for o in out {
            match o {
                Output::Publish(b) => net.push(b),
                Output::EnterEpoch { sync, epoch } => {
                    for a in self.authors.iter_mut().chain(self.coordinator.as_mut()) {
                        a.enter_epoch(sync, epoch);
                    }
                }
                Output::WriteEoe { epoch, heads } => {
                    for i in 0..self.authors.len() {
                        let body = Body::Control { code: ControlCode::Eoe, payload: epoch_payload(epoch) };
                        let links = if i == 0 { heads.clone() } else { Vec::new() };
                        self.authors[i].observe(self.clock.tick());
                        let rec = self.authors[i].write_control(body.clone(), links).unwrap();
                        self.clock.observe(rec.header().lamport);
                        self.local(rec, &body, now, net);
                    }
                }
                Output::WriteRts { epoch } => {
                    let c = self.coordinator.as_mut().unwrap();
                    let body = Body::Control { code: ControlCode::Rts, payload: epoch_payload(epoch) };
                    c.observe(self.clock.tick());
                    let rec = c.write_body(body.clone()).unwrap();
                    self.clock.observe(rec.header().lamport);
                    self.local(rec, &body, now, net);
                }
                Output::WriteSync { epoch, heads } => {
                    let c = self.coordinator.as_mut().unwrap();
                    if epoch > c.epoch() {
                        c.observe(self.clock.tick());
                        let rec = c.write_sync_epoch(epoch, heads).unwrap();
                        self.clock.observe(rec.header().lamport);
                        let fp = self.verifier.app_key_fp(rec.header().key_gen).unwrap();
                        self.local(rec, &Body::Sync { app_key_fp: fp }, now, net);
                    }
                }
                Output::Equivocation { writer, seq, .. } => panic!("equivocation by writer {writer} at seq {seq}"),
                _ => {}
            }
        }
    }

    fn receive(&mut self, bytes: &[u8], now: u64, net: &mut Vec<Vec<u8>>) {
        match Msg::decode(bytes) {
            Err(_) => self.core.on_rejected(RejectReason::BadMessage),
            Ok(Msg::Record { bytes, .. }) => {
                let limits = self.verifier.metadata().meta.policy.limits;
                match Record::decode(&bytes, &limits) {
                    Err(_) => self.core.on_rejected(RejectReason::Encoding),
                    Ok(rec) if self.core.precheck(&rec) => {}
                    Ok(rec) => match self.verifier.verify_open(rec) {
                        Err(rej) => self.core.on_rejected(RejectReason::from_verifier(&rej.reason)),
                        Ok(opened) => {
                            let out = self.core.on_verified(opened, now);
                            self.outputs(out, now, net);
                        }
                    },
                }
            }
            Ok(m) => self.core.on_message(m),
        }
    }
}

struct Cluster {
    nodes: Vec<TestNode>,
    now: u64,
}

impl Cluster {
    /// Delivers every queued message to every other node, until the network is quiet.
    fn flood(&mut self, from: usize, first: Vec<Vec<u8>>) {
        let mut q: VecDeque<(usize, Vec<u8>)> = first.into_iter().map(|b| (from, b)).collect();
        let mut steps = 0;
        while let Some((src, b)) = q.pop_front() {
            steps += 1;
            assert!(steps < 1_000_000, "message storm");
            for (i, n) in self.nodes.iter_mut().enumerate() {
                if i != src {
                    let mut net = Vec::new();
                    n.receive(&b, self.now, &mut net);
                    q.extend(net.into_iter().map(|b| (i, b)));
                }
            }
        }
    }

    fn step(&mut self) {
        self.now += 5;
        for i in 0..self.nodes.len() {
            let mut net = Vec::new();
            let out = self.nodes[i].core.on_tick(self.now);
            self.nodes[i].outputs(out, self.now, &mut net);
            self.flood(i, net);
        }
    }

    fn put(&mut self, node: usize, key: &str, value: &str) {
        let mut net = Vec::new();
        let now = self.now;
        self.nodes[node].put(key, value, now, &mut net);
        self.flood(node, net);
    }

    fn min_epoch(&self) -> u64 {
        self.nodes.iter().map(|n| n.core.epoch()).min().unwrap()
    }

    fn run_until(&mut self, what: &str, mut done: impl FnMut(&Cluster) -> bool) {
        for _ in 0..4000 {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!("timed out waiting for {what}");
    }

    fn rejected(&self, r: RejectReason) -> Vec<u64> {
        self.nodes.iter().map(|n| n.metrics.rejected(r)).collect()
    }
}

#[test]
fn rotation_retires_the_old_key_and_all_nodes_converge() {
    let owner = OwnerKey::from_seed(&[42; 32]).unwrap();
    let meta = new_capsule(&owner, APP, "rotation", 0, Limits::default()).unwrap();
    let app = owner.app(APP).unwrap();
    let writers: Vec<u32> = (1..=3).map(|n| psl_scl::writer_index(n, 0, 0).unwrap()).collect();
    let mut c = Cluster { nodes: vec![TestNode::new(&meta, &app, &[], true)], now: 0 };
    for w in &writers {
        c.nodes.push(TestNode::new(&meta, &app, &[*w], false));
    }

    // Before the rotation: writes under generation 0 are accepted everywhere.
    c.run_until("the first epochs", |c| c.min_epoch() >= 2);
    for n in 1..=3 {
        c.put(n, &format!("pre-{n}"), "old key");
    }
    c.run_until("pre-rotation writes applied", |c| {
        c.nodes.iter().skip(1).all(|n| (1..=3).all(|k| n.memtable.get(format!("pre-{k}").as_bytes()).is_some()))
    });

    // The leader rotates: a new hardened application key, effective 4 epochs ahead.
    let from_epoch = c.nodes.iter().map(|n| n.core.epoch()).max().unwrap() + 4;
    let cert = RotationCert::issue(&owner, &meta, 1, NEW_APP, from_epoch).unwrap();
    let new_app = owner.app(NEW_APP).unwrap();
    // Nodes 0..=2 get the certificate and their keys from the leader directly.
    for (i, n) in c.nodes.iter_mut().enumerate().take(3) {
        assert!(n.core.install_rotation(&cert, Some(new_app.data_key())).unwrap());
        for a in n.authors.iter_mut().chain(n.coordinator.as_mut()) {
            let w = a.writer();
            a.schedule_rotation(&cert, new_app.writer(w).unwrap(), new_app.data_key()).unwrap();
        }
        if i == 0 {
            n.core.set_coordinator_key_gen(1);
        }
    }
    // The coordinator carries the certificate into the log as a Rotate control record.
    {
        let now = c.now;
        let mut net = Vec::new();
        let n = &mut c.nodes[0];
        let body = Body::Control { code: ControlCode::Rotate, payload: cert.encode() };
        n.coordinator.as_mut().unwrap().observe(n.clock.tick());
        let rec = n.coordinator.as_mut().unwrap().write_control(body.clone(), Vec::new()).unwrap();
        n.local(rec, &body, now, &mut net);
        c.flood(0, net);
    }
    // Node 3 learnt the new application public key from the log alone.
    assert_eq!(c.nodes[3].verifier.key_gen_newest(), 1);
    assert_eq!(c.nodes[3].verifier.rotation_certs(), vec![cert.clone()]);
    // ... and then gets its data key and writer key from the leader (the certificate again).
    {
        let n = &mut c.nodes[3];
        assert!(n.core.install_rotation(&cert, Some(new_app.data_key())).unwrap(), "the data key is new");
        let w = n.authors[0].writer();
        n.authors[0].schedule_rotation(&cert, new_app.writer(w).unwrap(), new_app.data_key()).unwrap();
    }

    // Writes in the epochs before the rotation epoch still use the old key and are accepted.
    assert!(c.min_epoch() < from_epoch);
    c.put(1, "late-old", "still generation 0");
    c.run_until("the rotation epoch", |c| c.min_epoch() > from_epoch);
    for n in 1..=3 {
        c.put(n, &format!("post-{n}"), "new key");
    }
    for n in &c.nodes {
        for a in n.authors.iter().chain(n.coordinator.as_ref()) {
            assert_eq!(a.key_gen(), 1, "writer {} signs under the new generation", a.writer());
        }
    }

    // An attacker holding the retired application key writes after the rotation epoch: as a
    // fresh writer, and by continuing node 1's writer with its retired key.
    let forged_fresh = {
        let mut a = Author::new(&meta, &app, psl_scl::writer_index(9, 0, 0).unwrap()).unwrap();
        let (epoch, links) = c.nodes[1].core.last_sync().cloned().unwrap();
        a.enter_epoch(psl_capsule::Link { writer: DEFAULT_COORDINATOR, seq: 0, hash: links[0].hash }, epoch);
        a.write_ops([("forged", Some("by a retired key"))]).unwrap()
    };
    assert_eq!(forged_fresh.header().key_gen, 0);
    assert!(forged_fresh.header().epoch >= from_epoch);
    let forged_next = {
        let w1 = writers[0];
        let head = c.nodes[2].core.orderer().heads()[&w1];
        let mut a = Author::new(&meta, &app, w1).unwrap();
        a.resume(&psl_capsule::Head {
            writer: w1,
            seq: head.seq,
            hash: head.hash,
            lamport: 1 << 40,
            epoch: c.nodes[1].core.epoch(),
        });
        a.write_ops([("post-1", Some("overwritten by a retired key"))]).unwrap()
    };
    assert_eq!(forged_next.header().key_gen, 0);
    let before = c.rejected(RejectReason::RetiredKey);
    let snapshots: Vec<_> = c.nodes.iter().map(|n| n.memtable.snapshot()).collect();
    let msgs = [&forged_fresh, &forged_next]
        .iter()
        .map(|r| Msg::Record { capsule: meta.name(), bytes: r.shared_bytes() }.encode())
        .collect();
    c.flood(usize::MAX, msgs);
    let after = c.rejected(RejectReason::RetiredKey);
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(*a, b + 2, "node {i} counts both retired-key records");
    }
    assert_eq!(after, vec![2; 4], "no honest record, own or remote, was under a retired key");
    for (n, s) in c.nodes.iter().zip(&snapshots) {
        assert_eq!(&n.memtable.snapshot(), s, "a refused record changes no memtable");
    }
    // The verifier names the reason too (for tools that verify without a node).
    let rej = c.nodes[2].verifier.verify(forged_fresh).unwrap_err();
    assert_eq!(rej.reason.name(), "retired-key");

    // Everyone converges on the same store: old and new writes, nothing forged.
    c.run_until("post-rotation writes applied everywhere", |c| {
        c.nodes.iter().skip(1).all(|n| {
            (1..=3).all(|k| n.memtable.get(format!("post-{k}").as_bytes()).is_some())
                && n.memtable.get(b"late-old").is_some()
        })
    });
    let first = c.nodes[1].memtable.snapshot();
    for n in &c.nodes[2..] {
        assert_eq!(n.memtable.snapshot(), first);
    }
    assert!(first.keys().any(|k| k == b"pre-1") && !first.keys().any(|k| k == b"forged"));
    assert_eq!(c.nodes[2].memtable.get(b"post-1").as_deref(), Some(&b"new key"[..]));
    for n in &c.nodes {
        assert_eq!(n.metrics.rejected(RejectReason::KeyFingerprint), 0, "every SYNC named the key in force");
        assert_eq!(n.metrics.rejected(RejectReason::Decryption), 0);
        assert_eq!(n.metrics.rejected(RejectReason::Signature), 0);
        assert_eq!(n.metrics.rejected(RejectReason::KeyGeneration), 0);
        assert!(n.core.epoch() > from_epoch);
    }
}

#[test]
fn coordinator_without_its_rotated_key_holds_the_epoch_before_the_rotation() {
    let owner = OwnerKey::from_seed(&[43; 32]).unwrap();
    let meta = new_capsule(&owner, APP, "hold", 0, Limits::default()).unwrap();
    let app = owner.app(APP).unwrap();
    let w = psl_scl::writer_index(1, 0, 0).unwrap();
    let mut c =
        Cluster { nodes: vec![TestNode::new(&meta, &app, &[], true), TestNode::new(&meta, &app, &[w], false)], now: 0 };
    c.run_until("epoch 1", |c| c.min_epoch() >= 1);
    let from_epoch = c.min_epoch() + 2;
    let cert = RotationCert::issue(&owner, &meta, 1, NEW_APP, from_epoch).unwrap();
    let new_app = owner.app(NEW_APP).unwrap();
    for n in c.nodes.iter_mut() {
        n.core.install_rotation(&cert, Some(new_app.data_key())).unwrap();
    }
    // The coordinator node knows of the rotation but its writer has no new key yet.
    for _ in 0..200 {
        c.step();
    }
    assert_eq!(c.min_epoch(), from_epoch - 1, "no SYNC at or after the rotation epoch without the key");
    let n = &mut c.nodes[0];
    n.coordinator
        .as_mut()
        .unwrap()
        .schedule_rotation(&cert, new_app.writer(DEFAULT_COORDINATOR).unwrap(), new_app.data_key())
        .unwrap();
    n.core.set_coordinator_key_gen(1);
    c.nodes[1].authors[0].schedule_rotation(&cert, new_app.writer(w).unwrap(), new_app.data_key()).unwrap();
    c.run_until("the rotation epoch", |c| c.min_epoch() > from_epoch);
    assert_eq!(c.rejected(RejectReason::RetiredKey), vec![0, 0]);
}
