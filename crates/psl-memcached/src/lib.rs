//! SecureCached: a memcached-compatible front end on PSL's secure, replicated store.
//!
//! Every memcached client can use the store: the text protocol of memcached 1.6 (`get`,
//! `gets`, `set`, `add`, `replace`, `append`, `prepend`, `cas`, `delete`, `incr`, `decr`,
//! `touch`, `gat`, `gats`, `flush_all`, `stats`, `version`, `verbosity`, `quit`, `noreply`)
//! and the meta commands (`mg`, `ms`, `md`, `ma`, `mn`). Each item is one KV value of a
//! [`psl_node::Node`], so each write is an op in a sealed, signed, encrypted DataCapsule record
//! that the other nodes verify before applying.
//!
//! Module map:
//! - [`proto`]: the parser: pure, bounded, never panics (fuzzed by `fuzz/fuzz_targets/memcached_parser.rs`).
//! - [`op`]: [`op::Rmw`], a read-modify-write command run at a key's home, and
//!   [`op::Outcome`], what it did: the values front ends pass to each other.
//! - [`item`]: an item's value layout (flags, absolute expiry, store time, payload) and the
//!   CAS unique derived from the record version.
//! - [`store`]: [`FrontEnd`]: the semantics (expiry, flush_all, CAS, incr/decr, striped
//!   per-key locks, home-front-end arbitration, LRU eviction of local copies).
//! - [`exec`]: runs a parsed command and writes the exact memcached reply.
//! - [`session`]: one connection's protocol state, free of I/O: parses what was read, answers
//!   pipelined requests in order, keeps its buffers bounded.
//! - [`server`]: [`Server`]: binds and serves with one of two runtimes, both thin I/O around
//!   sessions: `evloop` (plain TCP: one `mio` event loop per worker thread, as memcached's
//!   libevent workers) or tokio tasks (TLS, rustls with aws-lc-rs). Idle timeout,
//!   connection limit. `config`: the settings and errors both runtimes share.
//! - `lru`: sharded LRU memory accounting. [`stats`]: the `stats` counters.
//! - [`peer`]: forwarding conditional commands to a key's home front end in another process:
//!   sealed frames over TCP, their codec (fuzzed with the parser), bounded timeouts; the home
//!   side serves a [`peer::PeerService`] (the front end).
//! - [`shards`]: a key space of several shards: each command on a key of another shard goes,
//!   whole, to a front end of that shard over the peer channel.
//! - [`home`]: home failover as an I/O-free state machine (leases per slot granted by a
//!   majority, Lamport fences, hand-over of acknowledged writes), tested in a seeded
//!   simulation.
//! - [`failover`]: its runtime in a group of front-end processes (three or more): a driver
//!   thread, hand-overs and prunes, control messages on the peer channel, and the routing of
//!   conditional commands to each slot's current home, through a [`failover::FailoverHost`]
//!   (the front end).
//!
//! Imports go one way: `store` uses `failover` and `peer`, which use `op` and `home`; the two
//! lower modules reach the front end only through the traits they define.
//! - [`deploy`]: in-process deployments (the embedded default, test and bench groups; the
//!   caller may add a CapsuleDB role on their hub).
//!
//! # Semantics and their cost
//!
//! **CAS uniques** are a 64-bit mix of the record version `(lamport, writer)` of the item
//! ([`item::cas_of`]), so every front end that holds the same version reports the same unique;
//! two versions of one key collide with probability 2^-63 (uniques stay below 2^63, which
//! libmemcached and Java clients need). As in memcached 1.6, `touch`, `gat`, `gats` and `mg`
//! with `T` keep the unique: the touch's new version carries the old unique in the item
//! ([`item::encode_keeping`]); every data-changing write gets a new one.
//!
//! **Read-modify-write commands** (`cas`, `add`, `replace`, `append`, `prepend`, `incr`,
//! `decr`, `touch`, `gat`, `gats`, `ms` with a mode or `C`, `md` with `C`, `ma`, `mg` with `T`
//! or `N`) run under a striped lock (1024 stripes) of the key's *home* front end:
//! `hash(key) mod group size` ([`FrontEnd::join_group`]). Two of them on one key are therefore
//! serialized wherever they arrive: of two `cas` with one unique exactly one is `STORED`.
//! Cost: a command whose home is another front end is forwarded: in one process a direct call
//! into the home (about a microsecond); between processes one sealed request/reply round trip
//! on a pooled TCP connection to the home's peer address ([`peer`]). The home's own node does
//! the write, and the home compares against *its* memtable, so a `cas` whose unique the home
//! has not applied yet fails with `EXISTS` (safe; the client retries after the replication
//! delay, one `sync` at most). Plain `get`, `set` and `delete` are never forwarded: a `set` on
//! another front end racing a `cas` is ordered by record version, as if it came before or after.
//! With static homes, a home that cannot be reached within the peer timeout makes the command
//! fail with `SERVER_ERROR` (never a hang, never a local decision). A group of three
//! processes or more fails homes over instead ([`failover`]): another member takes a dead
//! home's keys over after a safe hand-over. See `docs/protocol/memcached.md` §6.
//!
//! **Expiry**: relative seconds up to 30 days, absolute Unix time above, negative = expired
//! at once; stored as an absolute time in the item, checked on every read.
//! **flush_all \[delay\]** writes a replicated state key ([`store::FLUSH_KEY`]): items stored
//! before the flush time read as missing on every front end once that time has come. Each
//! front end re-reads that key at most every millisecond (a local flush updates it at once).
//!
//! **Memory limit**: each front end accounts the items it wrote or read (key + value +
//! overhead) in a sharded LRU; past the limit it evicts the least recently used, counted in
//! `evictions`. Eviction drops the local copy only. Without CapsuleDB a tombstone just above the
//! item's version is applied to this node's memtable (never sealed or sent), which frees the
//! value; any newer write replaces it; other nodes keep their copies, and the key reads as
//! missing here until it is written again. With CapsuleDB (`NodeOptions::capsuledb`) the entry
//! leaves the memtable only once CapsuleDB holds its version (`Memtable::evict_key`; until then
//! it is *pinned*, still counted), and a later read gets it back from CapsuleDB with its
//! original version: same value, flags and CAS unique (`docs/protocol/memcached.md` §7).
//!
//! **Durability** is SCL's: a write is in the local memtable and queued for sealing when the
//! reply is sent; see `docs/protocol/scl.md`.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
mod config;
pub mod deploy;
mod evloop;
pub mod exec;
pub mod failover;
pub mod home;
pub mod item;
mod lru;
pub mod op;
pub mod peer;
pub mod proto;
pub mod server;
pub mod session;
pub mod shards;
pub mod stats;
pub mod store;

pub use exec::VERSION;
pub use server::{tls_acceptor, Server, ServerConfig, ServerError};
pub use stats::Stats;
pub use store::{Config, FrontEnd, Versioned};
