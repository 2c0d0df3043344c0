//! Capsule servers with a node on the in-process fabric: quorum acks, a server down, two down,
//! a cut-off server catching up, a corrupted log repaired from peers, a stale server caught by
//! the freshness check, slow servers pacing a writer (flow control). Every wait is bounded.

use psl_capsule::{new_capsule, Limits, SignedMetadata};
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::{FabricConfig, InProcHub, Switch};
use psl_node::flow::FlowOptions;
use psl_node::{Node, NodeError, NodeKeys, NodeOptions};
use psl_scl::{CoordinatorConfig, Metrics};
use psl_server::read::{fetch_fresh, fetch_quorum, fetch_quorum_within, Patience, ReadClient};
use psl_server::{check_fresh, server_key, FsyncPolicy, Server, ServerOptions, ServerView, Stale};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct World {
    _t: tempfile::TempDir,
    hub: InProcHub,
    meta: SignedMetadata,
    app: AppKey,
    dirs: Vec<PathBuf>,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().unwrap();
        let owner = OwnerKey::generate();
        let app = owner.app(1).unwrap();
        let meta = new_capsule(&owner, 1, "durability", 0, Limits::default()).unwrap();
        let hub = InProcHub::new(FabricConfig { queue_msgs_max: 1 << 15, ..FabricConfig::default() }).unwrap();
        let dirs = (0..3).map(|i| t.path().join(format!("server{i}"))).collect();
        World { _t: t, hub, meta, app, dirs }
    }

    fn server(&self, id: u32, up: &Arc<AtomicBool>) -> Server {
        self.server_with(id, up, ServerOptions { id, ..Default::default() })
    }

    fn server_with(&self, id: u32, up: &Arc<AtomicBool>, opts: ServerOptions) -> Server {
        let f = Switch::new(self.hub.endpoint(format!("server{id}")), up.clone());
        let key = server_key(&self.app, id).unwrap();
        Server::start(&self.dirs[id as usize], self.meta.clone(), key, Arc::new(f), opts).unwrap()
    }

    fn node(&self, id: u32) -> Node {
        self.node_with(id, |_| {})
    }

    fn node_with(&self, id: u32, f: impl FnOnce(&mut NodeOptions)) -> Node {
        let mut o = NodeOptions { node_id: id, writers: 2, ..NodeOptions::default() };
        o.core.servers = 3;
        f(&mut o);
        Node::start(
            NodeKeys::derive(&self.meta, &self.app, &o).unwrap(),
            Arc::new(self.hub.endpoint(format!("n{id}"))),
            o,
        )
        .unwrap()
    }

    fn coordinator(&self) -> Node {
        let o = NodeOptions {
            node_id: 0x7000,
            writers: 0,
            coordinator: Some(CoordinatorConfig { epoch_ms: 50, eoe_timeout_ms: 200, ..CoordinatorConfig::default() }),
            ..NodeOptions::default()
        };
        Node::start(NodeKeys::derive(&self.meta, &self.app, &o).unwrap(), Arc::new(self.hub.endpoint("coord")), o)
            .unwrap()
    }
}

fn up() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(true))
}

fn put_many(n: &Node, tag: &str, count: usize) {
    for i in 0..count {
        n.put(format!("{tag}-{}", i % 500).as_bytes(), format!("{tag}-v{i}").as_bytes()).unwrap();
    }
}

/// Waits until `s` holds at least every head of `of` (bounded).
fn wait_caught_up(s: &Server, of: &Server, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (a, b) = (s.heads(), of.heads());
        if b.iter().all(|(w, (seq, _))| a.get(w).is_some_and(|(s2, _)| s2 >= seq)) {
            return;
        }
        assert!(Instant::now() < deadline, "server did not catch up within {within:?}: has {a:?}, peer {b:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn server_quorum_acks_make_writes_durable_and_a_restarted_server_catches_up() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    let mut servers: Vec<Option<Server>> = (0..3).map(|i| Some(w.server(i, &ups[i as usize]))).collect();
    let node = w.node(1);
    put_many(&node, "a", 3000);
    node.sync_durable(Duration::from_secs(20)).expect("durable with three servers");
    // A durable write is on f + 1 = 2 disks at least.
    let with_all = servers.iter().flatten().filter(|s| !s.is_empty()).count();
    assert!(with_all >= 2);
    // One server down: durability goes on with the other two.
    servers[0].take().unwrap().shutdown();
    put_many(&node, "b", 3000);
    node.sync_durable(Duration::from_secs(20)).expect("durable with two of three servers");
    // Restarted, it catches up by anti-entropy alone.
    servers[0] = Some(w.server(0, &ups[0]));
    wait_caught_up(servers[0].as_ref().unwrap(), servers[1].as_ref().unwrap(), Duration::from_secs(30));
    for s in servers.iter().flatten() {
        assert!(s.check().unwrap().is_clean());
        assert!(s.failed().is_none());
    }
}

#[test]
fn server_two_of_three_down_times_out_naming_the_acks() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    let s0 = w.server(0, &ups[0]);
    let node = w.node(2);
    put_many(&node, "x", 200);
    let t0 = Instant::now();
    let err = node.sync_durable(Duration::from_millis(800)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "bounded wait");
    match &err {
        NodeError::DurableTimeout { acked_by, quorum, servers, .. } => {
            assert_eq!((*acked_by, *quorum, *servers), (1, 2, 3), "{err}");
        }
        e => panic!("expected a durability timeout, got {e}"),
    }
    assert!(err.to_string().contains("only 1 of the 3"), "{err}");
    drop(s0);
}

