//! Frames: `u32 LE length ‖ JSON message`, at most [`FRAME_BYTES_MAX`] bytes. Byte strings are
//! hex in the JSON. Every message of the roles is one variant of [`Msg`].

use crate::error::FaasError;
use crate::worker::WorkerDebug;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Largest frame (a sealed program, input or result fits well under it).
pub const FRAME_BYTES_MAX: usize = 32 << 20;
/// What a frame reader reserves before the bytes arrive (the rest grows as they do).
const FRAME_PREALLOC_BYTES: usize = 64 << 10;

/// Unix-microsecond times a worker took along the launch path.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerTimes {
    /// The scheduler's forward arrived.
    pub forwarded_us: u64,
    /// The leader's grant arrived (after attestation both ways).
    pub granted_us: u64,
    /// Keys opened and the node started.
    pub keys_ready_us: u64,
    /// Program opened and every slot's lambda started.
    pub started_us: u64,
    /// Latest first host operation of its lambdas.
    pub first_op_us: u64,
}

/// `Debug` shows only the message's name: some carry key material.
#[derive(Clone, Serialize, Deserialize)]
#[serde(tag = "t")]
pub enum Msg {
    // worker -> scheduler
    /// A worker announces itself to the scheduler (on connecting, and again after losing the link).
    Register {
        /// The worker's id.
        worker: u32,
        /// The worker's control address (`host:port`, its `DEBUG` line interface), for operators.
        control: String,
        /// A job is still running on the worker (it registers again after losing the link).
        #[serde(default)]
        busy: bool,
    },
    /// A worker is still alive (sent periodically to the scheduler).
    Heartbeat {
        /// The worker's id.
        worker: u32,
    },
    /// A worker finished its job and can take another.
    Idle {
        /// The worker's id.
        worker: u32,
    },
    /// A worker's outcome for a job: sealed results (for the client) or an error.
    WorkerDone {
        /// The worker's id.
        worker: u32,
        /// The job id (hex).
        job: String,
        /// The job's results sealed for the client (hex); absent on error.
        sealed_result: Option<String>,
        /// Why the job failed on this worker; absent on success.
        error: Option<String>,
        /// Launch-path timestamps the worker recorded for this job.
        times: WorkerTimes,
    },
    // scheduler -> worker
    /// The scheduler's answer to `Register`: the worker is in its registry.
    Registered,
    /// The scheduler forwards a client's sealed program to a worker.
    Forward {
        /// The job id (hex).
        job: String,
        /// The sealed program (hex, a `SealedProgram`'s bytes; the scheduler cannot open it).
        program: String,
        /// The sealed input (hex), if the job has one.
        input: Option<String>,
        /// How many lambdas the job runs in all.
        lambdas: u32,
    },
    // client -> scheduler
    /// A client hands the scheduler a sealed program to run.
    Submit {
        /// The job id (hex).
        job: String,
        /// The sealed program (hex).
        program: String,
        /// The sealed input (hex), if any.
        input: Option<String>,
        /// How many lambdas the job runs in all.
        lambdas: u32,
    },
    /// A client asks the scheduler for its registry (answered with `StatusReply`).
    Status,
    // scheduler -> client
    /// The scheduler's answer to `Submit`: the workers it forwarded the program to.
    Dispatched {
        /// Ids of the workers the program was forwarded to.
        workers: Vec<u32>,
        /// When the scheduler received the submission (Unix microseconds).
        received_us: u64,
    },
    /// One worker's outcome, relayed by the scheduler to the client.
    WorkerResult {
        /// The worker's `WorkerDone` message.
        done: Box<Msg>,
    },
    /// The scheduler's answer to `Status`.
    StatusReply {
        /// Every registered worker's state.
        workers: Vec<WorkerStatus>,
    },
    // client <-> leader (TLS)
    /// A client opens a session with the leader and asks for its report over `nonce`.
    ClientHello {
        /// The client's fresh 32-byte nonce (hex).
        nonce: String,
    },
    /// The leader's report over the client's nonce (answers `ClientHello`).
    LeaderReport {
        /// The attestation backend's name (for example `sim`, `dcap`, `snp`).
        backend: String,
        /// The report bytes (hex), binding the leader's TLS certificate key.
        evidence: String,
    },
    /// A client starts a job at the leader (answered `Ok` or `Error`).
    BeginJob {
        /// The job id (hex).
        job: String,
        /// The owner key file's text: secret, erased when the message is dropped.
        owner: zeroize::Zeroizing<String>,
        /// The job capsule's signed metadata (hex).
        meta: String,
        /// How many lambdas the job runs in all.
        lambdas: u32,
        /// Fewest attested workers the job needs to be admitted.
        min_workers: usize,
        /// A job already running whose leader went away (a restarted leader takes it back to
        /// end it): each granted worker, its node id and its lambda slots, as `Admitted` said.
        #[serde(default)]
        resume: Option<Vec<(u32, u32, u32)>>,
    },
    /// The client tells the leader which workers the scheduler dispatched to (answered `Admitted`).
    Expect {
        /// Ids of the dispatched workers.
        workers: Vec<u32>,
    },
    /// The leader's admission outcome for the workers the client expects.
    Admitted {
        /// Each granted worker with the lambda slots it runs.
        granted: Vec<(u32, Vec<u32>)>,
        /// Each refused worker with why (bad report, no offer in time, not needed).
        refused: Vec<(u32, String)>,
        /// Each granted worker's node id (for a restarted leader to take the job back).
        #[serde(default)]
        nodes: Vec<(u32, u32)>,
    },
    /// The client ends its job: keys erased, workers RESET (answered `Ended`).
    EndJob,
    /// Rotate the running job's application key, the rotation epoch `margin_epochs` ahead.
    RotateKey {
        /// How many epochs after the current one the new key takes effect.
        margin_epochs: u64,
    },
    /// The rotation done: the certificate and who installed it.
    Rotated {
        /// The new certificate and which workers and coordinators installed it.
        report: crate::deploy::KeyRotationReport,
    },
    /// `stored`: records each capsule host holds for the job when it closed it.
    Ended {
        /// Each worker RESET at the end of the job, with its state dump.
        resets: Vec<(u32, WorkerDebug)>,
        /// Each capsule host's id and the records it stored for the job.
        #[serde(default)]
        stored: Vec<(u32, u64)>,
        /// What each of the job's coordinators did (primary first).
        #[serde(default)]
        coordinators: Vec<crate::coordinator::CoordinatorStats>,
    },
    // leader <-> capsule host (TLS)
    /// When the policy requires attested hosts: the host's report over `nonce`, binding its TLS
    /// certificate key, comes before the leader sends it a key.
    HostHello {
        /// The leader's fresh 32-byte nonce (hex).
        nonce: String,
    },
    /// A capsule host's report over the leader's nonce (answers `HostHello`).
    HostReport {
        /// The attestation backend's name.
        backend: String,
        /// The report bytes (hex), binding the host's TLS certificate key.
        evidence: String,
    },
    /// The leader opens the job's capsule on a capsule host and hands it its server key.
    HostOpen {
        /// The capsule server's id.
        id: u32,
        /// The job capsule's signed metadata (hex).
        meta: String,
        /// The server's signing key (hex): secret, erased when the message is dropped.
        key: zeroize::Zeroizing<String>,
        /// The server key's certificate (hex), in a capsule that certifies writers.
        #[serde(default)]
        cert: Option<String>,
    },
    /// A capsule host closed the job's capsule (answers `EndJob`).
    HostClosed {
        /// How many records it stored for the job.
        records: u64,
    },
    /// A rotation certificate for the job's capsule (hex; public).
    HostRotate {
        /// The encoded rotation certificate (hex).
        cert: String,
    },
    // leader <-> coordinator host (TLS; the host attests like a worker, binding its channel key
    // and its certificate key)
    /// The leader asks a coordinator host to attest for a job.
    CoordHello {
        /// The coordinator host's id (the host refuses a hello meant for another id).
        id: u32,
        /// The job id (16 bytes, hex).
        job: String,
        /// The leader's fresh 32-byte nonce (hex).
        nonce: String,
    },
    /// A coordinator host's attested bid (answers `CoordHello`).
    CoordOffer {
        /// The host's X25519 channel public key (hex), bound in its report.
        channel_public: String,
        /// The attestation backend's name.
        backend: String,
        /// The report bytes (hex) over the leader's nonce.
        evidence: String,
        /// The rank this host already runs for the job (its leader went away), if any.
        #[serde(default)]
        running: Option<u8>,
    },
    /// The keys of coordinator rank `rank`, sealed to the host's channel key (hex).
    CoordOpen {
        /// The coordinator rank (0 is the primary, the others shadows).
        rank: u8,
        /// The rank's key bundle sealed to the host's channel key (hex).
        sealed: String,
    },
    /// `adopted`: the host was already running this job's coordinator of this rank (its
    /// leader had gone away) and kept it.
    CoordOpened {
        /// Whether the host kept a coordinator it was already running.
        adopted: bool,
    },
    /// The leader asks a coordinator host for its coordinator's current epoch.
    CoordEpoch,
    /// A coordinator host's current epoch (answers `CoordEpoch`).
    CoordEpochIs {
        /// The coordinator's current epoch.
        epoch: u64,
    },
    /// A key rotation stage sealed to the host's channel key (hex).
    CoordRotate {
        /// The key generation being rotated to.
        key_gen: u32,
        /// Which stage of the rotation this message carries.
        stage: crate::coordinator::RotationStage,
        /// The stage's keys sealed to the host's channel key (hex).
        sealed: String,
    },
    /// Key statements (revocations; public), `KeyStatement::encode_list` in hex.
    CoordStatements {
        /// The encoded statement list (hex).
        list: String,
    },
    /// A coordinator host closed the job's coordinator (answers `EndJob`).
    CoordClosed {
        /// What the coordinator did over the job.
        stats: crate::coordinator::CoordinatorStats,
    },
    // worker <-> leader (TLS, both sides attested)
    /// A worker asks the leader for its keys for a job and for the leader's report over `nonce`.
    WorkerHello {
        /// The worker's id.
        worker: u32,
        /// The job id (hex).
        job: String,
        /// The worker's fresh 32-byte nonce (hex).
        nonce: String,
    },
    /// The leader's report over a role's nonce, and the leader's own nonce for the role's report.
    LeaderChallenge {
        /// The attestation backend's name.
        backend: String,
        /// The leader's report bytes (hex), binding its TLS certificate key.
        evidence: String,
        /// The leader's fresh 32-byte nonce (hex) the role must attest over.
        nonce: String,
    },
    /// A role's attested bid for keys (answers `LeaderChallenge`).
    Offer {
        /// The role's X25519 channel public key (hex), bound in its report.
        channel_public: String,
        /// The attestation backend's name.
        backend: String,
        /// The role's report bytes (hex) over the leader's nonce.
        evidence: String,
    },
    /// The leader admits a worker: its node id, lambda slots and keys sealed to its channel key.
    Grant {
        /// The worker's node id in the job.
        node_id: u32,
        /// The lambda slots (indices in the job) the worker runs.
        lambdas: Vec<u32>,
        /// The worker's key bundle sealed to its channel key (hex).
        sealed_keys: String,
        /// The job capsule's name (hex; public): which capsule the worker's fabric endpoint
        /// subscribes to before the key bundle is opened. Absent: every capsule.
        #[serde(default)]
        capsule: Option<String>,
    },
    /// The leader refuses a role's bid.
    Refused {
        /// Why it was refused.
        why: String,
    },
    /// A key rotation: the certificate, the new data key and this worker's new writer keys,
    /// sealed to its channel key (hex).
    Rotate {
        /// The key generation being rotated to.
        key_gen: u32,
        /// The rotation bundle sealed to the worker's channel key (hex).
        sealed_keys: String,
    },
    /// A worker installed a key rotation (answers `Rotate`).
    RotateDone {
        /// The key generation it installed.
        key_gen: u32,
    },
    /// The leader tells a worker to RESET: erase its keys and stop its lambdas.
    Reset,
    /// A worker's answer to `Reset`.
    ResetDone {
        /// The worker's state when it was reset.
        debug: WorkerDebug,
    },
    // KV role (front end, KV coordinator, CapsuleDB) <-> leader (TLS, both sides attested):
    // `KvHello` -> `LeaderChallenge`; `Offer` -> `KvKeys` or `Refused`.
    /// A KV role asks the leader for its keys and for the leader's report over `nonce`.
    KvHello {
        /// "frontend", "coordinator" or "capsuledb".
        role: String,
        /// The role's instance id.
        id: u32,
        /// The role's fresh 32-byte nonce (hex).
        nonce: String,
        /// The writers the role will sign with (at most `kvgrant::KV_WRITERS_MAX`, all its
        /// own): the leader grants their keys and no other.
        #[serde(default)]
        writers: Vec<u32>,
    },
    /// The KV capsule's keys for this role (its data key, its writers' keys and
    /// certificates), sealed to its channel key (hex).
    KvKeys {
        /// The role's key bundle sealed to its channel key (hex).
        sealed: String,
    },
    // any
    /// Success, for requests that carry no other answer.
    Ok,
    /// Failure of a request.
    Error {
        /// What went wrong.
        why: String,
    },
}

