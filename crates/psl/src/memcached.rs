//! `psl memcached`: SecureCached, the memcached-compatible front end (crate `psl-memcached`).
//!
//! Alone (`psl memcached --listen ADDR`) it runs the embedded default: one node with a front
//! end, an in-process coordinator, on an in-process hub (`--capsuledb` adds an in-process
//! CapsuleDB role, so that the memory limit evicts without losing data). With `--cluster DIR`
//! it joins the KV deployment `psl up --kv` runs (everything it needs is in DIR/cluster.json;
//! it takes a fresh node id and forwards conditional commands to the group's homes). With
//! `--cluster ROUTER --capsule FILE --owner KEY --id N` (or, instead of `--owner`, `--kv-leader
//! ADDR` with `--attest` and `--kv-attest-policy`: the keys from the attested leader, in memory
//! only) its node joins a running deployment through a router, like `psl node`; with `--peer-listen A --peers A,B,…` it is one front
//! end of a group whose members forward each key's conditional commands to the key's home
//! (see `psl_memcached::peer`).

use anyhow::{bail, Context, Result};
use clap::Args;
use psl_capsule::CapsuleFile;
use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::failover::FailoverConfig;
use psl_memcached::peer::{PeerConfig, PeerKey, PeerServer};
use psl_memcached::proto::Limits;
use psl_memcached::{Config, FrontEnd, Server, ServerConfig};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `psl memcached`: the SecureCached front end, on the embedded default or joining a deployment.
#[derive(Args, Debug)]
pub struct MemcachedArgs {
    /// Address to serve the memcached protocol on.
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub listen: SocketAddr,
    /// Server worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Item memory limit in MiB (memcached -m); least recently used local copies are evicted.
    #[arg(long, default_value_t = 64)]
    pub memory_mb: u64,
    /// Largest item data block in bytes (memcached -I), at most 1 MiB (the capsule's value limit).
    #[arg(long, default_value_t = 1 << 20)]
    pub item_size_max: usize,
    /// Most simultaneous client connections (memcached -c).
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Close client connections idle this many seconds (0: never).
    #[arg(long, default_value_t = 300)]
    pub idle_timeout_secs: u64,
    /// TLS certificate chain (PEM); with --tls-key, clients must speak TLS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Attestation (`--attest`, needs --tls-cert): publish a report binding the TLS
    /// certificate, for clients to check with `psl attest verify`.
    #[command(flatten)]
    pub attest: crate::attest::PublishArgs,
    /// Embedded default only: receive-only replica nodes that verify and apply every write.
    #[arg(long, default_value_t = 0)]
    pub replicas: usize,
    /// Writer actors of the front end's node (default: 1).
    #[arg(long)]
    pub writers: Option<usize>,
    /// Join a running deployment instead of running the embedded default: DIR (or
    /// DIR/cluster.json) of `psl up --kv`, or a fabric URL (psl://ROUTER, a bare router
    /// HOST:PORT, or nats://H1:4222,...; then with --capsule, --owner and --id).
    #[arg(long)]
    pub cluster: Option<String>,
    /// The fabric to join through (as `--cluster URL`), and the NATS options.
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    /// With --cluster: the capsule file that names the capsule.
    #[arg(long)]
    pub capsule: Option<PathBuf>,
    /// With --cluster: the owner key file (development; a deployment gives --kv-leader).
    #[arg(long)]
    pub owner: Option<PathBuf>,
    /// With --cluster ROUTER: the KV keys from the leader (attesting with --attest).
    #[command(flatten)]
    pub kv: crate::kvkeys::KvLeaderArgs,
    /// With --cluster: this node's id, 1 to 32767.
    #[arg(long)]
    pub id: Option<u32>,
    /// With --cluster: state directory keeping the incarnation counter (as `psl node --state`).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Verify actors of each node (default: 0 embedded, where the core thread verifies; 2 with
    /// --cluster).
    #[arg(long)]
    pub verifiers: Option<usize>,
    /// Most ops per record.
    #[arg(long, default_value_t = 512)]
    pub batch_ops_max: usize,
    /// Microseconds a writer waits for a batch to fill (default: 5000 embedded, 2000 with --cluster).
    #[arg(long)]
    pub flush_us: Option<u64>,
    /// Microseconds from one seal of a writer to the next, for a batch that is not full
    /// (default: 0 embedded, 5000 with --cluster): under a steady load a writer seals at most
    /// one record per interval, so every role's work per record is spread over more ops,
    /// while a write after a quiet spell still waits only --flush-us.
    #[arg(long)]
    pub seal_interval_us: Option<u64>,
    /// With --cluster: where this front end serves read-modify-write commands forwarded by the
    /// other front ends of its group (sealed under a key derived from the capsule's data key).
    #[arg(long, requires = "peers")]
    pub peer_listen: Option<SocketAddr>,
    /// With --cluster: the peer addresses of every front end of the group, this one's
    /// (`--peer-listen`) included, in the same order on every member. Each key's conditional
    /// commands (cas, add, replace, append, prepend, incr, decr, touch, gat, …) run at its
    /// home `peers[hash(key) % n]`; plain get/set/delete stay local.
    #[arg(long, value_delimiter = ',', requires = "peer_listen")]
    pub peers: Vec<SocketAddr>,
    /// Bound on reaching a home front end (connect, send, reply); past it the command fails
    /// with SERVER_ERROR.
    #[arg(long, default_value_t = 2000)]
    pub peer_timeout_ms: u64,
    /// With a fabric: MiB of recent records the front end's node keeps to answer peers'
    /// repair requests (oldest evicted first; peers and capsule servers hold them too).
    /// Default: 128, at most a quarter of --memory-budget-mb.
    #[arg(long)]
    pub repair_cache_mb: Option<u64>,
    /// Memory budget (`--memory-budget-mb`; the item memory is `--memory-mb`).
    #[command(flatten)]
    pub budget: crate::roles::BudgetArgs,
    /// Prometheus metrics over HTTP (`--metrics ADDR`).
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
    /// The attested HTTPS endpoint (`--http ADDR`).
    #[command(flatten)]
    pub https: crate::roles::HttpsArgs,
    /// How the ring threads wait for work (`--dedicated-cores`).
    #[command(flatten)]
    pub cores: crate::roles::CoresArgs,
    /// With --peers of three or more: home failover. A slot's home holds a lease granted by a
    /// majority of the group for this long; when a front end is down, another takes its slots
    /// over after about two leases (docs/protocol/memcached.md §6). 0: static homes (a
    /// conditional command whose home is down fails with SERVER_ERROR). Every member must use
    /// the same value.
    #[arg(long, default_value_t = psl_memcached::failover::HOME_LEASE_MS_DEFAULT)]
    pub home_lease_ms: u64,
    /// This front end's entry in --peers, when --peer-listen binds another address (0.0.0.0).
    #[arg(long, requires = "peer_listen")]
    pub peer_advertise: Option<SocketAddr>,
    /// With --cluster: the KV deployment's shard map capsule (docs/protocol/sharding.md).
    /// Under a map of several shards this front end serves the shard of its --capsule and
    /// sends each command on another shard's key, whole, to a front end of that shard.
    /// `--cluster DIR` takes the map the cluster file names.
    #[arg(long)]
    pub shard_map: Option<PathBuf>,
    /// Back the memory limit with CapsuleDB: an evicted item is read back through CapsuleDB
    /// (same value, flags and CAS unique) instead of being lost. Embedded: runs a CapsuleDB
    /// role in this process (its records in a temporary directory, removed on exit).
    /// `--cluster DIR` always reads through the deployment's CapsuleDB (implied).
    #[arg(long)]
    pub capsuledb: bool,
    /// With `--cluster ROUTER`: CapsuleDB's writer index (printed by `psl capsuledb`); backs
    /// the memory limit with it, as --capsuledb.
    #[arg(long)]
    pub capsuledb_writer: Option<u32>,
    /// Joining through a fabric (`--cluster ROUTER`, as `psl up` starts its front ends): the
    /// capsule's servers (ids 0..N), whose acks pace the writers (`--flow-window-ops`).
    /// `--cluster DIR` takes the deployment's. 0: none counted.
    #[arg(long, default_value_t = 0)]
    pub servers: u32,
    /// Ops each writer may have sealed or queued and not yet acked by a quorum of capsule
    /// servers, by CapsuleDB and by the peer nodes that pace it; beyond it a set waits for
    /// their acks, so the writers run at their pace (0: off). When acks stop moving for a
    /// second the window opens until they move again (docs/protocol/scl.md §4).
    #[arg(long, default_value_t = psl_node::flow::WINDOW_OPS_DEFAULT)]
    pub flow_window_ops: usize,
    /// Records each writer may have in flight under the same acks: the receivers' queues count
    /// messages, so this bounds them when records are small (at least 1).
    #[arg(long, default_value_t = psl_node::flow::WINDOW_RECORDS_DEFAULT)]
    pub flow_window_records: usize,
}

