//! Many hosts from one file: the cluster description (TOML), `psl up --config FILE --init`
//! (the shared files), `psl up --config FILE --host NAME` (one host's roles) and the addresses
//! `psl status --config FILE` probes.
//!
//! Every address is derived from the file: a host's `address` (what the others dial) and a
//! port per role (`[ports]`, plus the role's id), so every host knows every other host's
//! addresses without asking. Roles listen on the host's `bind` (default: its address).
//! See `docs/deploy.md` for the format and a three-site example.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kids::{fabric_flags, spawn, spawn_cmd, stop_all, wait_line, Kid, STOP};

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub cluster: Settings,
    #[serde(default)]
    pub ports: Ports,
    #[serde(rename = "host", default)]
    pub hosts: Vec<Host>,
}

/// `[cluster]`: what every host shares.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Each host's state directory (stores, incarnation counters, logs of nats-server).
    #[serde(default = "default_dir")]
    pub dir: PathBuf,
    /// Files every host needs, the same on each (made once by `psl up --config F --init`,
    /// then copied): the sim platform key (used only under `--attest sim`), the attestation
    /// policy, the KV capsule's public metadata and its servers' certificates, public keys and
    /// pins. No other secret key: the KV owner key stays in `operator`.
    #[serde(default = "default_shared")]
    pub shared: PathBuf,
    /// The operator's private directory (mode 0700): `--init` writes the control key there
    /// (`control.key`, mode 0600), which signs control commands (`psl kv --control-key`), and
    /// the KV capsule's owner key (`kv-owner.key`, 0600). Never copy it to the hosts: they get
    /// only `control.pub`, in `shared`, and their own files in `dir/NAME/`.
    #[serde(default = "default_operator")]
    pub operator: PathBuf,
    /// The fabric; default: the NATS servers of the hosts with `nats = "cluster"`, else the
    /// host with `router = true`.
    pub fabric: Option<String>,
    pub nats_creds: Option<PathBuf>,
    pub nats_tls_ca: Option<PathBuf>,
    #[serde(default = "default_prefix")]
    pub nats_prefix: String,
    /// Epoch length of the KV capsule's coordinators.
    #[serde(default = "default_epoch_ms")]
    pub epoch_ms: u64,
    /// Memory limit of each memcached front end, MiB.
    #[serde(default = "default_memory_mb")]
    pub kv_memory_mb: u64,
    /// Writer actors of each front end's node (`psl memcached --writers`; its default if
    /// absent).
    #[serde(default)]
    pub kv_writers: Option<usize>,
    /// Microseconds each front end's writers wait for a batch to fill (`--flush-us`).
    #[serde(default)]
    pub kv_flush_us: Option<u64>,
    /// Microseconds from one seal of each front end's writer to the next under load
    /// (`--seal-interval-us`).
    #[serde(default)]
    pub kv_seal_interval_us: Option<u64>,
    /// Each front end's flow window in ops (`--flow-window-ops`).
    #[serde(default)]
    pub kv_flow_window_ops: Option<usize>,
    /// Each front end's flow window in records (`--flow-window-records`).
    #[serde(default)]
    pub kv_flow_window_records: Option<usize>,
    /// Whether every role serves its Prometheus metrics (`--metrics`), on a free port of its
    /// host's control address, listed in `dir/NAME/metrics.json` and printed at start.
    #[serde(default = "default_metrics")]
    pub metrics: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            dir: default_dir(),
            shared: default_shared(),
            operator: default_operator(),
            fabric: None,
            nats_creds: None,
            nats_tls_ca: None,
            nats_prefix: default_prefix(),
            epoch_ms: default_epoch_ms(),
            kv_memory_mb: default_memory_mb(),
            kv_writers: None,
            kv_flush_us: None,
            kv_seal_interval_us: None,
            kv_flow_window_ops: None,
            kv_flow_window_records: None,
            metrics: default_metrics(),
        }
    }
}

fn default_dir() -> PathBuf {
    "psl-cluster".into()
}
fn default_shared() -> PathBuf {
    "psl-cluster/shared".into()
}
fn default_operator() -> PathBuf {
    "psl-operator".into()
}
fn default_metrics() -> bool {
    true
}
fn default_prefix() -> String {
    psl_fabric::subject::SUBJECT_PREFIX_DEFAULT.into()
}
fn default_epoch_ms() -> u64 {
    100
}
fn default_memory_mb() -> u64 {
    64
}

/// `[ports]`: the port of each role (plus its id where a host may run several).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ports {
    pub router: u16,
    pub nats: u16,
    pub nats_cluster: u16,
    pub nats_leaf: u16,
    pub nats_monitor: u16,
    pub scheduler: u16,
    pub leader: u16,
    /// + capsule host id.
    pub capsule_host: u16,
    /// + coordinator host id.
    pub coordinator_host: u16,
    /// + worker id.
    pub worker_control: u16,
    /// + KV capsule server id.
    pub kv_server_read: u16,
    /// + coordinator rank.
    pub kv_coordinator_control: u16,
    pub capsuledb_control: u16,
    /// + front end id - 1.
    pub memcached: u16,
    /// + front end id.
    pub memcached_peer: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            router: 7400,
            nats: 4222,
            nats_cluster: 6222,
            nats_leaf: 7422,
            nats_monitor: 8222,
            scheduler: 7500,
            leader: 7501,
            capsule_host: 7600,
            coordinator_host: 7650,
            worker_control: 7700,
            kv_server_read: 7800,
            kv_coordinator_control: 7900,
            capsuledb_control: 7950,
            memcached: 11211,
            memcached_peer: 7960,
        }
    }
}

/// What NATS server a host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NatsRole {
    /// A member of the cluster: routes to every other `cluster` host; accepts leaf nodes.
    Cluster,
    /// A leaf node (an edge site): one outbound link to the cluster's leaf ports; this host's
    /// roles use it as their fabric, so local traffic stays local.
    Leaf,
}

/// `[[host]]`: one machine and the roles it runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: String,
    /// The address the other hosts reach this one at.
    pub address: IpAddr,
    /// Where its roles listen (default: `address`; `0.0.0.0` for every interface).
    pub bind: Option<IpAddr>,
    /// Where its KV coordinators' and CapsuleDB's control interfaces listen (default
    /// 127.0.0.1: reachable from this host only; the commands that matter need the
    /// operator's control key whatever the address).
    pub control_bind: Option<IpAddr>,
    /// This host's fabric, if not the cluster's (an edge site's own leaf node, say).
    pub fabric: Option<String>,
    pub nats: Option<NatsRole>,
    #[serde(default)]
    pub router: bool,
    #[serde(default)]
    pub scheduler: bool,
    #[serde(default)]
    pub leader: bool,
    #[serde(default)]
    pub capsule_hosts: Vec<u32>,
    /// Coordinator hosts (ids 0 ..= 2: host r runs each job's coordinator of rank r). None on
    /// any host: ids 0 and 1 go to the first two hosts with workers.
    #[serde(default)]
    pub coordinator_hosts: Vec<u32>,
    #[serde(default)]
    pub workers: Vec<u32>,
    #[serde(default)]
    pub kv_servers: Vec<u32>,
    #[serde(default)]
    pub kv_coordinators: Vec<u8>,
    #[serde(default)]
    pub capsuledb: bool,
    #[serde(default)]
    pub memcached: Vec<u32>,
}

/// CapsuleDB's node id in a cluster (its writer index is `id << 16 | 15`).
pub const CAPSULEDB_ID: u32 = 30_000;

impl Host {
    pub fn bind(&self) -> IpAddr {
        self.bind.unwrap_or(self.address)
    }
    fn at(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.address, port)
    }
    fn listen(&self, port: u16) -> String {
        SocketAddr::new(self.bind(), port).to_string()
    }
    fn control_bind(&self) -> IpAddr {
        self.control_bind.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
    }
    /// Where a control interface listens.
    fn control_listen(&self, port: u16) -> String {
        SocketAddr::new(self.control_bind(), port).to_string()
    }
    /// Where a control interface is reached: loopback (on this host only) by default.
    pub fn control_at(&self, port: u16) -> SocketAddr {
        match self.control_bind() {
            a if a.is_unspecified() => self.at(port),
            a => SocketAddr::new(a, port),
        }
    }
}

