//! `psl capsule-host`: a DataCapsule server (`psl_server::Server`) per job, for the FaaS
//! deployment. Every job is a new capsule under a new application key, so a long-running
//! host cannot be configured with one capsule at start (as `psl capsule-server` is): the
//! leader opens the job's capsule on each host when the job begins (`HostOpen{id, meta, key}`:
//! the signed metadata and this server's ack-signing key, the application key's child
//! `server_writer(id)`), and closes it when the job ends (`EndJob` → `HostClosed{records}`).
//! The store stays on disk in `DIR/<capsule name>/` (check it with `psl capsule-server check`).
//! When the leader rotates the job's application key it sends the owner-signed certificate
//! (`HostRotate{cert}` → `Ok`): the server installs it durably (`rotations.bin`) and accepts the
//! new generation's records from the rotation epoch on.
//!
//! A host whose leader connection breaks mid-job keeps serving the capsule (the job's writers
//! go on and need their acks) for up to [`ORPHAN_WAIT`]: a restarted leader that opens the same
//! capsule again adopts the running server; otherwise it closes.
//!
//! The host is untrusted storage: it verifies with public keys and never sees the data key.
//! The link from the leader is TLS, and the leader sends the host its key only once it knows
//! it talks to that host: by the host's TLS key, pinned for it (`--tls-key`, made by `psl up
//! --init`; the leader's handshake fails on any other key), and/or by attestation where the
//! leader's policy says `[hosts] require_attestation = true` (then the leader sends
//! `HostHello{nonce}` first and the host answers `HostReport{backend, evidence}`, a report over
//! the nonce binding its TLS certificate key, from its `--attest` attester). No TEE is assumed
//! for storage: its key only signs acks for that one job's capsule, but whoever held it could
//! ack writes it never stored.

use super::wire::{read_msg, unhex, unhex_n, write_msg, Msg};
use crate::attest::{bind_channel_key, Attester};
use crate::error::FaasError;
use crate::tls::{self, ServerStream, TlsIdentity};
use parking_lot::Mutex;
use psl_capsule::SignedMetadata;
use psl_crypto::SigningKey;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a host keeps serving a job's capsule after its leader went away.
pub const ORPHAN_WAIT: Duration = Duration::from_secs(120);

/// Servers whose leader went away, by capsule name, with the orphaning's serial number.
type Orphans = Arc<Mutex<HashMap<String, (u64, psl_server::Server)>>>;

/// How a capsule host process is run.
pub struct HostConfig {
    /// The host's id: the capsule server id it serves each job as.
    pub id: u32,
    /// The directory it keeps one store per job capsule in.
    pub dir: PathBuf,
    /// Where it listens for the leader (TLS).
    pub listen: SocketAddr,
    /// The fabric each job's capsule server attaches to (subscribed, on NATS, to that capsule's
    /// records, repair and heads).
    pub fabric: psl_fabric::FabricSpec,
    /// Answers the leader's `HostHello` (none: the host cannot be attested).
    pub attester: Option<Box<dyn Attester>>,
    /// The host's TLS key, the one the leader pins for it (`psl capsule-host --tls-key`,
    /// made by `psl up --init`); none: a fresh key per process, which only an attested host or
    /// a leader allowing unauthenticated hosts accepts.
    pub tls: Option<TlsIdentity>,
}

/// The sealed blob: `magic ‖ job id ‖ kind ‖ salt ‖ ciphertext length` (the AES-256-GCM
/// associated data), then the ciphertext and its tag.
/// bound address, then serves the leader's connections. Fails only on bind or setup errors.
pub fn serve_host(mut cfg: HostConfig, ready: impl FnOnce(SocketAddr)) -> Result<(), FaasError> {
    std::fs::create_dir_all(&cfg.dir)?;
    let listener = TcpListener::bind(cfg.listen).map_err(|e| FaasError::Net(format!("binding {}: {e}", cfg.listen)))?;
    let addr = listener.local_addr()?;
    let me = match cfg.tls.take() {
        Some(me) => me,
        None => TlsIdentity::generate("psl-capsule-host")?,
    };
    let tls = me.server_config(false)?;
    let spki = me.spki_hash();
    let cfg = Arc::new(cfg);
    let orphans: Orphans = Arc::default();
    ready(addr);
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let (cfg, tls, orphans) = (cfg.clone(), tls.clone(), orphans.clone());
        std::thread::Builder::new().name("capsule-host-conn".into()).spawn(move || {
            if let Err(e) = tls::accept(tcp, tls).and_then(|(s, _)| job(&cfg, &spki, &orphans, s)) {
                tracing::warn!("capsule host {}: {e}", cfg.id);
            }
        })?;
    }
    Ok(())
}

/// The reply to a `HostHello`: this host's attestation report for `nonce`, bound to its TLS key.
fn attest_reply(cfg: &HostConfig, spki: &[u8; 32], nonce: &str) -> Result<Msg, FaasError> {
    let nonce = unhex_n::<32>("nonce", nonce)?;
    Ok(match &cfg.attester {
        None => Msg::Error { why: format!("capsule host {} runs without --attest: it cannot be attested", cfg.id) },
        Some(a) => match a.attest(&nonce, &bind_channel_key(spki)) {
            Ok(ev) => Msg::HostReport { backend: ev.backend.into(), evidence: hex::encode(&ev.bytes) },
            Err(e) => Msg::Error { why: format!("capsule host {}: attesting: {e}", cfg.id) },
        },
    })
}