/// One registered worker's state as the scheduler sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// The worker's id.
    pub worker: u32,
    /// Whether the worker is free to take a job.
    pub idle: bool,
    /// Milliseconds since the worker's last heartbeat.
    pub since_heartbeat_ms: u64,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Msg::{}", self.name())
    }
}

impl Msg {
    /// A role's answer to the leader's challenge: its channel key and its report.
    pub fn offer(o: &crate::grant::Offer) -> Msg {
        Msg::Offer {
            channel_public: hex::encode(o.channel_public),
            backend: o.evidence.backend.into(),
            evidence: hex::encode(&o.evidence.bytes),
        }
    }

    /// The leader's report over the role's nonce, and the leader's own nonce for the role's.
    pub fn leader_challenge(ev: &crate::attest::Evidence, nonce: &[u8; 32]) -> Msg {
        Msg::LeaderChallenge { backend: ev.backend.into(), evidence: hex::encode(&ev.bytes), nonce: hex::encode(nonce) }
    }

    /// The variant's name, for logs and errors (`Debug` prints only this).
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Register { .. } => "Register",
            Msg::Heartbeat { .. } => "Heartbeat",
            Msg::Idle { .. } => "Idle",
            Msg::WorkerDone { .. } => "WorkerDone",
            Msg::Registered => "Registered",
            Msg::Forward { .. } => "Forward",
            Msg::Submit { .. } => "Submit",
            Msg::Status => "Status",
            Msg::Dispatched { .. } => "Dispatched",
            Msg::WorkerResult { .. } => "WorkerResult",
            Msg::StatusReply { .. } => "StatusReply",
            Msg::ClientHello { .. } => "ClientHello",
            Msg::LeaderReport { .. } => "LeaderReport",
            Msg::BeginJob { .. } => "BeginJob",
            Msg::Expect { .. } => "Expect",
            Msg::Admitted { .. } => "Admitted",
            Msg::EndJob => "EndJob",
            Msg::RotateKey { .. } => "RotateKey",
            Msg::Rotated { .. } => "Rotated",
            Msg::HostRotate { .. } => "HostRotate",
            Msg::Rotate { .. } => "Rotate",
            Msg::RotateDone { .. } => "RotateDone",
            Msg::Ended { .. } => "Ended",
            Msg::WorkerHello { .. } => "WorkerHello",
            Msg::LeaderChallenge { .. } => "LeaderChallenge",
            Msg::Offer { .. } => "Offer",
            Msg::Grant { .. } => "Grant",
            Msg::Refused { .. } => "Refused",
            Msg::Reset => "Reset",
            Msg::ResetDone { .. } => "ResetDone",
            Msg::HostHello { .. } => "HostHello",
            Msg::HostReport { .. } => "HostReport",
            Msg::HostOpen { .. } => "HostOpen",
            Msg::HostClosed { .. } => "HostClosed",
            Msg::CoordHello { .. } => "CoordHello",
            Msg::CoordOffer { .. } => "CoordOffer",
            Msg::CoordOpen { .. } => "CoordOpen",
            Msg::CoordOpened { .. } => "CoordOpened",
            Msg::CoordEpoch => "CoordEpoch",
            Msg::CoordEpochIs { .. } => "CoordEpochIs",
            Msg::CoordRotate { .. } => "CoordRotate",
            Msg::CoordStatements { .. } => "CoordStatements",
            Msg::CoordClosed { .. } => "CoordClosed",
            Msg::KvHello { .. } => "KvHello",
            Msg::KvKeys { .. } => "KvKeys",
            Msg::Ok => "Ok",
            Msg::Error { .. } => "Error",
        }
    }
}