fn plus(base: u16, id: u32) -> Result<u16> {
    u16::try_from(base as u32 + id).ok().context("a port (base + id) is above 65535")
}

impl ClusterConfig {
    pub fn load(path: &Path) -> Result<ClusterConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let c: ClusterConfig = toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
        c.validate().with_context(|| format!("{}", path.display()))?;
        Ok(c)
    }

    /// Names unique, ids unique across hosts, every role that needs another one has it.
    pub fn validate(&self) -> Result<()> {
        if self.hosts.is_empty() {
            bail!("no [[host]]");
        }
        let mut names = BTreeSet::new();
        for h in &self.hosts {
            if !names.insert(&h.name) {
                bail!("host {:?} is named twice", h.name);
            }
        }
        let unique = |what: &str, ids: Vec<u32>| -> Result<()> {
            let mut seen = BTreeSet::new();
            for i in ids {
                if !seen.insert(i) {
                    bail!("{what} {i} is on two hosts (or twice on one)");
                }
            }
            Ok(())
        };
        unique("capsule host", self.hosts.iter().flat_map(|h| h.capsule_hosts.clone()).collect())?;
        unique("worker", self.hosts.iter().flat_map(|h| h.workers.clone()).collect())?;
        unique("coordinator host", self.hosts.iter().flat_map(|h| h.coordinator_hosts.clone()).collect())?;
        let cids: BTreeSet<u32> = self.hosts.iter().flat_map(|h| h.coordinator_hosts.clone()).collect();
        if !cids.is_empty() && (cids != (0..cids.len() as u32).collect() || cids.len() > 3) {
            bail!("coordinator host ids must be 0 .. n, n at most 3 (host r runs each job's coordinator of rank r)");
        }
        unique("kv server", self.hosts.iter().flat_map(|h| h.kv_servers.clone()).collect())?;
        unique(
            "kv coordinator rank",
            self.hosts.iter().flat_map(|h| h.kv_coordinators.iter().map(|r| *r as u32)).collect(),
        )?;
        unique("memcached front end", self.hosts.iter().flat_map(|h| h.memcached.clone()).collect())?;
        self.check_roles()?;
        self.check_fabric()
    }

    /// Every role that needs another one has it, at most one of each singleton role, ids in
    /// range.
    fn check_roles(&self) -> Result<()> {
        let count = |f: fn(&Host) -> bool| self.hosts.iter().filter(|h| f(h)).count();
        if count(|h| h.scheduler) > 1
            || count(|h| h.leader) > 1
            || count(|h| h.capsuledb) > 1
            || count(|h| h.router) > 1
        {
            bail!("at most one scheduler, one leader, one CapsuleDB and one router per cluster");
        }
        let workers = self.hosts.iter().any(|h| !h.workers.is_empty());
        if workers && (count(|h| h.scheduler) == 0 || count(|h| h.leader) == 0) {
            bail!("workers need a host with scheduler = true and one with leader = true");
        }
        if self.hosts.iter().any(|h| h.workers.iter().any(|w| *w == 0 || *w > 32767)) {
            bail!("worker ids are 1 ..= 32767");
        }
        if self.hosts.iter().any(|h| h.memcached.iter().any(|m| *m == 0 || *m > 255)) {
            bail!("memcached front end ids are 1 ..= 255");
        }
        let ids: Vec<u32> = self.hosts.iter().flat_map(|h| h.capsule_hosts.clone()).collect();
        if ids.iter().copied().collect::<BTreeSet<_>>() != (0..ids.len() as u32).collect() {
            bail!("capsule host ids must be 0 .. n (the leader opens every job on each, by id)");
        }
        let n = self.kv_servers();
        if n > 0 && (n.is_multiple_of(2) || self.kv_server_ids() != (0..n).collect::<Vec<_>>()) {
            bail!("kv servers must be an odd count 2f + 1 with ids 0 .. n");
        }
        let kv = self.has_kv();
        if kv && self.hosts.iter().all(|h| h.kv_coordinators.is_empty()) {
            bail!("the KV deployment needs a coordinator (kv_coordinators = [0] on some host)");
        }
        if kv && self.hosts.iter().any(needs_kv_secrets) && count(|h| h.leader) == 0 {
            bail!(
                "the KV deployment needs a leader (leader = true on some host): it holds the KV owner key and hands \
                 the front ends, KV coordinators and CapsuleDB their keys after attestation"
            );
        }
        Ok(())
    }

    /// Every host has a fabric, and a NATS leaf node has a cluster to join.
    fn check_fabric(&self) -> Result<()> {
        if self.fabric_spec(None).is_err() && self.hosts.iter().any(|h| h.fabric.is_none()) {
            bail!("no fabric: give [cluster] fabric, a host with nats = \"cluster\", or one with router = true");
        }
        for h in &self.hosts {
            self.fabric_spec(Some(h)).with_context(|| format!("host {}", h.name))?;
            if h.nats == Some(NatsRole::Leaf) && self.nats_hosts().is_empty() {
                bail!("host {} runs a NATS leaf node but no host has nats = \"cluster\"", h.name);
            }
        }
        Ok(())
    }

    pub fn host(&self, name: &str) -> Result<&Host> {
        self.hosts.iter().find(|h| h.name == name).with_context(|| {
            let names: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
            format!("no host {name:?} in the cluster file (hosts: {})", names.join(", "))
        })
    }

    fn nats_hosts(&self) -> Vec<&Host> {
        self.hosts.iter().filter(|h| h.nats == Some(NatsRole::Cluster)).collect()
    }

    fn kv_server_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.hosts.iter().flat_map(|h| h.kv_servers.clone()).collect();
        v.sort_unstable();
        v
    }

    pub fn kv_servers(&self) -> u32 {
        self.kv_server_ids().len() as u32
    }

    pub fn has_kv(&self) -> bool {
        self.hosts.iter().any(|h| {
            !h.kv_servers.is_empty() || !h.kv_coordinators.is_empty() || h.capsuledb || !h.memcached.is_empty()
        })
    }

    /// The fabric of `host` (its own `fabric`, its leaf node's, or the cluster's).
    pub fn fabric_spec(&self, host: Option<&Host>) -> Result<psl_fabric::FabricSpec> {
        let url: psl_fabric::FabricUrl = match (host.and_then(|h| h.fabric.as_deref()), host) {
            (Some(u), _) => u.parse()?,
            (None, Some(h)) if h.nats == Some(NatsRole::Leaf) => {
                psl_fabric::FabricUrl::Nats(vec![format!("nats://{}", h.at(self.ports.nats))])
            }
            _ => match &self.cluster.fabric {
                Some(u) => u.parse()?,
                None if !self.nats_hosts().is_empty() => psl_fabric::FabricUrl::Nats(
                    self.nats_hosts().iter().map(|h| format!("nats://{}", h.at(self.ports.nats))).collect(),
                ),
                None => match self.hosts.iter().find(|h| h.router) {
                    Some(r) => psl_fabric::FabricUrl::Router(r.at(self.ports.router).to_string()),
                    None => bail!("no fabric"),
                },
            },
        };
        let args = psl_fabric::FabricArgs {
            fabric: None,
            nats_creds: self.cluster.nats_creds.clone(),
            nats_tls_ca: self.cluster.nats_tls_ca.clone(),
            nats_prefix: self.cluster.nats_prefix.clone(),
        };
        args.spec_of(url)
    }

    pub fn scheduler(&self) -> Option<SocketAddr> {
        self.hosts.iter().find(|h| h.scheduler).map(|h| h.at(self.ports.scheduler))
    }
    pub fn leader(&self) -> Option<SocketAddr> {
        self.hosts.iter().find(|h| h.leader).map(|h| h.at(self.ports.leader))
    }
    /// Capsule hosts by id.
    pub fn capsule_hosts(&self) -> Vec<(u32, SocketAddr)> {
        let mut v: Vec<(u32, SocketAddr)> = self
            .hosts
            .iter()
            .flat_map(|h| h.capsule_hosts.iter().map(|id| (*id, h.at(self.ports.capsule_host + *id as u16))))
            .collect();
        v.sort();
        v
    }
    /// Coordinator hosts by id, with the index of the host each runs on: as listed, or (none
    /// listed) ids 0 and 1 on the first two hosts with workers (both on one if only one has).
    pub fn coordinator_hosts(&self) -> Vec<(u32, usize, SocketAddr)> {
        let at = |hi: usize, id: u32| (id, hi, self.hosts[hi].at(self.ports.coordinator_host + id as u16));
        let mut v: Vec<(u32, usize, SocketAddr)> = self
            .hosts
            .iter()
            .enumerate()
            .flat_map(|(hi, h)| h.coordinator_hosts.iter().map(move |id| at(hi, *id)))
            .collect();
        if v.is_empty() {
            let with_workers: Vec<usize> =
                self.hosts.iter().enumerate().filter(|(_, h)| !h.workers.is_empty()).map(|(i, _)| i).collect();
            if let Some(first) = with_workers.first() {
                v = vec![at(*first, 0), at(*with_workers.get(1).unwrap_or(first), 1)];
            }
        }
        v.sort();
        v
    }

    pub fn workers(&self) -> Vec<(u32, SocketAddr)> {
        self.hosts
            .iter()
            .flat_map(|h| h.workers.iter().map(|id| (*id, h.at(self.ports.worker_control.wrapping_add(*id as u16)))))
            .collect()
    }
    pub fn kv_server_reads(&self) -> Vec<(u32, SocketAddr)> {
        let mut v: Vec<(u32, SocketAddr)> = self
            .hosts
            .iter()
            .flat_map(|h| h.kv_servers.iter().map(|id| (*id, h.at(self.ports.kv_server_read + *id as u16))))
            .collect();
        v.sort();
        v
    }
    pub fn capsuledb(&self) -> Option<SocketAddr> {
        self.hosts.iter().find(|h| h.capsuledb).map(|h| h.control_at(self.ports.capsuledb_control))
    }
    /// Front ends by id: (id, memcached address, peer address).
    pub fn memcached(&self) -> Vec<(u32, SocketAddr, SocketAddr)> {
        let mut v: Vec<(u32, SocketAddr, SocketAddr)> = self
            .hosts
            .iter()
            .flat_map(|h| {
                h.memcached.iter().map(|id| {
                    (*id, h.at(self.ports.memcached + (*id as u16 - 1)), h.at(self.ports.memcached_peer + *id as u16))
                })
            })
            .collect();
        v.sort();
        v
    }
    /// NATS servers: (host, client address, monitoring address).
    pub fn nats_servers(&self) -> Vec<(String, SocketAddr, SocketAddr)> {
        self.hosts
            .iter()
            .filter(|h| h.nats.is_some())
            .map(|h| (h.name.clone(), h.at(self.ports.nats), h.at(self.ports.nats_monitor)))
            .collect()
    }
    pub fn router(&self) -> Option<SocketAddr> {
        self.hosts.iter().find(|h| h.router).map(|h| h.at(self.ports.router))
    }

    fn shared(&self, base: &Path) -> PathBuf {
        base.join(&self.cluster.shared)
    }
    /// The operator's private directory (`[cluster] operator`).
    pub fn operator_dir(&self, base: &Path) -> PathBuf {
        base.join(&self.cluster.operator)
    }
}