/// Keeps serving `server` after its leader went away (`e`), for up to `ORPHAN_WAIT` for a new
/// leader to take it back, then closes it.
fn keep_orphan(
    orphans: &Orphans,
    id: u32,
    name: String,
    server: psl_server::Server,
    e: &FaasError,
) -> Result<(), FaasError> {
    // The leader went away mid-job: keep serving for a new leader to take the job back.
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(
        "capsule host {id}: the leader went away ({e}); serving the capsule for up to {} s more",
        ORPHAN_WAIT.as_secs()
    );
    orphans.lock().insert(name.clone(), (serial, server));
    let orphans = orphans.clone();
    std::thread::Builder::new().name("capsule-host-orphan".into()).spawn(move || {
        std::thread::sleep(ORPHAN_WAIT);
        let mut g = orphans.lock();
        if g.get(&name).is_some_and(|(s, _)| *s == serial) {
            if let Some((_, server)) = g.remove(&name) {
                drop(g);
                tracing::warn!("capsule host {id}: no leader took the capsule back; closing it");
                server.shutdown();
            }
        }
    })?;
    Ok(())
}

/// Waits until `server`'s record count holds still for 100 ms (at most 2 s): records still in flight.
fn wait_settled(server: &psl_server::Server) {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut last = (server.len(), Instant::now());
    while Instant::now() < deadline && last.1.elapsed() < Duration::from_millis(100) {
        std::thread::sleep(Duration::from_millis(10));
        let n = server.len();
        if n != last.0 {
            last = (n, Instant::now());
        }
    }
}

fn job(cfg: &HostConfig, spki: &[u8; 32], orphans: &Orphans, mut s: ServerStream) -> Result<(), FaasError> {
    s.sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut first = read_msg(&mut s)?;
    if let Msg::HostHello { nonce } = &first {
        let reply = attest_reply(cfg, spki, nonce)?;
        write_msg(&mut s, &reply)?;
        first = read_msg(&mut s)?;
    }
    let Msg::HostOpen { id, meta, key, cert } = first else {
        return Err(FaasError::Net("expected HostOpen".into()));
    };
    if id != cfg.id {
        return write_msg(&mut s, &Msg::Error { why: format!("this host is server {}, not {id}", cfg.id) });
    }
    let meta = SignedMetadata::decode(&unhex("meta", &meta)?).map_err(|e| FaasError::Capsule(e.to_string()))?;
    // Decoded straight into a buffer erased on drop (`unhex_n` would leave an unwiped `Vec`).
    let mut secret = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(key.as_str(), &mut secret[..])
        .map_err(|e| FaasError::Net(format!("field key is not 32 bytes of hex: {e}")))?;
    let key = SigningKey::from_bytes(&secret).map_err(|_| FaasError::Config("server key is not a valid key".into()))?;
    let name = meta.name().to_string();
    let dir = cfg.dir.join(&name);
    let adopted = orphans.lock().remove(&name).map(|(_, server)| server);
    let server = match adopted {
        Some(server) => {
            tracing::info!("capsule host {id}: a new leader took back the capsule it kept serving");
            server
        }
        None => {
            let ep = cfg
                .fabric
                .connect(&format!("capsule-host-{id}"), &psl_fabric::Interest::server(meta.name().0 .0))
                .map_err(|e| FaasError::Net(format!("attaching to the fabric {}: {e}", cfg.fabric)))?;
            let cert = match cert {
                Some(c) => Some(
                    psl_capsule::WriterCert::decode(&unhex("cert", &c)?)
                        .map_err(|e| FaasError::Config(format!("server certificate: {e}")))?,
                ),
                None => None,
            };
            let opts = psl_server::ServerOptions { id, cert, ..psl_server::ServerOptions::default() };
            match psl_server::Server::start(&dir, meta, key, ep, opts) {
                Ok(x) => x,
                Err(e) => return write_msg(&mut s, &Msg::Error { why: format!("starting the capsule server: {e}") }),
            }
        }
    };
    write_msg(&mut s, &Msg::Ok)?;
    tracing::info!("capsule host {id}: serving capsule in {}", dir.display());
    s.sock.set_read_timeout(Some(Duration::from_secs(24 * 3600)))?;
    // Key rotations (certificates: the host verifies with public keys) until the job ends.
    let end = loop {
        match read_msg(&mut s) {
            Ok(Msg::HostRotate { cert }) => {
                let r = unhex("cert", &cert).and_then(|b| {
                    psl_capsule::RotationCert::decode(&b).map_err(|e| FaasError::Capsule(format!("certificate: {e}")))
                });
                let reply =
                    match r.and_then(|c| server.install_rotation(&c).map_err(|e| FaasError::Capsule(e.to_string()))) {
                        Ok(_) => Msg::Ok,
                        Err(e) => Msg::Error { why: format!("capsule host {id}: key rotation: {e}") },
                    };
                write_msg(&mut s, &reply)?;
            }
            other => break other,
        }
    };
    if let Err(e) = &end {
        return keep_orphan(orphans, id, name, server, e);
    }
    wait_settled(&server);
    let records = server.len() as u64;
    let failed = server.failed();
    server.shutdown();
    tracing::info!("capsule host {id}: closed with {records} records");
    match end {
        Ok(Msg::EndJob) => match failed {
            None => write_msg(&mut s, &Msg::HostClosed { records }),
            Some(e) => write_msg(&mut s, &Msg::Error { why: format!("the capsule server failed: {e}") }),
        },
        Ok(m) => Err(FaasError::Net(format!("expected EndJob, got {}", m.name()))),
        Err(e) => Err(e),
    }
}
