//! A seeded, deterministic simulator of SCL.
//!
//! Module map:
//! - [`config`]: what a run looks like ([`SimConfig`]): nodes, writers, coordinators, workload,
//!   fault rates and schedule.
//! - [`net`]: the simulated untrusted network: per-link loss, duplication, delay (so reordering),
//!   corruption, replay, partitions.
//! - [`node`]: one simulated node: the product's [`psl_scl::NodeEngine`] (the same one
//!   `psl-node`'s core thread runs) with its data writers ([`psl_capsule::Author`]) inline
//!   instead of in threads; a coordinator's own-chain log in memory ([`node::SimLog`]).
//! - [`server`]: simulated capsule servers: the real `psl_server::ServerCore` and commit path
//!   over [`server::SimDisk`], a disk that loses unsynced writes (or keeps a torn prefix) when
//!   its server crashes.
//! - [`cluster`]: the nodes, coordinators and servers of one run, their deliveries, flushes and
//!   ticks, crashes and restarts (with a node's rebuild from the servers, a coordinator's
//!   restart from its own-chain log).
//! - [`workload`]: the ops the nodes issue (and, in the read-through scenario, their reads
//!   through CapsuleDB).
//! - [`revocation`]: the revocation scenario's leader (revokes a writer, RESETs its node) and
//!   adversary (forges records with the revoked key).
//! - [`checker`]: one checker per invariant (no unverified byte applied or stored, coherence,
//!   no equivocation, read your writes, durability, convergence, completeness, revocation
//!   learnt), over the history of what honest writers did.
//! - [`run`]: the loop: one step per simulated millisecond over the above, the report.
//! - [`scale`]: the scale scenario: N nodes over several capsules (shards of the key space),
//!   delivered by NATS-style subjects (`psl_fabric::subject`), with what the router tree's
//!   flood would have cost beside it; records and bytes received per node per second, memory
//!   per node, and over the deployment the ops applied and records verified per second.
//!
//! Everything random comes from one seed (network, workload, faults, and the record salts), so
//! a seed replays exactly: `psl sim --seeds 1 --start SEED`.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod checker;
pub mod cluster;
pub mod config;
pub mod net;
pub mod node;
pub mod revocation;
pub mod run;
pub mod scale;
pub mod server;
pub mod workload;

pub use config::SimConfig;
pub use run::{run_seed, SimReport, Violation};
pub use scale::{run_scale, ScaleConfig, ScaleReport};