#[test]
fn server_cut_off_catches_up_without_operator_action() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    let servers: Vec<Server> = (0..3).map(|i| w.server(i, &ups[i as usize])).collect();
    let node = w.node(3);
    put_many(&node, "c", 500);
    node.sync_durable(Duration::from_secs(20)).unwrap();
    ups[2].store(false, Ordering::Release);
    put_many(&node, "d", 3000);
    node.sync_durable(Duration::from_secs(20)).expect("two servers suffice");
    assert!(servers[2].len() < servers[0].len(), "the cut-off server missed records");
    ups[2].store(true, Ordering::Release);
    wait_caught_up(&servers[2], &servers[0], Duration::from_secs(30));
}

fn corrupt_middle(log: &Path) {
    let mut b = std::fs::read(log).unwrap();
    let mid = b.len() / 2;
    for x in &mut b[mid..mid + 16] {
        *x ^= 0x5a;
    }
    std::fs::write(log, b).unwrap();
}

#[test]
fn server_corrupted_log_is_reported_and_repaired_from_peers() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    let mut servers: Vec<Option<Server>> = (0..3).map(|i| Some(w.server(i, &ups[i as usize]))).collect();
    let node = w.node(4);
    put_many(&node, "e", 4000);
    node.sync_durable(Duration::from_secs(20)).unwrap();
    wait_caught_up(servers[0].as_ref().unwrap(), servers[1].as_ref().unwrap(), Duration::from_secs(20));
    servers[0].take().unwrap().shutdown();
    corrupt_middle(&w.dirs[0].join(psl_store::LOG_FILE));
    {
        let (st, _) = psl_store::DiskStore::open_readonly(&w.dirs[0], None).unwrap();
        let rep = st.check().unwrap();
        assert!(!rep.is_clean(), "check reports the damage");
    }
    let s0 = w.server(0, &ups[0]);
    assert!(s0.start_report().repaired, "repaired on start: {:?}", s0.start_report());
    assert!(!s0.start_report().problems.is_empty());
    wait_caught_up(&s0, servers[1].as_ref().unwrap(), Duration::from_secs(30));
    assert!(s0.check().unwrap().is_clean());
}

