//! `psl`: the one binary of PSL. A subcommand per user task and, as they are built, per role.
//!
//! Module map:
//! - `keys`: owner key files (`psl keys ...`).
//! - `capsule`: the DataCapsule tool (`psl capsule ...`).
//! - `bench`: benchmarks that print one JSON object (`psl bench NAME --json`).
//! - `demo`: the embedded end-to-end demonstration (`psl demo`).
//! - `util`: file helpers shared by the commands (atomic writes, key loading).

mod bench;
mod capsule;
mod demo;
mod keys;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "psl", version, about = "PSL: secure, stateful serverless lambdas on DataCapsules")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
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
    /// End-to-end demonstration on the embedded default: keys, a capsule with several writers,
    /// a SYNC, verification, a membership proof, a durable store round trip.
    Demo(demo::DemoArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PSL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
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
        Cmd::Demo(a) => demo::run(a),
    }
}
