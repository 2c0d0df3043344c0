//! `psl`: the one binary of PSL. A subcommand per user task and, as they are built, per role.
//!
//! Module map:
//! - `keys`: owner key files (`psl keys ...`).
//! - `capsule`: the DataCapsule tool (`psl capsule ...`).
//! - `bench`: benchmarks that print one JSON object (`psl bench NAME --json`); `bench::loadgen`,
//!   the reusable YCSB load generator behind `psl bench ycsb`.
//! - `report`: `psl report --out DIR`: every benchmark, as plots and tables (md, html, json).
//! - `demo`: the embedded end-to-end demonstration (`psl demo`).
//! - `roles`: long-running roles: `psl node`, `psl coordinator`, `psl capsule-server`
//!   (`psl router` comes from psl-fabric).
//! - `run`: `psl run JOB.js`: a job of sandboxed lambdas on a running deployment (`--cluster`)
//!   or on the embedded FaaS deployment.
//! - `faas_roles`: `psl leader`, `psl scheduler`, `psl worker`, `psl coordinator-host`,
//!   `psl capsule-host` as processes.
//! - `attest`: `psl attest measure|verify`, and the `--attest` flags the roles share.
//! - `up`: `psl up`: the default deployment as child processes on loopback (or on given
//!   interfaces), on a router, a local nats-server, or a fabric given by URL.
//! - `cluster`: the cluster description (TOML) and `psl up --config F --host NAME`.
//! - `kids`: the child processes `up` and `cluster` start, watch and stop together.
//! - `status`: `psl status --config F`: every role's health, epoch, lag and counters.
//! - `memcached`: `psl memcached`: the SecureCached front end.
//! - `capsuledb`: `psl capsuledb`: the CapsuleDB role, `snapshots` and `get --at`.
//! - `kv`: the client of a node's control interface (`psl kv put|get|del|sync|stats|dump`).
//! - `sim`: the seeded simulator over many seeds (`psl sim`).
//! - `chaos`: seeded fault schedules over real processes and a checker (`psl chaos`).
//! - `util`: helpers shared by the commands (atomic writes, key loading, progress bars).
//! - `doctor`: `psl doctor`: what this machine offers and lacks (TEEs, nats-server, ports, limits).
//! - here: `psl completions SHELL` (clap_complete), and `psl --version` with the git commit
//!   `build.rs` found.

mod attest;
mod bench;
mod capsule;
mod capsuledb;
mod chaos;
mod cluster;
mod demo;
mod doctor;
mod faas_roles;
mod keys;
mod kids;
mod kv;
mod kvkeys;
mod memcached;
mod report;
mod roles;
mod run;
mod sim;
mod status;
mod up;
mod util;

use clap::{Parser, Subcommand};

// jemalloc instead of glibc malloc: every node allocates a key and a value per op and a
// record buffer of tens of KiB per batch, and freeing those made glibc consolidate its arenas
// (~5% of CPU). `psl bench scl --cases w1` measured 2.2-2.4 µs of CPU per put with jemalloc
// against 2.8-3.3 µs with glibc (and 3.1-3.6 µs with mimalloc), same run, same machine.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "psl",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("PSL_GIT_COMMIT"), ")"),
    about = "PSL: secure, stateful serverless lambdas on DataCapsules"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// `psl router`: the fabric's router, with the memory budget every long-running role takes.
