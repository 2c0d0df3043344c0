//! CapsuleDB on the capsule servers, in one process (in-process fabric, three real servers on
//! disk with their TCP read interface): blocks and indexes reach every server through the
//! fabric and the index only after a majority acked its blocks; after a crash of the role (its
//! memtable lost), a database opened from the servers' newest index plus the replay of the
//! writes above its frontier holds every key; a restarted role takes a new block-writer
//! incarnation; a server that lies about a block is caught, counted, and another server read;
//! a server cut off from the fabric (stale) is skipped by the replay.

use psl_capsule::{new_capsule, Author, Limits, SignedMetadata, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::servers::{self, block_incarnation, Publisher, ServerStore};
use psl_capsuledb::{BlockStore, CapsuleDb, Config};
use psl_crypto::{AppKey, Hash256, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, InProcHub, Switch};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::CoordinatorConfig;
use psl_server::{server_key, Server, ServerOptions};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROLE_ID: u32 = 30_000;

struct World {
    _t: tempfile::TempDir,
    hub: InProcHub,
    meta: SignedMetadata,
    app: AppKey,
    servers: Vec<Server>,
    reads: Vec<SocketAddr>,
    ups: Vec<Arc<AtomicBool>>,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().unwrap();
        let owner = OwnerKey::generate();
        let app = owner.app(1).unwrap();
        let meta = new_capsule(&owner, 1, "capsuledb-servers", 0, Limits::default()).unwrap();
        let hub = InProcHub::new(FabricConfig { queue_msgs_max: 1 << 15, ..FabricConfig::default() }).unwrap();
        let ups: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
        let servers: Vec<Server> = (0..3)
            .map(|id| {
                let opts =
                    ServerOptions { id, read_listen: Some("127.0.0.1:0".parse().unwrap()), ..Default::default() };
                let ep = Arc::new(Switch::new(hub.endpoint(format!("server{id}")), ups[id as usize].clone()));
                Server::start(&t.path().join(format!("s{id}")), meta.clone(), server_key(&app, id).unwrap(), ep, opts)
                    .unwrap()
            })
            .collect();
        let reads = servers.iter().map(|s| s.read_addr().unwrap()).collect();
        World { _t: t, hub, meta, app, servers, reads, ups }
    }

    fn node(&self, id: u32, f: impl FnOnce(&mut NodeOptions)) -> Node {
        let mut o = NodeOptions { node_id: id, writers: 2, ..NodeOptions::default() }.shared_cores();
        o.core.servers = 3;
        f(&mut o);
        let ep: Arc<dyn Fabric> = Arc::new(self.hub.endpoint(format!("n{id}")));
        Node::start(NodeKeys::derive(&self.meta, &self.app, &o).unwrap(), ep, o).unwrap()
    }

    fn public(&self) -> Verifier {
        Verifier::new(self.meta.clone(), None)
    }

    fn keyed(&self) -> Verifier {
        Verifier::new(self.meta.clone(), Some(self.app.data_key()))
    }

    fn config() -> Config {
        Config { memtable_entries_max: 100, block_entries_max: 100, ..Config::default() }
    }

    /// The role as `psl capsuledb --servers` starts it: survey, new block-writer incarnation,
    /// node, open the newest index (or create), start with answers held, replay, serve.
    fn role(&self, opts: RoleOptions) -> (Role, Arc<Publisher>, servers::ReplayReport) {
        self.role_with(opts, 65_536, Duration::from_secs(20))
    }

    fn role_with(
        &self,
        opts: RoleOptions,
        journal: usize,
        durable_timeout: Duration,
    ) -> (Role, Arc<Publisher>, servers::ReplayReport) {
        let survey = servers::survey_fresh(&self.reads, &self.public(), 2, Duration::from_secs(10));
        assert_eq!(survey.reached.len(), 3, "{:?}", survey.skipped);
        let inc = survey.next_incarnation(ROLE_ID, &self.public()).unwrap();
        let publisher = Publisher::new(servers::block_writer(ROLE_ID, inc).unwrap(), durable_timeout);
        let stores: Vec<Arc<dyn BlockStore>> =
            ServerStore::for_servers(&self.reads, &publisher).into_iter().map(|s| s as Arc<dyn BlockStore>).collect();
        let node = Arc::new(self.node(ROLE_ID, |o| {
            o.writers = 0;
            o.memtable_keys_max = Some(1024);
            o.capsuledb_role = Some(journal);
        }));
        publisher.attach(node.clone());
        let author = Author::new(&self.meta, &self.app, publisher.writer()).unwrap();
        let db = match survey.newest_index(ROLE_ID, &self.public()).unwrap() {
            Some(h) => CapsuleDb::open(Self::config(), stores, self.keyed(), author, h).unwrap(),
            None => CapsuleDb::create(Self::config(), stores, self.keyed(), author).unwrap(),
        };
        let frontier = db.frontier().clone();
        let answer = psl_scl::writer_index(ROLE_ID, 0, 15).unwrap();
        let keys =
            RoleKeys { writer: answer, signing: self.app.writer(answer).unwrap(), data_key: self.app.data_key() };
        let role = Role::start_shared(node, db, keys, Vec::new(), opts, false, Some(publisher.clone())).unwrap();
        let report = servers::replay(role.db(), &survey, &frontier, &self.public(), &self.keyed(), ROLE_ID, 2).unwrap();
        role.serve();
        (role, publisher, report)
    }

    /// A read-only database opened from the servers' newest index (no node: nothing is written).
    fn open_readonly(&self, reads: &[SocketAddr]) -> (CapsuleDb, servers::Survey) {
        let survey = servers::survey_fresh(reads, &self.public(), 2, Duration::from_secs(10));
        let publisher = Publisher::new(servers::block_writer(ROLE_ID, 4095).unwrap(), Duration::from_secs(1));
        let stores: Vec<Arc<dyn BlockStore>> =
            ServerStore::for_servers(reads, &publisher).into_iter().map(|s| s as Arc<dyn BlockStore>).collect();
        let h = survey.newest_index(ROLE_ID, &self.public()).unwrap().expect("an index on the servers");
        let author = Author::new(&self.meta, &self.app, publisher.writer()).unwrap();
        // A memtable that never freezes: this database writes nothing.
        let config = Config { memtable_entries_max: 60_000, ..Self::config() };
        (CapsuleDb::open(config, stores, self.keyed(), author, h).unwrap(), survey)
    }
}

