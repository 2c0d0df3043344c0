//! Long-running roles: `psl node`, `psl coordinator` (and `psl router`, from psl-fabric).

use crate::util::read_owner_key;
use anyhow::{bail, Context, Result};
use clap::Args;
use psl_capsule::CapsuleFile;
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::CoordinatorConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// The flags `psl node` and `psl coordinator` share: the capsule and its keys, the fabric, the
/// epoch, the repair cache, the memory budget and the cores.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// The capsule file that names the capsule (its metadata; records in it are not loaded).
    #[arg(long)]
    pub capsule: PathBuf,
    /// Owner key file (development); a deployment gives --kv-leader instead.
    #[arg(long)]
    pub owner: Option<PathBuf>,
    /// The KV keys from the leader (`--kv-leader`) instead of --owner.
    #[command(flatten)]
    pub kv: crate::kvkeys::KvLeaderArgs,
    /// How this role attests to the leader (with --kv-leader).
    #[command(flatten)]
    pub attest: crate::attest::AttestArgs,
    /// The untrusted multicast fabric: `--fabric psl://HOST:PORT` (a router; `--router` is an
    /// alias) or `--fabric nats://H1:4222,nats://H2:4222`, with the `--nats-*` options.
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    /// Epoch length in milliseconds (RTS every epoch).
    #[arg(long, default_value_t = 100)]
    pub epoch_ms: u64,
    /// MiB of recent records kept to answer peers' repair requests (oldest evicted first;
    /// peers and capsule servers hold them too). Default: 128 for a node, 16 for a
    /// coordinator, which keeps no values.
    #[arg(long)]
    pub repair_cache_mb: Option<u64>,
    /// The memory budget (`--memory-budget-mb`).
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// How the ring threads wait for work (`--dedicated-cores`).
    #[command(flatten)]
    pub cores: CoresArgs,
    /// Prometheus metrics over HTTP (`--metrics ADDR`).
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// The attested HTTPS endpoint (`--http ADDR`).
    #[command(flatten)]
    pub https: HttpsArgs,
}

/// `--dedicated-cores`: how a role's ring threads wait for work.
#[derive(Args, Debug, Clone, Default)]
pub struct CoresArgs {
    /// This process has cores of its own: its ring threads spin (~20-40 µs) and yield before
    /// they park, for lower wake-up latency at the price of CPU. Without it they park after 32
    /// spins (`NodeOptions::shared_cores`), which is right when roles share a machine's cores,
    /// as under `psl up` (docs/protocol/scale.md §9).
    #[arg(long)]
    pub dedicated_cores: bool,
}

impl CoresArgs {
    /// `opts` with the ring waits this process should use.
    pub fn apply(&self, opts: NodeOptions) -> NodeOptions {
        if self.dedicated_cores {
            opts
        } else {
            opts.shared_cores()
        }
    }
}

/// `--memory-budget-mb`: the resident memory a role is sized to stay within (its repair
/// cache defaults to at most a quarter of it) and watched against (`psl_node::memory`).
#[derive(Args, Debug, Clone, Default)]
pub struct BudgetArgs {
    /// Memory budget of this process in MiB: its repair cache defaults to at most a quarter of
    /// it, and its resident memory is watched against it (a warning and the
    /// `psl_process_over_budget_samples_total` counter when above). Default: per role (router
    /// 64, coordinator 128, capsule server and CapsuleDB 192, node and front end 256).
    #[arg(long, value_name = "MB")]
    pub memory_budget_mb: Option<u64>,
}

/// `--metrics ADDR`: a role's Prometheus metrics over HTTP (`psl-http`).
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve this role's Prometheus metrics at http://ADDR/metrics (GET; port 0 picks a free
    /// one). Prints `metrics http://ADDR/metrics`. The counters carry no secrets and need no
    /// credential: bind loopback or a private network.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

impl MetricsArgs {
    /// Starts the metrics server when `--metrics` was given, serving what `render` renders,
    /// the memory budget watch's figures (`psl_process_*`) when `process` is set (a node's
    /// render has them already), and this process's CPU, memory, threads and descriptors
    /// (`process_*`). Keep the returned server alive as long as the role runs.
    pub fn serve(
        &self,
        render: impl Fn() -> String + Send + Sync + 'static,
        process: bool,
    ) -> Result<Option<psl_http::MetricsServer>> {
        let Some(addr) = self.metrics else { return Ok(None) };
        let render: psl_http::Render = Arc::new(move || {
            let mut s = render();
            if process {
                s.push_str(&psl_node::memory::render_metrics());
            }
            s.push_str(&psl_http::process_metrics());
            s
        });
        let server = psl_http::MetricsServer::start(addr, render)?;
        // Tests, `psl up` and scripts read this line to find the port.
        println!("metrics {}", server.url());
        use std::io::Write;
        std::io::stdout().flush()?;
        Ok(Some(server))
    }
}