#[derive(clap::Args, Debug)]
struct RouterCmd {
    #[command(flatten)]
    router: psl_fabric::RouterArgs,
    #[command(flatten)]
    budget: roles::BudgetArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create and inspect owner keys (BIP32 master keys on secp256k1).
    #[command(subcommand)]
    Keys(keys::KeysCmd),
    /// Create, append to, inspect, verify, merge and prove DataCapsules.
    #[command(subcommand)]
    Capsule(capsule::CapsuleCmd),
    /// Run a benchmark; `--json` prints one JSON object.
    Bench(bench::BenchArgs),
    /// Run every benchmark and write a report (markdown, self-contained HTML, PNG plots, JSON).
    Report(report::ReportArgs),
    /// End-to-end demonstration on the embedded default: keys, a capsule with several writers,
    /// a SYNC, verification, a membership proof, a durable store round trip.
    Demo(demo::DemoArgs),
    /// Run a worker node: memtable, writer and verify actors, fabric client, control interface.
    Node(roles::NodeArgs),
    /// Run a coordinator (primary or shadow): RTS every epoch, SYNC over every writer's EOE.
    Coordinator(roles::CoordinatorArgs),
    /// Run a router of the multicast tree (untrusted; may inject faults for tests).
    Router(RouterCmd),
    /// Talk to a node: put, get, del, sync, stats, dump, call (signed with --control-key).
    Kv(kv::KvArgs),
    /// Run the seeded simulator; exit 0 only if every seed holds every invariant.
    Sim(sim::SimArgs),
    /// Run seeded fault schedules over real processes on loopback and check the history;
    /// exit 0 only if every seed passes every check.
    Chaos(chaos::ChaosArgs),
    /// Run a JavaScript job on N lambdas (embedded deployment, or --cluster; sim attestation is INSECURE).
    Run(run::RunArgs),
    /// Start the default deployment on this machine (router, capsule hosts, scheduler, leader, workers) until Ctrl-C; `--attest sim` (INSECURE, the default here) or hardware.
    Up(up::UpArgs),
    /// Show every role's health, epoch, lag and counters across the hosts of a cluster file.
    Status(status::StatusArgs),
    /// Run the FaaS leader (trusted): attests workers under a policy file, hands out keys, RESETs.
    Leader(faas_roles::LeaderArgs),
    /// Run the FaaS scheduler (untrusted): worker registry, forwards sealed programs.
    Scheduler(faas_roles::SchedulerArgs),
    /// Run a FaaS worker: attests to the leader (--attest), runs lambdas on SCL.
    Worker(faas_roles::WorkerArgs),
    /// Run a capsule server for FaaS jobs: the leader opens each job's capsule on it.
    CapsuleHost(faas_roles::CapsuleHostArgs),
    /// Run a coordinator host: each job's coordinator of one rank (primary or shadow), placed
    /// and keyed by the leader after attestation.
    CoordinatorHost(faas_roles::CoordinatorHostArgs),
    /// Run a DataCapsule server (verified durable storage, signed acks), or check its storage.
    CapsuleServer(roles::CapsuleServerArgs),
    /// Serve the memcached protocol on the secure store (SecureCached).
    Memcached(Box<memcached::MemcachedArgs>),
    /// Run CapsuleDB (the LSM tree of DataCapsule records behind bounded memtables), or list
    /// its snapshots / read a key as of one.
    Capsuledb(capsuledb::CapsuleDbArgs),
    /// Attestation: print the measurements for a policy; verify a quote or report offline.
    #[command(subcommand)]
    Attest(attest::AttestCmd),
    /// Say what this machine offers and lacks (TEEs, nats-server, memcached, ports, limits, disk,
    /// clock): one PASS/WARN/FAIL line each, with the fix; exit 1 if any FAILs.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script: `psl completions bash > /etc/bash_completion.d/psl`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PSL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Keys(c) => keys::run(c),
        Cmd::Capsule(c) => capsule::run(c),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Report(a) => report::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Node(a) => roles::run_node(a),
        Cmd::Coordinator(a) => roles::run_coordinator(a),
        Cmd::Router(a) => {
            a.budget.watch(roles::RoleKind::Router, "router");
            psl_fabric::run_router(a.router).map(|()| 0)
        }
        Cmd::Kv(c) => kv::run(c),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Chaos(a) => chaos::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Up(a) => up::run(a),
        Cmd::Status(a) => status::run(a),
        Cmd::Leader(a) => faas_roles::run_leader(a),
        Cmd::Scheduler(a) => faas_roles::run_scheduler(a),
        Cmd::Worker(a) => faas_roles::run_worker(a),
        Cmd::CapsuleHost(a) => faas_roles::run_capsule_host(a),
        Cmd::CoordinatorHost(a) => faas_roles::run_coordinator_host(a),
        Cmd::CapsuleServer(a) => roles::run_capsule_server(a),
        Cmd::Memcached(a) => memcached::run(*a),
        Cmd::Capsuledb(a) => capsuledb::run(a),
        Cmd::Attest(c) => attest::run(c),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "psl", &mut std::io::stdout());
            Ok(0)
        }
    }
}
