//! `psl up`: the embedded default deployment on one machine, as child processes (on loopback
//! unless `--bind`/`--advertise` say otherwise): a fabric (a router, or with `--fabric nats` a
//! local `nats-server`, or an existing fabric given by URL), three capsule hosts (capsule servers for each job's capsule, f = 1), the
//! scheduler, the leader (which runs each job's coordinator) and N workers. It
//! writes `DIR/cluster.json` (what `psl run --cluster` reads), prints the addresses, and runs
//! until Ctrl-C or SIGTERM, then stops the children.
//!
//! Attestation (`--attest`): with `sim`, the default on a machine without a TEE, `psl up` draws
//! the simulated platform key, writes it to `DIR/sim-platform.key` (mode 0600) for its
//! children, and writes a development policy `DIR/attest-policy.toml` that says
//! `allow_insecure_sim = true` (and requires attested capsule hosts, whose TLS keys it also
//! makes, `DIR/capsule-host<id>.tls-key`, and pins in the leader), the leader, the workers and
//! the clients use it; all of this is INSECURE and says so on stderr. With `sgx`, `tdx`, `snp` or
//! `auto` every attested role takes its reports from the hardware and `--attest-policy FILE` is
//! required (see docs/security/attestation.md).
//!
//! With `--kv` (or `--memcached N`) it also runs a long-lived KV deployment for SecureCached
//! on the same router: the KV capsule and its owner key, created once in `DIR/kv/` and kept
//! across restarts; its coordinator; capsule servers for it (`--kv-servers`, f = 1 with 3);
//! a CapsuleDB role (directory store `DIR/kv/capsuledb/`); and N `psl memcached` front ends
//! forming one peer group. `DIR/cluster.json` then has a `kv` object, from which
//! `psl memcached --cluster DIR` joins with a fresh node id. The KV owner key sits in DIR
//! (mode 0600): see docs/protocol/memcached.md for what that trusts. The capsule servers never
//! get it: each is started with its own ack key (`DIR/kv/server<id>.ack-key`, 0600) and
//! certificate.
//!
//! With `--config cluster.toml --host NAME` it starts one host's roles of a many-host
//! deployment instead (see `crate::cluster`).

use crate::kids::{catch_signals, fabric_flags, spawn, spawn_cmd, stop_all, wait_line, Kid, STOP};
use anyhow::{bail, Context, Result};
use clap::Args;
use psl_faas::attest_select::AttestChoice;
use psl_faas::net::{ClusterInfo, WorkerInfo};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(
    after_help = "WARNING: with --attest sim (the default) attestation uses the simulated backend, which is INSECURE (anyone holding DIR/sim-platform.key can forge reports), under a generated policy that says allow_insecure_sim = true; never use it in production."
)]
pub struct UpArgs {
    /// How the leader, workers and capsule hosts attest: `sim` (INSECURE, development: a
    /// generated policy DIR/attest-policy.toml with allow_insecure_sim = true), or `sgx`, `tdx`,
    /// `snp`, `auto` (hardware; needs --attest-policy).
    #[arg(long, default_value = "sim")]
    pub attest: psl_faas::attest_select::AttestChoice,
    /// The attestation policy file (required with hardware attestation; with sim, replaces the
    /// generated development policy).
    #[arg(long)]
    pub attest_policy: Option<PathBuf>,
    /// The configfs-tsm root the roles use (tdx, snp, auto).
    #[arg(long, default_value = psl_faas::attest_tsm::TSM_ROOT_DEFAULT)]
    pub tsm_root: PathBuf,
    /// Gramine's attestation directory the roles use (sgx, auto).
    #[arg(long, default_value = psl_faas::attest_gramine::GRAMINE_DIR_DEFAULT)]
    pub gramine_dir: PathBuf,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// Capsule hosts (`psl capsule-host`, server ids 0 ..): every job's capsule is stored on
    /// each (2f + 1 for f faults; 0 for none).
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Coordinator hosts (`psl coordinator-host`, ids 0 ..): each job's primary coordinator
    /// runs on host 0 and its shadows on the others (1 ..= 3).
    #[arg(long, default_value_t = 2)]
    pub coordinators: u32,
    /// Directory for the cluster file and the sim platform key (created if missing).
    #[arg(long, default_value = "psl-up")]
    pub dir: PathBuf,
    /// A worker whose heartbeats stop for this long is dropped by the scheduler.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_timeout_ms: u64,
    /// TEST ONLY: these workers (ids, 1-based) claim a measurement the policy does not allow.
    #[arg(long, value_delimiter = ',')]
    pub test_rogue_workers: Vec<u32>,
    /// TEST ONLY: the scheduler flips this byte of every sealed program it forwards.
    #[arg(long)]
    pub test_scheduler_flip_byte: Option<usize>,
    /// TEST ONLY: these workers stop heartbeating after 500 ms.
    #[arg(long, value_delimiter = ',')]
    pub test_hung_workers: Vec<u32>,
    /// Also run the KV deployment for SecureCached (capsule kept in DIR/kv, its coordinator,
    /// capsule servers, CapsuleDB, and `--memcached` front ends; 1 unless given).
    #[arg(long)]
    pub kv: bool,
    /// `psl memcached` front ends of the KV deployment, one peer group (implies --kv).
    #[arg(long)]
    pub memcached: Option<u32>,
    /// Capsule servers of the KV capsule (2f + 1; 0 for none).
    #[arg(long, default_value_t = 3)]
    pub kv_servers: u32,
    /// Shards of the KV key space (docs/protocol/sharding.md; 1 to 16): each its own capsule
    /// (DIR/kv for shard 0, DIR/kv/shard<S> for the others), coordinator, capsule servers,
    /// CapsuleDB and `--memcached` front ends. Each key belongs to one shard (a range of its
    /// hash, in the map capsule DIR/kv/map.capsule); a front end sends a command on another
    /// shard's key to a front end of that shard.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub shards: u16,
    /// Memory limit of each front end, MiB (evictions are read back through CapsuleDB).
    #[arg(long, default_value_t = 64)]
    pub kv_memory_mb: u64,
    /// Writer actors of each front end's node (`psl memcached --writers`; its default if not
    /// given).
    #[arg(long)]
    pub kv_writers: Option<usize>,
    /// Microseconds each front end's writers wait for a batch to fill (`psl memcached
    /// --flush-us`; its default if not given).
    #[arg(long)]
    pub kv_flush_us: Option<u64>,
    /// Microseconds from one seal of each front end's writer to the next under load (`psl
    /// memcached --seal-interval-us`; its default if not given).
    #[arg(long)]
    pub kv_seal_interval_us: Option<u64>,
    /// Each front end's flow window in ops (`psl memcached --flow-window-ops`).
    #[arg(long, default_value_t = psl_node::flow::WINDOW_OPS_DEFAULT)]
    pub kv_flow_window_ops: usize,
    /// Each front end's flow window in records (`psl memcached --flow-window-records`).
    #[arg(long, default_value_t = psl_node::flow::WINDOW_RECORDS_DEFAULT)]
    pub kv_flow_window_records: usize,
    /// With three front ends or more: their home lease (`psl memcached --home-lease-ms`;
    /// conditional commands fail over to another front end when a key's home is down). 0:
    /// static homes.
    #[arg(long, default_value_t = psl_memcached::failover::HOME_LEASE_MS_DEFAULT)]
    pub home_lease_ms: u64,
    /// The fabric: `router` (start a router), `nats` (start a local nats-server, Debian's
    /// package), or the URL of a running one (psl://HOST:PORT, nats://H1:4222,...).
    #[arg(long, default_value = "router", value_name = "router|nats|URL")]
    pub fabric: String,
    /// NATS credentials file, for a nats:// fabric that needs one.
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// CA certificate of the NATS servers' TLS, for a nats:// fabric that requires TLS.
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// First token(s) of the NATS subjects.
    #[arg(long, default_value = psl_fabric::subject::SUBJECT_PREFIX_DEFAULT)]
    pub nats_prefix: String,
    /// Interface every role listens on (0.0.0.0: all; then give --advertise).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// Do not serve the roles' Prometheus metrics. By default every role serves them on a free
    /// port of --bind (`--metrics`), listed in `DIR/cluster.json` under `metrics`.
    #[arg(long)]
    pub no_metrics: bool,
    /// Address other machines reach this one at: printed and written to the cluster file in
    /// place of the bound one (default: --bind).
    #[arg(long)]
    pub advertise: Option<std::net::IpAddr>,
    /// A cluster description (TOML): start the roles of `--host` only (see docs/deploy.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --config: the host whose roles to start.
    #[arg(long, requires = "config", conflicts_with = "init", value_name = "NAME")]
    pub host: Option<String>,
    /// With --config: make the files every host shares (sim platform key, KV capsule and
    /// owner key) once, then exit; copy them to every host.
    #[arg(long, requires = "config")]
    pub init: bool,
}