fn net(what: &str, e: impl std::fmt::Display) -> FaasError {
    FaasError::Net(format!("{what}: {e}"))
}

/// Writes `m` as one frame and flushes; fails with `FaasError::Net` on an I/O error or
/// a message over `FRAME_BYTES_MAX`.
pub fn write_msg<W: Write>(w: &mut W, m: &Msg) -> Result<(), FaasError> {
    // Frame buffers are wiped when dropped: some messages carry key material (over TLS).
    // Encoded into room reserved up front, so that growing the buffer leaves no unwiped copy of
    // a key-carrying message (a few KiB) behind.
    let mut body = zeroize::Zeroizing::new(Vec::with_capacity(FRAME_PREALLOC_BYTES));
    serde_json::to_writer(&mut *body, m).map_err(|e| net("encoding a message", e))?;
    if body.len() > FRAME_BYTES_MAX {
        return Err(net("sending", format!("{} message of {} bytes is over the frame limit", m.name(), body.len())));
    }
    let mut f = zeroize::Zeroizing::new(Vec::with_capacity(4 + body.len()));
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(&body);
    w.write_all(&f).map_err(|e| net(&format!("sending {}", m.name()), e))?;
    w.flush().map_err(|e| net(&format!("sending {}", m.name()), e))
}

/// Reads one frame and decodes it; fails with `FaasError::Net` on an I/O error, a frame
/// over `FRAME_BYTES_MAX`, a short frame or undecodable JSON.
pub fn read_msg<R: Read>(r: &mut R) -> Result<Msg, FaasError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| net("reading a frame header", e))?;
    let n = u32::from_le_bytes(len) as usize;
    if n > FRAME_BYTES_MAX {
        return Err(net("reading", format!("frame of {n} bytes is over the limit of {FRAME_BYTES_MAX}")));
    }
    // Memory grows with the bytes that actually arrive, not with what the header claims. The
    // first 64 KiB are reserved at once, so frames that carry key material (a few KiB) are
    // never reallocated, which would leave unwiped copies behind.
    let mut body = zeroize::Zeroizing::new(Vec::with_capacity(n.min(FRAME_PREALLOC_BYTES)));
    r.take(n as u64).read_to_end(&mut body).map_err(|e| net("reading a frame", e))?;
    if body.len() != n {
        return Err(net("reading a frame", format!("connection ended after {} of {n} bytes", body.len())));
    }
    serde_json::from_slice(&body).map_err(|e| net("decoding a message", e))
}