/// Makes a role's API routes from its endpoint's TLS SPKI hash and answer signer.
pub type ApiMaker = Box<dyn FnOnce([u8; 32], psl_faas::tls::AnswerSigner) -> (Vec<&'static str>, psl_http::Api)>;

/// `--http ADDR`: a trusted role's HTTPS endpoint, whose TLS key its attestation evidence binds.
#[derive(Args, Debug, Clone, Default)]
pub struct HttpsArgs {
    /// Serve HTTPS here (port 0 picks a free one) under a fresh TLS key of this process, bound
    /// into its attestation evidence: `GET /v1/attestation?nonce=HEX` answers evidence over the
    /// client's nonce and that key (with `--attest`), which `psl verify https://ADDR --policy
    /// FILE` checks; `GET /metrics` is served there too. Prints `https https://ADDR`.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
}

impl HttpsArgs {
    /// Starts the HTTPS endpoint when `--http` was given, attesting as `attest` says (no
    /// `--attest`: the attestation route says there is no evidence to give). The attester is
    /// opened only here, only with `--http`.
    ///
    /// `api`, when given, makes the role's API routes from the endpoint's TLS identity (its
    /// SPKI hash and a signer with its key: the API signs its answers with the attested key).
    pub fn serve(
        &self,
        role: &str,
        attest: &crate::attest::AttestArgs,
        render: impl Fn() -> String + Send + Sync + 'static,
        api: Option<ApiMaker>,
    ) -> Result<Option<psl_http::HttpServer>> {
        let Some(addr) = self.http else { return Ok(None) };
        let attester = attest.open(role, || crate::attest::measurement(attest.sim_binary_hash.as_deref()))?;
        let id = psl_faas::tls::TlsIdentity::generate(&format!("psl {role}"))?;
        let spki = id.spki_hash();
        let api = match api {
            Some(make) => Some(make(spki, id.answer_signer()?)),
            None => None,
        };
        let role_name = role.to_string();
        let attestation: psl_http::Attest = Arc::new(move |nonce: [u8; 32]| {
            let Some(att) = &attester else {
                return Err(format!("psl {role_name} runs without --attest: it has no evidence to give"));
            };
            let rd = psl_faas::attest::bind_https_tls(&spki);
            let ev = att.attest(&nonce, &rd).map_err(|e| e.to_string())?;
            Ok(serde_json::json!({
                "role": role_name,
                "backend": ev.backend,
                "evidence": hex::encode(&ev.bytes),
                "binds": format!("tls-spki {}", hex::encode(spki)),
                "report_data": hex::encode(rd),
                "nonce": hex::encode(nonce),
            }))
        });
        let render: psl_http::Render = Arc::new(move || {
            let mut s = render();
            s.push_str(&psl_http::process_metrics());
            s
        });
        let routes = psl_http::Routes { metrics: Some(render), attestation: Some(attestation), api };
        let server =
            psl_http::HttpServer::serve(addr, routes, Some(id.server_config(false)?), psl_http::Limits::default())?;
        // Tests, `psl up` and scripts read this line.
        println!("https {}", server.base_url());
        use std::io::Write;
        std::io::stdout().flush()?;
        Ok(Some(server))
    }
}

/// A role of the deployment, for its default memory budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    /// `psl router`.
    Router,
    /// `psl capsule-server`.
    CapsuleServer,
    /// `psl coordinator`.
    Coordinator,
    /// `psl capsuledb`.
    CapsuleDb,
    /// `psl node`.
    Node,
    /// `psl memcached` (a SecureCached front end).
    FrontEnd,
}

impl RoleKind {
    /// The default budget, MiB: what the role measured at its peak in `psl bench cluster`
    /// (300,000 keys of 100 bytes, front ends holding 64 MiB of items) with room to spare,
    /// and none above the 256 MiB of issue 17.
    pub fn budget_mb_default(self) -> u64 {
        match self {
            RoleKind::Router => 64,
            RoleKind::Coordinator => 128,
            RoleKind::CapsuleServer | RoleKind::CapsuleDb => 192,
            RoleKind::Node | RoleKind::FrontEnd => 256,
        }
    }

    /// The role a `psl` subcommand runs (`None`: not a long-running role).
    pub fn of_subcommand(cmd: &str) -> Option<RoleKind> {
        Some(match cmd {
            "router" => RoleKind::Router,
            "capsule-server" => RoleKind::CapsuleServer,
            "coordinator" => RoleKind::Coordinator,
            "capsuledb" => RoleKind::CapsuleDb,
            "node" => RoleKind::Node,
            "memcached" => RoleKind::FrontEnd,
            _ => return None,
        })
    }
}

impl BudgetArgs {
    /// The budget in MiB, this role's default if none was given.
    pub(crate) fn mb(&self, kind: RoleKind) -> u64 {
        self.memory_budget_mb.unwrap_or_else(|| kind.budget_mb_default()).max(1)
    }

    /// Starts watching this process against its budget; returns the budget in MiB.
    pub(crate) fn watch(&self, kind: RoleKind, role: &str) -> u64 {
        let mb = self.mb(kind);
        psl_node::memory::watch(role, mb);
        tracing::info!(role, budget_mb = mb, "memory budget");
        mb
    }
}

/// A repair cache of `default_mb`, at most a quarter of the budget `budget_mb`, unless
/// `given` (`--repair-cache-mb`) says otherwise.
pub(crate) fn repair_cache_mb(given: Option<u64>, default_mb: u64, budget_mb: u64) -> u64 {
    given.unwrap_or_else(|| default_mb.min((budget_mb / 4).max(1)))
}

/// Repair caches (`--repair-cache-mb`): a node's, and that of a role that only follows the
/// capsule (a coordinator, CapsuleDB), whose records every node and capsule server also holds.
pub(crate) const REPAIR_CACHE_MB_NODE: u64 = (psl_scl::CACHE_BYTES_MAX_DEFAULT >> 20) as u64;
pub(crate) const REPAIR_CACHE_MB_FOLLOWER: u64 = 16;

/// A `--repair-cache-mb` in bytes (at least 1 MiB).
pub(crate) fn mib_bytes(mb: u64) -> usize {
    (mb.max(1) as usize).saturating_mul(1 << 20)
}

/// Who may use a role's control interface (`--control`): the operator, by signing each
/// command with the control key `psl keys control` (or `psl up --init`) made.
#[derive(Args, Debug, Clone)]
pub struct ControlArgs {
    /// The operator's control public key file (`control.pub`; default: the environment's
    /// PSL_CONTROL_PUB): commands that sign, revoke or return plaintext need its signature.
    /// Without it the control interface answers only STATS, KEYGEN and METRICS.
    #[arg(long, value_name = "FILE")]
    pub control_pub: Option<PathBuf>,
    /// Close a control connection silent this long (milliseconds).
    #[arg(long, default_value_t = psl_node::control::IDLE_MS_DEFAULT)]
    pub control_idle_ms: u64,
}