/// A front end's writer actors when it joins a deployment. One writer signs every record of
/// the front end: with batching it seals far more ops than a front end serves (one core signs
/// about 20,000 records/s), and each extra writer halves the ops per record, which every other
/// role then verifies once per record (`psl bench cluster`: 1 writer 0.68-0.69 of memcached
/// on 50/50 against 0.38-0.50 with 2; docs/protocol/scale.md §7).
pub const CLUSTER_WRITERS_DEFAULT: usize = 1;
/// How long a joined front end's writer waits for a batch to fill, µs: the replication delay
/// a set may see on its way to the other front ends, traded for ops per record.
pub const CLUSTER_FLUSH_US_DEFAULT: u64 = 2000;
/// The shortest time from one seal of a joined front end's writer to the next, µs, for a
/// batch that is not full: under load the writer seals every 5 ms (26-32 ops per record in
/// `psl bench cluster` against 18-19 with seals every 2 ms, and the roles' CPU per op about
/// 6 % lower; docs/protocol/scale.md §10), while a set after a quiet spell replicates after
/// `CLUSTER_FLUSH_US_DEFAULT`.
pub const CLUSTER_SEAL_INTERVAL_US_DEFAULT: u64 = 5000;

/// What a front end needs to join the KV deployment of `psl up --kv` (the `kv` object of
/// DIR/cluster.json).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct KvInfo {
    /// The deployment's fabric (`router` in cluster files written before NATS).
    #[serde(alias = "router")]
    pub fabric: psl_fabric::FabricSpec,
    /// The KV capsule file and its owner key file (mode 0600; see docs/protocol/memcached.md),
    /// where this machine has it (single-machine `psl up --kv`).
    pub capsule: PathBuf,
    /// The KV capsule's owner key file, where this machine has it.
    #[serde(default)]
    pub owner: Option<PathBuf>,
    /// The shard map capsule (`psl shard show`), where this machine has it.
    #[serde(default)]
    pub map: Option<PathBuf>,
    /// The version of the map it held when this was written (0: none, or not recorded).
    #[serde(default)]
    pub map_version: u64,
    /// Where a joining front end gets the KV keys instead (`psl up --config` clusters): the
    /// leader, after attestation.
    #[serde(default)]
    pub leader: Option<KvLeaderInfo>,
    /// CapsuleDB's writer index.
    pub capsuledb_writer: u32,
    /// The front-end group's peer addresses (each key's home is `peers[hash % n]`).
    pub peers: Vec<SocketAddr>,
    /// The memcached addresses of the group's front ends.
    pub front_ends: Vec<SocketAddr>,
    /// The front ends' attested HTTPS endpoints (`--http`; `psl verify URL --policy P`), in
    /// the order of `front_ends`.
    #[serde(default)]
    pub http: Vec<String>,
    /// Capsule servers' ids and store directories.
    pub servers: Vec<(u32, PathBuf)>,
    /// Where a joining front end draws its node id (a counter file, locked while drawn) and
    /// keeps its incarnation counter (`nodes/<id>`).
    pub state: PathBuf,
    /// The group's home lease with failover (0: static homes; absent in files written
    /// before failover).
    #[serde(default)]
    pub home_lease_ms: u64,
    /// The control interfaces (STATS, METRICS) of the KV coordinator and CapsuleDB, where
    /// known (`psl up` records them; `psl bench cluster` reads their counters).
    #[serde(default)]
    pub coordinator_control: Option<SocketAddr>,
    /// CapsuleDB's control interface (STATS, METRICS), where known.
    #[serde(default)]
    pub capsuledb_control: Option<SocketAddr>,
    /// The operator's control key that signs their commands (secret, mode 0600), where this
    /// machine has it (single-machine `psl up` makes one in its directory).
    #[serde(default)]
    pub control_key: Option<PathBuf>,
    /// The capsule servers' read interfaces (by id), where known (`psl up` records them;
    /// `psl bench cluster` reads their `STATS`).
    #[serde(default)]
    pub server_reads: Vec<SocketAddr>,
    /// With several shards (`psl up --shards N`): the memcached addresses of each shard's
    /// front ends, by shard (the fields above are shard 0's). Any front end serves every key.
    #[serde(default)]
    pub shard_front_ends: Vec<Vec<SocketAddr>>,
}