impl UpArgs {
    /// The address printed for a socket bound at `bound`.
    fn advertised(&self, bound: SocketAddr) -> SocketAddr {
        match self.advertise {
            Some(ip) if bound.ip().is_unspecified() || bound.ip() == self.bind => SocketAddr::new(ip, bound.port()),
            _ => bound,
        }
    }

    fn bind0(&self) -> String {
        SocketAddr::new(self.bind, 0).to_string()
    }
}

/// Runs `psl ARGS` to completion (a setup step: key and capsule creation).
fn psl_once(args: &[String]) -> Result<()> {
    let exe = std::env::current_exe().context("finding the psl binary")?;
    let o =
        Command::new(exe).args(args).stdin(Stdio::null()).output().with_context(|| format!("running psl {args:?}"))?;
    if !o.status.success() {
        bail!("psl {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

/// A free port on `ip` (bound, then released: the front end binds it a moment later).
fn free_port(ip: std::net::IpAddr) -> Result<SocketAddr> {
    Ok(psl_fabric::natsd::free_port(ip)?)
}

/// A path as a command-line argument.
fn path_arg(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// The KV deployment's files in `DIR/kv/` (absolute paths); a shard's other than shard 0's in
/// `DIR/kv/shard<S>/` ([`KvFiles::for_shard`]).
#[derive(Clone)]
struct KvFiles {
    dir: PathBuf,
    owner: PathBuf,
    capsule: PathBuf,
    /// The shard map capsule ([`crate::shard`]).
    map: PathBuf,
    control_key: PathBuf,
    control_pub: PathBuf,
}

impl KvFiles {
    /// Makes `DIR/kv/`, and there (once) the KV owner key, capsule and map capsule, and the
    /// control keys.
    fn create(a: &UpArgs) -> Result<KvFiles> {
        let dir = a.dir.join("kv");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Absolute: a joining front end may run from another directory.
        let dir = std::fs::canonicalize(&dir).with_context(|| format!("resolving {}", dir.display()))?;
        let owner = dir.join("owner.key");
        let capsule = dir.join("kv.capsule");
        let s = path_arg;
        // Created once: the KV store outlives restarts of `psl up` (the servers' and CapsuleDB's
        // stores are for this capsule).
        if !owner.exists() {
            if capsule.exists() {
                bail!(
                    "{} exists without its owner key {}: remove {} to start a new KV store",
                    s(&capsule),
                    s(&owner),
                    s(&dir)
                );
            }
            psl_once(&["keys".into(), "new".into(), "--out".into(), s(&owner)])?;
        }
        if !capsule.exists() {
            psl_once(&[
                "capsule".into(),
                "new".into(),
                "--owner".into(),
                s(&owner),
                "--label".into(),
                "psl-up-kv".into(),
                "--out".into(),
                s(&capsule),
            ])?;
        }
        let map = dir.join("map.capsule");
        let kv_meta = crate::roles::read_metadata(&capsule)?;
        crate::shard::create(&crate::util::read_owner_key(&owner)?, &kv_meta, &map)?;
        // The operator's control key (secret, 0600, in this directory): it signs the commands
        // on the coordinator's and CapsuleDB's control interfaces, which get its public half.
        let control_key = dir.join("control.key");
        let control_pub = dir.join("control.pub");
        crate::util::write_control_keys(&control_key, &control_pub)?;
        Ok(KvFiles { dir, owner, capsule, map, control_key, control_pub })
    }

    /// Shard `s`'s files: shard 0's are these; another shard's capsule (made once: the same
    /// owner and application, so one data key reads every shard and the map) and its roles'
    /// state are in `DIR/kv/shard<s>/`. The owner key, the control keys and the map are shared.
    fn for_shard(&self, s: u16) -> Result<KvFiles> {
        if s == 0 {
            return Ok(self.clone());
        }
        let dir = self.dir.join(format!("shard{s}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let capsule = dir.join("kv.capsule");
        if !capsule.exists() {
            let app_index = crate::roles::read_metadata(&self.capsule)?.meta.app_index;
            psl_once(&[
                "capsule".into(),
                "new".into(),
                "--owner".into(),
                path_arg(&self.owner),
                "--label".into(),
                format!("psl-up-kv-shard{s}"),
                "--app-index".into(),
                app_index.to_string(),
                "--out".into(),
                path_arg(&capsule),
            ])?;
        }
        Ok(KvFiles { dir, capsule, ..self.clone() })
    }

    /// Each capsule server's own ack key (0600) and certificate, never the owner key; made
    /// where missing.
    fn server_keys(&self, n: u32) -> Result<Vec<(PathBuf, PathBuf)>> {
        let s = path_arg;
        let server_keys = (0..n)
            .map(|id| (self.dir.join(format!("server{id}.ack-key")), self.dir.join(format!("server{id}.cert"))))
            .collect::<Vec<_>>();
        if server_keys.iter().any(|(k, _)| !k.exists()) {
            let meta = crate::roles::read_metadata(&self.capsule)?;
            let ok = crate::util::read_owner_key(&self.owner)?;
            if ok.public() != meta.meta.owner {
                bail!("{} is not the owner key of {}", s(&self.owner), s(&self.capsule));
            }
            let app = ok.app(meta.meta.app_index)?;
            for (id, (key, cert)) in server_keys.iter().enumerate() {
                if !key.exists() {
                    crate::roles::write_server_credentials(&meta, &app, id as u32, key, cert)?;
                }
            }
        }
        Ok(server_keys)
    }
}

/// Started children's ids, each with its output.
type Outputs = Vec<(u32, Receiver<String>)>;

/// What starting the KV deployment's processes needs: the arguments, the fabric, the files
/// and the deadline for their first lines.
struct KvLaunch<'a> {
    a: &'a UpArgs,
    /// The attestation flags the front ends attest their HTTPS endpoint with.
    attest: &'a [String],
    fabric: &'a psl_fabric::FabricSpec,
    files: KvFiles,
    deadline: Instant,
    /// This shard's index (0 with one shard).
    shard: u16,
    /// The map capsule the front ends route by, with several shards.
    map: Option<PathBuf>,
}

impl KvLaunch<'_> {
    /// The name of this shard's process `role` (`kv coordinator`; `kv shard 1 coordinator`).
    fn name(&self, role: &str) -> String {
        match self.shard {
            0 => format!("kv {role}"),
            s => format!("kv shard {s} {role}"),
        }
    }

    /// The name of this shard's front end `id` (`memcached 1`; `shard 1 memcached 1`).
    fn front_end(&self, id: u32) -> String {
        match self.shard {
            0 => format!("memcached {id}"),
            s => format!("shard {s} memcached {id}"),
        }
    }

    /// The arguments of KV role `role` (the coordinator or CapsuleDB) before its own.
    fn common(&self, role: &str) -> Vec<String> {
        let f = &self.files;
        let mut v = vec![role.into(), "--capsule".into(), path_arg(&f.capsule), "--owner".into(), path_arg(&f.owner)];
        v.extend(fabric_flags(self.fabric));
        if role == "coordinator" || role == "capsuledb" {
            v.extend(["--control-pub".into(), path_arg(&f.control_pub)]);
        }
        v
    }

    /// Starts the KV capsule servers; returns each one's id and output, and each one's id and
    /// store directory.
    fn spawn_servers(&self, kids: &mut Vec<Kid>) -> Result<(Outputs, Vec<(u32, PathBuf)>)> {
        let (a, f, s) = (self.a, &self.files, path_arg);
        let server_keys = f.server_keys(a.kv_servers)?;
        let mut srx = Vec::new();
        let mut servers = Vec::new();
        for id in 0..a.kv_servers {
            let sdir = f.dir.join(format!("server{id}"));
            let (key, cert) = &server_keys[id as usize];
            let mut args =
                vec!["capsule-server".to_string(), "--capsule".into(), s(&f.capsule), "--ack-key".into(), s(key)];
            if cert.exists() {
                args.extend(["--cert".into(), s(cert)]);
            }
            args.extend(fabric_flags(self.fabric));
            args.extend([
                "--dir".into(),
                s(&sdir),
                "--id".into(),
                id.to_string(),
                "--n".into(),
                a.kv_servers.to_string(),
            ]);
            // Its read interface (records, heads, STATS): loopback, for operators and benchmarks.
            args.extend(["--read".into(), "127.0.0.1:0".into()]);
            let (k, rx) = spawn(&self.name(&format!("capsule server {id}")), &args)?;
            kids.push(k);
            srx.push((id, rx));
            servers.push((id, sdir));
        }
        Ok((srx, servers))
    }

    /// Waits for each KV capsule server's `ready` and `reads` lines; returns its read
    /// interfaces.
    fn wait_servers(&self, srx: Outputs) -> Result<Vec<SocketAddr>> {
        let mut server_reads = Vec::new();
        for (id, rx) in srx {
            wait_line(&self.name(&format!("capsule server {id}")), &rx, "ready ", self.deadline)?;
            server_reads
                .push(wait_line(&self.name(&format!("capsule server {id}")), &rx, "reads ", self.deadline)?.parse()?);
        }
        Ok(server_reads)
    }

    /// Starts a front end on each peer address of `binds`, one peer group, with CapsuleDB's
    /// writer index `writer`; returns their peer addresses and their outputs
    /// ([`KvLaunch::wait_front_ends`]).
    fn spawn_front_ends(
        &self,
        binds: &[SocketAddr],
        writer: u32,
        kids: &mut Vec<Kid>,
    ) -> Result<(Vec<SocketAddr>, Outputs)> {
        let (a, f, s) = (self.a, &self.files, path_arg);
        let peers: Vec<SocketAddr> = binds.iter().map(|b| a.advertised(*b)).collect();
        let list = peers.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
        let mut frx = Vec::new();
        for (i, peer) in peers.iter().enumerate() {
            let id = i as u32 + 1;
            let mut args = vec!["memcached".to_string(), "--listen".into(), a.bind0()];
            args.extend(fabric_flags(self.fabric));
            args.extend([
                "--capsule".into(),
                s(&f.capsule),
                "--owner".into(),
                s(&f.owner),
                "--id".into(),
                id.to_string(),
                "--state".into(),
                s(&f.dir.join(format!("memcached{id}"))),
                "--capsuledb-writer".into(),
                writer.to_string(),
                "--memory-mb".into(),
                a.kv_memory_mb.to_string(),
                "--flow-window-ops".into(),
                a.kv_flow_window_ops.to_string(),
                "--flow-window-records".into(),
                a.kv_flow_window_records.to_string(),
            ]);
            if let Some(w) = a.kv_writers {
                args.extend(["--writers".into(), w.to_string()]);
            }
            if let Some(us) = a.kv_flush_us {
                args.extend(["--flush-us".into(), us.to_string()]);
            }
            if let Some(us) = a.kv_seal_interval_us {
                args.extend(["--seal-interval-us".into(), us.to_string()]);
            }
            if a.kv_servers > 0 {
                // The capsule servers hold every record and answer repairs: a front end keeps
                // only a short window of them for its peers. Their acks pace its writers.
                args.extend(["--repair-cache-mb".into(), crate::roles::REPAIR_CACHE_MB_FOLLOWER.to_string()]);
                args.extend(["--servers".into(), a.kv_servers.to_string()]);
            }
            // Even a group of one serves its peer address: joining front ends forward to it.
            args.extend(["--peer-listen".into(), binds[i].to_string(), "--peers".into(), list.clone()]);
            args.extend(["--peer-advertise".into(), peer.to_string()]);
            args.extend(["--home-lease-ms".into(), a.home_lease_ms.to_string()]);
            if let Some(m) = &self.map {
                args.extend(["--shard-map".into(), s(m)]);
            }
            // Its attested HTTPS endpoint (`psl verify`, docs/client.md).
            args.extend(["--http".into(), SocketAddr::new(a.bind, 0).to_string()]);
            args.extend(self.attest.iter().cloned());
            let (k, rx) = spawn(&self.front_end(id), &args)?;
            kids.push(k);
            frx.push((id, rx));
        }
        Ok((peers, frx))
    }

    /// Waits for the front ends' HTTPS and memcached lines; returns their memcached addresses
    /// and their attested HTTPS endpoints.
    fn wait_front_ends(&self, frx: Outputs) -> Result<(Vec<SocketAddr>, Vec<String>)> {
        let a = self.a;
        let (mut listen, mut http) = (Vec::new(), Vec::new());
        for (id, rx) in frx {
            // In the order it prints them: its HTTPS endpoint, then its memcached address.
            let url = wait_line(&self.front_end(id), &rx, "https ", self.deadline)?;
            let at: SocketAddr = url.trim_start_matches("https://").parse()?;
            http.push(format!("https://{}", a.advertised(at)));
            listen.push(a.advertised(wait_line(&self.front_end(id), &rx, "listening ", self.deadline)?.parse()?));
        }
        Ok((listen, http))
    }
}

/// The writer index CapsuleDB's `ready` line names (`writer=W`).
fn capsuledb_writer(ready: &str) -> Result<u32> {
    ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("writer="))
        .and_then(|w| w.parse().ok())
        .with_context(|| format!("psl capsuledb printed 'ready {ready}' without writer=W"))
}

/// A shard's roles spawned, before their first lines are read ([`KvLaunch::spawn_shard`]).
struct ShardSpawned {
    servers: Vec<(u32, PathBuf)>,
    srx: Outputs,
    drx: Receiver<String>,
}

/// A shard's capsule servers, CapsuleDB and coordinator up ([`KvLaunch::core_up`]).
struct ShardCore {
    servers: Vec<(u32, PathBuf)>,
    server_reads: Vec<SocketAddr>,
    coordinator_control: SocketAddr,
    capsuledb_control: SocketAddr,
    writer: u32,
}

impl KvLaunch<'_> {
    /// Spawns this shard's capsule servers and CapsuleDB (every shard's start before any is
    /// waited for: the shards start side by side).
    fn spawn_shard(&self, kids: &mut Vec<Kid>) -> Result<ShardSpawned> {
        let (srx, servers) = self.spawn_servers(kids)?;
        let mut dargs = self.common("capsuledb");
        // Its control interface hands out plaintext: loopback only, like the coordinator's.
        dargs.extend([
            "--store".into(),
            path_arg(&self.files.dir.join("capsuledb")),
            "--control".into(),
            "127.0.0.1:0".into(),
        ]);
        let (k, drx) = spawn(&self.name("capsuledb"), &dargs)?;
        kids.push(k);
        Ok(ShardSpawned { servers, srx, drx })
    }

    /// Waits for the servers, then starts the coordinator: a restarted coordinator (its
    /// writer index has no incarnation) learns its own chain back from them during its rejoin
    /// period, so it never re-uses a seq. Waits for it and for CapsuleDB.
    fn core_up(&self, sp: ShardSpawned, kids: &mut Vec<Kid>) -> Result<ShardCore> {
        let deadline = self.deadline;
        let server_reads = self.wait_servers(sp.srx)?;
        let mut cargs = self.common("coordinator");
        cargs.extend(["--state".into(), path_arg(&self.files.dir.join("coordinator"))]);
        let (k, crx) = spawn(&self.name("coordinator"), &cargs)?;
        kids.push(k);
        let coordinator_control: SocketAddr =
            wait_line(&self.name("coordinator"), &crx, "control ", deadline)?.parse()?;
        let capsuledb_control: SocketAddr =
            wait_line(&self.name("capsuledb"), &sp.drx, "control ", deadline)?.parse()?;
        let writer = capsuledb_writer(&wait_line(&self.name("capsuledb"), &sp.drx, "ready ", deadline)?)?;
        Ok(ShardCore { servers: sp.servers, server_reads, coordinator_control, capsuledb_control, writer })
    }

    /// What a front end needs to join this shard (the `kv` object of the cluster file).
    fn info(
        &self,
        core: ShardCore,
        peers: Vec<SocketAddr>,
        fronts: (Vec<SocketAddr>, Vec<String>),
    ) -> crate::memcached::KvInfo {
        let files = &self.files;
        let (front_ends, http) = fronts;
        crate::memcached::KvInfo {
            fabric: self.fabric.clone(),
            capsule: files.capsule.clone(),
            owner: Some(files.owner.clone()),
            map: Some(files.map.clone()),
            map_version: 0,
            leader: None,
            capsuledb_writer: core.writer,
            home_lease_ms: if peers.len() >= psl_memcached::failover::MEMBERS_MIN { self.a.home_lease_ms } else { 0 },
            peers,
            front_ends,
            http,
            servers: core.servers,
            state: files.dir.join("joined"),
            coordinator_control: Some(core.coordinator_control),
            capsuledb_control: Some(core.capsuledb_control),
            control_key: Some(files.control_key.clone()),
            server_reads: core.server_reads,
            shard_front_ends: Vec::new(),
        }
    }
}

/// The map of `a.shards` shards: the capsules `names`, each served by the front ends at
/// `peers`, the point space cut into equal ranges in shard order.
fn shard_map(names: &[psl_capsule::CapsuleName], peers: &[Vec<SocketAddr>]) -> psl_scl::shard::ShardMap {
    use psl_scl::shard::{Route, Shard, ShardMap};
    let n = names.len() as u128;
    ShardMap {
        map_version: 0,
        shards: names
            .iter()
            .zip(peers)
            .map(|(c, p)| Shard { capsule: c.0 .0, front_ends: p.iter().map(|a| a.to_string()).collect() })
            .collect(),
        routes: (0..n).map(|s| Route { first: ((s << 64) / n) as u64, shard: s as u16 }).collect(),
        moves: Vec::new(),
    }
}

/// Starts the KV deployment's processes on `fabric` (see the module docs), every shard's;
/// returns what a front end needs to join (the `kv` object of the cluster file: shard 0's,
/// with every shard's memcached addresses).
fn start_kv(
    a: &UpArgs,
    attest: &[String],
    front_ends: u32,
    fabric: &psl_fabric::FabricSpec,
    kids: &mut Vec<Kid>,
    deadline: Instant,
) -> Result<crate::memcached::KvInfo> {
    let files = KvFiles::create(a)?;
    let shards = (0..a.shards).map(|s| files.for_shard(s)).collect::<Result<Vec<_>>>()?;
    // Every front end's peer address first: the map names them, and each front end reads the
    // map when it starts. A new map version when they changed since the last start.
    let mut binds = Vec::with_capacity(shards.len());
    for _ in &shards {
        binds.push((0..front_ends).map(|_| free_port(a.bind)).collect::<Result<Vec<_>>>()?);
    }
    let names =
        shards.iter().map(|f| Ok(crate::roles::read_metadata(&f.capsule)?.name())).collect::<Result<Vec<_>>>()?;
    let advertised: Vec<Vec<SocketAddr>> = binds.iter().map(|b| b.iter().map(|x| a.advertised(*x)).collect()).collect();
    let owner = crate::util::read_owner_key(&files.owner)?;
    let next = shard_map(&names, &advertised);
    match crate::shard::read(&files.map, &owner, Some(&names[0]))? {
        Some(current) => {
            crate::shard::same_layout(&current.map, &next).with_context(|| format!("--shards {}", a.shards))?
        }
        // A store from before maps were written: it has one shard.
        None if a.shards > 1 && files.dir.join("coordinator").exists() => bail!(
            "--shards {}: {} holds a store of one shard (made before shard maps); changing its shard count would hide              keys; remove the directory to start an empty store",
            a.shards,
            files.dir.display()
        ),
        None => {}
    }
    let (map, _) = crate::shard::publish(&files.map, &owner, &names[0], next)?;
    let routed = (a.shards > 1).then(|| files.map.clone());
    let launches: Vec<KvLaunch> = shards
        .into_iter()
        .enumerate()
        .map(|(s, f)| KvLaunch { a, attest, fabric, files: f, deadline, shard: s as u16, map: routed.clone() })
        .collect();
    // Stage by stage across the shards, so that they start side by side.
    let spawned = launches.iter().map(|l| l.spawn_shard(kids)).collect::<Result<Vec<_>>>()?;
    let cores = launches.iter().zip(spawned).map(|(l, sp)| l.core_up(sp, kids)).collect::<Result<Vec<_>>>()?;
    let mut fronts = Vec::with_capacity(launches.len());
    for ((l, core), b) in launches.iter().zip(&cores).zip(&binds) {
        fronts.push(l.spawn_front_ends(b, core.writer, kids)?);
    }
    let mut infos = Vec::with_capacity(launches.len());
    for ((l, core), (peers, frx)) in launches.iter().zip(cores).zip(fronts) {
        let up = l.wait_front_ends(frx)?;
        infos.push(l.info(core, peers, up));
    }
    let shard_front_ends = infos.iter().map(|i| i.front_ends.clone()).collect();
    let mut info = infos.swap_remove(0);
    info.map_version = map.map.map_version;
    info.shard_front_ends = shard_front_ends;
    Ok(info)
}

/// Starts the leader again with `args` (its first start's, bound to the address it had),
/// retrying while the old socket's port is not yet free.
fn restart(args: &[String]) -> Result<Kid> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (k, rx) = spawn("leader", args)?;
        match wait_line("leader", &rx, "leader ", Instant::now() + Duration::from_secs(5)) {
            Ok(_) => {
                eprintln!("leader started again");
                return Ok(k);
            }
            Err(e) if Instant::now() < deadline => {
                let mut k = k;
                let _ = k.child.kill();
                let _ = k.child.wait();
                eprintln!("warning: the leader did not start again ({e:#}); retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Starts the fabric `a.fabric` asks for (a router or a local nats-server as a child), or
/// takes the URL of a running one; returns its spec.
fn start_fabric(a: &UpArgs, kids: &mut Vec<Kid>, deadline: Instant) -> Result<psl_fabric::FabricSpec> {
    let url = match a.fabric.as_str() {
        "router" => {
            let mut args = vec!["router".to_string(), "--listen".into(), a.bind0()];
            if let Some(ip) = a.advertise {
                args.extend(["--advertise".into(), ip.to_string()]);
            }
            let (k, rx) = spawn("router", &args)?;
            kids.push(k);
            psl_fabric::FabricUrl::Router(wait_line("router", &rx, "listening ", deadline)?)
        }
        "nats" => {
            let listen = free_port(a.bind)?;
            let dir = a.dir.join("nats");
            let mut o = psl_fabric::natsd::NatsServerOptions::new("psl-up", listen, &dir);
            o.client_advertise = a.advertise.map(|ip| SocketAddr::new(ip, listen.port()).to_string());
            let (k, _rx) = spawn_cmd("nats-server", o.command().context("writing the nats-server configuration")?)
                .context("starting nats-server (Debian package nats-server; see scripts/install-nats-test-deps.sh)")?;
            kids.push(k);
            let probe = if listen.ip().is_unspecified() {
                SocketAddr::new([127, 0, 0, 1].into(), listen.port())
            } else {
                listen
            };
            while !psl_fabric::natsd::answers_info(probe) {
                if Instant::now() >= deadline
                    || kids.last_mut().is_some_and(|k| matches!(k.child.try_wait(), Ok(Some(_))))
                {
                    bail!("nats-server did not start on {listen} (its log is on stderr above)");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            psl_fabric::FabricUrl::Nats(vec![format!("nats://{}", a.advertised(listen))])
        }
        url => url.parse().with_context(|| format!("--fabric {url}: not router, nats, or a fabric URL"))?,
    };
    let args = psl_fabric::FabricArgs {
        fabric: Some(url.clone()),
        nats_creds: a.nats_creds.clone(),
        nats_tls_ca: a.nats_tls_ca.clone(),
        nats_prefix: a.nats_prefix.clone(),
    };
    args.spec_of(url)
}

/// The attestation flags every attested child gets, and the policy file (absolute). With sim:
/// the platform key and a generated development policy in DIR, announced on stderr.
fn attestation(a: &UpArgs) -> Result<(Vec<String>, PathBuf)> {
    let mut flags = vec!["--attest".to_string()];
    if a.attest != AttestChoice::Sim {
        flags.push(format!("{:?}", a.attest).to_lowercase());
        flags.extend(["--tsm-root".into(), a.tsm_root.display().to_string()]);
        flags.extend(["--gramine-dir".into(), a.gramine_dir.display().to_string()]);
        let p = a.attest_policy.as_ref().context(
            "hardware attestation needs --attest-policy FILE (its measurements: `psl attest measure`; see \
             docs/security/attestation.md)",
        )?;
        let p = std::fs::canonicalize(p).with_context(|| format!("the policy {}", p.display()))?;
        return Ok((flags, p));
    }
    flags.push("sim".into());
    let key_path = a.dir.join("sim-platform.key");
    let secret = psl_crypto::SigningKey::generate().expose_secret_bytes();
    crate::util::write_atomic(&key_path, zeroize::Zeroizing::new(hex::encode(&secret[..])).as_bytes(), 0o600)?;
    let platform = psl_faas::SimPlatform::from_secret(&secret)?;
    let bin = hex::encode(psl_faas::attest::binary_hash().0);
    let measurement = crate::attest::measurement(Some(&bin))?;
    flags.extend(["--sim-platform-key".into(), key_path.display().to_string(), "--sim-binary-hash".into(), bin]);
    let path = match &a.attest_policy {
        Some(p) => p.clone(),
        None => {
            let p = a.dir.join("attest-policy.toml");
            let text = psl_faas::attest_policy::dev_sim_policy_text(
                &hex::encode(platform.public().to_bytes()),
                &[measurement],
                true,
            );
            crate::util::write_atomic(&p, text.as_bytes(), 0o644)?;
            p
        }
    };
    let path = std::fs::canonicalize(&path).with_context(|| format!("the policy {}", path.display()))?;
    crate::attest::warn_sim_once(&format!(
        "WARNING: attestation backend 'sim' is INSECURE (development only): the attestation policy {} says \
         allow_insecure_sim = true, so reports anyone holding {} can forge are accepted. On a TEE use --attest \
         sgx|tdx|snp|auto --attest-policy FILE.",
        path.display(),
        key_path.display()
    ));
    Ok((flags, path))
}

/// Checks the role counts; returns the number of KV front ends, if the KV deployment runs.
fn check_counts(a: &UpArgs) -> Result<Option<u32>> {
    if a.workers == 0 || a.workers > 255 {
        bail!("--workers must be 1 ..= 255");
    }
    if !(1..=3).contains(&a.coordinators) {
        bail!("--coordinators must be 1 ..= 3 (a job capsule allows three coordinator ranks)");
    }
    if a.servers > 64 {
        bail!("--servers must be 0 ..= 64");
    }
    let kv_front_ends = match (a.kv, a.memcached) {
        (_, Some(n)) => Some(n),
        (true, None) => Some(1),
        (false, None) => None,
    };
    if kv_front_ends.is_some_and(|n| n > 255) {
        bail!("--memcached must be 0 ..= 255");
    }
    if kv_front_ends.is_some() && (a.kv_servers > 63 || (a.kv_servers != 0 && a.kv_servers.is_multiple_of(2))) {
        bail!("--kv-servers must be 0 or an odd number (2f + 1) up to 63");
    }
    Ok(kv_front_ends)
}

/// What starting the deployment needs: the arguments, the attestation flags and policy, and
/// the deadline for the children's first lines.
struct Launch<'a> {
    a: &'a UpArgs,
    attest_flags: Vec<String>,
    policy_path: PathBuf,
    /// `policy_path` as an argument.
    attest_policy: String,
    deadline: Instant,
}

/// The started deployment: the cluster file's contents and the leader's arguments (to start
/// it again on the same address).
struct Started {
    info: ClusterInfo,
    kv: Option<crate::memcached::KvInfo>,
    leader_args: Vec<String>,
    /// The leader's HTTPS endpoint with the jobs API (with a KV store).
    faas_http: Option<String>,
}

/// A capsule host started: its id, its store directory and its output.
type HostOutput = (u32, PathBuf, Receiver<String>);

impl Launch<'_> {
    /// Adds the attestation flags every attested child gets to `v`.
    fn attest(&self, v: &mut Vec<String>) {
        v.extend(self.attest_flags.iter().cloned());
    }

    /// Starts every process (the fabric, the KV deployment if `kv_front_ends`, the scheduler,
    /// the capsule and coordinator hosts, the leader, the workers) and waits until each is up.
    fn start(&self, kv_front_ends: Option<u32>, kids: &mut Vec<Kid>) -> Result<Started> {
        let (a, deadline) = (self.a, self.deadline);
        let fabric = start_fabric(a, kids, deadline)?;
        let mut kv = None;
        if let Some(n) = kv_front_ends {
            kv = Some(start_kv(a, &self.attest_flags, n, &fabric, kids, deadline)?);
        }
        let srx = self.spawn_scheduler(kids)?;
        let (hrx, pins) = self.spawn_capsule_hosts(&fabric, kids)?;
        let crx = self.spawn_coordinator_hosts(&fabric, kids)?;
        let mut coordinator_hosts = Vec::new();
        for (id, rx) in crx {
            let line = wait_line(&format!("coordinator host {id}"), &rx, &format!("coordinator-host {id} "), deadline)?;
            coordinator_hosts.push((id, a.advertised(line.parse()?)));
        }
        let mut hosts = Vec::new();
        for (id, hdir, rx) in hrx {
            let addr: SocketAddr =
                wait_line(&format!("capsule host {id}"), &rx, &format!("capsule-host {id} "), deadline)?.parse()?;
            hosts.push((id, a.advertised(addr), hdir));
        }
        let mut largs = vec!["leader".to_string(), "--listen".into(), a.bind0()];
        largs.extend(fabric_flags(&fabric));
        for (_, addr, _) in &hosts {
            largs.extend(["--capsule-host".into(), addr.to_string()]);
        }
        for pin in &pins {
            largs.extend(["--capsule-host-pin".into(), pin.clone()]);
        }
        for (_, addr) in &coordinator_hosts {
            largs.extend(["--coordinator-host".into(), addr.to_string()]);
        }
        self.attest(&mut largs);
        largs.extend(["--attest-policy".into(), self.attest_policy.clone()]);
        // With a KV store, the leader serves the jobs API to the KV capsule's credentials.
        if let Some(kv) = &kv {
            largs.extend(["--http".into(), SocketAddr::new(a.bind, 0).to_string()]);
            largs.extend(["--clients-capsule".into(), kv.capsule.display().to_string()]);
            largs.extend(["--cluster-file".into(), a.dir.join("cluster.json").display().to_string()]);
        }
        let (k, lrx) = spawn("leader", &largs)?;
        kids.push(k);
        let scheduler: SocketAddr = a.advertised(wait_line("scheduler", &srx, "scheduler ", deadline)?.parse()?);
        // The endpoint starts before the leader's own port, so its line comes first.
        let https_at: Option<SocketAddr> = match &kv {
            Some(_) => Some(wait_line("leader", &lrx, "https ", deadline)?.trim_start_matches("https://").parse()?),
            None => None,
        };
        let faas_http = https_at.map(|at| format!("https://{}", a.advertised(at)));
        let bound: SocketAddr = wait_line("leader", &lrx, "leader ", deadline)?.parse()?;
        let leader: SocketAddr = a.advertised(bound);
        // A leader that exits is started again on the same address (see `supervise`).
        largs[2] = bound.to_string();
        // And its endpoint on the same port, so the cluster file's `faas.http` stays true.
        if let (Some(at), Some(i)) = (https_at, largs.iter().position(|x| x == "--http")) {
            largs[i + 1] = at.to_string();
        }
        let workers = self.start_workers(&fabric, scheduler, leader, kids)?;
        let info = ClusterInfo {
            scheduler,
            leader,
            fabric,
            attestation_backend: backend_name(a.attest),
            attest_policy: self.policy_path.clone(),
            workers,
            capsule_hosts: hosts,
            coordinator_hosts,
            pids: kids.iter().map(|k| (k.name.clone(), k.child.id())).collect(),
        };
        Ok(Started { info, kv, leader_args: largs, faas_http })
    }

    /// Starts the scheduler; returns its output.
    fn spawn_scheduler(&self, kids: &mut Vec<Kid>) -> Result<Receiver<String>> {
        let a = self.a;
        let mut sargs = vec![
            "scheduler".to_string(),
            "--listen".into(),
            a.bind0(),
            "--heartbeat-timeout-ms".into(),
            a.heartbeat_timeout_ms.to_string(),
        ];
        if let Some(b) = a.test_scheduler_flip_byte {
            sargs.extend(["--test-flip-program-byte".into(), b.to_string()]);
        }
        let (k, srx) = spawn("scheduler", &sargs)?;
        kids.push(k);
        Ok(srx)
    }

    /// Starts the capsule hosts, each with a fresh TLS key; returns their outputs and the
    /// leader's pins of their keys (`ID=SPKI-HASH`).
    fn spawn_capsule_hosts(
        &self,
        fabric: &psl_fabric::FabricSpec,
        kids: &mut Vec<Kid>,
    ) -> Result<(Vec<HostOutput>, Vec<String>)> {
        let a = self.a;
        let mut hrx = Vec::new();
        let mut pins = Vec::new();
        for id in 0..a.servers {
            let hdir = a.dir.join(format!("server{id}"));
            // Each host's TLS key (0600), pinned by the leader: nobody else at its address
            // gets its ack-signing key.
            let key = a.dir.join(format!("capsule-host{id}.tls-key"));
            let me = psl_faas::tls::TlsIdentity::generate("psl-capsule-host")?;
            crate::util::write_atomic(&key, me.key_pem().as_bytes(), 0o600)?;
            pins.push(format!("{id}={}", hex::encode(me.spki_hash())));
            let mut args = vec![
                "capsule-host".to_string(),
                "--id".into(),
                id.to_string(),
                "--dir".into(),
                hdir.display().to_string(),
                "--listen".into(),
                a.bind0(),
                "--tls-key".into(),
                key.display().to_string(),
            ];
            args.extend(fabric_flags(fabric));
            self.attest(&mut args);
            let (k, rx) = spawn(&format!("capsule host {id}"), &args)?;
            kids.push(k);
            hrx.push((id, hdir, rx));
        }
        Ok((hrx, pins))
    }

    /// Starts the coordinator hosts; returns each one's id and output.
    fn spawn_coordinator_hosts(&self, fabric: &psl_fabric::FabricSpec, kids: &mut Vec<Kid>) -> Result<Outputs> {
        let a = self.a;
        let mut crx = Vec::new();
        for id in 0..a.coordinators {
            let mut args = vec![
                "coordinator-host".to_string(),
                "--id".into(),
                id.to_string(),
                "--dir".into(),
                a.dir.join(format!("coordinator{id}")).display().to_string(),
                "--listen".into(),
                a.bind0(),
            ];
            args.extend(fabric_flags(fabric));
            self.attest(&mut args);
            let (k, rx) = spawn(&format!("coordinator host {id}"), &args)?;
            kids.push(k);
            crx.push((id, rx));
        }
        Ok(crx)
    }

    /// Starts the workers (on `scheduler` and `leader`) and waits for their control addresses.
    fn start_workers(
        &self,
        fabric: &psl_fabric::FabricSpec,
        scheduler: SocketAddr,
        leader: SocketAddr,
        kids: &mut Vec<Kid>,
    ) -> Result<Vec<WorkerInfo>> {
        let a = self.a;
        let mut wrx = Vec::new();
        for id in 1..=a.workers {
            let mut w = vec![
                "worker".to_string(),
                "--id".into(),
                id.to_string(),
                "--scheduler".into(),
                scheduler.to_string(),
                "--leader".into(),
                leader.to_string(),
                "--control".into(),
                a.bind0(),
            ];
            w.extend(fabric_flags(fabric));
            self.attest(&mut w);
            w.extend(["--attest-policy".into(), self.attest_policy.clone()]);
            if a.test_rogue_workers.contains(&id) {
                w.push("--test-rogue-measurement".into());
            }
            if a.test_hung_workers.contains(&id) {
                w.extend(["--test-stop-heartbeats-after-ms".into(), "500".into()]);
            }
            let (k, rx) = spawn(&format!("worker {id}"), &w)?;
            kids.push(k);
            wrx.push((id, rx));
        }
        let mut workers = Vec::new();
        for (id, rx) in wrx {
            let line = wait_line(&format!("worker {id}"), &rx, &format!("worker {id} control "), self.deadline)?;
            workers.push(WorkerInfo { id, control: a.advertised(line.parse()?) });
        }
        Ok(workers)
    }
}

/// The attestation backend's name in the cluster file.
fn backend_name(attest: AttestChoice) -> String {
    match attest {
        AttestChoice::Sim => psl_faas::attest::SIM_BACKEND.into(),
        AttestChoice::Sgx => "sgx".into(),
        AttestChoice::Tdx => "tdx".into(),
        AttestChoice::Snp => "snp".into(),
        AttestChoice::Auto => "auto".into(),
    }
}

/// Writes the cluster file `path` (with a `kv` object when the KV deployment runs).
fn write_cluster_file(path: &std::path::Path, up: &Started) -> Result<()> {
    let mut file = serde_json::to_value(&up.info)?;
    if let Some(kv) = &up.kv {
        file["kv"] = serde_json::to_value(kv)?;
    }
    if let Some(url) = &up.faas_http {
        file["faas"] = serde_json::json!({ "http": url });
    }
    // Each role's Prometheus scrape URL, by name (`--metrics`; none with --no-metrics).
    let metrics = crate::kids::metrics_urls();
    if !metrics.is_empty() {
        file["metrics"] = serde_json::to_value(metrics)?;
    }
    crate::util::write_atomic(path, serde_json::to_string_pretty(&file)?.as_bytes(), 0o644)?;
    Ok(())
}

/// The attestation policy the deployment's roles are checked under (what `attestation` wrote
/// or was given).
fn self_policy(a: &UpArgs) -> PathBuf {
    a.attest_policy.clone().unwrap_or_else(|| a.dir.join("attest-policy.toml"))
}

/// Prints the addresses, the cluster file and the `up MS` line tests read, and flushes them.
fn print_summary(a: &UpArgs, up: &Started, cluster_path: &std::path::Path, cold_ms: f64) -> Result<()> {
    let info = &up.info;
    println!("fabric    {}", info.fabric);
    println!("scheduler {}", info.scheduler);
    println!("leader    {}", info.leader);
    if let Some(url) = &up.faas_http {
        println!("leader https {url} (the jobs API: POST /v1/jobs)");
    }
    for (id, addr, dir) in &info.capsule_hosts {
        println!("capsule host {id} {addr} (stores in {})", dir.display());
    }
    for (id, addr) in &info.coordinator_hosts {
        println!("coordinator host {id} {addr}");
    }
    for w in &info.workers {
        println!("worker {} control {}", w.id, w.control);
    }
    if let Some(kv) = &up.kv {
        println!(
            "kv capsule {} (owner key {}, mode 0600)",
            kv.capsule.display(),
            kv.owner.as_deref().unwrap_or(std::path::Path::new("-")).display()
        );
        println!("kv capsuledb writer {}", kv.capsuledb_writer);
        if let Some(m) = &kv.map {
            println!("kv shard map {} (version {})", m.display(), kv.map_version);
            if let Some(owner) = &kv.owner {
                println!("try: psl shard show --map {} --owner {}", m.display(), owner.display());
            }
        }
        for (i, m) in kv.front_ends.iter().enumerate() {
            println!("memcached {} {m}", i + 1);
        }
        // Shard 0's are the lines above; any front end serves every key.
        for (s, fes) in kv.shard_front_ends.iter().enumerate().skip(1) {
            for (i, m) in fes.iter().enumerate() {
                println!("memcached shard {s} {} {m}", i + 1);
            }
        }
        if let Some(h) = kv.http.first() {
            println!("try: psl verify {h} --policy {}", self_policy(a).display());
            if let Some(owner) = &kv.owner {
                println!(
                    "try: psl keys client --owner {} --capsule {} --can read,write,run --out client.cred",
                    owner.display(),
                    kv.capsule.display()
                );
            }
        }
        println!("try: psl memcached --listen {}:11311 --cluster {}", a.bind, a.dir.display());
    }
    println!("cluster file {}", cluster_path.display());
    println!("try: psl run examples/wordcount.js --lambdas 4 --cluster {}", cluster_path.display());
    // Tests and benchmarks read this line.
    println!("up {cold_ms:.1} ms");
    use std::io::Write;
    std::io::stdout().flush()?;
    Ok(())
}

/// Whether the deployment carries on without a child named `name` that exited.
fn dispensable(name: &str) -> bool {
    name.starts_with("worker")
        || name.starts_with("coordinator host")
        || name.starts_with("memcached")
        || name.starts_with("capsule host")
}

/// Watches the children until Ctrl-C or SIGTERM, or until one the deployment needs exits:
/// starts an exited leader again with `leader_args`; returns the exit code.
fn supervise(kids: &mut Vec<Kid>, leader_args: &[String]) -> i32 {
    let mut code = 0;
    while !STOP.load(Ordering::SeqCst) {
        // A child's exit and Ctrl-C are noticed within this (an idle deployment's supervisor
        // wakes five times a second).
        std::thread::sleep(Duration::from_millis(200));
        let mut restart_leader = false;
        for k in kids.iter_mut().filter(|k| !k.gone) {
            if let Ok(Some(st)) = k.child.try_wait() {
                k.gone = true;
                if k.name == "leader" && !leader_args.is_empty() {
                    // The leader holds keys only while a job runs, and a running job survives
                    // it (its coordinators, capsule hosts and workers go on; the client has a
                    // restarted leader take the job back): start it again, same address.
                    eprintln!("warning: the leader exited ({st}); starting it again on {}", leader_args[2]);
                    restart_leader = true;
                } else if dispensable(&k.name) {
                    // The scheduler drops a worker from the registry; the others carry on. Jobs
                    // run on the capsule hosts that are up, and stay durable while a majority is.
                    eprintln!("warning: {} exited ({st}); the deployment carries on without it", k.name);
                } else {
                    eprintln!("error: {} exited ({st}); stopping the deployment", k.name);
                    code = 1;
                    STOP.store(true, Ordering::SeqCst);
                }
            }
        }
        if restart_leader {
            match restart(leader_args) {
                Ok(k) => kids.push(k),
                Err(e) => {
                    eprintln!("error: starting the leader again: {e:#}; stopping the deployment");
                    code = 1;
                    STOP.store(true, Ordering::SeqCst);
                }
            }
        }
    }
    code
}

/// `psl up`: checks the arguments, starts the deployment (or, with `--config`, one host's
/// part of a cluster, or its shared files), writes the cluster file, prints the addresses and
/// watches the children until Ctrl-C or SIGTERM.
pub fn run(a: UpArgs) -> Result<i32> {
    match (&a.config, &a.host) {
        (Some(config), _) if a.init => return crate::cluster::init(config),
        (Some(config), Some(host)) => return crate::cluster::up_host(config, host),
        (Some(_), None) => bail!("--config needs --host NAME (or --init)"),
        _ => {}
    }
    if a.bind.is_unspecified() && a.advertise.is_none() {
        bail!("--bind {} needs --advertise IP: the address the other machines reach this one at", a.bind);
    }
    let t0 = Instant::now();
    let kv_front_ends = check_counts(&a)?;
    catch_signals();
    if !a.no_metrics {
        crate::kids::serve_metrics_on(a.bind);
    }
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let (attest_flags, policy_path) = attestation(&a)?;
    let attest_policy = policy_path.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let launch = Launch { a: &a, attest_flags, policy_path, attest_policy, deadline };
    let mut kids = Vec::new();
    let up = match launch.start(kv_front_ends, &mut kids) {
        Ok(up) => up,
        Err(e) => {
            stop_all(&mut kids);
            return Err(e);
        }
    };
    let cluster_path = a.dir.join("cluster.json");
    write_cluster_file(&cluster_path, &up)?;
    let cold_ms = t0.elapsed().as_secs_f64() * 1e3;
    print_summary(&a, &up, &cluster_path, cold_ms)?;
    let code = supervise(&mut kids, &up.leader_args);
    eprintln!("stopping {} processes", kids.len());
    stop_all(&mut kids);
    let _ = std::fs::remove_file(&cluster_path);
    Ok(code)
}
