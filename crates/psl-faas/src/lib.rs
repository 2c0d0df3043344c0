//! The PSL FaaS runtime: sealed programs, attestation, key delivery, and the leader, scheduler
//! and worker roles, wired together in process as the embedded deployment, or run as separate
//! processes over the network.
//!
//! Module map:
//! - [`program`]: [`SealedProgram`]: a job's program (and input) sealed with AES-256-GCM under a
//!   key derived from the application data key, the job id as associated data.
//! - [`attest`]: the [`Attester`] / [`AttestVerifier`] traits, [`AttestPolicy`], and the `sim`
//!   backend (**insecure, for development only**: a simulated platform key signs the report).
//! - [`attest_dcap`]: the `dcap` backend's verifier: Intel SGX / TDX DCAP quotes checked with
//!   `dcap-qvl` against collateral at a given time, a TCB status policy, measurements and the
//!   report data binding.
//! - [`channel`]: key delivery sealed to the worker's X25519 channel key bound in its report.
//! - [`tls`]: TLS 1.3 channels whose certificate key is the one bound into the report
//!   (self-signed Ed25519 certificates; the peer's key hash checked against the report).
//! - [`grant`]: what the leader and the parties it admits exchange: [`grant::Offer`] (a
//!   party's attested bid), [`grant::Grant`] and [`grant::RotationGrant`] (a worker's sealed
//!   keys), their associated data, a job's bounds, the metadata check every key bundle shares.
//! - [`leader`]: the trusted leader: attests workers and coordinator hosts, derives keys,
//!   places the job's coordinators (a primary and shadows, each on its own host), rotates
//!   the job's application key (`prepare_rotation` / `finish_rotation`: per-worker bundles
//!   sealed to each channel key, the coordinators held below the rotation epoch until
//!   the workers have their keys), RESETs workers.
//! - [`coordinator`]: a job's coordinator as its own role: a coordinator host attests like a
//!   worker, opens the keys of one coordinator rank and runs a coordinator-only node; the
//!   [`coordinator::CoordinatorLink`] the leader reaches it through (in process or over TLS).
//! - [`rotation`]: leader side of application key rotation: derives the next hardened
//!   application key, its data key and writer keys, and the owner-signed certificate.
//! - [`scheduler`]: the untrusted scheduler: a registry of workers; forwards sealed programs.
//! - [`worker`]: a worker: attests, receives its keys, runs lambda slots on a `psl_node::Node`,
//!   waits for its writes to be durable on the job's capsule servers, installs key rotations
//!   in that node.
//! - [`kvgrant`]: least-privilege KV keys: the check of what a KV role asks the leader for
//!   (its own writers only), the bundle of the data key and those writers' keys and
//!   certificates, and [`kvgrant::KvRoleKeys`], what the role opens (a `psl_node::KeySource`).
//! - [`kv`]: [`NodeKv`], the sandbox's [`psl_sandbox::KvHost`] over a `psl_node::Node`.
//! - [`deploy`]: [`Deployment`]: every role in one process over an `InProcHub`, with the
//!   job's capsule servers; `run_job` (with an optional key rotation mid-job, `rotate_keys`).
//! - [`net`]: the roles as processes over TCP (`psl leader`, `psl scheduler`, `psl worker`),
//!   the client of `psl run --cluster`, the wire frames and the cluster file.
//! - [`error`] holds [`FaasError`].
//!
//! Imports go one way among the roles: `leader` uses `coordinator` (the link to a coordinator
//! host and its bundles); `worker` uses `leader` only to ask it for a nonce in process; all
//! three use `grant` for what passes between them.
//!
//! Trust: the leader and the workers are trusted (they would run in TEEs); the scheduler, the
//! fabric and everything that only sees sealed bytes are not. The scheduler never holds a key.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod attest;
pub mod attest_dcap;
pub mod attest_gramine;
pub mod attest_pccs;
pub mod attest_policy;
pub mod attest_select;
pub mod attest_snp;
#[cfg(any(test, feature = "testkit"))]
pub mod attest_testkit;
pub mod attest_tsm;
pub mod channel;
pub mod coordinator;
pub mod deploy;
pub mod error;
pub mod grant;
pub mod kv;
pub mod kvgrant;
pub mod leader;
pub mod net;
pub mod program;
pub mod rotation;
pub mod scheduler;
pub mod tls;
pub mod worker;

pub use attest::{
    AttestPolicy, AttestVerifier, Attester, Evidence, Measurement, SimAttester, SimPlatform, SimVerifier,
};
pub use deploy::{Deployment, DeploymentConfig, JobReport, JobRequest, LambdaReport, LaunchBreakdown};
pub use error::FaasError;
pub use kv::NodeKv;
pub use program::{JobId, SealedProgram};
