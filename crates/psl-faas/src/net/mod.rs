//! The FaaS roles as separate processes on the network.
//!
//! - [`wire`]: length-prefixed JSON frames and every message of the roles.
//! - [`leader`]: `psl leader` (trusted): TLS only; attests itself to clients, takes the owner
//!   key, attests workers and grants them keys, places the job's coordinators on coordinator
//!   hosts, sends RESET.
//! - [`scheduler`]: `psl scheduler` (untrusted): worker registry with heartbeats, forwards
//!   sealed jobs, relays sealed results. Plain TCP: it only ever sees sealed bytes.
//! - [`worker`]: `psl worker`: registers and heartbeats, attests to the leader over TLS, runs
//!   its slots on a `psl_node::Node` attached to the router, seals its results for the client.
//! - [`coordhost`]: `psl coordinator-host`: a job's coordinator (primary or shadow) as its own
//!   attested process, and the leader's link to it.
//! - [`host`]: `psl capsule-host`: a capsule server per job (durable copies of the job's
//!   records), opened and closed by the leader.
//! - [`client`]: what `psl run --cluster` does, and the cluster file ([`ClusterInfo`]).

pub mod client;
pub mod coordhost;
pub mod host;
pub mod kvkeys;
pub mod leader;
pub mod scheduler;
pub mod wire;
pub mod worker;

pub use client::{run_remote, run_remote_with, ClusterInfo, JobProgress, Progress, RemoteJob, WorkerInfo};

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (processes of one machine share this clock, so the
/// launch breakdown can subtract times taken in different processes).
pub fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// An `Instant` of this process as Unix microseconds.
pub fn instant_us(i: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (a, u) = *ANCHOR.get_or_init(|| (Instant::now(), unix_us()));
    if i >= a {
        u + (i - a).as_micros() as u64
    } else {
        u.saturating_sub((a - i).as_micros() as u64)
    }
}