impl ControlArgs {
    /// The control interface's options, with `revoker` for `REVOKE`.
    pub fn options(&self, revoker: Option<psl_node::control::Revoker>) -> Result<psl_node::control::ControlOptions> {
        let from_env = || std::env::var_os("PSL_CONTROL_PUB").filter(|v| !v.is_empty()).map(PathBuf::from);
        let operator = match self.control_pub.clone().or_else(from_env) {
            Some(p) => Some(crate::util::read_control_pub(&p)?),
            None => {
                tracing::warn!("no --control-pub: the control interface answers only STATS, KEYGEN and METRICS");
                None
            }
        };
        Ok(psl_node::control::ControlOptions { operator, revoker, idle_ms: self.control_idle_ms })
    }
}

/// `psl node`: a worker node.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The flags shared with `psl coordinator`.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Who may use the control interface (`--control-pub`, `--control-idle-ms`).
    #[command(flatten)]
    pub control_auth: ControlArgs,
    /// Node id, 1 to 32767 (with the incarnation it names the node's writers).
    #[arg(long)]
    pub id: u32,
    /// Writer actors (crypto threads); 0 makes a receive-only node.
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Verify actors.
    #[arg(long, default_value_t = 2)]
    pub verifiers: usize,
    /// Most ops per record.
    #[arg(long, default_value_t = 512)]
    pub batch_ops_max: usize,
    /// Microseconds a writer waits for a batch to fill.
    #[arg(long, default_value_t = 500)]
    pub flush_us: u64,
    /// Control interface address (line protocol: PUT/GET/DEL/SYNC/STATS/DUMP/METRICS; loopback
    /// by default: give a routable address only on a network you trust, see --control-pub).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub control: SocketAddr,
    /// State directory: keeps the incarnation counter, so that a restarted node never re-uses
    /// its old writers' sequence numbers. Without it a random incarnation is drawn.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Capsule servers n (ids 0 .. n): SYNC_DURABLE waits for acks from a majority (f + 1 of
    /// 2f + 1). 0 turns durability off.
    #[arg(long, default_value_t = 0)]
    pub servers: u32,
    /// Ops each writer may have sealed or queued and not yet acked by a quorum of capsule
    /// servers (--servers), by CapsuleDB (--capsuledb) and by the peer nodes that pace it;
    /// beyond it a put waits for their acks (0: off). When acks stop moving for a second the
    /// window opens until they move again (docs/protocol/scl.md §4).
    #[arg(long, default_value_t = psl_node::flow::WINDOW_OPS_DEFAULT)]
    pub flow_window_ops: usize,
    /// Records each writer may have in flight under the same acks (at least 1).
    #[arg(long, default_value_t = psl_node::flow::WINDOW_RECORDS_DEFAULT)]
    pub flow_window_records: usize,
    /// Capsule servers' read addresses (`psl capsule-server --read`), comma-separated: the
    /// node starts by rebuilding its memtable from the first fresh one (not from peers), under
    /// an incarnation above any the servers have seen, and serves clients only after that.
    #[arg(long, value_delimiter = ',')]
    pub recover_from: Vec<SocketAddr>,
    /// With --recover-from: how long to wait for f + 1 servers (of --servers N) to hold fresh
    /// copies (each holding every record the newest SYNC links) before giving up; a line is
    /// logged per retry. A server one epoch behind, or just restarted and catching up, is
    /// waited for, not refused.
    #[arg(long, default_value_t = 30_000)]
    pub recover_timeout_ms: u64,
    /// CapsuleDB's writer index (printed by `psl capsuledb`): gets the memtable cannot answer
    /// are read from CapsuleDB.
    #[arg(long)]
    pub capsuledb: Option<u32>,
    /// Bound on the memtable's keys (cold keys CapsuleDB holds are evicted); needs --capsuledb.
    #[arg(long, requires = "capsuledb")]
    pub memtable_keys_max: Option<usize>,
}

/// `psl coordinator`: a coordinator, primary or shadow.
#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// The flags shared with `psl node`.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Who may use the control interface (`--control-pub`, `--control-idle-ms`).
    #[command(flatten)]
    pub control_auth: ControlArgs,
    /// 0 = primary; 1, 2, ... = shadows that take over, in order, when SYNCs stop.
    #[arg(long, default_value_t = 0)]
    pub rank: u8,
    /// Milliseconds to wait for every writer's EOE before closing an epoch without it.
    #[arg(long, default_value_t = 300)]
    pub eoe_timeout_ms: u64,
    /// Epochs without a SYNC before a shadow takes over (times 1 + its rank; counted from the
    /// first write after the last SYNC, or after `--epoch-idle-ms` if nothing was written).
    #[arg(long, default_value_t = 5)]
    pub takeover_after_epochs: u64,
    /// Epoch length in milliseconds while nothing but epochs is written (a write, or a node's
    /// pending sync, brings back the `--epoch-ms` pace at once); at least `--epoch-ms`.
    #[arg(long, default_value_t = psl_scl::coordinator::EPOCH_IDLE_MS_DEFAULT)]
    pub epoch_idle_ms: u64,
    /// Control interface address (STATS, DUMP, METRICS).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub control: SocketAddr,
    /// State directory: every record this coordinator signs is fsync'd to its own-chain log
    /// there before it is published, and a restart on the same directory continues after the
    /// newest of them, however long its peers take to answer. Without it a coordinator that
    /// restarts while cut off from its peers can sign a seq twice (equivocation).
    #[arg(long)]
    pub state: Option<PathBuf>,
}

