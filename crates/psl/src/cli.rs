//! The command line of `psl`: one subcommand per user task and per role. `bench`, `report` and
//! `chaos` take their arguments raw and hand them to `psl-tools` ([`crate::tools`]).

use crate::{
    attest, capsule, capsuledb, demo, doctor, faas_roles, keys, kv, memcached, roles, run, shard, sim, status, tools,
    up,
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "psl",
    version = crate::VERSION,
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
    #[command(flatten)]
    metrics: roles::MetricsArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create and inspect owner keys (BIP32 master keys on secp256k1).
    #[command(subcommand)]
    Keys(keys::KeysCmd),
    /// Create, append to, inspect, verify, merge and prove DataCapsules.
    #[command(subcommand)]
    Capsule(capsule::CapsuleCmd),
    /// Show a KV deployment's shard map (verified), and which shard holds a key.
    #[command(subcommand)]
    Shard(shard::ShardCmd),
    /// Run a benchmark; `--json` prints one JSON object (psl-tools; `psl bench --help`).
    #[command(disable_help_flag = true)]
    Bench(tools::ToolArgs),
    /// Run every benchmark and write a report: markdown, HTML, PNG plots, JSON (psl-tools).
    #[command(disable_help_flag = true)]
    Report(tools::ToolArgs),
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
    /// exit 0 only if every seed passes every check (psl-tools).
    #[command(disable_help_flag = true)]
    Chaos(tools::ToolArgs),
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
    /// Check a role's HTTPS endpoint (`--http`) before trusting it: its evidence under a policy,
    /// bound to the TLS key this client sees and to a fresh nonce; exit 0 only if it verifies.
    Verify(crate::verify::VerifyUrlArgs),
    /// Say what this machine offers and lacks (TEEs, nats-server, memcached, ports, limits, disk,
    /// clock): one PASS/WARN/FAIL line each, with the fix; exit 1 if any FAILs.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script: `psl completions bash > /etc/bash_completion.d/psl`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Parses the command line, runs the command and exits with its code.
pub fn main() -> ! {
    crate::init_tracing();
    let cli = Cli::parse();
    if prints_only(&cli.cmd) {
        end_quietly_on_a_closed_pipe();
    }
    crate::exit_with(run(cli))
}

/// Commands that read files and print, and touch no socket and no child: `psl capsule show … |
/// head` ends them the way it ends `cat`, not with `println!`'s panic on a closed pipe. Roles and
/// clients keep SIGPIPE ignored (Rust's default), so a peer that hangs up is an error they handle.
fn prints_only(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Keys(_) | Cmd::Capsule(_) | Cmd::Shard(_) | Cmd::Attest(_) | Cmd::Doctor(_) | Cmd::Completions { .. }
    )
}

/// Restores SIGPIPE's default action (end the process), as before Rust's runtime ignored it.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: signal(2) with SIG_DFL installs no handler and takes no pointer; it only sets this
    // process's disposition for one signal. It runs on the main thread before any other thread
    // exists, so nothing observes the change half made.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Keys(c) => keys::run(c),
        Cmd::Capsule(c) => capsule::run(c),
        Cmd::Shard(c) => shard::run(c),
        Cmd::Bench(a) => tools::run("bench", a),
        Cmd::Report(a) => tools::run("report", a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Node(a) => roles::run_node(a),
        Cmd::Coordinator(a) => roles::run_coordinator(a),
        Cmd::Router(a) => {
            a.budget.watch(roles::RoleKind::Router, "router");
            // The router's own figures are its process's (it keeps no counters of its own yet).
            let _metrics = a.metrics.serve(String::new, true)?;
            psl_fabric::run_router(a.router).map(|()| 0)
        }
        Cmd::Kv(c) => kv::run(c),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Chaos(a) => tools::run("chaos", a),
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
        Cmd::Verify(a) => crate::verify::run(a),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "psl", &mut std::io::stdout());
            Ok(0)
        }
    }
}
