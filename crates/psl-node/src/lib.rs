//! A PSL node: the threaded runtime that runs the SCL protocol engines of `psl-scl`.
//!
//! ```text
//!  put/delete ─▶ writer actor queues (bounded, one per writer, by key) ─▶ writer actors
//!                 (memtable updated at put time)                         batch→seal→sign
//!                                                                            │ local records
//!   get ◀── memtable ◀── core thread (NodeCore: orderer, coordinator, cache, sync barriers)
//!                          │  ▲ verified / rejected            │ publish
//!                          ▼  │                                ▼
//!           verify actors (pool; none: the core)    ═══ boundary: outbound SPSC ring ═══▶ host: fabric.publish
//!                          ▲                                                                    
//!             dispatcher ◀═══ boundary: inbound SPSC ring ◀═══ host: fabric.recv
//! ```
//!
//! Module map:
//! - [`node`]: [`Node`]: start, `put`/`delete`/`get`/`sync`, metrics, shutdown; installing an
//!   application key rotation ([`NodeRotation`]) through the core's and writers' channels.
//! - [`options`]: [`NodeOptions`] and the limits of every queue.
//! - `actor`: writer actors (one [`psl_capsule::Author`] each), each sharing its writer's queue
//!   (`psl_scl::engine::queue::WriterQueue`) with `put` under one lock; they wait as its seal
//!   policy says.
//! - `core`: the core thread that owns the [`psl_scl::NodeCore`]; `msg`: what it is sent.
//! - `mono`: this process's monotonic clock in ms and µs, the time base of the flow windows
//!   and seal policies.
//! - [`flow`]: `psl_scl::window` under the name the options have always used: flow control
//!   from the capsule servers', CapsuleDB's and peers' acks back to the writers: a writer
//!   runs at most [`flow::FlowOptions::window_ops`] ops and [`flow::FlowOptions::window_records`]
//!   records ahead of what a quorum holds, a live CapsuleDB has taken in and its pacing peers
//!   have applied. The window's logic is the engine's; the runtime waits on it.
//! - [`chainlog`]: a coordinator's own-chain log (write-ahead of every record it signs), so a
//!   coordinator restarted on its state directory never signs a seq twice.
//! - `dbclient`: the CapsuleDB miss path: sealed requests, verified answers and frontiers
//!   (bounded memtables evict what CapsuleDB holds and ask it back); the requests waiting and
//!   the answers' intake are the engine's (`psl_scl::engine::asks`).
//! - `host`: the untrusted side: two threads moving messages between the rings and the fabric.
//! - [`recovery`]: a node restarting empty rebuilds its memtable from the capsule servers'
//!   read interface (freshness-checked) before it rejoins, under an incarnation above any the
//!   servers have seen.
//! - [`control`]: the line-based TCP control interface (`psl node --control`) and its client.
//! - [`memory`]: the process's memory budget: resident memory sampled against it, in every
//!   node's metrics (`psl_process_*`).
//!
//! The rings' waiters park once they run out of spins; the peer's next push or pop rings them
//! awake (`psl_boundary::BackoffPolicy::parking`).
//!
//! Trust: everything but `host` is the trusted core. The host side sees only what crosses the
//! rings: sealed, signed records and repair/heads messages; never a key or a plaintext byte.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
mod actor;
pub mod chainlog;
pub mod control;
mod core;
mod dbclient;
mod host;
pub mod memory;
mod mono;
mod msg;
pub mod node;
pub mod options;
pub use psl_scl::window as flow;
pub mod recovery;
mod ring;

pub use dbclient::DbClientStats;
pub use msg::RotationState;
pub use node::{KeySource, Node, NodeError, NodeKeys, NodeRotation};
pub use options::NodeOptions;