/// The shared files under `[cluster] shared`.
struct Shared {
    sim_key: PathBuf,
    /// The attestation policy the leader, the workers and `psl run --cluster` check reports
    /// against. `--init` writes a development policy that allows the INSECURE sim backend (in
    /// those words: `allow_insecure_sim = true`) for the sim key above and this build's
    /// measurement; replace it with a hardware policy (docs/security/attestation.md) to run
    /// attested.
    policy: PathBuf,
    /// Where clusters made before the owner key left the shared directory kept it: `--init`
    /// moves it to the operator's directory, and `psl up --host` refuses to start while it is
    /// there.
    legacy_kv_owner: PathBuf,
    /// The KV capsule's public metadata.
    kv_capsule: PathBuf,
    /// The shard map capsule (sealed under the KV application's data key; `psl shard show`).
    kv_map: PathBuf,
    /// The operator's control public key (the secret half stays in `[cluster] operator`).
    control_pub: PathBuf,
}

impl Shared {
    fn at(dir: &Path) -> Shared {
        Shared {
            sim_key: dir.join("sim-platform.key"),
            policy: dir.join("attest-policy.toml"),
            legacy_kv_owner: dir.join("kv-owner.key"),
            kv_capsule: dir.join("kv.capsule"),
            kv_map: dir.join("kv-map.capsule"),
            control_pub: dir.join("control.pub"),
        }
    }

    /// KV capsule server `id`'s certificate (public).
    fn kv_server_cert(&self, id: u32) -> PathBuf {
        self.kv_capsule.with_file_name(format!("kv-server{id}.cert"))
    }
}

/// KV capsule server `id`'s ack-signing key, in its own host's directory only (secret, 0600).
fn kv_ack_key_path(host_dir: &Path, id: u32) -> PathBuf {
    host_dir.join(format!("kv-server{id}.ack-key"))
}

/// The KV owner key's copy on the leader's host (`psl leader --kv-owner`), in that host's own
/// directory only (secret, 0600): the leader hands the front ends, KV coordinators and
/// CapsuleDB their keys after attestation. No other host gets one.
fn kv_host_owner_path(host_dir: &Path) -> PathBuf {
    host_dir.join("kv-owner.key")
}

/// The KV owner key in the operator's directory: the one kept copy.
fn kv_operator_owner_path(op: &Path) -> PathBuf {
    op.join("kv-owner.key")
}

/// Whether host `h` runs a KV role that needs the capsule's secrets (not a capsule server):
/// it gets them from the leader, after attestation.
fn needs_kv_secrets(h: &Host) -> bool {
    !h.memcached.is_empty() || !h.kv_coordinators.is_empty() || h.capsuledb
}

/// Whether host `h` holds the KV owner key: the leader's host, in a KV deployment.
fn holds_kv_owner(c: &ClusterConfig, h: &Host) -> bool {
    c.has_kv() && h.leader
}