/// The KV keys of role `role` `id`, which signs as `writers` (from --owner: the application
/// key; or from the leader with --kv-leader: the data key and exactly those writers' keys).
pub(crate) fn load(
    common: &CommonArgs,
    meta: &psl_capsule::SignedMetadata,
    role: psl_faas::leader::KvRole,
    id: u32,
    writers: &[u32],
) -> Result<crate::kvkeys::KvKeys> {
    crate::kvkeys::kv_keys(meta, common.owner.as_deref(), &common.kv, &common.attest, role, id, writers)
}

/// The capsule and its application key, from an owner key file.
fn load_with_owner(capsule: &Path, owner: &Path) -> Result<(psl_capsule::SignedMetadata, psl_crypto::AppKey)> {
    let bytes = std::fs::read(capsule).with_context(|| format!("reading {}", capsule.display()))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", capsule.display()))?;
    let owner_key = read_owner_key(owner)?;
    if owner_key.public() != f.metadata.meta.owner {
        bail!("{} is not the owner key of capsule {}", owner.display(), f.metadata.name());
    }
    let app = owner_key.app(f.metadata.meta.app_index)?;
    Ok((f.metadata, app))
}

/// Reads, increments and durably stores the incarnation counter.
pub(crate) fn next_incarnation(dir: &Path) -> Result<u32> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = dir.join("incarnation");
    let cur: u32 = match std::fs::read_to_string(&p) {
        Ok(s) => s.trim().parse().with_context(|| format!("{} is not a number", p.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e).with_context(|| format!("reading {}", p.display())),
    };
    let next = cur + 1;
    if next >= 1 << 12 {
        bail!("{}: this node id has used all 4096 incarnations; give it a new --id", p.display());
    }
    crate::util::write_atomic(&p, next.to_string().as_bytes(), 0o644)?;
    Ok(next)
}

pub(crate) fn serve(
    node: Node,
    control: SocketAddr,
    what: &str,
    auth: &ControlArgs,
    common: &CommonArgs,
) -> Result<i32> {
    serve_with(node, control, what, auth.options(None)?, common)
}

/// A revoker for the control interface's `REVOKE`, from the application key this role holds.
pub(crate) fn revoker(meta: &psl_capsule::SignedMetadata, app: psl_crypto::AppKey) -> psl_node::control::Revoker {
    let name = meta.name();
    let app = Arc::new(app);
    Arc::new(move |w, from, from_seq| {
        psl_capsule::Revocation::issue(&app, name, 0, w, from, from_seq)
            .map(psl_capsule::KeyStatement::Revoke)
            .map_err(|e| e.to_string())
    })
}

pub(crate) fn serve_with(
    node: Node,
    control: SocketAddr,
    what: &str,
    opts: psl_node::control::ControlOptions,
    common: &CommonArgs,
) -> Result<i32> {
    let listener =
        std::net::TcpListener::bind(control).with_context(|| format!("binding the control address {control}"))?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to find the control port.
    println!("control {addr}");
    use std::io::Write;
    std::io::stdout().flush()?;
    tracing::info!(%addr, "{what} ready; writers {:?}", node.writers());
    let node = Arc::new(node);
    let n = node.clone();
    let _metrics = common.metrics.serve(move || n.render_metrics(), false)?;
    let n = node.clone();
    // A node serves the KV routes over its values, to the capsule owner's credentials.
    let (nn, meta) = (node.clone(), node.metadata().clone());
    let kv: ApiMaker = Box::new(move |spki, signer| {
        let guard = crate::api::Guard::new(meta.name(), meta.meta.owner, spki, signer);
        crate::api::node_kv(nn, Arc::new(guard))
    });
    let api = (what == "node").then_some(kv);
    let _https = common.https.serve(what, &common.attest, move || n.render_metrics(), api)?;
    let stop = Arc::new(AtomicBool::new(false));
    psl_node::control::serve_opts(node, listener, stop, opts)?;
    Ok(0)
}

/// Attaches a role's endpoint to the fabric `spec` names; on NATS it subscribes to what
/// `interest` names (its capsule, the messages of its role).
pub(crate) fn fabric(
    spec: &psl_fabric::FabricSpec,
    name: &str,
    interest: &psl_fabric::Interest,
) -> Result<Arc<dyn psl_fabric::Fabric>> {
    spec.connect(name, interest).with_context(|| format!("attaching {name} to the fabric {spec}"))
}

/// The 32 bytes of a capsule's name, as the fabric's subjects use them.
pub(crate) fn capsule_id(meta: &psl_capsule::SignedMetadata) -> [u8; 32] {
    meta.name().0 .0
}

