//! The TEE boundary of a PSL node: two single-producer single-consumer rings of sealed records
//! between the trusted core and the untrusted host.
//!
//! Module map:
//! - [`boundary`]: [`Boundary::new`] → ([`CoreSide`], [`HostSide`]); per-side `push`,
//!   `push_blocking`, `pop`, `pop_batch`, `wait_pop`; [`BoundaryStats`], [`BoundaryMonitor`].
//! - [`ring`]: the SPSC rings themselves ([`ring::duplex`], [`ring::ring`], [`Producer`],
//!   [`Consumer`], [`Full`], [`RingStats`], [`RingMonitor`]): the layout (one cache line per
//!   crossing, request and answer in the same line), and the proof that the `unsafe` is sound.
//! - [`backoff`]: [`BackoffPolicy`], how blocked operations spin, yield and sleep.
//! - `bench` (feature `bench`, off by default; psl-tools turns it on): `bench_crossings`, the
//!   crossing benchmark (ring vs. the cache-line floor, `rtrb`, `std::sync::mpsc` and a pipe),
//!   and streaming throughput. `examples/crossings.rs` prints it as JSON.
//! - `padded`: 128-byte cache padding.
//!
//! # What crosses
//!
//! ```text
//!  trusted core                                   untrusted host
//!  CoreSide.outbound (Producer) ──ring──▶ HostSide.outbound (Consumer)  → fabric, capsule servers
//!  CoreSide.inbound  (Consumer) ◀──ring── HostSide.inbound  (Producer)  ← records from the network
//! ```
//!
//! Items are [`SealedRecord`]s: opaque, already sealed and signed bytes (`Arc<[u8]>`, so a
//! record moves through a ring as a 16-byte pointer, never copied). Keys and plaintext never
//! cross: the core seals before pushing and verifies after popping; the host only relays bytes.
//! The host never calls into the core per record, nor the core into the host: each side only
//! reads and writes the rings' shared memory. (In one process, "shared memory" is the heap; a
//! real enclave would place the rings in untrusted memory both can map, as the PSL paper's SCL
//! does.)
//!
//! # The SPSC guarantee
//!
//! Each ring has exactly one [`Producer`] and one [`Consumer`], made together by
//! [`ring::duplex`] or [`ring::ring`] (and so by [`Boundary::new`]). Neither is `Clone`; operations take `&mut self`; both
//! are `Send` (each can be moved to its own thread) and `!Sync` (never shared). So the
//! single-producer single-consumer discipline that the lock-free ring relies on is enforced by
//! the type system, not by convention. Within a ring, items arrive in push order, each exactly
//! once; items still in a ring are dropped with it, once the last end of its pair is gone.
//!
//! # Backpressure
//!
//! A ring's capacity (`capacity_items`, exact) bounds the records in flight in that direction.
//! A full ring refuses [`push`](Producer::push) and hands the record back in [`Full`]; a
//! [`push_blocking`](Producer::push_blocking) waits for room, and
//! [`wait_pop`](Consumer::wait_pop) for a record, under a [`BackoffPolicy`]:
//!
//! 1. spin, polling before every `PAUSE` (default 2048 polls, ~20–40 µs): a peer that answers
//!    meanwhile is seen one cache-line transfer later;
//! 2. yield the CPU between polls (default 64 times);
//! 3. sleep between polls, 50 µs doubling to 1 ms (defaults), never past the deadline; or,
//!    on a ring with a doorbell ([`BackoffPolicy::parking`], what a node's rings use), park
//!    until the peer's next push or pop rings it awake.
//!
//! A waiter therefore never burns a core for more than the spin and yield phases. A sleeping
//! one notices progress within `max_sleep` (1 ms plus timer slack); a parked one costs nothing
//! while idle and wakes when rung. By default neither side wakes the other: waking needs a
//! system call by the peer, and for the trusted core a system call is an enclave exit, the very
//! cost the rings remove. The doorbell keeps that call off the busy path: a waiter raises a
//! flag before it parks, the peer checks it (one fence and one load) after each push or pop,
//! and wakes it only if it is raised, so a busy ring never rings, and a quiet one rings once
//! per burst ([`backoff`] has the protocol and why no wake-up is lost). Both blocking calls
//! return early when the peer's end has been dropped and the wait could never end. Counters
//! (pushed, popped, full events, doorbells, in flight) are kept per ring in cache lines written
//! by one side only.
//!
//! # Cost
//!
//! A crossing is one cache-line transfer, and a record and the answer to it share one line
//! (the two rings' slots are interleaved; see [`ring`]). On the 2-core development VM a
//! one-way crossing measures the same as two threads bouncing one counter through one cache
//! line, the hardware floor (~265 TSC cycles, ~100 ns, here; the floor itself measures
//! 225–280 depending on where its line lands), about half of `rtrb`, ~300x below a pipe or a
//! blocking channel. The PSL paper's SGX ring measured 461–526 cycles. Run
//! `cargo run --release -p psl-boundary --features bench --example crossings`.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(missing_docs)]
pub mod backoff;
#[cfg(feature = "bench")]
pub mod bench;
pub mod boundary;
mod padded;
pub mod ring;

use std::sync::Arc;

pub use backoff::BackoffPolicy;
#[cfg(feature = "bench")]
pub use bench::{bench_crossings, CaseReport, CrossingConfig, CrossingReport, HEADLINE_KEYS};
pub use boundary::{Boundary, BoundaryMonitor, BoundaryStats, CoreSide, HostSide};
pub use ring::{Consumer, Full, Producer, RingMonitor, RingStats};

/// What crosses the boundary: one sealed, signed record, as opaque shared bytes.
pub type SealedRecord = Arc<[u8]>;
