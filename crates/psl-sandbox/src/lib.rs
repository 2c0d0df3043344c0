//! PSL lambdas: user JavaScript run in QuickJS (through `rquickjs`), one runtime per lambda, each
//! on its own thread, with the host KV API as the only capability.
//!
//! Module map:
//! - [`host`]: the [`KvHost`] trait the sandbox calls (`put`/`get`/`del`/`sync`/`sync_durable`/
//!   `scan`, reads with their versions); the runtime crate implements it over a
//!   `psl_node::Node`, tests over a map.
//! - [`value`]: [`KvValue`] (text, JSON, bytes) and its stored form (SecureCached's item layout,
//!   the kind in the client flags), decoded totally.
//! - [`limits`]: [`SandboxLimits`], every bound a lambda runs under, with defaults.
//! - [`run`]: [`run_lambda`] / [`spawn_lambda`]: build the runtime, install the API, evaluate,
//!   and turn every way a lambda can end into a [`LambdaOutcome`].
//!
//! What a lambda sees (globals): `put(key, value, {durable})` (a string, or bytes as a
//! `Uint8Array`/`ArrayBuffer`), `get(key)` (string, `Uint8Array` or null), `getEntry(key)`
//! (`{key, value, type, lamport, writer}` or null), `del(key, {durable})`,
//! `sync({durable, timeoutMs})`, `scan(prefix, {limit, after})`, `putJSON(key, value,
//! {durable})`, `getJSON(key)`, `emit(value)`, `log(...)`, and the frozen object `lambda` =
//! `{ id, count, input }`; plus the ECMAScript built-ins (JSON, Math, Date,
//! Promise, ...). There is no `require`, no module loader (`import` fails), no `std`/`os`
//! module, no timer, file, network or process access: QuickJS's core has none, and this crate
//! installs no loader and no libc bindings. `eval` and `Function` compile code in the same
//! realm, so they reach exactly the globals above and nothing else.
//!
//! Limits: a memory limit (QuickJS allocator), a native stack limit, a CPU-time limit (the
//! thread's CPU clock, checked by QuickJS's interrupt handler) and a wall-clock limit. A lambda
//! interrupted for time cannot catch the interruption. A lambda that runs out of memory,
//! throws, or is interrupted ends with a [`LambdaError`] naming its id and the [`StopReason`];
//! other lambdas run in other runtimes on other threads and are not affected.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod host;
pub mod limits;
pub mod run;
pub mod value;

pub use host::{HostError, KvEntry, KvHost, MapHost};
pub use limits::SandboxLimits;
pub use run::{run_lambda, spawn_lambda, LambdaError, LambdaHandle, LambdaOutcome, LambdaSpec, StopReason};
pub use value::KvValue;