/// Hex text to bytes, naming the field on error.
pub fn unhex(field: &str, s: &str) -> Result<Vec<u8>, FaasError> {
    hex::decode(s).map_err(|e| FaasError::Net(format!("field {field} is not hex: {e}")))
}

/// Hex text to exactly `N` bytes.
pub fn unhex_n<const N: usize>(field: &str, s: &str) -> Result<[u8; N], FaasError> {
    unhex(field, s)?.try_into().map_err(|_| FaasError::Net(format!("field {field} is not {N} bytes")))
}

/// Evidence from its wire form. Only backends this build knows are accepted.
pub fn evidence(backend: &str, hex_bytes: &str) -> Result<crate::attest::Evidence, FaasError> {
    let backend = crate::attest::backend_by_name(backend)
        .ok_or_else(|| FaasError::Net(format!("unknown attestation backend {backend:?}")))?;
    Ok(crate::attest::Evidence { backend, bytes: unhex("evidence", hex_bytes)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_frames_are_errors() {
        let m = Msg::Forward { job: "00".into(), program: "ab".into(), input: None, lambdas: 3 };
        let mut b = Vec::new();
        write_msg(&mut b, &m).unwrap();
        let back = read_msg(&mut &b[..]).unwrap();
        assert!(matches!(back, Msg::Forward { lambdas: 3, .. }));
        for n in 0..b.len() {
            assert!(read_msg(&mut &b[..n]).is_err());
        }
        let mut huge = ((FRAME_BYTES_MAX + 1) as u32).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(read_msg(&mut &huge[..]).is_err());
        let mut junk = 3u32.to_le_bytes().to_vec();
        junk.extend_from_slice(b"{{{");
        assert!(read_msg(&mut &junk[..]).is_err());
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the decoder; what decodes re-encodes to a frame that
        /// decodes to the same message.
        #[test]
        fn arbitrary_frames_never_panic(len in 0u32..4096, body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut b = len.to_le_bytes().to_vec();
            b.extend_from_slice(&body);
            if let Ok(m) = read_msg(&mut &b[..]) {
                let mut again = Vec::new();
                write_msg(&mut again, &m).unwrap();
                let back = read_msg(&mut &again[..]).unwrap();
                proptest::prop_assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(&m).unwrap());
            }
        }

        /// JSON-shaped frames (the likely way to reach the message decoder) never panic it.
        #[test]
        fn json_frames_never_panic(t in "(Forward|Grant|Offer|Ended|HostOpen|Submit|Ok)", junk in ".{0,64}") {
            let body = format!("{{\"t\":\"{t}\",{junk}}}");
            let mut b = (body.len() as u32).to_le_bytes().to_vec();
            b.extend_from_slice(body.as_bytes());
            let _ = read_msg(&mut &b[..]);
        }
    }
}