#[test]
fn server_stale_prefix_is_caught_by_a_reader_that_knows_a_newer_sync() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    let servers: Vec<Server> = (0..3).map(|i| w.server(i, &ups[i as usize])).collect();
    let _coord = w.coordinator();
    let node = w.node(5);
    put_many(&node, "f", 200);
    node.sync(Duration::from_secs(20)).unwrap();
    node.sync_durable(Duration::from_secs(20)).unwrap();
    ups[2].store(false, Ordering::Release);
    put_many(&node, "g", 500);
    node.sync(Duration::from_secs(20)).unwrap();
    node.sync_durable(Duration::from_secs(20)).unwrap();
    // The reader's newest SYNC: from a server it trusts to be fresh enough (any verified SYNC
    // would do: signatures make its source irrelevant). Wait until a server stored one that
    // links the node's newest records.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (_epoch, links) = loop {
        let s = servers[0].latest_sync().unwrap().expect("a SYNC");
        let h = s.header().clone();
        if h.links.iter().any(|l| l.writer >= 5 << 16 && l.writer < 6 << 16 && l.seq > 0) && h.epoch > 2 {
            break (h.epoch, h.links.clone());
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    };
    let view = |s: &Server| -> Result<(), Stale> {
        let heads = s.heads();
        let hash_at = |w: u32, q: u64| s.range(w, q, q).ok().and_then(|v| v.first().map(|r| r.hash()));
        check_fresh(&ServerView { heads: &heads, hash_at: &hash_at }, &links)
    };
    let stale = view(&servers[2]);
    assert!(stale.is_err(), "the cut-off server serves a stale prefix and is caught");
    // Another server passes: the reader reads from it instead.
    let deadline = Instant::now() + Duration::from_secs(20);
    while view(&servers[1]).is_err() {
        assert!(Instant::now() < deadline, "server 1 never became fresh: {:?}", view(&servers[1]));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn server_reads_over_tcp_and_a_withholding_server_is_skipped() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    let opts = |id: u32, fsync| ServerOptions {
        id,
        fsync,
        read_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    // Each server runs another fsync policy: all of them ack only what they synced.
    // With server 2 cut off below, durability rests on servers 0 (group) and 1 (interval).
    let policies = [FsyncPolicy::Group, FsyncPolicy::IntervalMs(5), FsyncPolicy::Always];
    let servers: Vec<Server> =
        (0..3).map(|i| w.server_with(i, &ups[i as usize], opts(i, policies[i as usize]))).collect();
    let addrs: Vec<_> = servers.iter().map(|s| s.read_addr().unwrap()).collect();
    let _coord = w.coordinator();
    let node = w.node(6);
    put_many(&node, "r", 200);
    node.sync(Duration::from_secs(20)).unwrap();
    node.sync_durable(Duration::from_secs(20)).unwrap();
    ups[2].store(false, Ordering::Release);
    put_many(&node, "s", 300);
    node.sync(Duration::from_secs(20)).unwrap();
    node.sync_durable(Duration::from_secs(20)).unwrap();
    let v = psl_capsule::Verifier::new(w.meta.clone(), None);

    // Every read the in-process API offers, over TCP, agrees with it.
    let mut c = ReadClient::connect(addrs[0]).unwrap();
    let heads = c.heads().unwrap();
    let local = servers[0].heads();
    for (wr, (seq, hash)) in &heads {
        let (lseq, lhash) = local.get(wr).copied().unwrap_or((0, psl_crypto::Hash256::ZERO));
        assert!(lseq >= *seq, "TCP heads ahead of the store");
        if lseq == *seq {
            assert_eq!(lhash, *hash);
        }
        let chain = c.range(&v, *wr, 0, *seq).unwrap();
        assert_eq!(chain.len() as u64, seq + 1);
        assert_eq!(chain.last().unwrap().hash(), *hash);
        let one = c.get(&v, hash).unwrap().expect("the head record");
        assert_eq!(one.hash(), *hash);
        let p = c.proof(&v, hash).unwrap();
        assert_eq!(p.verify(Some(w.meta.name())).unwrap().target.hash, *hash);
    }
    assert!(c.get(&v, &psl_crypto::Hash256([7; 32])).unwrap().is_none());
    let sync = c.latest_sync(&v).unwrap().expect("a SYNC");
    assert_eq!(sync.header().kind, psl_capsule::Kind::Sync);
    // STATS over TCP: the server's own counters, as its in-process view gives them.
    let before = servers[0].len() as u64;
    let st = c.stats().unwrap();
    assert_eq!(st["writer"], servers[0].stats_json()["writer"], "{st}");
    // The coordinator keeps writing RTS and SYNC records meanwhile.
    assert!(st["records"].as_u64().unwrap() >= before && before > 0, "{st}");
    assert!(st["acks_sent"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["in_dropped"], 0, "{st}");

    // Wait for a SYNC that the cut-off server cannot have: one linking the node's later writes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let newest = loop {
        let s = c.latest_sync(&v).unwrap().expect("a SYNC");
        let stale_heads = ReadClient::connect(addrs[2]).unwrap().heads().unwrap();
        let ahead = s.header().links.iter().any(|l| stale_heads.get(&l.writer).is_none_or(|(q, _)| *q < l.seq));
        if ahead {
            break (s.header().epoch, s.header().links.clone());
        }
        assert!(Instant::now() < deadline, "no SYNC beyond the cut-off server's copy");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The withholding server is asked first, and skipped; the copy comes from a fresh one.
    let order = [addrs[2], addrs[0], addrs[1]];
    let got = fetch_fresh(&order, &v, Some(newest.clone())).unwrap();
    assert_eq!(got.servers.len(), 1);
    assert_ne!(got.servers[0], addrs[2]);
    assert!(got.skipped.iter().any(|(a, why)| *a == addrs[2] && why.contains("stale")), "{:?}", got.skipped);
    let mut r = psl_capsule::Replica::new(w.meta.name());
    for rec in got.records {
        r.insert(rec).unwrap();
    }
    for l in &newest.1 {
        assert!(r.get(&l.hash).is_some(), "the fetched copy holds every record the SYNC links");
    }
    // A majority of fresh copies: the two up-to-date servers, in union; the stale one skipped.
    let q = fetch_quorum(&order, &v, Some(newest.clone()), 2).unwrap();
    assert_eq!(q.servers, vec![addrs[0], addrs[1]]);
    // With the stale server and one fresh one, no majority of fresh copies exists.
    let err = fetch_quorum(&[addrs[2], addrs[0]], &v, Some(newest.clone()), 2).unwrap_err();
    assert!(err.to_string().contains("1 fresh copies of the 2 needed"), "{err}");
    // Only the stale server left: no fresh copy, and the error says why.
    let err = fetch_fresh(&[addrs[2]], &v, Some(newest.clone())).unwrap_err();
    assert!(err.to_string().contains("stale"), "{err}");

    // Waiting: all three copies needed while server 2 is cut off. Bounded, it fails at the
    // deadline saying what it waited for...
    let t0 = Instant::now();
    let err = fetch_quorum_within(&order, &v, Some(newest.clone()), 3, Patience::within(Duration::from_millis(600)))
        .unwrap_err()
        .to_string();
    assert!(t0.elapsed() >= Duration::from_millis(300), "it gave up before the deadline");
    // At most 2 (a loaded machine may time a fresh server out too; a first round slower than the
    // whole wait leaves no "after waiting").
    assert!(err.contains("2 fresh copies of the 3 needed") || err.contains("1 fresh copies of the 3 needed"), "{err}");
    assert!(err.contains("links") && err.contains("stale"), "{err}");
    // ... and once the server is reconnected and catches up by anti-entropy, the same wait
    // succeeds, with all three, the union holding every record the newest SYNC links.
    let reconnect = {
        let up2 = ups[2].clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            up2.store(true, Ordering::Release);
        })
    };
    let q = fetch_quorum_within(&order, &v, Some(newest.clone()), 3, Patience::within(Duration::from_secs(60)))
        .expect("server 2 catches up within the wait");
    reconnect.join().unwrap();
    assert!(q.rounds > 1, "server 2 was stale at first");
    assert_eq!(q.servers.len(), 3);
    let held: std::collections::HashSet<_> = q.records.iter().map(|r| r.hash()).collect();
    assert!(newest.1.iter().all(|l| held.contains(&l.hash)));
}