fn wait(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn val(tag: &str, i: usize) -> Vec<u8> {
    format!("{tag}-value-{i}").into_bytes()
}

#[test]
fn capsuledb_blocks_on_servers_and_restart_replays_writes_above_the_index() {
    let w = World::new();
    let _coord = w.node(0x7000, |o| {
        o.writers = 0;
        o.coordinator = Some(CoordinatorConfig { epoch_ms: 50, eoe_timeout_ms: 200, ..CoordinatorConfig::default() });
    });
    // Never idle-freeze: what is not frozen by the size rule stays in the role's memtable.
    let no_idle = RoleOptions { idle_flush: Duration::from_secs(3600), ..RoleOptions::default() };
    let (role, publisher, first) = w.role(no_idle);
    assert_eq!(first.records, 0, "nothing to replay on a fresh start");
    let block_writer = publisher.writer();
    assert_eq!(block_incarnation(ROLE_ID, block_writer), Some(0));
    let worker = w.node(1, |_| {});
    for i in 0..250 {
        worker.put(format!("a{i:03}").as_bytes(), &val("a", i)).unwrap();
    }
    worker.sync_durable(Duration::from_secs(20)).unwrap();
    // 250 writes: two freezes (more than 100 entries each), about 48 left in the memtable.
    wait("two freezes", Duration::from_secs(20), || {
        let db = role.db().lock();
        db.index_seq() >= 2 && db.memtable_len() + 202 >= 250
    });
    // Written after the newest index: only in the role's memtable.
    for i in 0..30 {
        worker.put(format!("b{i:03}").as_bytes(), &val("b", i)).unwrap();
    }
    worker.delete(b"a000").unwrap();
    worker.sync_durable(Duration::from_secs(20)).unwrap();
    wait("the role applying every write", Duration::from_secs(20), || {
        role.stats().applied.load(std::sync::atomic::Ordering::Relaxed) >= 281
    });
    let (seq, newest) = {
        let db = role.db().lock();
        assert!(db.memtable_len() >= 31, "writes after the index are in the memtable only");
        (db.index_seq(), db.newest_index())
    };
    // Every server stored the block writer's chain up to the newest index (durable before the
    // index was recorded: at least a majority at once, every server after anti-entropy).
    wait("every server holding the newest index", Duration::from_secs(20), || {
        w.servers.iter().all(|s| s.get(&Hash256(newest)).unwrap().is_some())
    });
    for s in &w.servers {
        let (head, _) = s.heads()[&block_writer];
        assert!(head >= 3, "server {:?} holds the block chain up to {head}", s.writer());
    }
    // Crash: the role's memtable is lost.
    role.shutdown();
    drop(publisher);

    // From the servers alone: the newest index, without the writes after it...
    let (db, survey) = w.open_readonly(&w.reads);
    assert_eq!(db.index_seq(), seq);
    let frontier = db.frontier().clone();
    let db = parking_lot::Mutex::new(db);
    assert_eq!(db.lock().get(b"b000").unwrap(), None, "b000 was written after the newest index");
    // ... and with the replay of what the servers hold above its frontier.
    let r = servers::replay(&db, &survey, &frontier, &w.public(), &w.keyed(), ROLE_ID, 2).unwrap();
    assert!(r.ops >= 31 && r.ops < 281, "replayed only above the frontier: {r:?}");
    assert_eq!(r.writers, worker.writers().len().min(r.writers).max(1));
    {
        let mut db = db.lock();
        assert_eq!(db.get(b"a000").unwrap(), None, "a000 was deleted after the index");
        for i in 1..250 {
            assert_eq!(db.get(format!("a{i:03}").as_bytes()).unwrap(), Some(val("a", i)), "a{i:03}");
        }
        for i in 0..30 {
            assert_eq!(db.get(format!("b{i:03}").as_bytes()).unwrap(), Some(val("b", i)), "b{i:03}");
        }
    }
    drop(db);

    // The restarted role: a new block-writer incarnation, the same keys, and it keeps writing.
    let (role, publisher, replayed) = w.role(RoleOptions::default());
    assert_eq!(block_incarnation(ROLE_ID, publisher.writer()), Some(1));
    assert!(replayed.ops >= 31, "{replayed:?}");
    for i in 0..30 {
        assert_eq!(role.db().lock().get(format!("b{i:03}").as_bytes()).unwrap(), Some(val("b", i)));
    }
    worker.put(b"c000", b"after-restart").unwrap();
    wait("c000 applied and frozen, the new incarnation's chain on the servers", Duration::from_secs(20), || {
        let mut db = role.db().lock();
        db.get(b"c000").unwrap().is_some()
            && db.memtable_len() == 0
            && w.servers.iter().filter(|s| s.heads().contains_key(&publisher.writer())).count() >= 2
    });
    assert!(role.db().lock().index_seq() > seq);
    assert_eq!(role.db().lock().get(b"c000").unwrap(), Some(b"after-restart".to_vec()));
}

/// A read-interface proxy in front of a real server that alters every record it returns for
/// `GET` (flips one byte in the middle).
fn lying_proxy(upstream: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || {
                let mut up = TcpStream::connect(upstream).unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut out = s;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    up.write_all(line.as_bytes()).unwrap();
                    let Ok(Ok(mut frames)) = psl_server::read::read_answer(&mut up) else { return };
                    if line.starts_with("GET") {
                        if let Some(f) = frames.first_mut() {
                            let n = f.len();
                            f[n / 2] ^= 0x20;
                        }
                    }
                    let mut b = (frames.len() as u32).to_be_bytes().to_vec();
                    for f in frames {
                        b.extend_from_slice(&(f.len() as u32).to_be_bytes());
                        b.extend_from_slice(&f);
                    }
                    if out.write_all(&b).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

#[test]
fn capsuledb_altered_block_from_one_server_is_counted_and_read_from_another() {
    let w = World::new();
    let (role, publisher, _) = w.role(RoleOptions { idle_flush: Duration::from_millis(100), ..RoleOptions::default() });
    let worker = w.node(1, |_| {});
    for i in 0..150 {
        worker.put(format!("k{i:03}").as_bytes(), &val("k", i)).unwrap();
    }
    wait("every write frozen", Duration::from_secs(20), || {
        let db = role.db().lock();
        role.stats().applied.load(std::sync::atomic::Ordering::Relaxed) >= 150 && db.memtable_len() == 0
    });
    let newest = role.db().lock().newest_index();
    wait("the newest index on every server", Duration::from_secs(20), || {
        w.servers.iter().all(|s| s.get(&Hash256(newest)).unwrap().is_some())
    });
    role.shutdown();
    drop(publisher);

    // Server 0 is read through a proxy that alters every record: the index is read from
    // another server, and so is every block; each altered copy is counted.
    let reads = vec![lying_proxy(w.reads[0]), w.reads[1], w.reads[2]];
    let (mut db, _) = w.open_readonly(&reads);
    for i in 0..150 {
        assert_eq!(db.get(format!("k{i:03}").as_bytes()).unwrap(), Some(val("k", i)), "k{i:03}");
    }
    let st = db.stats();
    assert!(st.block_fetches >= 1);
    assert!(st.rejected_copies > st.block_fetches, "every fetch (and the index) met an altered copy first: {st:?}");

    // Only lying servers: a read fails (an error, never a wrong value).
    let (mut honest, _) = w.open_readonly(&w.reads);
    let _ = honest.get(b"k000").unwrap();
    let liars = vec![lying_proxy(w.reads[1]), lying_proxy(w.reads[2])];
    let publisher = Publisher::new(servers::block_writer(ROLE_ID, 4095).unwrap(), Duration::from_secs(1));
    let stores: Vec<Arc<dyn BlockStore>> =
        ServerStore::for_servers(&liars, &publisher).into_iter().map(|s| s as Arc<dyn BlockStore>).collect();
    let author = Author::new(&w.meta, &w.app, publisher.writer()).unwrap();
    assert!(CapsuleDb::open(World::config(), stores, w.keyed(), author, honest.newest_index()).is_err());
}

#[test]
fn capsuledb_replay_skips_a_stale_server() {
    let w = World::new();
    let _coord = w.node(0x7000, |o| {
        o.writers = 0;
        o.coordinator = Some(CoordinatorConfig { epoch_ms: 50, eoe_timeout_ms: 200, ..CoordinatorConfig::default() });
    });
    let no_idle = RoleOptions { idle_flush: Duration::from_secs(3600), ..RoleOptions::default() };
    let (role, publisher, _) = w.role(no_idle);
    let worker = w.node(1, |_| {});
    for i in 0..40 {
        worker.put(format!("x{i:03}").as_bytes(), &val("x", i)).unwrap();
    }
    worker.sync_durable(Duration::from_secs(20)).unwrap();
    // Server 2 is cut off; writes and SYNCs go on without it.
    w.ups[2].store(false, Ordering::Release);
    for i in 0..40 {
        worker.put(format!("y{i:03}").as_bytes(), &val("y", i)).unwrap();
    }
    worker.sync_durable(Duration::from_secs(20)).unwrap();
    worker.sync(Duration::from_secs(20)).unwrap();
    role.shutdown();
    drop(publisher);
    let stale = w.reads[2];
    wait("server 2 behind the SYNC the others hold", Duration::from_secs(20), || {
        let s = servers::survey(&w.reads, &w.public());
        s.reached.len() == 3 && s.fresh().len() == 2 && s.fresh().iter().all(|r| r.addr != stale)
    });
    let (db, survey) = w.open_readonly(&w.reads);
    assert!(db.frontier().is_empty(), "nothing was frozen");
    let db = parking_lot::Mutex::new(db);
    let r = servers::replay(&db, &survey, &BTreeMap::new(), &w.public(), &w.keyed(), ROLE_ID, 2).unwrap();
    assert!(r.skipped.iter().any(|(a, why)| *a == stale && why.contains("stale")), "{r:?}");
    assert!(!r.servers.contains(&stale), "{r:?}");
    let mut db = db.lock();
    for i in 0..40 {
        assert_eq!(db.get(format!("x{i:03}").as_bytes()).unwrap(), Some(val("x", i)));
        assert_eq!(db.get(format!("y{i:03}").as_bytes()).unwrap(), Some(val("y", i)));
    }
}

/// The role's journal holds 32 updates: while the tree waits for the servers' acks (holding
/// the database), the node's core must not block on the full journal, or no ack is processed
/// and every index waits for its timeout. A writer filling 40 memtables shows no such wait.
#[test]
fn capsuledb_waiting_for_acks_does_not_block_the_node_on_a_full_journal() {
    let w = World::new();
    // A wait that timed out would fail the index write: 3 s is far above an ack's latency.
    let (role, publisher, _) = w.role_with(RoleOptions::default(), 32, Duration::from_secs(3));
    let worker = w.node(1, |_| {});
    for i in 0..4000 {
        worker.put(format!("z{i:05}").as_bytes(), &val("z", i)).unwrap();
    }
    worker.sync_durable(Duration::from_secs(20)).unwrap();
    wait("every write applied and frozen", Duration::from_secs(60), || {
        role.stats().applied.load(std::sync::atomic::Ordering::Relaxed) >= 4000 && role.db().lock().memtable_len() == 0
    });
    assert_eq!(role.stats().errors.load(std::sync::atomic::Ordering::Relaxed), 0, "no index write failed");
    assert!(role.db().lock().index_seq() >= 40);
    for i in (0..4000).step_by(97) {
        assert_eq!(role.db().lock().get(format!("z{i:05}").as_bytes()).unwrap(), Some(val("z", i)));
    }
    drop(publisher);
}
