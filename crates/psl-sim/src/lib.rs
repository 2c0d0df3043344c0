//! A seeded, deterministic simulator of SCL.
//!
//! Module map:
//! - [`config`]: what a run looks like ([`SimConfig`]): nodes, writers, coordinators, workload,
//!   fault rates and schedule.
//! - [`net`]: the simulated untrusted network: per-link loss, duplication, delay (so reordering),
//!   corruption, replay, partitions.
//! - [`node`]: one simulated node: the real [`psl_scl::NodeCore`], memtable, verifier and
//!   writers ([`psl_capsule::Author`]), driven inline instead of by threads.
//! - [`server`]: simulated capsule servers: the real `psl_server::ServerCore` and commit path
//!   over [`server::SimDisk`], a disk that loses unsynced writes (or keeps a torn prefix) when
//!   its server crashes.
//! - [`run`]: the event loop, the fault schedule and the invariants checked after every step.
//! - [`scale`]: the scale scenario: N nodes over several capsules, delivered by NATS-style
//!   subjects (`psl_fabric::subject`), with what the router tree's flood would have cost
//!   beside it; records and bytes received per node per second, memory per node.
//!
//! Everything random comes from one seed (network, workload, faults, and the record salts), so
//! a seed replays exactly: `psl sim --seeds 1 --start SEED`.

pub mod config;
pub mod net;
pub mod node;
pub mod run;
pub mod scale;
pub mod server;

pub use config::SimConfig;
pub use run::{run_seed, SimReport, Violation};
pub use scale::{run_scale, ScaleConfig, ScaleReport};