/// Puts `count` one-op writes as fast as they are admitted; returns the most ops the node had in
/// flight to the servers right after any of them.
fn put_fast(n: &Node, tag: &str, count: usize) -> usize {
    let mut most = 0;
    for i in 0..count {
        n.put(format!("{tag}-{i}").as_bytes(), b"v").unwrap();
        most = most.max(n.flow_unacked_ops());
    }
    most
}

#[test]
fn server_acks_pace_a_writer_and_a_lost_quorum_opens_its_window_until_acks_move() {
    let w = World::new();
    let ups: Vec<_> = (0..3).map(|_| up()).collect();
    // Servers that sync, and so ack, only every 150 ms: far behind a writer of small records.
    let slow = |id| ServerOptions { id, fsync: FsyncPolicy::IntervalMs(150), ..Default::default() };
    let _servers: Vec<Server> = (0..3).map(|i| w.server_with(i, &ups[i as usize], slow(i))).collect();
    const WINDOW: usize = 200;
    let node = w.node_with(7, |o| {
        o.writers = 1;
        o.batch_ops_max = 4;
        o.flow = FlowOptions { window_ops: WINDOW, stall: Duration::from_secs(2), ..FlowOptions::default() };
    });
    let m = node.metrics().clone();
    // Paced: never more than the window in flight (without flow control all 1,200 would be).
    let most = put_fast(&node, "a", 1200);
    assert!(most <= WINDOW, "{most} ops in flight, window {WINDOW}");
    let waits = Metrics::get(&m.flow_waits);
    assert!(waits > 0, "the writer never waited for the servers");
    assert_eq!(Metrics::get(&m.flow_opened), 0, "acks kept moving: the window must not open");
    node.sync_durable(Duration::from_secs(20)).expect("durable");

    // Two of three servers cut off: no quorum acks. The writer waits one stall, then goes on.
    ups[1].store(false, Ordering::Release);
    ups[2].store(false, Ordering::Release);
    let t0 = Instant::now();
    put_fast(&node, "b", 1200);
    assert_eq!(Metrics::get(&m.flow_opened), 1, "the window opens once");
    assert!(t0.elapsed() >= Duration::from_secs(2), "it waited the stall first");

    // Back: acks move, the window closes and paces the writer again.
    ups[1].store(true, Ordering::Release);
    ups[2].store(true, Ordering::Release);
    node.sync_durable(Duration::from_secs(30)).expect("durable once the servers are back");
    let most = put_fast(&node, "c", 1200);
    assert!(most <= WINDOW, "{most} ops in flight after the window closed, window {WINDOW}");
    assert!(Metrics::get(&m.flow_waits) > waits, "paced again");
    assert_eq!(Metrics::get(&m.flow_opened), 1);
}
