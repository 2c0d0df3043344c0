//! `psl capsuledb`: run the CapsuleDB role, or read its history.
//!
//! - `psl capsuledb --capsule F --owner K --fabric URL [--store DIR ...] [--servers A,B,C]`:
//!   joins the fabric as a receive-only node, applies every write to the LSM tree, stores
//!   blocks and indexes as signed, encrypted records in every `--store` directory and, with
//!   `--servers` (the capsule servers' read addresses), on the capsule servers (published on
//!   the fabric; an index only after a majority acked its blocks). Reads verify and fall back
//!   to the next directory or server. Answers workers' reads and publishes its frontier.
//!   Restarts from the newest index recorded in the directories or on the servers, and with
//!   `--servers` replays the writes above that index's frontier from them before it answers
//!   reads. Prints `ready writer=W index=N`; workers pass `--capsuledb W` (and
//!   `--memtable-keys-max`) to `psl node`.
//! - `psl capsuledb snapshots --capsule F --owner K (--store DIR | --servers A,B,C)`: lists
//!   every kept index.
//! - `psl capsuledb get KEY --at N ...`: reads KEY as index N had it (newest without `--at`).

use crate::kvkeys::KvKeys;
use crate::util::show_bytes;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use psl_capsule::{CapsuleFile, SignedMetadata, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::servers::{self, Survey};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, DirStore, Publisher, RecordHash, ServerStore};
use psl_node::{KeySource, Node, NodeKeys, NodeOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `psl capsuledb`: run the CapsuleDB role, or read its stores with a subcommand.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CapsuleDbArgs {
    /// `snapshots` or `get` instead of running the role.
    #[command(subcommand)]
    pub cmd: Option<CapsuleDbCmd>,
    /// The capsule, the owner key and where the records are (the subcommands take them too).
    #[command(flatten)]
    pub open: OpenArgs,
    /// The KV keys from the leader instead of --owner (attesting with --attest).
    #[command(flatten)]
    pub kv: crate::kvkeys::KvLeaderArgs,
    /// How the role attests to the leader (with --kv-leader).
    #[command(flatten)]
    pub attest: crate::attest::AttestArgs,
    /// The fabric (`--fabric URL`, alias `--router`) and its NATS options.
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    /// Node id of the role (1 to 32766); its writer index is `id << 16 | 15`.
    #[arg(long, default_value_t = 30_000)]
    pub id: u32,
    /// Memtable entries before a freeze into level 0 (one run of blocks).
    #[arg(long, default_value_t = psl_capsuledb::Config::default().memtable_entries_max)]
    pub memtable_entries: usize,
    /// Level-0 runs (about one per freeze) before level 0 merges into level 1.
    #[arg(long, default_value_t = psl_capsuledb::Config::default().l0_blocks_max)]
    pub l0_blocks: usize,
    /// Size ratio between levels.
    #[arg(long, default_value_t = psl_capsuledb::Config::default().fanout)]
    pub fanout: usize,
    /// Entries per block (a point read fetches at most one block per level-0 run and per level).
    #[arg(long, default_value_t = psl_capsuledb::Config::default().block_entries_max)]
    pub block_entries: usize,
    /// The read cache, in blocks' worth of entries (see docs/protocol/capsuledb.md §3).
    #[arg(long, default_value_t = psl_capsuledb::Config::default().cache_blocks_max)]
    pub cache_blocks: usize,
    /// Freeze a non-empty memtable that has not changed the index for this long.
    #[arg(long, default_value_t = 500)]
    pub idle_flush_ms: u64,
    /// How often to ack what this role has taken in: writers that use CapsuleDB are paced by
    /// these acks (docs/protocol/capsuledb.md §1). 0: never ack (writers are then not paced
    /// by CapsuleDB, and a full queue here drops records that must be repaired).
    #[arg(long, default_value_t = psl_capsuledb::role::ACK_EVERY_MS_DEFAULT)]
    pub ack_every_ms: u64,
    /// Hold the acks while more updates than this wait for the tree (journaled, or spilled
    /// while blocks wait for the servers).
    #[arg(long, default_value_t = psl_capsuledb::role::ACK_BACKLOG_MAX_DEFAULT)]
    pub ack_backlog_max: usize,
    /// Serve the role's node control interface here (STATS, METRICS: what `psl status` reads;
    /// GET, DUMP and DIGEST for the operator, see --control-pub).
    #[arg(long, value_name = "ADDR")]
    pub control: Option<SocketAddr>,
    /// Who may use the control interface (`--control-pub`, `--control-idle-ms`).
    #[command(flatten)]
    pub control_auth: crate::roles::ControlArgs,
    /// The memory budget (`--memory-budget-mb`).
    #[command(flatten)]
    pub budget: crate::roles::BudgetArgs,
    /// Prometheus metrics over HTTP (`--metrics ADDR`).
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
    /// How the ring threads wait for work (`--dedicated-cores`).
    #[command(flatten)]
    pub cores: crate::roles::CoresArgs,
}

/// Where CapsuleDB's records are and how to open them: the capsule file, the owner key, the
/// store directories and the capsule servers.
#[derive(Args, Debug, Clone)]
pub struct OpenArgs {
    /// The capsule file that names the capsule.
    #[arg(long, global = true)]
    pub capsule: Option<PathBuf>,
    /// Owner key file (the data key and CapsuleDB's signing key are derived from it).
    #[arg(long, global = true)]
    pub owner: Option<PathBuf>,
    /// Store directory of block and index records (repeat for copies).
    #[arg(long, global = true)]
    pub store: Vec<PathBuf>,
    /// Read addresses of the capsule servers (`psl capsule-server --read`), comma-separated:
    /// blocks and indexes are stored on them, read back from them, and replayed from after a
    /// restart. List all n (the durability quorum is a majority of them).
    #[arg(long, global = true, value_delimiter = ',')]
    pub servers: Vec<SocketAddr>,
    /// With --servers: how long to wait for a majority of them to be fresh (each holding every
    /// record the newest SYNC links) before the restart's replay gives up; a line is logged
    /// per retry.
    #[arg(long, global = true, default_value_t = 30_000)]
    pub recover_timeout_ms: u64,
}

/// The subcommands of `psl capsuledb`: read the stored tree without running the role.
#[derive(Subcommand, Debug)]
pub enum CapsuleDbCmd {
    /// List the kept indexes (snapshots), newest first.
    Snapshots {
        /// Print one JSON object: the newest index's sequence number and every kept one.
        #[arg(long)]
        json: bool,
    },
    /// Read KEY, as of index `--at` (the newest stored index without it).
    Get {
        /// The key to read (its UTF-8 bytes).
        key: String,
        /// The sequence number of the index to read through (one that `snapshots` lists).
        #[arg(long)]
        at: Option<u64>,
    },
}

/// CapsuleDB's writer index for role node `id`.
pub fn db_writer(id: u32) -> Result<u32> {
    psl_scl::writer_index(id, 0, 15).with_context(|| format!("CapsuleDB id {id} is out of range (1 to 32766)"))
}

/// The capsule's metadata and the `--store` directories (no keys yet: which writers CapsuleDB
/// signs with depends on what the stores hold, [`Stores::open`]).
fn open_dirs(o: &OpenArgs, kv: &crate::kvkeys::KvLeaderArgs) -> Result<(SignedMetadata, Vec<Arc<DirStore>>)> {
    let (Some(capsule), true) = (&o.capsule, o.owner.is_some() || kv.kv_leader.is_some()) else {
        bail!("psl capsuledb needs --capsule and --owner (or --kv-leader)");
    };
    if o.store.is_empty() && o.servers.is_empty() {
        bail!("psl capsuledb needs at least one --store directory or --servers");
    }
    let bytes = std::fs::read(capsule).with_context(|| format!("reading {}", capsule.display()))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", capsule.display()))?;
    let mut stores = Vec::new();
    for d in &o.store {
        stores.push(DirStore::open(d).with_context(|| format!("opening store {}", d.display()))?);
    }
    Ok((f.metadata, stores))
}

/// CapsuleDB `id`'s keys: from the owner key file (development) or from the leader after
/// attestation (in memory): the data key and `writers`' keys, its role writer and, with
/// servers, this start's block writer.
fn load_keys(
    meta: &SignedMetadata,
    o: &OpenArgs,
    kv: &crate::kvkeys::KvLeaderArgs,
    attest: &crate::attest::AttestArgs,
    id: u32,
    writers: &[u32],
) -> Result<KvKeys> {
    crate::kvkeys::kv_keys(meta, o.owner.as_deref(), kv, attest, psl_faas::leader::KvRole::CapsuleDb, id, writers)
}

/// The writers CapsuleDB signs records with besides its node's (none: a receive-only node):
/// its role writer `writer` and, with servers, this start's block writer.
fn own_writers(writer: u32, stores: &Stores) -> Vec<u32> {
    let block = stores.writer(writer);
    if block == writer {
        vec![writer]
    } else {
        vec![writer, block]
    }
}

/// Where CapsuleDB's records are: directories first (local), then the servers.
struct Stores {
    dirs: Vec<Arc<DirStore>>,
    servers: Vec<Arc<ServerStore>>,
    /// Present with `--servers`: what the servers hold, and the role's block writer's
    /// publisher (a new incarnation).
    survey: Option<Survey>,
    publisher: Option<Arc<Publisher>>,
}

impl Stores {
    fn open(o: &OpenArgs, meta: &SignedMetadata, dirs: Vec<Arc<DirStore>>, id: u32) -> Result<Stores> {
        if o.servers.is_empty() {
            return Ok(Stores { dirs, servers: Vec::new(), survey: None, publisher: None });
        }
        let public = Verifier::new(meta.clone(), None);
        let quorum = o.servers.len() / 2 + 1;
        let survey = servers::survey_fresh(&o.servers, &public, quorum, Duration::from_millis(o.recover_timeout_ms));
        if survey.reached.len() < quorum {
            let why: Vec<String> = survey.skipped.iter().map(|(a, e)| format!("{a}: {e}")).collect();
            bail!(
                "psl capsuledb reached {} of the {} capsule servers; {quorum} are needed: {}",
                survey.reached.len(),
                o.servers.len(),
                why.join("; ")
            );
        }
        let inc = survey.next_incarnation(id, &public)?;
        let w = servers::block_writer(id, inc).with_context(|| format!("CapsuleDB id {id}: no block writer"))?;
        let publisher = Publisher::new(w, Duration::from_secs(30));
        let servers = ServerStore::for_servers(&o.servers, &publisher);
        Ok(Stores { dirs, servers, survey: Some(survey), publisher: Some(publisher) })
    }

    fn all(&self) -> Vec<Arc<dyn BlockStore>> {
        let d = self.dirs.iter().map(|s| s.clone() as Arc<dyn BlockStore>);
        d.chain(self.servers.iter().map(|s| s.clone() as Arc<dyn BlockStore>)).collect()
    }

    /// The writer of new records: the new incarnation's block writer with servers, else the
    /// role's own writer (resumed after the newest index, as the records stay local).
    fn writer(&self, role_writer: u32) -> u32 {
        self.publisher.as_ref().map_or(role_writer, |p| p.writer())
    }

    /// Newest index hashes the directories and the servers record.
    fn candidates(&self, meta: &SignedMetadata, id: u32) -> Result<Vec<RecordHash>> {
        let mut out = Vec::new();
        for s in &self.dirs {
            out.extend(s.newest()?);
        }
        if let Some(sv) = &self.survey {
            let public = Verifier::new(meta.clone(), None);
            out.extend(sv.newest_index(id, &public)?);
        }
        Ok(out)
    }
}

/// Opens the database from the newest recorded index (the highest index that verifies), or
/// `None` if none is recorded.
fn open_newest(
    config: Config,
    meta: &SignedMetadata,
    keys: &KvKeys,
    writer: u32,
    stores: &Stores,
    id: u32,
) -> Result<Option<CapsuleDb>> {
    let dyn_stores = stores.all();
    let writer = stores.writer(writer);
    let mut best: Option<CapsuleDb> = None;
    let mut last_err = None;
    for h in stores.candidates(meta, id)? {
        let author = keys.author(meta, writer)?.with_salt_seed(rand::random());
        let verifier = Verifier::new(meta.clone(), Some(keys.data_key()));
        match CapsuleDb::open(config, dyn_stores.clone(), verifier, author, h) {
            Ok(db) if best.as_ref().is_none_or(|b| db.index_seq() > b.index_seq()) => best = Some(db),
            Ok(_) => {}
            Err(e) => last_err = Some(e),
        }
    }
    match (best, last_err) {
        (Some(db), _) => Ok(Some(db)),
        (None, Some(e)) => Err(e).context("no recorded index could be read from any store"),
        (None, None) => Ok(None),
    }
}

/// Runs `psl capsuledb`: the role (until killed), or `snapshots` (exit 0) or `get` (exit 0 if
/// the key holds a value, 1 if deleted or absent).
pub fn run(a: CapsuleDbArgs) -> Result<i32> {
    let config = Config {
        memtable_entries_max: a.memtable_entries,
        l0_blocks_max: a.l0_blocks,
        fanout: a.fanout,
        block_entries_max: a.block_entries,
        cache_blocks_max: a.cache_blocks,
        drop_tombstones: false,
    };
    let writer = db_writer(a.id)?;
    match a.cmd {
        Some(CapsuleDbCmd::Snapshots { json }) => {
            let (meta, dirs) = open_dirs(&a.open, &a.kv)?;
            let stores = Stores::open(&a.open, &meta, dirs, a.id)?;
            let keys = load_keys(&meta, &a.open, &a.kv, &a.attest, a.id, &own_writers(writer, &stores))?;
            let Some(mut db) = open_newest(config, &meta, &keys, writer, &stores, a.id)? else {
                bail!("no index recorded in the store(s): has `psl capsuledb` run on them?");
            };
            let snaps = db.snapshots()?;
            if json {
                println!("{}", serde_json::json!({"newest": db.index_seq(), "snapshots": snaps}));
            } else {
                for s in snaps {
                    println!("{s}");
                }
            }
            Ok(0)
        }
        Some(CapsuleDbCmd::Get { key, at }) => {
            let (meta, dirs) = open_dirs(&a.open, &a.kv)?;
            let stores = Stores::open(&a.open, &meta, dirs, a.id)?;
            let keys = load_keys(&meta, &a.open, &a.kv, &a.attest, a.id, &own_writers(writer, &stores))?;
            let Some(mut db) = open_newest(config, &meta, &keys, writer, &stores, a.id)? else {
                bail!("no index recorded in the store(s): has `psl capsuledb` run on them?");
            };
            let seq = at.unwrap_or(db.index_seq());
            let found = db.get_cell_at(seq, key.as_bytes());
            let st = db.stats();
            // Tests and operators see here which copies were refused.
            eprintln!(
                "read: block_fetches={} rejected_copies={} missing_copies={}",
                st.block_fetches, st.rejected_copies, st.missing_copies
            );
            match found? {
                Some((v, Some(val))) => {
                    println!("{} (lamport {}, writer {})", show_bytes(&val), v.lamport, v.writer);
                    Ok(0)
                }
                Some((v, None)) => {
                    println!("(deleted at lamport {}, writer {})", v.lamport, v.writer);
                    Ok(1)
                }
                None => {
                    println!("(not found in index {seq})");
                    Ok(1)
                }
            }
        }
        None => run_role(a, config, writer),
    }
}

/// The CapsuleDB role: starts its node, opens (or creates) the database, replays from the
/// servers, announces `ready`, and logs its counters forever.
fn run_role(a: CapsuleDbArgs, config: Config, writer: u32) -> Result<i32> {
    let spec = a.fabric.spec("psl capsuledb (or a subcommand)")?;
    let (meta, dirs) = open_dirs(&a.open, &a.kv)?;
    let stores = Stores::open(&a.open, &meta, dirs, a.id)?;
    let RoleNode { node, app, db_signing, db_cert } = start_node(&a, config, writer, &spec, &meta, &stores)?;
    let db = open_or_create(config, &meta, &app, writer, &stores, a.id)?;
    let start_seq = db.index_seq();
    let frontier = db.frontier().clone();
    let role_keys = RoleKeys { writer, signing: db_signing, data_key: app.data_key() };
    let keyed = Verifier::new(meta.clone(), Some(app.data_key()));
    if let Some(c) = db_cert {
        keyed.install_statement(&psl_capsule::KeyStatement::Cert(c))?;
    }
    drop(app);
    let replaying = stores.survey.is_some();
    let role_opts = RoleOptions {
        idle_flush: Duration::from_millis(a.idle_flush_ms.max(1)),
        ack_every: Duration::from_millis(a.ack_every_ms),
        ack_backlog_max: a.ack_backlog_max,
        ..RoleOptions::default()
    };
    if let Some(addr) = a.control {
        serve_control(&a, addr, &node)?;
    }
    let role = Arc::new(Role::start_shared(
        node,
        db,
        role_keys,
        stores.dirs.clone(),
        role_opts,
        !replaying,
        stores.publisher.clone(),
    )?);
    let r = role.clone();
    let _metrics = a.metrics.serve(
        move || {
            let mut s = r.node().render_metrics();
            s.push_str(&r.stats().render_prometheus());
            let index = r.db().lock().index_seq();
            s.push_str(&format!("# TYPE psl_capsuledb_index_seq gauge\npsl_capsuledb_index_seq {index}\n"));
            s
        },
        false,
    )?;
    let replayed_ops = match &stores.survey {
        Some(survey) => Some(replay_from_servers(&a, &meta, &role, survey, &frontier, &keyed)?),
        None => None,
    };
    // Tests and scripts read this line.
    match replayed_ops {
        Some(n) => println!("ready writer={writer} index={start_seq} replayed_ops={n}"),
        None => println!("ready writer={writer} index={start_seq}"),
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    log_forever(&role)
}

/// The role's running node and the keys the role goes on with: its application keys and its
/// role writer's signing key and certificate.
struct RoleNode {
    node: Arc<Node>,
    app: KvKeys,
    db_signing: psl_crypto::SigningKey,
    db_cert: Option<psl_capsule::WriterCert>,
}

/// Loads the role's keys and starts its receive-only node on the fabric (first: with servers,
/// records go out through it, and it counts their acks).
fn start_node(
    a: &CapsuleDbArgs,
    config: Config,
    writer: u32,
    spec: &psl_fabric::FabricSpec,
    meta: &SignedMetadata,
    stores: &Stores,
) -> Result<RoleNode> {
    let mut opts = NodeOptions {
        node_id: a.id,
        incarnation: rand::random::<u32>() % (1 << 12),
        writers: 0,
        memtable_keys_max: Some(config.memtable_entries_max.max(1024)),
        capsuledb_role: Some(65_536),
        ..NodeOptions::default()
    };
    opts = a.cores.apply(opts);
    opts.core.servers = a.open.servers.len() as u32;
    let budget_mb = a.budget.watch(crate::roles::RoleKind::CapsuleDb, "capsuledb");
    opts.core.cache_bytes_max =
        crate::roles::mib_bytes(crate::roles::repair_cache_mb(None, crate::roles::REPAIR_CACHE_MB_FOLLOWER, budget_mb));
    // The keys of exactly its own writers (with --kv-leader, all the leader grants).
    let mut wanted = NodeKeys::writers_for(meta, &opts)?;
    wanted.extend(own_writers(writer, stores));
    let app = load_keys(meta, &a.open, &a.kv, &a.attest, a.id, &wanted)?;
    let mut keys = NodeKeys::from_source(meta, &app, &opts)?;
    // The role writer signs answers and frontiers (workers check them with its key); the block
    // writer (with servers, a new incarnation's) signs the records. Both are announced with
    // the node's own; the block writer also opens its chain with its certificate.
    let (db_signing, db_cert) = app.writer_credentials(meta, writer)?;
    keys.certs.extend(db_cert.clone().map(psl_capsule::KeyStatement::Cert));
    if stores.writer(writer) != writer {
        let (_, block_cert) = app.writer_credentials(meta, stores.writer(writer))?;
        keys.certs.extend(block_cert.map(psl_capsule::KeyStatement::Cert));
    }
    let interest = psl_fabric::Interest::capsuledb(crate::roles::capsule_id(meta), a.id);
    let ep = crate::roles::fabric(spec, &format!("capsuledb-{}", a.id), &interest)?;
    let node = Arc::new(Node::start(keys, ep, opts)?);
    if let Some(p) = &stores.publisher {
        p.attach(node.clone());
    }
    Ok(RoleNode { node, app, db_signing, db_cert })
}

/// The database from the newest recorded index, or a new, empty one if none is recorded.
fn open_or_create(
    config: Config,
    meta: &SignedMetadata,
    app: &KvKeys,
    writer: u32,
    stores: &Stores,
    id: u32,
) -> Result<CapsuleDb> {
    Ok(match open_newest(config, meta, app, writer, stores, id)? {
        Some(db) => db,
        None => {
            let author = app.author(meta, stores.writer(writer))?.with_salt_seed(rand::random());
            let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
            CapsuleDb::create(config, stores.all(), verifier, author)?
        }
    })
}

/// `--control ADDR`: binds it, prints `control ADDR`, and serves the node's control interface
/// on a thread of its own.
fn serve_control(a: &CapsuleDbArgs, addr: SocketAddr, node: &Arc<Node>) -> Result<()> {
    let opts = a.control_auth.options(None)?;
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("binding the control address {addr}"))?;
    println!("control {}", l.local_addr()?);
    let (n, stop) = (node.clone(), Arc::new(std::sync::atomic::AtomicBool::new(false)));
    std::thread::Builder::new().name("capsuledb-control".into()).spawn(move || {
        if let Err(e) = psl_node::control::serve_opts(n, l, stop, opts) {
            tracing::warn!("capsuledb control interface: {e}");
        }
    })?;
    Ok(())
}

/// Before answering reads: replays every write the servers hold above the index's `frontier`,
/// prints what it replayed, then lets the role serve; returns the ops replayed.
fn replay_from_servers(
    a: &CapsuleDbArgs,
    meta: &SignedMetadata,
    role: &Role,
    survey: &Survey,
    frontier: &std::collections::BTreeMap<u32, u64>,
    keyed: &Verifier,
) -> Result<usize> {
    let public = Verifier::new(meta.clone(), None);
    let quorum = a.open.servers.len() / 2 + 1;
    let r = servers::replay(role.db(), survey, frontier, &public, keyed, a.id, quorum)
        .context("replaying the writes above the newest index from the capsule servers")?;
    let from: Vec<String> = r.servers.iter().map(|s| s.to_string()).collect();
    println!(
        "replayed records={} ops={} writers={} from {} skipped={}",
        r.records,
        r.ops,
        r.writers,
        from.join(","),
        r.skipped.len()
    );
    role.serve();
    Ok(r.ops)
}

/// Logs the role's counters every 5 seconds, forever.
fn log_forever(role: &Role) -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(5));
        let s = role.stats();
        tracing::info!(
            applied = s.applied.load(std::sync::atomic::Ordering::Relaxed),
            answers = s.answers.load(std::sync::atomic::Ordering::Relaxed),
            errors = s.errors.load(std::sync::atomic::Ordering::Relaxed),
            acks_sent = s.acks_sent.load(std::sync::atomic::Ordering::Relaxed),
            acks_held = s.acks_held.load(std::sync::atomic::Ordering::Relaxed),
            index = role.db().lock().index_seq(),
            rejected_copies = role.db().lock().stats().rejected_copies,
            missing_copies = role.db().lock().stats().missing_copies,
            "capsuledb"
        );
    }
}
