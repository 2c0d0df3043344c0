//! Errors of the FaaS runtime. None carries a key or a plaintext byte of the user's program.

#[derive(Debug, thiserror::Error)]
pub enum FaasError {
    #[error("integrity check failed for job {job}: the sealed {what} was altered (or sealed under another key); no lambda ran it")]
    Integrity { job: String, what: &'static str },
    #[error("sealed {what} is malformed: {why}")]
    Malformed { what: &'static str, why: String },
    #[error("attestation of {who} refused: {why}")]
    Attestation { who: String, why: String },
    #[error("job needs at least {needed} attested worker(s), {attested} passed attestation ({refused})")]
    TooFewWorkers { needed: usize, attested: usize, refused: String },
    #[error("no idle worker is registered with the scheduler")]
    NoIdleWorkers,
    #[error("key delivery: {0}")]
    Channel(String),
    #[error("{who} asked for keys that are not its own: {why}")]
    KvRequest { who: String, why: String },
    #[error("configuration: {0}")]
    Config(String),
    #[error("node: {0}")]
    Node(#[from] psl_node::NodeError),
    #[error("capsule: {0}")]
    Capsule(String),
    #[error("worker {worker}: {why}")]
    Worker { worker: u32, why: String },
    #[error("network: {0}")]
    Net(String),
    #[error("TLS handshake with {addr}: its certificate's key is not the one pinned for it ({pin}): refused")]
    NotPinned { addr: String, pin: String },
    #[error("{who} is not authenticated: {why}")]
    Unauthenticated { who: String, why: String },
    #[error("starting a thread: {0}")]
    Spawn(#[from] std::io::Error),
}