/// Node ids drawn by joining front ends: the group's own front ends use 1 ..= 255.
const JOIN_ID_FIRST: u32 = 1000;
const JOIN_ID_LAST: u32 = 32_767;

/// Reads the `kv` object of a cluster file (`DIR` or `DIR/cluster.json`).
pub fn read_kv(p: &std::path::Path) -> Result<KvInfo> {
    let file = if p.is_dir() { p.join("cluster.json") } else { p.to_path_buf() };
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading the cluster file {} (is `psl up --kv` running?)", file.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not a cluster file", file.display()))?;
    let kv = v.get("kv").cloned().with_context(|| {
        format!("{} has no KV deployment: start it with `psl up --kv` (or `--memcached N`)", file.display())
    })?;
    serde_json::from_value(kv).with_context(|| format!("the kv object of {}", file.display()))
}

/// Draws a node id no other front end joining this deployment has drawn: a counter file under
/// an exclusive lock (flock), so that concurrent joins on this machine get distinct ids.
fn draw_node_id(state: &std::path::Path) -> Result<u32> {
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
    let lock_path = state.join("ids.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    // SAFETY: flock(2) on a file descriptor this function owns (open until `lock` drops, which
    // releases the lock); no memory is shared with the kernel.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        bail!("locking {}: {}", lock_path.display(), std::io::Error::last_os_error());
    }
    let p = state.join("next-id");
    let next: u32 = match std::fs::read_to_string(&p) {
        Ok(s) => s.trim().parse().with_context(|| format!("{} is not a number", p.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => JOIN_ID_FIRST,
        Err(e) => return Err(e).with_context(|| format!("reading {}", p.display())),
    };
    if !(JOIN_ID_FIRST..=JOIN_ID_LAST).contains(&next) {
        bail!("{}: every node id for joining front ends ({JOIN_ID_FIRST} ..= {JOIN_ID_LAST}) is used", p.display());
    }
    crate::util::write_atomic(&p, (next + 1).to_string().as_bytes(), 0o644)?;
    drop(lock);
    Ok(next)
}

/// The leader that hands a joining front end its keys, and how the front end attests.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct KvLeaderInfo {
    /// The leader's address (what `--kv-leader` takes).
    pub addr: SocketAddr,
    /// The deployment's attestation policy (the leader's report is checked against it).
    pub attest_policy: PathBuf,
    /// The sim platform key of a development cluster (INSECURE; `--attest sim`), if any.
    #[serde(default)]
    pub sim_platform_key: Option<PathBuf>,
}

/// Where the front end's node joins.
enum Join {
    /// `--cluster ROUTER`: everything from the command line.
    Router(JoinTarget),
    /// `--cluster DIR`: from the deployment's cluster file.
    Dir(Box<KvInfo>),
}

/// Runs a CapsuleDB role in this process on `fabric` (the embedded deployment's), with its
/// records in a directory store at `dir`. Returns the role and its writer index.
fn start_capsuledb_in_process(
    meta: &psl_capsule::SignedMetadata,
    app: &psl_crypto::AppKey,
    fabric: Arc<dyn psl_fabric::Fabric>,
    dir: &std::path::Path,
) -> Result<(psl_capsuledb::role::Role, u32)> {
    use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
    use psl_capsuledb::{BlockStore, CapsuleDb, DirStore};
    let id = 30_000;
    let writer = psl_scl::writer_index(id, 0, 15).context("CapsuleDB's writer index")?;
    let store = DirStore::open(dir).with_context(|| format!("opening the CapsuleDB store {}", dir.display()))?;
    let config = psl_capsuledb::Config::default();
    let author = psl_capsule::Author::new(meta, app, writer)?.with_salt_seed(rand::random());
    let verifier = psl_capsule::Verifier::new(meta.clone(), Some(app.data_key()));
    let db = CapsuleDb::create(config, vec![store.clone() as Arc<dyn BlockStore>], verifier, author)?;
    let opts = NodeOptions {
        node_id: id,
        writers: 0,
        verifiers: 1,
        memtable_keys_max: Some(config.memtable_entries_max.max(1024)),
        capsuledb_role: Some(65_536),
        ..NodeOptions::default()
    }
    .shared_cores();
    let mut node_keys = NodeKeys::derive(meta, app, &opts)?;
    let (signing, cert) = psl_capsule::writer_credentials(meta, app, writer)?;
    node_keys.certs.extend(cert.map(psl_capsule::KeyStatement::Cert));
    let node = Node::start(node_keys, fabric, opts)?;
    let keys = RoleKeys { writer, signing, data_key: app.data_key() };
    let role = Role::start(node, db, keys, vec![store], RoleOptions::default())?;
    Ok((role, writer))
}

/// Runs `psl memcached`: serves the memcached protocol until stopped; returns the exit code.
pub fn run(a: MemcachedArgs) -> Result<i32> {
    let budget_mb = a.budget.watch(crate::roles::RoleKind::FrontEnd, "memcached");
    if a.memory_mb.saturating_mul(2) > budget_mb {
        tracing::warn!(
            memory_mb = a.memory_mb,
            budget_mb,
            "--memory-mb (items) is over half of --memory-budget-mb: the node's memtable, repair cache and buffers need the rest"
        );
    }
    let join = parse_join(&a)?;
    if a.item_size_max == 0 {
        bail!("--item-size-max must be above 0");
    }
    let config = Config {
        limits: Limits { item_size_max: a.item_size_max, ..Limits::default() },
        memory_limit: a.memory_mb.max(1) << 20,
        threads: a.threads,
        max_connections: a.max_connections,
    };
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(psl_memcached::tls_acceptor(c, k)?),
        _ => None,
    };
    let scfg = ServerConfig {
        max_connections: a.max_connections,
        idle_timeout: (a.idle_timeout_secs > 0).then(|| Duration::from_secs(a.idle_timeout_secs)),
        threads: a.threads,
        tls,
    };
    // Keep the deployment alive as long as the server runs.
    let (fe, _deployment) = match join {
        None => start_embedded(&a, config)?,
        Some(join) => join_deployment(&a, join, config, budget_mb)?,
    };
    serve(&a, fe, scfg)
}

