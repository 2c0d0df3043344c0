//! `psl`: the product of PSL, one binary with a subcommand per user task and per role; this
//! library is that binary's code (`src/main.rs` only picks the allocator and calls
//! [`cli::main`]). The tools (`psl bench`, `psl report`, `psl chaos`) live in the `psl-tools`
//! crate, a binary of their own that `psl` runs ([`tools`]) and that uses this library's helpers;
//! nothing here depends on it.
//!
//! Module map:
//! - `cli`: the command line (clap), `psl completions SHELL` (clap_complete), and `psl --version`
//!   with the git commit `build.rs` found ([`VERSION`]).
//! - `tools`: `psl bench|report|chaos ...`: runs the `psl-tools` binary beside this one with the
//!   same arguments, as git runs its external subcommands; `psl sim --plot`'s drawing.
//! - `keys`: owner key files (`psl keys ...`).
//! - `capsule`: the DataCapsule tool (`psl capsule ...`).
//! - `demo`: the embedded end-to-end demonstration (`psl demo`).
//! - `roles`: long-running roles: `psl node`, `psl coordinator`, `psl capsule-server`
//!   (`psl router` comes from psl-fabric); every role's `--metrics ADDR` (Prometheus over
//!   HTTP) and the trusted roles' `--http ADDR` (the attested HTTPS endpoint), on `psl-http`.
//! - `api`: the HTTPS API's KV routes over a front end or a node (atomic batches included) and
//!   the leader's jobs routes (a job's progress as signed server-sent events), behind client
//!   credentials, every answer signed by the endpoint's attested TLS key.
//! - `verify`: `psl verify URL --policy FILE`: a role's HTTPS endpoint checked before it is
//!   trusted (its evidence, bound to the TLS key this client sees and to a fresh nonce).
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
//! - `shard`: the shard map capsule that `psl up --kv` and `--init` write beside the KV
//!   capsule, and `psl shard show|which` (docs/protocol/sharding.md §3).
//! - `capsuledb`: `psl capsuledb`: the CapsuleDB role, `snapshots` and `get --at`.
//! - `kv`: the client of a node's control interface (`psl kv put|get|del|sync|stats|dump`).
//! - `kvkeys`: the KV roles' keys, from the leader or from the owner key.
//! - `sim`: the seeded simulator over many seeds (`psl sim`).
//! - `util`: helpers shared by the commands and by `psl-tools` (atomic writes, key loading,
//!   progress bars, the binaries beside this one).
//! - `doctor`: `psl doctor`: what this machine offers and lacks (TEEs, nats-server, ports, limits).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod api;
mod attest;
mod capsule;
pub mod capsuledb;
pub mod cli;
mod cluster;
mod demo;
mod doctor;
mod faas_roles;
mod keys;
pub mod kids;
mod kv;
mod kvkeys;
pub mod memcached;
pub mod roles;
mod run;
pub mod shard;
mod sim;
pub mod status;
pub mod tools;
mod up;
pub mod util;
mod verify;

/// `psl --version` (and `psl-tools --version`): the crate version and the git commit.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("PSL_GIT_COMMIT"), ")");

/// Logs to stderr, filtered by `PSL_LOG` (default `warn`), in colour on a terminal.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PSL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Exits with a command's code, or prints its error and exits 2.
pub fn exit_with(result: anyhow::Result<i32>) -> ! {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}