/// Runs `psl node`: starts the node (after recovering from the capsule servers with
/// --recover-from) and serves its control interface until stopped; returns the exit code.
pub fn run_node(a: NodeArgs) -> Result<i32> {
    let budget_mb = a.common.budget.watch(RoleKind::Node, "node");
    let meta = read_metadata(&a.common.capsule)?;
    let recovery = if a.recover_from.is_empty() {
        None
    } else {
        let need = psl_node::recovery::quorum(a.servers, a.recover_from.len());
        let patience = psl_node::recovery::Patience::within(Duration::from_millis(a.recover_timeout_ms));
        let r = psl_node::recovery::fetch(&a.recover_from, &meta, a.id, need, patience).with_context(|| {
            format!(
                "recovering from the capsule servers {:?} (waited up to {} ms for {need} fresh copies)",
                a.recover_from, a.recover_timeout_ms
            )
        })?;
        if r.rounds > 1 {
            tracing::warn!(rounds = r.rounds, "recovery found {need} fresh copies after waiting");
        }
        for (s, why) in &r.skipped {
            tracing::warn!(server = %s, "recovery skipped a server: {why}");
        }
        Some(r)
    };
    let seen = recovery.as_ref().and_then(|r| r.incarnation_seen);
    let incarnation = match &a.state {
        Some(d) => {
            let i = psl_node::recovery::next_incarnation_above(Some(next_incarnation(d)?), seen);
            if i >= 1 << 12 {
                bail!("node id {} has used all 4096 incarnations; give it a new --id", a.id);
            }
            crate::util::write_atomic(&d.join("incarnation"), i.to_string().as_bytes(), 0o644)?;
            i
        }
        None if seen.is_some() => psl_node::recovery::next_incarnation_above(None, seen),
        None => {
            let i = rand::random::<u32>() % (1 << 12);
            tracing::warn!(
                incarnation = i,
                "no --state directory: drew a random incarnation; a restart could collide with an earlier one"
            );
            i
        }
    };
    let opts = NodeOptions {
        node_id: a.id,
        incarnation,
        writers: a.writers,
        verifiers: a.verifiers,
        batch_ops_max: a.batch_ops_max,
        flush_delay: Duration::from_micros(a.flush_us),
        core: psl_scl::NodeConfig {
            servers: a.servers,
            cache_bytes_max: mib_bytes(repair_cache_mb(a.common.repair_cache_mb, REPAIR_CACHE_MB_NODE, budget_mb)),
            ..psl_scl::NodeConfig::default()
        },
        capsuledb: a.capsuledb,
        memtable_keys_max: a.memtable_keys_max,
        flow: psl_node::flow::FlowOptions {
            window_ops: a.flow_window_ops,
            window_records: a.flow_window_records,
            ..psl_node::flow::FlowOptions::default()
        },
        ..NodeOptions::default()
    };
    let opts = a.common.cores.apply(opts);
    // The keys of exactly this incarnation's writers (with --kv-leader, all the leader grants).
    let kv = load(&a.common, &meta, psl_faas::leader::KvRole::FrontEnd, a.id, &NodeKeys::writers_for(&meta, &opts)?)?;
    let keys = NodeKeys::from_source(&meta, &kv, &opts)?;
    drop(kv);
    let spec = a.common.fabric.spec("psl node")?;
    let interest = psl_fabric::Interest::node(capsule_id(&meta), a.id, a.capsuledb.is_some());
    let name = format!("node-{}", a.id);
    let Some(r) = recovery else {
        let node = Node::start(keys, fabric(&spec, &name, &interest)?, opts)?;
        return serve(node, a.control, "node", &a.control_auth, &a.common);
    };
    let count = r.messages.len() as u64;
    let pre = Arc::new(psl_node::recovery::Preloaded::new(fabric(&spec, &name, &interest)?, r.messages));
    let node = Node::start(keys, pre.clone(), opts)?;
    if !psl_node::recovery::wait_applied(&pre, node.metrics(), count, Duration::from_secs(120)) {
        bail!("the node did not apply the {count} records recovered from {:?} within 120 s", r.servers);
    }
    // Tests and scripts read this line.
    let epoch = r.newest_sync_epoch.map(|e| format!("{e:#x}")).unwrap_or_else(|| "none".into());
    let from: Vec<String> = r.servers.iter().map(|s| s.to_string()).collect();
    println!("recovered {count} records from {} newest-sync-epoch {epoch} incarnation {incarnation}", from.join(","));
    serve(node, a.control, "node", &a.control_auth, &a.common)
}

/// Runs `psl coordinator`: starts the coordinator and serves its control interface until
/// stopped; returns the exit code.
pub fn run_coordinator(a: CoordinatorArgs) -> Result<i32> {
    let budget_mb = a.common.budget.watch(RoleKind::Coordinator, "coordinator");
    let meta = read_metadata(&a.common.capsule)?;
    let cfg = CoordinatorConfig {
        epoch_ms: a.common.epoch_ms,
        epoch_idle_ms: a.epoch_idle_ms,
        eoe_timeout_ms: a.eoe_timeout_ms,
        takeover_after_epochs: a.takeover_after_epochs,
        rank: a.rank,
        ranks: meta.meta.policy.coordinators,
        missed_eoe_max: 3,
    };
    // A coordinator's writer index has no incarnation: after a restart it first learns its own
    // chain back from its peers (rejoin), through the newest seq its state directory says it
    // signed, so that it never re-uses a seq.
    if a.state.is_none() {
        tracing::warn!("no --state directory: a restart while cut off from every peer could re-sign a seq");
    }
    // It keeps no values: it orders records, signs SYNCs and answers repairs from its cache,
    // and a memtable of every key would be most of its memory.
    let core = psl_scl::NodeConfig {
        rejoin_ms: (3 * a.common.epoch_ms).max(300),
        keep_values: false,
        cache_bytes_max: mib_bytes(repair_cache_mb(a.common.repair_cache_mb, REPAIR_CACHE_MB_FOLLOWER, budget_mb)),
        ..psl_scl::NodeConfig::default()
    };
    let opts = NodeOptions {
        node_id: psl_faas::kvgrant::KV_COORDINATOR_NODE_BASE + a.rank as u32,
        writers: 0,
        coordinator: Some(cfg),
        coordinator_state: a.state.clone(),
        core,
        ..NodeOptions::default()
    };
    let opts = a.common.cores.apply(opts);
    // Its rank's coordinator writer (and its node's writers: none).
    let writers = NodeKeys::writers_for(&meta, &opts)?;
    let kv = load(&a.common, &meta, psl_faas::leader::KvRole::Coordinator, a.rank as u32, &writers)?;
    let keys = NodeKeys::from_source(&meta, &kv, &opts)?;
    let spec = a.common.fabric.spec("psl coordinator")?;
    let ep = fabric(&spec, &format!("coordinator-{}", a.rank), &psl_fabric::Interest::coordinator(capsule_id(&meta)))?;
    let node = Node::start(keys, ep, opts)?;
    // On the development path (--owner) the coordinator holds the application key, as the
    // leader does: it signs `REVOKE`s (certified capsules), announces them and carries them
    // into the log. With --kv-leader it holds no application key: `REVOKE` says so, and the
    // operator signs the revocation with the owner key on the operator's machine and hands it
    // over (`psl kv revoke`: `REVOKE_SIGNED`, checked against the capsule before it is
    // announced and carried into the log).
    let certified = meta.meta.policy.writer_keys == psl_capsule::WriterKeys::Certified;
    let revoker = match kv.into_app() {
        Some(app) if certified => Some(revoker(&meta, app)),
        _ => None,
    };
    serve_with(node, a.control, "coordinator", a.control_auth.options(revoker)?, &a.common)
}

