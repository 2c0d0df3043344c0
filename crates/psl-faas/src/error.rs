//! Errors of the FaaS runtime. None carries a key or a plaintext byte of the user's program.

/// Every error of the FaaS runtime's roles.
#[derive(Debug, thiserror::Error)]
pub enum FaasError {
    /// A sealed program, input or result failed authentication (AES-GCM tag or job id).
    #[error("integrity check failed for job {job}: the sealed {what} was altered (or sealed under another key); no lambda ran it")]
    Integrity {
        /// The job id (hex).
        job: String,
        /// What was sealed (`program`, `input`, `result`).
        what: &'static str,
    },
    /// Sealed or encoded bytes do not have the expected form.
    #[error("sealed {what} is malformed: {why}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// How it is malformed.
        why: String,
    },
    /// A party's evidence was refused.
    #[error("attestation of {who} refused: {why}")]
    Attestation {
        /// The party (a worker, the leader, a capsule or coordinator host).
        who: String,
        /// The verifier's reason.
        why: String,
    },
    /// Fewer workers passed attestation than the job's minimum.
    #[error("job needs at least {needed} attested worker(s), {attested} passed attestation ({refused})")]
    TooFewWorkers {
        /// The job's minimum.
        needed: usize,
        /// How many passed.
        attested: usize,
        /// The refused workers and why, as text.
        refused: String,
    },
    /// The scheduler has no idle worker to dispatch to.
    #[error("no idle worker is registered with the scheduler")]
    NoIdleWorkers,
    /// Sealing or opening a key bundle on the channel key failed.
    #[error("key delivery: {0}")]
    Channel(String),
    /// A KV role asked the leader for keys beyond its own writers.
    #[error("{who} asked for keys that are not its own: {why}")]
    KvRequest {
        /// The role and its id.
        who: String,
        /// What it asked for that it may not have.
        why: String,
    },
    /// A configuration value is out of bounds or inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// The worker's or coordinator's node failed.
    #[error("node: {0}")]
    Node(#[from] psl_node::NodeError),
    /// Creating, opening or checking a capsule (metadata, certificates, records) failed.
    #[error("capsule: {0}")]
    Capsule(String),
    /// A worker failed or reported an error.
    #[error("worker {worker}: {why}")]
    Worker {
        /// The worker's id.
        worker: u32,
        /// What went wrong.
        why: String,
    },
    /// A network, framing or protocol error between the roles.
    #[error("network: {0}")]
    Net(String),
    /// A TLS peer presented a certificate key other than the one pinned for its address.
    #[error("TLS handshake with {addr}: its certificate's key is not the one pinned for it ({pin}): refused")]
    NotPinned {
        /// The peer's address.
        addr: String,
        /// The pinned key hash (hex).
        pin: String,
    },
    /// A peer could be authenticated neither by attestation nor by a pinned key.
    #[error("{who} is not authenticated: {why}")]
    Unauthenticated {
        /// The peer.
        who: String,
        /// Why no authentication applied.
        why: String,
    },
    /// An I/O error: starting a thread, or any other `std::io::Error` passed up with `?`.
    #[error("starting a thread: {0}")]
    Spawn(#[from] std::io::Error),
}
