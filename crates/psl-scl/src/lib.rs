//! The Secure Concurrency Layer's protocol engines: pure state machines and the shared
//! in-memory structures of a node's trusted core. No threads, sockets, files or clocks here:
//! callers pass the time in and carry the outputs out, so that the threaded runtime
//! (`psl-node`) and the seeded simulator (`psl-sim`) drive exactly the same logic.
//!
//! Module map:
//! - [`memtable`]: the concurrent key-value map with last-writer-wins by `(lamport, writer)`,
//!   optionally bounded (evicts cold keys CapsuleDB holds), with an optional update journal;
//!   atomic batches apply under every shard they touch and a scan gate.
//! - [`inline_key`]: [`InlineKey`], a map key that keeps short keys in the table's slot.
//! - [`clock`]: the node's Lamport clock.
//! - [`wire`]: the messages nodes exchange over the untrusted fabric (records, repair requests
//!   with an optional origin-only flag, heads hints, capsule servers' and CapsuleDB's acks).
//! - [`dbwire`]: CapsuleDB's messages: sealed read requests, signed sealed answers carrying the
//!   original version, signed frontiers (what bounded memtables may evict).
//! - [`orderer`]: the receive state machine: per-writer `seq` order, hold-back, gap repair,
//!   duplicate/replay/equivocation detection, withholding reports.
//! - [`coordinator`]: the epoch state machine of a coordinator (RTS, EOE collection, SYNC),
//!   primary or shadow; it holds before a key rotation epoch until it has its new key.
//! - [`node`]: [`NodeCore`], one node's protocol logic: orderer + optional coordinator + the
//!   record cache that answers repairs + the `sync()` barrier + application key rotation
//!   (installing certificates, refusing retired-key records before any signature check) +
//!   ack counting (durability from the servers, flow control from them and CapsuleDB).
//! - [`engine`]: [`NodeEngine`], the node behind one interface: events in, [`Command`]s out;
//!   it owns the [`NodeCore`] and drives the coordinator's writer (and its own-chain log).
//!   The runtime's core thread and the simulator both run it, and both put client writes
//!   through its per-writer queues (`engine::queue`: admission, stamp, seal policy) and
//!   CapsuleDB reads through its table of asks (`engine::asks`).
//! - [`announce`]: the key statements (own writers' certificates, revocations) a node (or a
//!   capsule server) announces on the fabric, repeated at intervals that double from
//!   [`node::CERTS_ANNOUNCE_MS`] while nothing new is heard (a handler of the [`NodeCore`]).
//! - [`window`]: a writer's flow-control window toward what paces it (a quorum of capsule
//!   servers, CapsuleDB, pacing peers), shared by the runtime's `put` and writer actor.
//! - `repair`: the repair cache that answers peers' requests, the answers owed, the heads
//!   hints not yet asked for (a handler of the [`NodeCore`]).
//! - `barrier`: the pending `sync()` barriers (a handler of the [`NodeCore`]).
//! - `durability`: the servers' acks per own writer, the quorum, and the durability barriers
//!   answered with a [`QuorumDurable`] proof (a handler of the [`NodeCore`]).
//! - `flow`: what paces the own writers beside the durability quorum (CapsuleDB's acks, peers'
//!   tagged heads hints) and the own heads hinted to peers (a handler of the [`NodeCore`]).
//! - `rejoin`: the rejoin period after a start (delay, persisted own-chain floor, probes) and
//!   the own coordinator chain's head it resumes from (a handler of the [`NodeCore`]).
//! - [`metrics`]: counters, rejections by reason, Prometheus text.
//! - [`shard`]: a key's point in the hash space and the shard map's codec and rules
//!   (`docs/protocol/sharding.md`; the rest of that design is not built yet).
//!
//! The protocol is described in `docs/protocol/scl.md`.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod announce;
mod barrier;
pub mod clock;
pub mod coordinator;
pub mod dbwire;
mod durability;
pub mod engine;
mod flow;
pub mod inline_key;
pub mod memtable;
pub mod metrics;
pub mod node;
pub mod orderer;
mod rejoin;
mod repair;
pub mod shard;
pub mod window;
pub mod wire;

pub use clock::LamportClock;
pub use coordinator::{CoordinatorConfig, CoordinatorSm};
pub use engine::{Command, NodeEngine};
pub use inline_key::InlineKey;
pub use memtable::{Entry, EvictKey, Lookup, Memtable, Version};
pub use metrics::{Metrics, RejectReason};
pub use node::{
    DurableStatus, DurableTicket, NodeConfig, NodeCore, Output, QuorumDurable, SyncTicket, CACHE_BYTES_MAX_DEFAULT,
};
pub use orderer::{Chained, Orderer, OrdererAction, OrdererConfig, TickWork};
pub use wire::{Ack, AckEntry, Msg, WireError};

/// Capsule servers' writer indices (`SERVER_WRITER_BASE + id`, `id < SERVERS_MAX`): servers sign
/// acks with these keys and never write records (see `docs/protocol/durability.md`). Defined in
/// `psl-capsule`, whose membership proofs refuse them, and re-exported here under the same names.
pub use psl_capsule::{server_id, server_writer, SERVERS_MAX, SERVER_WRITER_BASE};

/// The writer index of actor `actor` of node `node` in its `incarnation`:
/// `node << 16 | incarnation << 4 | actor` (node 1 to 32766, incarnation below 2^12, actor
/// below 16; node 32767 is left out so that no worker writer collides with the coordinators'
/// indices just below 2^31). A restarted node takes a new incarnation, so it never re-uses a (writer, seq)
/// slot that a record from before the crash may still occupy somewhere in the network.
pub fn writer_index(node: u32, incarnation: u32, actor: u32) -> Option<u32> {
    ((1..(1 << 15) - 1).contains(&node) && incarnation < 1 << 12 && actor < 16)
        .then_some((node << 16) | (incarnation << 4) | actor)
}
