//! The untrusted multicast network of PSL: the [`Fabric`] trait and its backends.
//!
//! The fabric carries opaque byte messages (sealed, signed DataCapsule records and small
//! protocol messages) and never interprets them: whatever it does to them, dropping,
//! duplicating, reordering, corrupting, replaying, is caught by the verifier and repaired by the
//! layers above. So it is deliberately lossy and bounded: every queue has a length and a byte
//! limit, and a message that does not fit is dropped and counted, never buffered without bound.
//!
//! Module map:
//! - [`fabric`]: the [`Fabric`] trait (`publish` to every other endpoint, `recv_timeout`,
//!   `try_recv`, `stats`) and its contract.
//! - [`inproc`]: [`InProcHub`] and [`InProcEndpoint`]: the fabric inside one process (tests,
//!   the embedded single-process deployment).
//! - [`tcp`]: [`TcpEndpoint`]: an endpoint attached to a router, reconnecting with backoff.
//! - [`nats`]: [`NatsEndpoint`]: an endpoint on a NATS deployment (`async-nats` on its own
//!   runtime thread): one subject tree per capsule, subscriptions by role, failover among the
//!   cluster's servers, credentials and TLS; reconnects and slow consumers counted.
//! - [`natsd`]: [`natsd::NatsServer`]: a local `nats-server` process with a generated
//!   configuration (`psl up --fabric nats`, the benchmark, the tests).
//! - [`subject`]: the NATS subject of a message (classified by its public SCL header; why
//!   there is no topic argument is explained there) and the subjects of a role ([`Interest`],
//!   also sent to a router as an interest frame).
//! - [`url`]: [`FabricUrl`] (`psl://HOST:PORT`, `nats://H1:4222,nats://H2:4222`) and
//!   [`FabricSpec`] (a URL and its NATS options), which connects a role's endpoint.
//! - [`router`]: [`Router`], [`RouterConfig`], [`RouterHandle`]: one node of a tree of routers
//!   that forwards every frame to every other link that wants it (an endpoint's interest
//!   frame filters its link); bounded per-link queues, per-link counters.
//! - [`frame`]: the wire format `u32 LE length ‖ payload` and its bounded, never-panicking
//!   incremental decoder.
//! - [`fault`]: [`FaultConfig`] and [`FaultInjector`]: the seeded adversary (drop, duplicate,
//!   reorder, delay, corrupt, replay) as a pure state machine.
//! - [`adversary`]: [`Adversarial`]: any endpoint with the adversary on its publish and/or
//!   receive side. (The router runs the same injector on each link's send path.)
//! - [`switch`]: [`Switch`]: any endpoint behind an on/off switch (a cut link, both ways).
//! - [`config`]: [`FabricConfig`] (queue and frame limits) and [`LinkTiming`] (connect,
//!   backoff, heartbeat, idle and write timeouts).
//! - [`stats`]: [`FabricStats`] and [`FaultStats`].
//! - [`error`]: [`FabricError`], [`RouterError`], [`ConfigError`].
//! - [`cli`]: [`RouterArgs`] and [`run_router`], the library side of `psl router`;
//!   [`FabricArgs`], the `--fabric URL` (alias `--router`) and `--nats-*` flags of every role.
//! - [`accept`]: [`accept_within`], a TCP listener's accept that waits in `poll(2)` (for the
//!   roles' control and read listeners, which must also notice a stop flag).
//! - `link` (private): a TCP link's outbound queue, read loop and write loop, shared by the
//!   router and the TCP endpoint. `queue` (private): the bounded receive queue.
//!
//! Defaults: `frame_bytes_max` 16 MiB, queues 4096 messages and 64 MiB, connect timeout 2 s,
//! reconnect backoff 50 ms doubling to 2 s, heartbeat every 1 s when idle, idle timeout 5 s,
//! write timeout 5 s.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod accept;
pub mod adversary;
pub mod cli;
pub mod config;
pub mod error;
pub mod fabric;
pub mod fault;
pub mod frame;
pub mod inproc;
mod link;
pub mod nats;
pub mod natsd;
mod queue;
pub mod router;
pub mod stats;
pub mod subject;
pub mod switch;
pub mod tcp;
pub mod url;

pub use accept::accept_within;
pub use adversary::{Adversarial, AdversaryStats};
pub use cli::{run_router, FabricArgs, RouterArgs};
pub use config::{FabricConfig, LinkTiming, FRAME_BYTES_MAX_DEFAULT};
pub use error::{ConfigError, FabricError, RouterError};
pub use fabric::{Fabric, Message};
pub use fault::{FaultConfig, FaultInjector};
pub use frame::{FrameDecoder, FrameError};
pub use inproc::{InProcEndpoint, InProcHub};
pub use nats::{NatsConfig, NatsEndpoint};
pub use router::{LinkRole, LinkStats, LinkTotals, Router, RouterConfig, RouterHandle, RouterStats};
pub use stats::{FabricStats, FaultStats};
pub use subject::Interest;
pub use switch::Switch;
pub use tcp::{TcpConfig, TcpEndpoint};
pub use url::{FabricSpec, FabricUrl};