/// `psl capsule-server`: run a DataCapsule server, or `check` a server's storage.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CapsuleServerArgs {
    /// `check` a server's storage instead of running a server.
    #[command(subcommand)]
    pub cmd: Option<CapsuleServerCmd>,
    /// The capsule file that names the capsule (its metadata).
    #[arg(long)]
    pub capsule: Option<PathBuf>,
    /// Owner key file: the development path, which derives this server's own signing key
    /// (application child `32768 + id`) from the owner's tree. A deployment gives `--ack-key`
    /// (and `--cert`) instead: a capsule server holds no key but its own.
    #[arg(long, conflicts_with_all = ["ack_key", "cert"])]
    pub owner: Option<PathBuf>,
    /// This server's own ack-signing key (`psl keys server`, or `psl up --init`: mode 0600, on
    /// its host only), checked against the capsule's public metadata and `--cert`.
    #[arg(long)]
    pub ack_key: Option<PathBuf>,
    /// The certificate of `--ack-key` (public), in a capsule that certifies writers.
    #[arg(long, requires = "ack_key")]
    pub cert: Option<PathBuf>,
    /// The fabric (`--fabric URL`, alias `--router`) and its NATS options.
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    /// Store directory (created if missing; re-verified, and repaired if damaged, on start).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Server id, 0 to 32767.
    #[arg(long)]
    pub id: Option<u32>,
    /// Address to serve reads on for other processes (heads, latest SYNC, record by hash,
    /// writer range, membership proof; see `docs/protocol/durability.md`). Printed as
    /// `reads ADDR` once listening. None if absent.
    #[arg(long)]
    pub read: Option<SocketAddr>,
    /// Verify threads.
    #[arg(long, default_value_t = 2)]
    pub verifiers: usize,
    /// Servers in the deployment, n = 2f + 1 (ids 0 .. n); this server's --id must be below it.
    /// Nodes count a write durable once f + 1 of them acked it (`psl node --servers N`).
    #[arg(long, default_value_t = 3)]
    pub n: u32,
    /// Failures tolerated; defaults to (n - 1) / 2. Must satisfy n = 2f + 1.
    #[arg(long)]
    pub f: Option<u32>,
    /// When batches are fsync'd: `group` (default: each fsync takes everything that arrived
    /// during the previous one), `always` (one record per fsync), `interval-ms=N` (at most one
    /// fsync every N ms). Acks always follow the fsync that covers them, whatever the policy.
    #[arg(long, default_value = "group")]
    pub fsync: psl_server::FsyncPolicy,
    /// Attestation (`--attest`): publish a report binding this server's ack-signing key.
    #[command(flatten)]
    pub attest: crate::attest::PublishArgs,
    /// The memory budget (`--memory-budget-mb`).
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Prometheus metrics over HTTP (`--metrics ADDR`).
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// The subcommands of `psl capsule-server`.
#[derive(clap::Subcommand, Debug)]
pub enum CapsuleServerCmd {
    /// Re-read and re-verify a server's storage end to end (exit 0 only if clean; 1 if
    /// damaged). `--dir` reads the store directory: of a stopped server, or of a running one
    /// (then the log as it was when the check began; what the server appends meanwhile is not
    /// covered, and is not damage). `--read` asks a running server to check its own store
    /// against its index (the `CHECK` request on its read address).
    Check {
        /// The server's store directory.
        #[arg(long, required_unless_present = "read", conflicts_with = "read")]
        dir: Option<PathBuf>,
        /// A running server's read address (`psl capsule-server --read`).
        #[arg(long)]
        read: Option<SocketAddr>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `psl capsule-server`: the server until stopped, or `check` (exit 0 if clean, 1 if
/// damaged).
pub fn run_capsule_server(a: CapsuleServerArgs) -> Result<i32> {
    match a.cmd {
        Some(CapsuleServerCmd::Check { dir: Some(dir), json, .. }) => return check_server_store(&dir, json),
        Some(CapsuleServerCmd::Check { read: Some(addr), json, .. }) => return check_running_server(addr, json),
        Some(CapsuleServerCmd::Check { .. }) => bail!("psl capsule-server check needs --dir DIR or --read ADDR"),
        None => {}
    }
    let (Some(capsule), true, Some(_), Some(dir), Some(id)) =
        (a.capsule, a.owner.is_some() || a.ack_key.is_some(), &a.fabric.fabric, a.dir, a.id)
    else {
        bail!(
            "psl capsule-server needs --capsule, --ack-key (or --owner), --fabric, --dir and --id (or the `check` \
             subcommand)"
        );
    };
    let f = a.f.unwrap_or(a.n.saturating_sub(1) / 2);
    if a.n == 0 || a.n != 2 * f + 1 {
        bail!("--n {} and --f {f} do not satisfy n = 2f + 1", a.n);
    }
    if id >= a.n {
        bail!("--id {id} is not below --n {} (server ids are 0 .. n)", a.n);
    }
    a.budget.watch(RoleKind::CapsuleServer, "capsule-server");
    let spec = a.fabric.spec("psl capsule-server")?;
    let (meta, key, cert) = match (a.owner, a.ack_key) {
        (_, Some(ack)) => {
            let meta = read_metadata(&capsule)?;
            let (key, cert) = read_server_credentials(&meta, id, &ack, a.cert.as_deref())?;
            (meta, key, cert)
        }
        (Some(owner), None) => {
            let (meta, app) = load_with_owner(&capsule, &owner)?;
            let (key, cert) = psl_server::server_credentials(&meta, &app, id)
                .with_context(|| format!("server id {id} is out of range (0 to 32767)"))?;
            drop(app);
            (meta, key, cert)
        }
        (None, None) => unreachable!("checked above"),
    };
    let ack_public = key.verifying_key().to_bytes();
    let opts = psl_server::ServerOptions {
        id,
        verifiers: a.verifiers,
        fsync: a.fsync,
        read_listen: a.read,
        cert,
        ..psl_server::ServerOptions::default()
    };
    tracing::info!(id, n = a.n, f, fsync = %a.fsync, "capsule server configuration");
    let ep = fabric(&spec, &format!("capsule-server-{id}"), &psl_fabric::Interest::server(capsule_id(&meta)))?;
    let server = Arc::new(psl_server::Server::start(&dir, meta, key, ep, opts)?);
    let rep = server.start_report().clone();
    let s = server.clone();
    let _metrics = a.metrics.serve(move || s.stats().render_prometheus(), true)?;
    // Tests and scripts read this line.
    println!("ready {} records={} repaired={}", server.writer(), rep.records, rep.repaired);
    if let Some(r) = server.read_addr() {
        println!("reads {r}");
    }
    crate::attest::publish(&a.attest, "capsule-server", "ack-signing key", &ack_public)?;
    use std::io::Write;
    std::io::stdout().flush()?;
    for p in &rep.problems {
        tracing::warn!("store problem found on open: {p}");
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(e) = server.failed() {
            bail!("capsule server stopped acking: {e}");
        }
    }
}

/// A capsule file's public metadata.
pub(crate) fn read_metadata(capsule: &Path) -> Result<psl_capsule::SignedMetadata> {
    let bytes = std::fs::read(capsule).with_context(|| format!("reading {}", capsule.display()))?;
    Ok(CapsuleFile::parse(&bytes).with_context(|| format!("{}", capsule.display()))?.metadata)
}

/// The first line of a capsule server's ack key file; the second is the key's 64 hex digits.
const ACK_KEY_MAGIC: &str = "psl capsule server ack key v1";

/// Writes capsule server `id`'s ack-signing key (from the owner's tree: `app`) to `key_path`
/// (mode 0600) and, in a capsule that certifies writers, its certificate to `cert_path`
/// (public). What a server needs instead of the owner key (`--ack-key`, `--cert`).
pub(crate) fn write_server_credentials(
    meta: &psl_capsule::SignedMetadata,
    app: &psl_crypto::AppKey,
    id: u32,
    key_path: &Path,
    cert_path: &Path,
) -> Result<bool> {
    let (key, cert) = psl_server::server_credentials(meta, app, id)
        .with_context(|| format!("server id {id} is out of range (0 to 32767)"))?;
    let secret = key.expose_secret_bytes();
    let mut text = zeroize::Zeroizing::new(String::with_capacity(100));
    text.push_str(ACK_KEY_MAGIC);
    text.push('\n');
    text.push_str(&format!("server {id}\n"));
    text.push_str(zeroize::Zeroizing::new(hex::encode(&secret[..])).as_str());
    text.push('\n');
    crate::util::write_atomic(key_path, text.as_bytes(), 0o600)?;
    if let Some(c) = &cert {
        crate::util::write_atomic(cert_path, &c.encode(), 0o644)?;
    }
    Ok(cert.is_some())
}

/// Reads capsule server `id`'s ack key (`--ack-key`) and certificate (`--cert`), and refuses
/// them unless they are server `id`'s: the key of that server's writer index under the
/// capsule's application key (derived writer keys), or the key its certificate, signed by the
/// application key, names (certified writer keys).
pub(crate) fn read_server_credentials(
    meta: &psl_capsule::SignedMetadata,
    id: u32,
    key_path: &Path,
    cert_path: Option<&Path>,
) -> Result<(psl_crypto::SigningKey, Option<psl_capsule::WriterCert>)> {
    let w = psl_scl::server_writer(id).with_context(|| format!("server id {id} is out of range (0 to 32767)"))?;
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(key_path).with_context(|| format!("reading key file {}", key_path.display()))?,
    );
    let mut lines = text.lines().map(str::trim);
    if lines.next() != Some(ACK_KEY_MAGIC) {
        bail!("{}: not a capsule server ack key (first line is not '{ACK_KEY_MAGIC}')", key_path.display());
    }
    let named = lines.next().and_then(|l| l.strip_prefix("server ")).and_then(|n| n.parse::<u32>().ok());
    if named != Some(id) {
        bail!("{} is not the ack key of capsule server {id} (it names {named:?})", key_path.display());
    }
    let mut raw = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(lines.next().unwrap_or(""), &mut raw[..])
        .with_context(|| format!("{}: the key is not 64 hex digits", key_path.display()))?;
    let key = psl_crypto::SigningKey::from_bytes(&raw).with_context(|| format!("{}", key_path.display()))?;
    let public = key.verifying_key();
    let cert = match meta.meta.policy.writer_keys {
        psl_capsule::WriterKeys::Derived => {
            if meta.meta.app.writer(w)? != public {
                bail!("{} is not the ack key of capsule server {id} of capsule {}", key_path.display(), meta.name());
            }
            None
        }
        psl_capsule::WriterKeys::Certified => {
            let p = cert_path.with_context(|| {
                format!("capsule {} certifies writers: give capsule server {id} its certificate (--cert)", meta.name())
            })?;
            let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            let c = psl_capsule::WriterCert::decode(&bytes).with_context(|| format!("{}", p.display()))?;
            c.check(meta.name(), &meta.meta.app.point()).with_context(|| format!("{}", p.display()))?;
            if c.writer != w {
                bail!("{} certifies writer {}, not capsule server {id} (writer {w})", p.display(), c.writer);
            }
            if c.key != public {
                bail!("{} certifies another key than {}", p.display(), key_path.display());
            }
            Some(c)
        }
    };
    Ok((key, cert))
}

/// What a check found, printed the same way for a directory and a running server.
struct CheckOutcome {
    what: String,
    frames: u64,
    verified: u64,
    records: u64,
    damage: Vec<String>,
    torn_tail: Option<String>,
    notes: Vec<String>,
    json: serde_json::Map<String, serde_json::Value>,
}

impl CheckOutcome {
    fn print(self, json: bool) -> i32 {
        let clean = self.damage.is_empty();
        if json {
            let mut j = self.json;
            j.insert("frames".into(), self.frames.into());
            j.insert("verified".into(), self.verified.into());
            j.insert("records".into(), self.records.into());
            j.insert("clean".into(), clean.into());
            j.insert("problems".into(), self.damage.clone().into());
            j.insert("torn_tail".into(), self.torn_tail.clone().into());
            j.insert("notes".into(), self.notes.clone().into());
            println!("{}", serde_json::Value::Object(j));
        } else {
            println!(
                "{}: {} frames, {} verified, {} records indexed",
                self.what, self.frames, self.verified, self.records
            );
            for p in &self.damage {
                println!("problem: {p}");
            }
            if let Some(t) = &self.torn_tail {
                println!("note (unacked bytes left by a crash, or a frame being written): {t}");
            }
            for n in &self.notes {
                println!("note: {n}");
            }
            println!("{}", if clean { "clean" } else { "DAMAGED" });
        }
        if clean {
            0
        } else {
            1
        }
    }
}

fn check_server_store(dir: &Path, json: bool) -> Result<i32> {
    let (store, _open) =
        psl_store::DiskStore::open_readonly(dir, None).with_context(|| format!("opening {}", dir.display()))?;
    let rep = store.check().with_context(|| format!("checking {}", dir.display()))?;
    // A torn tail is what a crash during an append leaves (or, while a server runs, the frame
    // it is writing): nothing in it was ever acked (acks follow the fsync), so it is reported
    // as a note, not as damage.
    let mut notes = Vec::new();
    if store.held_by_writer() {
        notes.push(format!(
            "the store is held by a running server: checked the {} bytes of records.log present when the check \
             began ({} bytes appended since are not covered, and are not damage); `psl capsule-server check \
             --read ADDR` checks through the running server, against its own index",
            rep.checked_bytes, rep.appended_bytes
        ));
    }
    notes.extend(lagging_note(&rep.lagging()));
    let heads: serde_json::Map<String, serde_json::Value> = store
        .heads()
        .into_iter()
        .map(|(w, h)| (w.to_string(), serde_json::json!({"seq": h.seq, "hash": h.hash.to_hex()})))
        .collect();
    let mut j = serde_json::Map::new();
    j.insert("dir".into(), dir.display().to_string().into());
    j.insert("live".into(), store.held_by_writer().into());
    j.insert("checked_bytes".into(), rep.checked_bytes.into());
    j.insert("appended_bytes".into(), rep.appended_bytes.into());
    j.insert("heads".into(), heads.into());
    Ok(CheckOutcome {
        what: dir.display().to_string(),
        frames: rep.frames,
        verified: rep.verified as u64,
        records: store.len() as u64,
        damage: rep.damage(),
        torn_tail: rep.torn_tail.as_ref().map(|t| t.to_string()),
        notes,
        json: j,
    }
    .print(json))
}

/// A note for records that link records the store does not hold yet: a replica behind its
/// peers (anti-entropy fills it), not damage.
fn lagging_note(lagging: &[String]) -> Option<String> {
    let first = lagging.first()?;
    Some(format!(
        "{} record(s) link records this replica does not hold yet (it lags its peers; anti-entropy fetches \
         them), e.g. {first}",
        lagging.len()
    ))
}

fn check_running_server(addr: SocketAddr, json: bool) -> Result<i32> {
    let c = psl_server::read::ReadClient::connect(addr)
        .and_then(|mut c| c.check())
        .with_context(|| format!("asking the server at {addr} to check its store"))?;
    let mut notes = Vec::new();
    if c.appended_bytes > 0 {
        notes.push(format!("{} bytes appended while the check ran are not covered", c.appended_bytes));
    }
    notes.extend(lagging_note(&c.lagging));
    let mut j = serde_json::Map::new();
    j.insert("server".into(), addr.to_string().into());
    j.insert("live".into(), true.into());
    j.insert("checked_bytes".into(), c.checked_bytes.into());
    j.insert("appended_bytes".into(), c.appended_bytes.into());
    Ok(CheckOutcome {
        what: format!("server {addr}"),
        frames: c.frames,
        verified: c.verified,
        records: c.records,
        damage: c.damage,
        torn_tail: c.torn_tail,
        notes,
        json: j,
    }
    .print(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_park_at_once_unless_their_cores_are_their_own() {
        let shared = NodeOptions::default().shared_cores().ring_backoff;
        assert_ne!(shared, NodeOptions::default().ring_backoff, "the two policies differ");
        assert_eq!(CoresArgs::default().apply(NodeOptions::default()).ring_backoff, shared);
        let own = CoresArgs { dedicated_cores: true }.apply(NodeOptions::default());
        assert_eq!(own.ring_backoff, NodeOptions::default().ring_backoff);
    }
}