fn psl_once(args: &[String]) -> Result<()> {
    let exe = std::env::current_exe().context("finding the psl binary")?;
    let o = Command::new(exe).args(args).stdin(std::process::Stdio::null()).output()?;
    if !o.status.success() {
        bail!("psl {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

/// `psl up --config F --init`: makes the shared files (once; existing ones are kept).
pub fn init(config: &Path) -> Result<i32> {
    let c = ClusterConfig::load(config)?;
    let base = config.parent().unwrap_or(Path::new("."));
    let dir = c.shared(base);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sh = Shared::at(&dir);
    make_sim_files(&sh)?;
    capsule_host_keys(&c, base, &dir)?;
    // The operator's own directory: the control key and the KV owner key, never shared.
    let op = c.operator_dir(base);
    create_private_dir(&op)?;
    let owner = kv_operator_owner_path(&op);
    move_legacy_owner(&sh, &owner)?;
    if c.has_kv() {
        make_kv_capsule(&c, base, &sh, &owner)?;
    }
    // The operator's control key: the secret in the operator's own directory, never in the
    // shared one; the hosts get the public half.
    let key = op.join("control.key");
    crate::util::write_control_keys(&key, &sh.control_pub)?;
    println!(
        "shared files in {} (copy this directory to every host; it holds no secret key but the sim platform's, \
         which only `--attest sim` uses)",
        dir.display()
    );
    println!("operator control key {} (keep it here: never copy it to a host)", key.display());
    if c.has_kv() {
        println!("KV owner key {} (keep it here: never copy it to a host)", owner.display());
    }
    Ok(0)
}

/// Makes the sim platform key and the development policy that allows it, where missing.
fn make_sim_files(sh: &Shared) -> Result<()> {
    if !sh.sim_key.exists() {
        let secret = psl_crypto::SigningKey::generate().expose_secret_bytes();
        let text = zeroize::Zeroizing::new(hex::encode(&secret[..]));
        crate::util::write_atomic(&sh.sim_key, text.as_bytes(), 0o600)?;
    }
    if !sh.policy.exists() {
        let platform = sim_platform(sh)?;
        let text = psl_faas::attest_policy::dev_sim_policy_text(
            &hex::encode(platform.public().to_bytes()),
            &[crate::attest::measurement(None)?],
            true,
        );
        crate::util::write_atomic(&sh.policy, text.as_bytes(), 0o644)?;
    }
    Ok(())
}

/// Makes the operator's directory `op` (mode 0700).
fn create_private_dir(op: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(op)
        .with_context(|| format!("creating {}", op.display()))?;
    Ok(())
}

/// A cluster made when the owner key was shared: the operator keeps it from now on. Moves it
/// to `owner` (or removes the shared copy of the same key) and warns about the hosts' copies.
fn move_legacy_owner(sh: &Shared, owner: &Path) -> Result<()> {
    if sh.legacy_kv_owner.exists() {
        if owner.exists() {
            if std::fs::read(owner)? != std::fs::read(&sh.legacy_kv_owner)? {
                bail!(
                    "{} and {} are different owner keys: keep the one the KV capsule {} names and delete the other",
                    sh.legacy_kv_owner.display(),
                    owner.display(),
                    sh.kv_capsule.display()
                );
            }
            std::fs::remove_file(&sh.legacy_kv_owner)?;
        } else {
            std::fs::rename(&sh.legacy_kv_owner, owner)
                .with_context(|| format!("moving {} to {}", sh.legacy_kv_owner.display(), owner.display()))?;
        }
        eprintln!(
            "warning: moved the KV owner key out of the shared directory to {}; delete every copy of {} on the hosts",
            owner.display(),
            sh.legacy_kv_owner.display()
        );
    }
    Ok(())
}

/// `--init`, KV: the owner key `owner` and the KV capsule (once), and the KV hosts' keys.
fn make_kv_capsule(c: &ClusterConfig, base: &Path, sh: &Shared, owner: &Path) -> Result<()> {
    let s = path_arg;
    if !owner.exists() {
        psl_once(&["keys".into(), "new".into(), "--out".into(), s(owner)])?;
    }
    if !sh.kv_capsule.exists() {
        psl_once(&[
            "capsule".into(),
            "new".into(),
            "--owner".into(),
            s(owner),
            "--label".into(),
            "psl-cluster-kv".into(),
            "--out".into(),
            s(&sh.kv_capsule),
        ])?;
    }
    kv_host_keys(c, base, sh, owner)?;
    kv_shard_map(c, sh, owner)
}

/// `--init`, KV: the shard map capsule (once) and, when the front ends' peer addresses
/// changed, a new map: one shard, the KV capsule, served by every front end of the file.
fn kv_shard_map(c: &ClusterConfig, sh: &Shared, owner_path: &Path) -> Result<()> {
    let owner = crate::util::read_owner_key(owner_path)?;
    let kv = crate::roles::read_metadata(&sh.kv_capsule)?;
    crate::shard::create(&owner, &kv, &sh.kv_map)?;
    let peers = c.memcached().iter().map(|m| m.2.to_string()).collect();
    let map = psl_scl::shard::ShardMap::single(0, kv.name().0 .0, peers);
    let (now, written) = crate::shard::publish(&sh.kv_map, &owner, &kv.name(), map)?;
    if written {
        println!("KV shard map version {} in {}", now.map.map_version, sh.kv_map.display());
    }
    Ok(())
}

/// `--init`, KV: each capsule server's own ack key (in its host's directory, 0600: copied to
/// that host only) and its certificate (public, in the shared directory); and a copy of the
/// owner key in the leader's host's directory (0600), for `psl leader --kv-owner`, which hands
/// the front ends, KV coordinators and CapsuleDB their keys after attestation. Any other
/// host's copy (made before the leader handed out KV keys) is removed. Files that exist are
/// kept; a server key whose certificate is shared but whose key is not here (moved to its
/// host) is not made again.
fn kv_host_keys(c: &ClusterConfig, base: &Path, sh: &Shared, owner_path: &Path) -> Result<()> {
    let owner = crate::util::read_owner_key(owner_path)?;
    let meta = crate::roles::read_metadata(&sh.kv_capsule)?;
    if owner.public() != meta.meta.owner {
        bail!("{} is not the owner key of the KV capsule {}", owner_path.display(), sh.kv_capsule.display());
    }
    let app = owner.app(meta.meta.app_index)?;
    let certified = meta.meta.policy.writer_keys == psl_capsule::WriterKeys::Certified;
    for h in &c.hosts {
        let host_dir = base.join(&c.cluster.dir).join(&h.name);
        for id in &h.kv_servers {
            let (key, cert) = (kv_ack_key_path(&host_dir, *id), sh.kv_server_cert(*id));
            if key.exists() || (certified && cert.exists()) {
                if key.exists() && certified && !cert.exists() {
                    crate::roles::write_server_credentials(&meta, &app, *id, &key, &cert)?;
                }
                continue;
            }
            std::fs::create_dir_all(&host_dir).with_context(|| format!("creating {}", host_dir.display()))?;
            crate::roles::write_server_credentials(&meta, &app, *id, &key, &cert)?;
            println!("kv capsule server {id}'s ack key {} (copy it to host {} only)", key.display(), h.name);
        }
        let copy = kv_host_owner_path(&host_dir);
        if holds_kv_owner(c, h) {
            if !copy.exists() {
                std::fs::create_dir_all(&host_dir).with_context(|| format!("creating {}", host_dir.display()))?;
                crate::util::write_atomic(&copy, owner.to_file_string().as_bytes(), 0o600)?;
                println!(
                    "KV owner key for host {}'s leader {} (copy it to host {} only: the leader hands the KV \
                     roles their keys after attestation)",
                    h.name,
                    copy.display(),
                    h.name
                );
            }
        } else if copy.exists() {
            std::fs::remove_file(&copy).with_context(|| format!("removing {}", copy.display()))?;
            eprintln!(
                "warning: removed {}: the leader hands host {}'s KV roles their keys now; delete every copy of it on \
                 host {}",
                copy.display(),
                h.name,
                h.name
            );
        }
    }
    Ok(())
}

/// Capsule host `id`'s TLS key pin (public: the hash of its key), in the shared directory.
fn tls_pin_path(shared: &Path, id: u32) -> PathBuf {
    shared.join(format!("capsule-host{id}.tls-pin"))
}

/// Capsule host `id`'s TLS private key, in its own host's directory only.
fn tls_key_path(host_dir: &Path, id: u32) -> PathBuf {
    host_dir.join(format!("capsule-host{id}.tls-key"))
}

/// `--init`: each capsule host's TLS key (in its host's directory, `[cluster] dir/NAME/`, mode
/// 0600: copied to that host only) and the pin the leader checks it by (in the shared
/// directory). A key that exists is kept and its pin rewritten from it; a pin whose key is not
/// here (made earlier, and moved to its host) is kept.
fn capsule_host_keys(c: &ClusterConfig, base: &Path, shared: &Path) -> Result<()> {
    use psl_faas::tls::TlsIdentity;
    for h in &c.hosts {
        let host_dir = base.join(&c.cluster.dir).join(&h.name);
        for id in &h.capsule_hosts {
            let (key, pin) = (tls_key_path(&host_dir, *id), tls_pin_path(shared, *id));
            let me = if key.exists() {
                TlsIdentity::load(&key, "psl-capsule-host")?
            } else if pin.exists() {
                continue;
            } else {
                std::fs::create_dir_all(&host_dir).with_context(|| format!("creating {}", host_dir.display()))?;
                let me = TlsIdentity::generate("psl-capsule-host")?;
                crate::util::write_atomic(&key, me.key_pem().as_bytes(), 0o600)?;
                println!("capsule host {id}'s TLS key {} (copy it to host {} only)", key.display(), h.name);
                me
            };
            let want = format!("{}\n", hex::encode(me.spki_hash()));
            if std::fs::read_to_string(&pin).ok().as_deref() != Some(want.as_str()) {
                crate::util::write_atomic(&pin, want.as_bytes(), 0o644)?;
            }
        }
    }
    Ok(())
}

/// The shared sim platform (its key is in the shared directory).
fn sim_platform(sh: &Shared) -> Result<std::sync::Arc<psl_faas::SimPlatform>> {
    let secret = zeroize::Zeroizing::new(
        std::fs::read_to_string(&sh.sim_key).with_context(|| format!("reading {}", sh.sim_key.display()))?,
    );
    let mut b = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(secret.trim(), &mut b[..]).context("the sim platform key is not 64 hex characters")?;
    Ok(psl_faas::SimPlatform::from_secret(&b)?)
}

/// The cluster file `psl run --cluster` and `psl memcached --cluster` read.
fn cluster_file(c: &ClusterConfig, sh: &Shared, kv_dir: &Path) -> Result<serde_json::Value> {
    let policy = std::fs::canonicalize(&sh.policy).with_context(|| format!("the policy {}", sh.policy.display()))?;
    let mut v = serde_json::json!({
        "scheduler": c.scheduler().map(|a| a.to_string()),
        "leader": c.leader().map(|a| a.to_string()),
        "fabric": c.fabric_spec(None).ok(),
        "attestation_backend": psl_faas::attest::SIM_BACKEND,
        "attest_policy": policy,
        "workers": c.workers().iter().map(|(id, a)| serde_json::json!({"id": id, "control": a.to_string()})).collect::<Vec<_>>(),
        "capsule_hosts": c.capsule_hosts().iter().map(|(id, a)| serde_json::json!([id, a.to_string(), ""])).collect::<Vec<_>>(),
        "coordinator_hosts": c.coordinator_hosts().iter().map(|(id, _, a)| serde_json::json!([id, a.to_string()])).collect::<Vec<_>>(),
    });
    if c.has_kv() {
        let mc = c.memcached();
        v["kv"] = serde_json::json!({
            "fabric": c.fabric_spec(None).ok(),
            "capsule": sh.kv_capsule,
            "map": sh.kv_map.exists().then_some(&sh.kv_map),
            // A front end joining on this host gets its keys from the leader, attested.
            "leader": c.leader().map(|a| serde_json::json!({
                "addr": a.to_string(),
                "attest_policy": policy,
                "sim_platform_key": std::fs::canonicalize(&sh.sim_key).ok(),
            })),
            "capsuledb_writer": psl_scl::writer_index(CAPSULEDB_ID, 0, 15),
            "peers": mc.iter().map(|m| m.2.to_string()).collect::<Vec<_>>(),
            "front_ends": mc.iter().map(|m| m.1.to_string()).collect::<Vec<_>>(),
            "servers": c.kv_server_ids().iter().map(|id| serde_json::json!([id, kv_dir.join(format!("server{id}"))])).collect::<Vec<_>>(),
            "state": kv_dir.join("joined"),
            // The front ends run with psl memcached's default lease: failover from three on.
            "home_lease_ms": if mc.len() >= psl_memcached::failover::MEMBERS_MIN {
                psl_memcached::failover::HOME_LEASE_MS_DEFAULT
            } else {
                0
            },
        });
    }
    Ok(v)
}

/// Waits until `addr` accepts a TCP connection (a role on another host is up).
fn wait_tcp(what: &str, addr: SocketAddr, deadline: Instant) -> Result<()> {
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err() {
        if Instant::now() >= deadline || STOP.load(std::sync::atomic::Ordering::SeqCst) {
            bail!("{what} at {addr} is not reachable");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waits until one server of `spec`'s fabric answers.
fn wait_fabric(spec: &psl_fabric::FabricSpec, deadline: Instant) -> Result<()> {
    let addrs: Vec<SocketAddr> = match &spec.url {
        psl_fabric::FabricUrl::Router(hp) => hp.parse().into_iter().collect(),
        psl_fabric::FabricUrl::Nats(v) => {
            v.iter().filter_map(|u| u.split_once("://").and_then(|(_, hp)| hp.parse().ok())).collect()
        }
    };
    loop {
        if addrs.iter().any(|a| std::net::TcpStream::connect_timeout(a, Duration::from_millis(300)).is_ok()) {
            return Ok(());
        }
        if Instant::now() >= deadline || STOP.load(std::sync::atomic::Ordering::SeqCst) {
            bail!("no server of the fabric {spec} is reachable");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `psl up --config F --host NAME`: starts NAME's roles, waits (bounded) for the roles of
/// other hosts each depends on, writes `DIR/cluster.json`, and runs until Ctrl-C or SIGTERM.
/// A role that exits is reported and left down (the cluster carries on without it; its
/// replacements are the operator's call); the exit code is then 1.
pub fn up_host(config: &Path, name: &str) -> Result<i32> {
    let c = ClusterConfig::load(config)?;
    let h = c.host(name)?.clone();
    let base = config.parent().unwrap_or(Path::new("."));
    let dir = base.join(&c.cluster.dir).join(&h.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sh = Shared::at(&c.shared(base));
    check_shared_files(&c, &sh, config, base)?;
    check_host_keys(&c, &h, config, &dir)?;
    crate::kids::catch_signals();
    if c.cluster.metrics {
        crate::kids::serve_metrics_on(h.control_bind());
    }
    let up = HostUp::new(config, base, c, h, dir, sh)?;
    let mut kids: Vec<Kid> = Vec::new();
    if let Err(e) = up.start_roles(&mut kids) {
        stop_all(&mut kids);
        return Err(e);
    }
    up.print_roles(&kids)?;
    write_metrics_list(&up.dir)?;
    let code = supervise_host(&up.h.name, &mut kids);
    eprintln!("host {}: stopping {} processes", up.h.name, kids.len());
    stop_all(&mut kids);
    Ok(code)
}

/// Writes `dir/metrics.json` (each role's scrape URL by name) and prints a `metrics NAME URL`
/// line per role, when the roles serve metrics.
fn write_metrics_list(dir: &Path) -> Result<()> {
    let urls = crate::kids::metrics_urls();
    if urls.is_empty() {
        return Ok(());
    }
    for (name, url) in &urls {
        println!("metrics {name} {url}");
    }
    crate::util::write_atomic(&dir.join("metrics.json"), serde_json::to_string_pretty(&urls)?.as_bytes(), 0o644)?;
    use std::io::Write;
    std::io::stdout().flush()?;
    Ok(())
}

/// Fails unless the shared files `--init` makes are here, and the KV owner key is not.
fn check_shared_files(c: &ClusterConfig, sh: &Shared, config: &Path, base: &Path) -> Result<()> {
    if !sh.sim_key.exists()
        || !sh.policy.exists()
        || (c.has_kv() && (!sh.kv_capsule.exists() || !sh.control_pub.exists()))
    {
        bail!(
            "the shared files are missing from {}: run `psl up --config {} --init` once and copy them to every host",
            c.shared(base).display(),
            config.display()
        );
    }
    if sh.legacy_kv_owner.exists() {
        bail!(
            "{} is the KV owner key in the shared directory, which every host gets: run `psl up --config {} --init` \
             on the operator's machine (it moves the key to the operator's directory) and delete every copy of it \
             on the hosts",
            sh.legacy_kv_owner.display(),
            config.display()
        );
    }
    Ok(())
}

/// Fails unless host `h`'s own secret files from `--init` (copied from `[cluster] dir/NAME/`)
/// are in `dir`, or if it holds a KV owner key it should not.
fn check_host_keys(c: &ClusterConfig, h: &Host, config: &Path, dir: &Path) -> Result<()> {
    let missing = |p: &Path, what: &str| -> Result<()> {
        if !p.exists() {
            bail!(
                "{what} has no key file {}: run `psl up --config {} --init` and copy {} to this host",
                p.display(),
                config.display(),
                dir.display()
            );
        }
        Ok(())
    };
    for id in &h.kv_servers {
        missing(&kv_ack_key_path(dir, *id), &format!("kv capsule server {id}"))?;
    }
    let host_owner = kv_host_owner_path(dir);
    if holds_kv_owner(c, h) {
        missing(&host_owner, "this host's leader (it hands the KV roles their keys)")?;
    } else if host_owner.exists() {
        bail!(
            "{} is a copy of the KV owner key on host {}, which does not run the leader: the leader hands the \
             KV roles their keys now; delete it (`psl up --config {} --init` removes it from the operator's copy)",
            host_owner.display(),
            h.name,
            config.display()
        );
    }
    Ok(())
}

/// A path as a command-line argument.
fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

/// A started role: its name, its output, and the start of the line that says it is up.
type Pending = (String, std::sync::mpsc::Receiver<String>, &'static str);

/// Waits for each started role's line in `ready`.
fn wait_ready(ready: Vec<Pending>, deadline: Instant) -> Result<()> {
    for (what, rx, prefix) in ready {
        wait_line(&what, &rx, prefix, deadline)?;
    }
    Ok(())
}

/// One host's part of the cluster, as `up_host` starts it.
struct HostUp<'a> {
    /// The cluster file (named in error messages) and its directory.
    config: &'a Path,
    base: &'a Path,
    c: ClusterConfig,
    h: Host,
    /// This host's state directory.
    dir: PathBuf,
    sh: Shared,
    fabric: psl_fabric::FabricSpec,
    /// The fabric's flags, for every role.
    ff: Vec<String>,
    /// The attestation policy (absolute).
    policy: String,
    /// What every attested role is given.
    attest: Vec<String>,
    deadline: Instant,
}

impl<'a> HostUp<'a> {
    /// Host `h`'s fabric and attestation flags, and the deadline of its roles' starts (warns
    /// on stderr that the sim backend is INSECURE).
    fn new(config: &'a Path, base: &'a Path, c: ClusterConfig, h: Host, dir: PathBuf, sh: Shared) -> Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let fabric = c.fabric_spec(Some(&h))?;
        let ff = fabric_flags(&fabric);
        let policy = path_arg(&std::fs::canonicalize(&sh.policy)?);
        // What every attested role is given: the sim backend (INSECURE; the shared policy must
        // say allow_insecure_sim = true for the leader and workers to accept it) with the
        // shared key.
        let attest: Vec<String> =
            vec!["--attest".into(), "sim".into(), "--sim-platform-key".into(), path_arg(&sh.sim_key)];
        crate::attest::warn_sim_once(&format!(
            "WARNING: attestation backend 'sim' is INSECURE (development only); the policy {policy} decides what \
             the leader and the workers accept"
        ));
        Ok(HostUp { config, base, c, h, dir, sh, fabric, ff, policy, attest, deadline })
    }

    /// The KV roles' directory on this host.
    fn kv_dir(&self) -> PathBuf {
        self.dir.join("kv")
    }

    /// Starts this host's roles in dependency order, each waited for, then writes
    /// `DIR/cluster.json`.
    fn start_roles(&self, kids: &mut Vec<Kid>) -> Result<()> {
        if let Some(role) = self.h.nats {
            self.start_nats(role, kids)?;
        }
        if self.h.router {
            self.start_router(kids)?;
        }
        wait_fabric(&self.fabric, self.deadline)?;
        // The leader first: the KV roles that need secrets get them from it.
        if self.h.leader {
            self.start_leader(kids)?;
        }
        self.start_kv_roles(kids)?;
        if self.h.scheduler {
            let a = vec!["scheduler".to_string(), "--listen".into(), self.h.listen(self.c.ports.scheduler)];
            let (k, rx) = spawn("scheduler", &a)?;
            kids.push(k);
            wait_line("scheduler", &rx, "scheduler ", self.deadline)?;
        }
        self.start_capsule_hosts(kids)?;
        self.start_coordinator_hosts(kids)?;
        let mut ready = Vec::new();
        self.spawn_workers(kids, &mut ready)?;
        self.spawn_memcached(kids, &mut ready)?;
        wait_ready(ready, self.deadline)?;
        let file = cluster_file(&self.c, &self.sh, &self.kv_dir())?;
        crate::util::write_atomic(
            &self.dir.join("cluster.json"),
            serde_json::to_string_pretty(&file)?.as_bytes(),
            0o644,
        )?;
        Ok(())
    }

    /// Starts this host's nats-server (a cluster member or a leaf node) and waits until it
    /// accepts connections.
    fn start_nats(&self, role: NatsRole, kids: &mut Vec<Kid>) -> Result<()> {
        let (c, h) = (&self.c, &self.h);
        let mut o = psl_fabric::natsd::NatsServerOptions::new(
            &h.name,
            SocketAddr::new(h.bind(), c.ports.nats),
            &self.dir.join("nats"),
        );
        o.client_advertise = Some(h.at(c.ports.nats).to_string());
        o.monitor = Some(SocketAddr::new(h.bind(), c.ports.nats_monitor));
        match role {
            NatsRole::Cluster => {
                o.cluster_listen = Some(SocketAddr::new(h.bind(), c.ports.nats_cluster));
                o.cluster_advertise = Some(h.at(c.ports.nats_cluster).to_string());
                o.routes = c
                    .nats_hosts()
                    .iter()
                    .filter(|x| x.name != h.name)
                    .map(|x| format!("nats-route://{}", x.at(c.ports.nats_cluster)))
                    .collect();
                o.leaf_listen = Some(SocketAddr::new(h.bind(), c.ports.nats_leaf));
            }
            NatsRole::Leaf => {
                o.leaf_remotes =
                    c.nats_hosts().iter().map(|x| format!("nats-leaf://{}", x.at(c.ports.nats_leaf))).collect();
            }
        }
        let (k, _) = spawn_cmd("nats-server", o.command()?).context("starting nats-server")?;
        kids.push(k);
        wait_tcp("this host's nats-server", h.at(c.ports.nats), self.deadline)
    }

    /// Starts this host's router and waits until it listens.
    fn start_router(&self, kids: &mut Vec<Kid>) -> Result<()> {
        let h = &self.h;
        let args = vec![
            "router".to_string(),
            "--listen".into(),
            h.listen(self.c.ports.router),
            "--advertise".into(),
            h.address.to_string(),
        ];
        let (k, rx) = spawn("router", &args)?;
        kids.push(k);
        wait_line("router", &rx, "listening ", self.deadline)?;
        Ok(())
    }

    /// Starts the leader (with the capsule hosts' pins, and the KV owner key in a KV
    /// deployment) and waits until it listens.
    fn start_leader(&self, kids: &mut Vec<Kid>) -> Result<()> {
        let c = &self.c;
        let mut a = vec!["leader".to_string(), "--listen".into(), self.h.listen(c.ports.leader)];
        a.extend(self.ff.clone());
        for (id, addr) in c.capsule_hosts() {
            a.extend(["--capsule-host".into(), addr.to_string()]);
            // Its pinned TLS key: nobody else at its address gets its key.
            if let Ok(pin) = std::fs::read_to_string(tls_pin_path(&c.shared(self.base), id)) {
                a.extend(["--capsule-host-pin".into(), format!("{id}={}", pin.trim())]);
            }
        }
        for (_, _, addr) in c.coordinator_hosts() {
            a.extend(["--coordinator-host".into(), addr.to_string()]);
        }
        if holds_kv_owner(c, &self.h) {
            // This host holds the KV owner key; the leader keeps the capsule's application
            // key and hands it to the attested KV roles.
            a.extend([
                "--kv-owner".into(),
                path_arg(&kv_host_owner_path(&self.dir)),
                "--kv-capsule".into(),
                path_arg(&self.sh.kv_capsule),
            ]);
        }
        a.extend(self.attest.clone());
        a.extend(["--attest-policy".into(), self.policy.clone()]);
        let (k, rx) = spawn("leader", &a)?;
        kids.push(k);
        wait_line("leader", &rx, "leader ", self.deadline)?;
        Ok(())
    }

    /// The arguments of KV role `role` (not a capsule server) before its own: it gets the
    /// capsule's secrets from the leader.
    fn kv_common(&self, role: &str) -> Vec<String> {
        let mut v = vec![role.into(), "--capsule".into(), path_arg(&self.sh.kv_capsule)];
        if let Some(l) = self.c.leader() {
            v.extend(["--kv-leader".into(), l.to_string(), "--kv-attest-policy".into(), self.policy.clone()]);
            v.extend(self.attest.clone());
        }
        v.extend(self.ff.clone());
        v
    }

    /// Starts this host's KV capsule servers, then its KV coordinators and CapsuleDB, each
    /// group waited for.
    fn start_kv_roles(&self, kids: &mut Vec<Kid>) -> Result<()> {
        let h = &self.h;
        // The KV roles that need the capsule's secrets (front ends, coordinators, CapsuleDB)
        // attest to the leader, which seals them the keys (kept in memory only); a capsule
        // server gets only its own ack key.
        if needs_kv_secrets(h) {
            let l = self.c.leader().context("the KV deployment has no leader")?;
            wait_tcp("the leader", l, self.deadline)?;
        }
        wait_ready(self.spawn_kv_servers(kids)?, self.deadline)?;
        let reads = self.c.kv_server_reads();
        if !h.kv_coordinators.is_empty() || h.capsuledb {
            // A restarting coordinator or CapsuleDB learns back from the servers: wait for them.
            for (id, addr) in &reads {
                wait_tcp(&format!("kv capsule server {id}"), *addr, self.deadline)?;
            }
        }
        let mut ready = self.spawn_kv_coordinators(kids)?;
        if h.capsuledb {
            ready.push(self.spawn_capsuledb(&reads, kids)?);
        }
        wait_ready(ready, self.deadline)
    }

    /// Starts this host's KV capsule servers, each with its own ack key.
    fn spawn_kv_servers(&self, kids: &mut Vec<Kid>) -> Result<Vec<Pending>> {
        let (c, s) = (&self.c, path_arg);
        let mut ready = Vec::new();
        for id in &self.h.kv_servers {
            let mut a = vec!["capsule-server".to_string(), "--capsule".into(), s(&self.sh.kv_capsule)];
            a.extend(["--ack-key".into(), s(&kv_ack_key_path(&self.dir, *id))]);
            let cert = self.sh.kv_server_cert(*id);
            if cert.exists() {
                a.extend(["--cert".into(), s(&cert)]);
            }
            a.extend(self.ff.clone());
            a.extend([
                "--dir".into(),
                s(&self.kv_dir().join(format!("server{id}"))),
                "--id".into(),
                id.to_string(),
                "--n".into(),
                c.kv_servers().to_string(),
                "--read".into(),
                self.h.listen(plus(c.ports.kv_server_read, *id)?),
            ]);
            let (k, rx) = spawn(&format!("kv capsule server {id}"), &a)?;
            kids.push(k);
            ready.push((format!("kv capsule server {id}"), rx, "ready "));
        }
        Ok(ready)
    }

    /// Starts this host's KV coordinators.
    fn spawn_kv_coordinators(&self, kids: &mut Vec<Kid>) -> Result<Vec<Pending>> {
        let (c, s) = (&self.c, path_arg);
        let mut ready = Vec::new();
        for rank in &self.h.kv_coordinators {
            let mut a = self.kv_common("coordinator");
            a.extend([
                "--rank".into(),
                rank.to_string(),
                "--epoch-ms".into(),
                c.cluster.epoch_ms.to_string(),
                "--control".into(),
                self.h.control_listen(plus(c.ports.kv_coordinator_control, *rank as u32)?),
                "--control-pub".into(),
                s(&self.sh.control_pub),
                "--state".into(),
                s(&self.kv_dir().join(format!("coordinator{rank}"))),
            ]);
            let (k, rx) = spawn(&format!("kv coordinator {rank}"), &a)?;
            kids.push(k);
            ready.push((format!("kv coordinator {rank}"), rx, "control "));
        }
        Ok(ready)
    }

    /// Starts CapsuleDB, which reads back from the capsule servers' read interfaces `reads`.
    fn spawn_capsuledb(&self, reads: &[(u32, SocketAddr)], kids: &mut Vec<Kid>) -> Result<Pending> {
        let mut a = self.kv_common("capsuledb");
        a.extend([
            "--id".into(),
            CAPSULEDB_ID.to_string(),
            "--store".into(),
            path_arg(&self.kv_dir().join("capsuledb")),
            "--control".into(),
            self.h.control_listen(self.c.ports.capsuledb_control),
            "--control-pub".into(),
            path_arg(&self.sh.control_pub),
        ]);
        if !reads.is_empty() {
            a.extend(["--servers".into(), reads.iter().map(|(_, r)| r.to_string()).collect::<Vec<_>>().join(",")]);
        }
        let (k, rx) = spawn("kv capsuledb", &a)?;
        kids.push(k);
        Ok(("kv capsuledb".into(), rx, "ready "))
    }

    /// Starts this host's capsule hosts, each with the TLS key the leader pins, one by one.
    fn start_capsule_hosts(&self, kids: &mut Vec<Kid>) -> Result<()> {
        for id in &self.h.capsule_hosts {
            let mut a = vec![
                "capsule-host".to_string(),
                "--id".into(),
                id.to_string(),
                "--dir".into(),
                path_arg(&self.dir.join(format!("capsule-host{id}"))),
                "--listen".into(),
                self.h.listen(plus(self.c.ports.capsule_host, *id)?),
            ];
            // The key the leader pins for this host.
            let key = tls_key_path(&self.dir, *id);
            if !key.exists() {
                bail!(
                    "capsule host {id} has no TLS key {}: run `psl up --config {} --init` and copy {} to this host",
                    key.display(),
                    self.config.display(),
                    self.dir.display()
                );
            }
            a.extend(["--tls-key".into(), path_arg(&key)]);
            a.extend(self.ff.clone());
            a.extend(self.attest.clone());
            let (k, rx) = spawn(&format!("capsule host {id}"), &a)?;
            kids.push(k);
            wait_line(&format!("capsule host {id}"), &rx, &format!("capsule-host {id} "), self.deadline)?;
        }
        Ok(())
    }

    /// Starts the coordinator hosts the file places on this host, one by one.
    fn start_coordinator_hosts(&self, kids: &mut Vec<Kid>) -> Result<()> {
        let c = &self.c;
        let me = c.hosts.iter().position(|x| x.name == self.h.name).context("this host is not in the cluster")?;
        for (id, _, _) in c.coordinator_hosts().into_iter().filter(|(_, hi, _)| *hi == me) {
            let mut a = vec![
                "coordinator-host".to_string(),
                "--id".into(),
                id.to_string(),
                "--dir".into(),
                path_arg(&self.dir.join(format!("coordinator-host{id}"))),
                "--listen".into(),
                self.h.listen(plus(c.ports.coordinator_host, id)?),
            ];
            a.extend(self.ff.clone());
            a.extend(self.attest.clone());
            let (k, rx) = spawn(&format!("coordinator host {id}"), &a)?;
            kids.push(k);
            wait_line(&format!("coordinator host {id}"), &rx, &format!("coordinator-host {id} "), self.deadline)?;
        }
        Ok(())
    }

    /// Starts this host's workers once the scheduler and the leader answer; adds them to
    /// `ready`.
    fn spawn_workers(&self, kids: &mut Vec<Kid>, ready: &mut Vec<Pending>) -> Result<()> {
        let (c, h) = (&self.c, &self.h);
        if h.workers.is_empty() {
            return Ok(());
        }
        let (sched, lead) = (c.scheduler().context("no scheduler")?, c.leader().context("no leader")?);
        wait_tcp("the scheduler", sched, self.deadline)?;
        wait_tcp("the leader", lead, self.deadline)?;
        for id in &h.workers {
            let port = c.ports.worker_control.wrapping_add(*id as u16);
            let mut a = vec![
                "worker".to_string(),
                "--id".into(),
                id.to_string(),
                "--scheduler".into(),
                sched.to_string(),
                "--leader".into(),
                lead.to_string(),
                "--control".into(),
                h.listen(port),
                "--advertise-control".into(),
                h.at(port).to_string(),
                "--attest-policy".into(),
                self.policy.clone(),
            ];
            a.extend(self.attest.clone());
            a.extend(self.ff.clone());
            let (k, rx) = spawn(&format!("worker {id}"), &a)?;
            kids.push(k);
            ready.push((format!("worker {id}"), rx, "worker "));
        }
        Ok(())
    }

    /// Starts this host's memcached front ends (one peer group with the other hosts'); adds
    /// them to `ready`.
    fn spawn_memcached(&self, kids: &mut Vec<Kid>, ready: &mut Vec<Pending>) -> Result<()> {
        let mc = self.c.memcached();
        let peers = mc.iter().map(|m| m.2.to_string()).collect::<Vec<_>>().join(",");
        for id in &self.h.memcached {
            let mine = mc.iter().find(|m| m.0 == *id).context("front end")?;
            let a = self.memcached_args(mine, &peers)?;
            let (k, rx) = spawn(&format!("memcached {id}"), &a)?;
            kids.push(k);
            ready.push((format!("memcached {id}"), rx, "listening "));
        }
        Ok(())
    }

    /// The arguments of front end `mine` (id, memcached address, peer address) in the group
    /// `peers`.
    fn memcached_args(&self, mine: &(u32, SocketAddr, SocketAddr), peers: &str) -> Result<Vec<String>> {
        let (c, h, id) = (&self.c, &self.h, mine.0);
        let mut a = self.kv_common("memcached");
        a.extend([
            "--listen".into(),
            h.listen(mine.1.port()),
            "--id".into(),
            id.to_string(),
            "--state".into(),
            path_arg(&self.kv_dir().join(format!("memcached{id}"))),
            "--memory-mb".into(),
            c.cluster.kv_memory_mb.to_string(),
            "--peer-listen".into(),
            h.listen(mine.2.port()),
            "--peer-advertise".into(),
            mine.2.to_string(),
            "--peers".into(),
            peers.to_string(),
        ]);
        if c.capsuledb().is_some() {
            let w = psl_scl::writer_index(CAPSULEDB_ID, 0, 15).context("CapsuleDB's writer index")?;
            a.extend(["--capsuledb-writer".into(), w.to_string()]);
        }
        if c.kv_servers() > 0 {
            // The capsule servers' acks pace the front end's writers (flow control).
            a.extend(["--servers".into(), c.kv_servers().to_string()]);
        }
        let set = &c.cluster;
        #[rustfmt::skip]
        let tuning = [
            ("--writers", set.kv_writers.map(|v| v.to_string())),
            ("--flush-us", set.kv_flush_us.map(|v| v.to_string())),
            ("--seal-interval-us", set.kv_seal_interval_us.map(|v| v.to_string())),
            ("--flow-window-ops", set.kv_flow_window_ops.map(|v| v.to_string())),
            ("--flow-window-records", set.kv_flow_window_records.map(|v| v.to_string())),
        ];
        for (flag, v) in tuning {
            if let Some(v) = v {
                a.extend([flag.to_string(), v]);
            }
        }
        Ok(a)
    }

    /// Prints the fabric, each role's pid, the cluster file and the `up NAME` line tests read,
    /// and flushes them.
    fn print_roles(&self, kids: &[Kid]) -> Result<()> {
        println!("host {} fabric {}", self.h.name, self.fabric);
        for k in kids {
            println!("role {} pid {}", k.name, k.child.id());
        }
        println!("cluster file {}", self.dir.join("cluster.json").display());
        // Tests and scripts read this line.
        println!("up {}", self.h.name);
        use std::io::Write;
        std::io::stdout().flush()?;
        Ok(())
    }
}

/// Watches host `name`'s roles until Ctrl-C or SIGTERM, reporting (and leaving down) those
/// that exit; returns the exit code: 1 if one did.
fn supervise_host(name: &str, kids: &mut [Kid]) -> i32 {
    let mut code = 0;
    while !STOP.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        for k in kids.iter_mut().filter(|k| !k.gone) {
            if let Ok(Some(st)) = k.child.try_wait() {
                k.gone = true;
                code = 1;
                eprintln!("warning: host {name}: {} exited ({st}); the other roles carry on", k.name);
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const EXAMPLE: &str = include_str!("../../../docs/examples/three-sites.toml");

    #[test]
    fn the_three_site_example_parses_and_derives_addresses() {
        let c: ClusterConfig = toml::from_str(EXAMPLE).unwrap();
        c.validate().unwrap();
        let cloud = c.fabric_spec(None).unwrap();
        assert_eq!(cloud.url.to_string(), "nats://10.0.0.11:4222,nats://10.0.0.12:4222,nats://10.0.0.13:4222");
        let edge = c.fabric_spec(Some(c.host("edge-a").unwrap())).unwrap();
        assert_eq!(edge.url.to_string(), "nats://192.168.10.5:4222", "an edge site uses its own leaf node");
        assert_eq!(c.kv_servers(), 3);
        assert_eq!(c.capsule_hosts().len(), 3);
        assert_eq!(c.memcached().len(), 2);
    }

    #[test]
    fn mistakes_are_named() {
        let bad = |t: &str| {
            toml::from_str::<ClusterConfig>(t)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map_err(|e| e.to_string()))
        };
        let h = |extra: &str| {
            format!(
                "[cluster]\nfabric = \"nats://10.0.0.1:4222\"\n[[host]]\nname = \"a\"\naddress = \"10.0.0.1\"\n{extra}"
            )
        };
        assert!(bad(&h("")).is_ok());
        assert!(bad(&h("workers = [1]")).unwrap_err().contains("scheduler"));
        assert!(bad(&h("kv_servers = [0, 1]\nkv_coordinators = [0]")).unwrap_err().contains("odd"));
        assert!(bad(&h("capsule_hosts = [1]")).unwrap_err().contains("0 .. n"));
        assert!(bad(&h("typo = 1")).unwrap_err().contains("typo"));
        // KV roles that need secrets get them from the leader: a KV deployment needs one.
        let kv = "kv_servers = [0]\nkv_coordinators = [0]\nmemcached = [1]";
        assert!(bad(&h(kv)).unwrap_err().contains("needs a leader"));
        assert!(bad(&h(&format!("{kv}\nleader = true"))).is_ok());
        let two = "[[host]]\nname = \"a\"\naddress = \"10.0.0.1\"\nrouter = true\n[[host]]\nname = \"a\"\naddress = \"10.0.0.2\"\n";
        assert!(bad(two).unwrap_err().contains("twice"));
        assert!(bad("[[host]]\nname = \"a\"\naddress = \"10.0.0.1\"\n").unwrap_err().contains("fabric"));
    }

    #[test]
    fn init_gives_each_capsule_host_its_own_tls_key_and_shares_only_its_pin() {
        use std::os::unix::fs::PermissionsExt;
        let c: ClusterConfig = toml::from_str(EXAMPLE).unwrap();
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir_all(&shared).unwrap();
        capsule_host_keys(&c, t.path(), &shared).unwrap();
        let mut pins = Vec::new();
        for h in c.hosts.iter().filter(|h| !h.capsule_hosts.is_empty()) {
            let id = h.capsule_hosts[0];
            let key = tls_key_path(&t.path().join(&c.cluster.dir).join(&h.name), id);
            assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
            let me = psl_faas::tls::TlsIdentity::load(&key, "x").unwrap();
            let pin = std::fs::read_to_string(tls_pin_path(&shared, id)).unwrap();
            assert_eq!(pin.trim(), hex::encode(me.spki_hash()));
            pins.push(pin);
        }
        assert_eq!(pins.len(), 3);
        assert!(std::fs::read_dir(&shared).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains("key")));
        // Run again: the keys are kept, so are the pins.
        capsule_host_keys(&c, t.path(), &shared).unwrap();
        let again: Vec<String> = (0..3).map(|id| std::fs::read_to_string(tls_pin_path(&shared, id)).unwrap()).collect();
        assert_eq!(pins, again);
    }
}
