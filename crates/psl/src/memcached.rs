//! `psl memcached`: SecureCached, the memcached-compatible front end (crate `psl-memcached`).
//!
//! Alone (`psl memcached --listen ADDR`) it runs the embedded default: one node with a front
//! end, an in-process coordinator, on an in-process hub. With `--cluster ROUTER --capsule FILE
//! --owner KEY --id N` its node joins a running deployment through a router, like `psl node`;
//! with `--peer-listen A --peers A,B,…` it is one front end of a group whose members forward
//! each key's conditional commands to the key's home (see `psl_memcached::peer`).

use crate::util::read_owner_key;
use anyhow::{bail, Context, Result};
use clap::Args;
use psl_capsule::CapsuleFile;
use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::peer::{PeerConfig, PeerKey, PeerServer};
use psl_memcached::proto::Limits;
use psl_memcached::{Config, FrontEnd, Server, ServerConfig};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// Embedded default only: receive-only replica nodes that verify and apply every write.
    #[arg(long, default_value_t = 0)]
    pub replicas: usize,
    /// Writer actors of the front end's node.
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Join a running deployment through this router instead of running the embedded default.
    #[arg(long, requires_all = ["capsule", "owner", "id"])]
    pub cluster: Option<SocketAddr>,
    /// With --cluster: the capsule file that names the capsule.
    #[arg(long)]
    pub capsule: Option<PathBuf>,
    /// With --cluster: the owner key file.
    #[arg(long)]
    pub owner: Option<PathBuf>,
    /// With --cluster: this node's id, 1 to 32767.
    #[arg(long)]
    pub id: Option<u32>,
    /// With --cluster: state directory keeping the incarnation counter (as `psl node --state`).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Verify actors of each node (default: 1 embedded, 2 with --cluster).
    #[arg(long)]
    pub verifiers: Option<usize>,
    /// Most ops per record.
    #[arg(long, default_value_t = 512)]
    pub batch_ops_max: usize,
    /// Microseconds a writer waits for a batch to fill (default: 2000 embedded, 500 with --cluster).
    #[arg(long)]
    pub flush_us: Option<u64>,
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
}

pub fn run(a: MemcachedArgs) -> Result<i32> {
    if a.peer_listen.is_some() && a.cluster.is_none() {
        bail!("--peer-listen and --peers form a group of --cluster front ends; the embedded default has one");
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = a.peers.iter().find(|p| !seen.insert(**p)) {
        bail!("--peers names {dup} twice; each front end of the group needs its own peer address");
    }
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
    let (fe, _deployment): (Arc<FrontEnd>, Box<dyn std::any::Any>) = match a.cluster {
        None => {
            let d = Embedded::start(&EmbeddedOptions {
                replicas: a.replicas,
                writers: a.writers,
                verifiers: a.verifiers.unwrap_or(1),
                flush_delay: Duration::from_micros(a.flush_us.unwrap_or(2000)),
                config,
                ..EmbeddedOptions::default()
            })?;
            (d.front_ends[0].clone(), Box::new(d))
        }
        Some(router) => {
            let (Some(capsule), Some(owner), Some(id)) = (&a.capsule, &a.owner, a.id) else {
                bail!("--cluster needs --capsule, --owner and --id");
            };
            let bytes = std::fs::read(capsule).with_context(|| format!("reading {}", capsule.display()))?;
            let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", capsule.display()))?;
            let ok = read_owner_key(owner)?;
            if ok.public() != f.metadata.meta.owner {
                bail!("{} is not the owner key of capsule {}", owner.display(), f.metadata.name());
            }
            let app = ok.app(f.metadata.meta.app_index)?;
            let incarnation = match &a.state {
                Some(d) => crate::roles::next_incarnation(d)?,
                None => rand::random::<u32>() % (1 << 12),
            };
            let opts = NodeOptions {
                node_id: id,
                incarnation,
                writers: a.writers,
                verifiers: a.verifiers.unwrap_or(2),
                batch_ops_max: a.batch_ops_max,
                flush_delay: Duration::from_micros(a.flush_us.unwrap_or(500)),
                ..NodeOptions::default()
            };
            let keys = NodeKeys::derive(&f.metadata, &app, &opts)?;
            let ep = psl_fabric::TcpEndpoint::connect(router, psl_fabric::TcpConfig::default())
                .with_context(|| format!("connecting to router {router}"))?;
            let node = Node::start(keys, Arc::new(ep), opts)?;
            let fe = FrontEnd::new(Arc::new(node), config);
            let peer_server = match a.peer_listen {
                None => None,
                Some(listen) => {
                    let me = a
                        .peers
                        .iter()
                        .position(|p| *p == listen)
                        .with_context(|| format!("--peer-listen {listen} must be one of --peers {:?}", a.peers))?;
                    let key = PeerKey::derive(&app.data_key());
                    let l = std::net::TcpListener::bind(listen)
                        .with_context(|| format!("binding the peer address {listen}"))?;
                    let cfg = PeerConfig { timeout: Duration::from_millis(a.peer_timeout_ms.max(1)) };
                    fe.join_remote_group(&a.peers, me, key.clone(), cfg);
                    tracing::info!(peers = ?a.peers, me, "front-end group joined");
                    Some(PeerServer::start(&fe, l, key).context("starting the peer server")?)
                }
            };
            (fe, Box::new(peer_server))
        }
    };
    let server = Server::start(fe, a.listen, scfg)?;
    // Tests and scripts read this line to find the port.
    println!("listening {}", server.addr());
    std::io::stdout().flush()?;
    tracing::info!(addr = %server.addr(), "psl memcached ready");
    server.wait();
    Ok(0)
}