/// A front end and what must stay alive while it serves (its deployment, or its peer server).
type Started = (Arc<FrontEnd>, Box<dyn std::any::Any>);

/// Where the front end's node joins (`None`: the embedded default), from `--cluster` and
/// `--fabric`; refuses the flags that do not go with it.
fn parse_join(a: &MemcachedArgs) -> Result<Option<Join>> {
    let url = match (&a.cluster, &a.fabric.fabric) {
        (Some(_), Some(_)) => bail!("give --cluster or --fabric, not both"),
        (None, Some(u)) => Some(u.clone()),
        (Some(c), None) if !std::path::Path::new(c).exists() => c.parse::<psl_fabric::FabricUrl>().ok(),
        _ => None,
    };
    let join = match &a.cluster {
        None if url.is_none() => None,
        c => Some(match url {
            Some(url) => join_router(a, url)?,
            None => join_dir(a, c.as_deref().unwrap_or_default())?,
        }),
    };
    if join.is_none()
        && (a.capsule.is_some()
            || a.owner.is_some()
            || a.kv.kv_leader.is_some()
            || a.id.is_some()
            || a.capsuledb_writer.is_some())
    {
        bail!("--capsule, --owner, --id and --capsuledb-writer go with --cluster ROUTER");
    }
    if a.peer_listen.is_some() && join.is_none() {
        bail!("--peer-listen and --peers form a group of --cluster front ends; the embedded default has one");
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = a.peers.iter().find(|p| !seen.insert(**p)) {
        bail!("--peers names {dup} twice; each front end of the group needs its own peer address");
    }
    Ok(join)
}

/// `--cluster ROUTER` (or `--fabric URL`): joining through a fabric, with the capsule, keys and
/// id from the command line.
fn join_router(a: &MemcachedArgs, url: psl_fabric::FabricUrl) -> Result<Join> {
    let fabric = a.fabric.spec_of(url)?;
    let (Some(capsule), true, Some(id)) = (&a.capsule, a.owner.is_some() || a.kv.kv_leader.is_some(), a.id) else {
        bail!("--cluster ROUTER needs --capsule, --owner (or --kv-leader) and --id (or give --cluster DIR of `psl up --kv`)");
    };
    if a.capsuledb {
        bail!("with --cluster ROUTER, give CapsuleDB's writer index: --capsuledb-writer W");
    }
    Ok(Join::Router(JoinTarget {
        fabric,
        capsule: capsule.clone(),
        owner: a.owner.clone(),
        id,
        state: a.state.clone(),
        db: a.capsuledb_writer,
        servers: a.servers,
    }))
}

/// `--cluster DIR`: joining the KV deployment of `psl up --kv`, as DIR/cluster.json records it.
fn join_dir(a: &MemcachedArgs, c: &str) -> Result<Join> {
    if a.capsule.is_some() || a.owner.is_some() || a.kv.kv_leader.is_some() || a.id.is_some() || a.state.is_some() {
        bail!("--cluster DIR takes the capsule, owner key and node id from DIR/cluster.json; drop --capsule, --owner, --id and --state");
    }
    if a.peer_listen.is_some() || a.capsuledb_writer.is_some() {
        bail!("--cluster DIR joins the deployment's front-end group and CapsuleDB as recorded in DIR/cluster.json; drop --peer-listen/--peers and --capsuledb-writer");
    }
    Ok(Join::Dir(Box::new(read_kv(std::path::Path::new(c))?)))
}

/// The embedded default: one node with a front end, an in-process coordinator and hub, and
/// with `--capsuledb` an in-process CapsuleDB role on a temporary directory.
fn start_embedded(a: &MemcachedArgs, config: Config) -> Result<Started> {
    let db_dir =
        if a.capsuledb { Some(tempfile::Builder::new().prefix("psl-memcached-capsuledb").tempdir()?) } else { None };
    let db_writer = match &db_dir {
        Some(_) => Some(psl_scl::writer_index(30_000, 0, 15).context("CapsuleDB's writer index")?),
        None => None,
    };
    let d = Embedded::start(&EmbeddedOptions {
        replicas: a.replicas,
        writers: a.writers.unwrap_or(psl_memcached::deploy::EmbeddedOptions::default().writers),
        verifiers: a.verifiers.unwrap_or(psl_memcached::deploy::EmbeddedOptions::default().verifiers),
        flush_delay: a
            .flush_us
            .map_or(psl_memcached::deploy::EmbeddedOptions::default().flush_delay, Duration::from_micros),
        seal_interval: a.seal_interval_us.map_or(Duration::ZERO, Duration::from_micros),
        config,
        capsuledb: db_writer,
        ..EmbeddedOptions::default()
    })?;
    let role = match &db_dir {
        Some(dir) => {
            let (role, writer) =
                start_capsuledb_in_process(&d.meta, d.app(), Arc::new(d.hub.endpoint("capsuledb")), dir.path())?;
            debug_assert_eq!(Some(writer), db_writer);
            tracing::info!(writer, dir = %dir.path().display(), "in-process CapsuleDB started");
            Some(role)
        }
        None => None,
    };
    // Tuple fields drop in order: the role, then the deployment, the directory last.
    Ok((d.front_ends[0].clone(), Box::new((role, d, db_dir))))
}

/// Where and as whom a joining front end's node runs.
#[derive(Clone)]
struct JoinTarget {
    fabric: psl_fabric::FabricSpec,
    capsule: PathBuf,
    owner: Option<PathBuf>,
    id: u32,
    state: Option<PathBuf>,
    /// CapsuleDB's writer index, when the node reads through it.
    db: Option<u32>,
    /// The capsule servers whose acks pace the writers.
    servers: u32,
}

/// Joins a running deployment: starts the front end's node on its fabric and joins (or serves)
/// the front-end group.
fn join_deployment(a: &MemcachedArgs, join: Join, config: Config, budget_mb: u64) -> Result<Started> {
    let t = join_target(&join)?;
    let bytes = std::fs::read(&t.capsule).with_context(|| format!("reading {}", t.capsule.display()))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", t.capsule.display()))?;
    let (kv, attest) = kv_source(a, &join);
    let incarnation = match &t.state {
        Some(d) => crate::roles::next_incarnation(d)?,
        None => rand::random::<u32>() % (1 << 12),
    };
    let opts = a.cores.apply(node_options(a, &t, incarnation, budget_mb));
    // Exactly this incarnation's writers' keys (with --kv-leader, all the leader grants).
    let app = crate::kvkeys::kv_keys(
        &f.metadata,
        t.owner.as_deref(),
        &kv,
        &attest,
        psl_faas::leader::KvRole::FrontEnd,
        t.id,
        &NodeKeys::writers_for(&f.metadata, &opts)?,
    )?;
    let keys = NodeKeys::from_source(&f.metadata, &app, &opts)?;
    let (id, db) = (t.id, t.db);
    let interest = psl_fabric::Interest::node(f.metadata.name().0 .0, id, db.is_some());
    let ep = crate::roles::fabric(&t.fabric, &format!("memcached-{id}"), &interest)?;
    let node = Node::start(keys, ep, opts)?;
    tracing::info!(id, incarnation, capsuledb = ?db, "front-end node joined");
    let fe = FrontEnd::new(Arc::new(node), config);
    let data_key = psl_node::KeySource::data_key(&app);
    let key = PeerKey::derive(&data_key);
    let map_file = match (&a.shard_map, &join) {
        (Some(m), _) => Some(m.clone()),
        (None, Join::Dir(kv)) => kv.map.clone(),
        (None, _) => None,
    };
    if let Some(m) = map_file {
        let now = crate::shard::read_as_member(&m, &f.metadata, data_key.clone())
            .with_context(|| format!("reading the shard map {}", m.display()))?
            .with_context(|| format!("the shard map {} holds no map yet", m.display()))?;
        if now.map.shards.len() > 1 {
            let cfg = PeerConfig { timeout: Duration::from_millis(a.peer_timeout_ms.max(1)) };
            let version = now.map.map_version;
            let shards = psl_memcached::shards::Shards::new(now.map, &f.metadata.name().0 .0, key.clone(), cfg)?;
            tracing::info!(
                shard = shards.me(),
                of = shards.map().shards.len(),
                version,
                "serving one shard of the map"
            );
            fe.serve_shard(shards);
            let watch = MapWatch { path: m, meta: f.metadata.clone(), data_key, key: key.clone(), cfg, version };
            std::thread::Builder::new()
                .name("shard-map-watch".into())
                .spawn({
                    let fe = Arc::downgrade(&fe);
                    move || watch.run(fe)
                })
                .context("spawning the shard map's watcher")?;
        }
    }
    let fresh = t.state.is_some() && incarnation == 1;
    let peer_server = join_group(a, &join, &fe, key, fresh)?;
    Ok((fe, Box::new(peer_server)))
}

/// How often a front end looks at its shard map's file for a newer map.
const MAP_WATCH_PERIOD: Duration = Duration::from_secs(1);

/// A front end's watch over the map capsule's file: a newer map (new front-end addresses
/// after a restart, say) is read, verified as at start, and routed by from then on. A file
/// that does not verify is refused and the map in use kept.
struct MapWatch {
    path: PathBuf,
    meta: psl_capsule::SignedMetadata,
    data_key: psl_crypto::DataKey,
    key: PeerKey,
    cfg: PeerConfig,
    version: u64,
}

impl MapWatch {
    /// Until the front end is dropped: once a period, if the file changed, read it again.
    fn run(mut self, fe: std::sync::Weak<FrontEnd>) {
        let stamp = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut seen = stamp(&self.path);
        loop {
            std::thread::sleep(MAP_WATCH_PERIOD);
            let Some(fe) = fe.upgrade() else { return };
            let now = stamp(&self.path);
            if now == seen {
                continue;
            }
            seen = now;
            match crate::shard::read_as_member(&self.path, &self.meta, self.data_key.clone()) {
                Ok(Some(c)) if c.map.map_version > self.version => {
                    let version = c.map.map_version;
                    match psl_memcached::shards::Shards::new(c.map, &self.meta.name().0 .0, self.key.clone(), self.cfg)
                    {
                        Ok(sh) => {
                            tracing::info!(from = self.version, to = version, "routing by a newer shard map");
                            fe.serve_shard(sh);
                            self.version = version;
                        }
                        Err(e) => tracing::warn!("shard map version {version} refused: {e}; keeping {}", self.version),
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("shard map {} refused: {e:#}; keeping version {}", self.path.display(), self.version)
                }
            }
        }
    }
}

/// The node's fabric, capsule, keys, id, state and CapsuleDB: from the command line
/// (`--cluster ROUTER`), or from the cluster file with a freshly drawn id (`--cluster DIR`).
fn join_target(join: &Join) -> Result<JoinTarget> {
    Ok(match join {
        Join::Router(target) => target.clone(),
        Join::Dir(kv) => {
            let id = draw_node_id(&kv.state)?;
            let state = kv.state.join("nodes").join(id.to_string());
            // Always through the deployment's CapsuleDB: this node's memtable starts empty
            // and SCL does not replay history to a new node, so only CapsuleDB can serve
            // what was written before it joined (and what its memory limit evicts).
            let db = Some(kv.capsuledb_writer);
            JoinTarget {
                fabric: kv.fabric.clone(),
                capsule: kv.capsule.clone(),
                owner: kv.owner.clone(),
                id,
                state: Some(state),
                db,
                servers: kv.servers.len() as u32,
            }
        }
    })
}

/// Where the KV keys come from: the owner key file (development), or the leader after
/// attestation (kept in memory only), as the command line or the cluster file names it.
fn kv_source(a: &MemcachedArgs, join: &Join) -> (crate::kvkeys::KvLeaderArgs, crate::attest::AttestArgs) {
    let dir_leader = match join {
        Join::Dir(kv) if kv.owner.is_none() => kv.leader.as_ref(),
        _ => None,
    };
    match dir_leader {
        Some(l) => {
            let mut at = a.attest.attest.clone();
            if at.attest.is_none() {
                if let Some(key) = &l.sim_platform_key {
                    at.attest = Some(psl_faas::attest_select::AttestChoice::Sim);
                    at.sim_platform_key = Some(key.clone());
                }
            }
            let kv = crate::kvkeys::KvLeaderArgs {
                kv_leader: Some(l.addr),
                kv_attest_policy: Some(l.attest_policy.clone()),
                ..a.kv.clone()
            };
            (kv, at)
        }
        _ => (a.kv.clone(), a.attest.attest.clone()),
    }
}

/// The joining node's options (before `--cores`): writers, verifiers, batching, CapsuleDB,
/// repair cache, capsule servers and flow window.
fn node_options(a: &MemcachedArgs, t: &JoinTarget, incarnation: u32, budget_mb: u64) -> NodeOptions {
    NodeOptions {
        node_id: t.id,
        incarnation,
        writers: a.writers.unwrap_or(CLUSTER_WRITERS_DEFAULT),
        verifiers: a.verifiers.unwrap_or(2),
        batch_ops_max: a.batch_ops_max,
        flush_delay: Duration::from_micros(a.flush_us.unwrap_or(CLUSTER_FLUSH_US_DEFAULT)),
        seal_interval: Duration::from_micros(a.seal_interval_us.unwrap_or(CLUSTER_SEAL_INTERVAL_US_DEFAULT)),
        capsuledb: t.db,
        core: psl_scl::NodeConfig {
            cache_bytes_max: crate::roles::mib_bytes(crate::roles::repair_cache_mb(
                a.repair_cache_mb,
                crate::roles::REPAIR_CACHE_MB_NODE,
                budget_mb,
            )),
            servers: t.servers,
            ..psl_scl::NodeConfig::default()
        },
        flow: psl_node::flow::FlowOptions {
            window_ops: a.flow_window_ops,
            window_records: a.flow_window_records,
            ..psl_node::flow::FlowOptions::default()
        },
        ..NodeOptions::default()
    }
}

/// Joins the front-end group: as a client of the deployment's homes (`--cluster DIR`), or as a
/// member serving its peers on `--peer-listen` (with home failover when the group allows it).
/// `fresh`: the first incarnation of a state directory.
fn join_group(
    a: &MemcachedArgs,
    join: &Join,
    fe: &Arc<FrontEnd>,
    key: PeerKey,
    fresh: bool,
) -> Result<Option<PeerServer>> {
    let cfg = PeerConfig { timeout: Duration::from_millis(a.peer_timeout_ms.max(1)) };
    Ok(match (join, a.peer_listen) {
        (Join::Dir(kv), _) => {
            if !kv.peers.is_empty() {
                fe.join_remote_group_as_client(&kv.peers, key, cfg, kv.home_lease_ms > 0);
                tracing::info!(peers = ?kv.peers, "forwarding conditional commands to the group's homes");
            }
            None
        }
        (Join::Router(_), None) => None,
        (Join::Router(_), Some(listen)) => {
            let mine = a.peer_advertise.unwrap_or(listen);
            let me = a.peers.iter().position(|p| *p == mine).with_context(|| {
                format!("--peer-advertise (or --peer-listen) {mine} must be one of --peers {:?}", a.peers)
            })?;
            let l =
                std::net::TcpListener::bind(listen).with_context(|| format!("binding the peer address {listen}"))?;
            if a.peers.len() >= psl_memcached::failover::MEMBERS_MIN && a.home_lease_ms > 0 {
                // Only the first incarnation of a state directory starts fresh (its
                // acceptor complete at once, no quarantine): one that ran before, or one
                // without a state directory, may have granted a lease that still holds
                // or stored writes a new home needs, so it waits out a quarantine and
                // counts as complete only once a home's prune names it. A wiped state
                // directory would pass for a first start: docs/protocol/memcached.md §6.2.
                let fcfg = FailoverConfig::new(a.home_lease_ms, fresh, cfg.timeout);
                fe.join_remote_group_with_failover(&a.peers, me, key.clone(), cfg, fcfg)
                    .map_err(|e| anyhow::anyhow!("home failover: {e}"))?;
            } else {
                fe.join_remote_group(&a.peers, me, key.clone(), cfg);
            }
            tracing::info!(peers = ?a.peers, me, "front-end group joined");
            Some(PeerServer::start(fe, l, key).context("starting the peer server")?)
        }
    })
}

/// Serves the memcached protocol on `--listen` (publishing the attestation report when asked),
/// prints `listening ADDR`, and waits for the server to stop.
fn serve(a: &MemcachedArgs, fe: Arc<FrontEnd>, scfg: ServerConfig) -> Result<i32> {
    // The front end's node counters and its memcached `stats`, for both servers.
    let render = |f: Arc<FrontEnd>| {
        move || {
            let mut s = f.node().render_metrics();
            s.push_str(&f.stats.render_prometheus());
            s
        }
    };
    let _metrics = a.metrics.serve(render(fe.clone()), false)?;
    let (f, meta) = (fe.clone(), fe.node().metadata().clone());
    let kv: crate::roles::ApiMaker = Box::new(move |spki, signer| {
        let guard = crate::api::Guard::new(meta.name(), meta.meta.owner, spki, signer);
        crate::api::kv(f, std::sync::Arc::new(guard))
    });
    let _https = a.https.serve("memcached", &a.attest.attest, render(fe.clone()), Some(kv))?;
    let server = Server::start(fe, a.listen, scfg)?;
    // With --kv-leader, --attest is how the front end attests to the leader; it publishes a
    // report for clients too when it serves TLS (--tls-cert). With --http, clients ask the
    // HTTPS endpoint for evidence over their own nonce (`psl verify`) instead.
    if a.attest.attest.attest.is_some()
        && (a.tls_cert.is_some() || (a.kv.kv_leader.is_none() && a.https.http.is_none()))
    {
        let cert = a.tls_cert.as_ref().context("--attest needs --tls-cert: the report binds the TLS certificate")?;
        let pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
        let leaf = pem::parse(&pem).with_context(|| format!("{}: not PEM", cert.display()))?;
        crate::attest::publish(&a.attest, "memcached", "TLS certificate (DER)", leaf.contents())?;
    }
    // Tests and scripts read this line to find the port.
    println!("listening {}", server.addr());
    std::io::stdout().flush()?;
    tracing::info!(addr = %server.addr(), "psl memcached ready");
    server.wait();
    Ok(0)
}
