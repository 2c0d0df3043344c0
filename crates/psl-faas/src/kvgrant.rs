//! Least-privilege KV keys: what the leader seals to one attested KV role (a SecureCached front
//! end or `psl node`, a KV coordinator, CapsuleDB), and what the role opens.
//!
//! A role names the writers it will sign with (`KvHello::writers`); the leader checks the list
//! against the role and its id ([`check_kv_request`]) and seals the capsule's data key and, for
//! exactly those writers, each one's signing key and certificate ([`kv_bundle`]). It never
//! seals the application key: a role cannot derive another writer's key, certify a writer or
//! sign a revocation (a KV coordinator's `REVOKE` is signed on the operator's machine instead,
//! `psl kv revoke`). Only capsules that certify writers qualify: in one that derives writer
//! keys (non-hardened children), any writer key with the public chain code gives back the
//! application key, so no smaller grant exists ([`check_kv_capsule`]).
//!
//! Bundle (version 2): `capsule name (32) ‖ data key (32) ‖ n u16 LE ‖ n × (writer u32 LE ‖
//! signing key 32) ‖ n × writer certificate`, associated data `"psl/kv-keys/v2" ‖ role ‖ 0 ‖
//! id u32 LE ‖ capsule name ‖ n u16 LE ‖ n × writer u32 LE` ([`kv_aad`]): it opens only for
//! the role, id and writer list it was asked for.

use crate::channel::{seal_to, ChannelKey};
use crate::error::FaasError;
use psl_capsule::certs::WRITER_CERT_LEN;
use psl_capsule::{KeyStatement, SignedMetadata, WriterCert, WriterKeys};
use psl_crypto::{AppKey, DataKey, SigningKey};
use zeroize::Zeroizing;

/// A KV role that needs the KV capsule's secrets, and gets them from the leader after
/// attestation (`Leader::grant_kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvRole {
    /// The KV front end (`frontend`).
    FrontEnd,
    /// A KV coordinator (`coordinator`).
    Coordinator,
    /// A CapsuleDB instance (`capsuledb`).
    CapsuleDb,
}

impl KvRole {
    /// The role's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            KvRole::FrontEnd => "frontend",
            KvRole::Coordinator => "coordinator",
            KvRole::CapsuleDb => "capsuledb",
        }
    }

    /// The role named `s` (`frontend`, `coordinator`, `capsuledb`); `FaasError::Net` for any other.
    pub fn parse(s: &str) -> Result<KvRole, FaasError> {
        Ok(match s {
            "frontend" => KvRole::FrontEnd,
            "coordinator" => KvRole::Coordinator,
            "capsuledb" => KvRole::CapsuleDb,
            _ => return Err(FaasError::Net(format!("unknown KV role {s:?}"))),
        })
    }
}

/// Most writers one KV role may ask for (a node runs at most 16 writer actors).
pub const KV_WRITERS_MAX: usize = 16;

/// A KV coordinator of rank `r` runs its node as node id `KV_COORDINATOR_NODE_BASE + r`
/// (`psl coordinator`); it may ask for that node's writers besides its rank's coordinator
/// writer.
pub const KV_COORDINATOR_NODE_BASE: u32 = 0x7000;

/// The version tag at the head of a KV bundle's associated data.
const KV_AAD_TAG: &[u8] = b"psl/kv-keys/v2";

/// Bytes of one writer's entry before the certificates: index and signing key.
const WRITER_ENTRY_LEN: usize = 4 + 32;

/// Bytes of a bundle's head: capsule name, data key, writer count.
const HEAD_LEN: usize = 32 + 32 + 2;

/// Associated data of a KV key bundle: the role, its id, the capsule and the writers asked for.
pub fn kv_aad(role: KvRole, id: u32, capsule: &[u8; 32], writers: &[u32]) -> Vec<u8> {
    let mut a = KV_AAD_TAG.to_vec();
    a.extend_from_slice(role.name().as_bytes());
    a.push(0);
    a.extend_from_slice(&id.to_le_bytes());
    a.extend_from_slice(capsule);
    a.extend_from_slice(&(writers.len().min(u16::MAX as usize) as u16).to_le_bytes());
    for w in writers {
        a.extend_from_slice(&w.to_le_bytes());
    }
    a
}

/// Whether the leader can hand out least-privilege keys for `meta`'s capsule: only if it
/// certifies writers (hardened writer keys).
pub fn check_kv_capsule(meta: &SignedMetadata) -> Result<(), FaasError> {
    match meta.meta.policy.writer_keys {
        WriterKeys::Certified => Ok(()),
        WriterKeys::Derived => Err(FaasError::Config(format!(
            "the KV capsule {} derives its writer keys: any one writer key and the public chain code give the \
             application key, so the leader cannot hand a KV role less than everything; make the KV capsule with \
             `psl capsule new --writer-keys certified` (the default)",
            meta.name()
        ))),
    }
}

/// The node id of a node writer index (`node << 16 | incarnation << 4 | actor`), if `w` is
/// one (node 1 to 32766).
fn node_of(w: u32) -> Option<u32> {
    let node = w >> 16;
    (1..(1 << 15) - 1).contains(&node).then_some(node)
}

/// Checks what KV role `role` `id` asks for: at most [`KV_WRITERS_MAX`] distinct writers, each
/// one of its own. A front end (or `psl node`) and CapsuleDB: writers of node `id` (any
/// incarnation and actor; CapsuleDB's role and block writers are its node's actors 15 and 14).
/// A KV coordinator of rank `id`: that rank's coordinator writer and the writers of its node
/// (`KV_COORDINATOR_NODE_BASE + id`). Never a capsule server's writer nor, for any but that
/// coordinator, a coordinator's.
pub fn check_kv_request(meta: &SignedMetadata, role: KvRole, id: u32, writers: &[u32]) -> Result<(), FaasError> {
    let refuse = |why: String| FaasError::KvRequest { who: format!("KV {} {id}", role.name()), why };
    if writers.len() > KV_WRITERS_MAX {
        return Err(refuse(format!("{} writers, at most {KV_WRITERS_MAX}", writers.len())));
    }
    for (i, w) in writers.iter().enumerate() {
        if writers[..i].contains(w) {
            return Err(refuse(format!("writer {w} twice")));
        }
    }
    let policy = &meta.meta.policy;
    let (node, coordinator) = match role {
        KvRole::FrontEnd | KvRole::CapsuleDb => (id, None),
        KvRole::Coordinator => {
            let rank = u8::try_from(id).ok().and_then(|r| policy.coordinator_at(r).map(|w| (r, w)));
            let Some((rank, w)) = rank else {
                return Err(refuse(format!("the capsule has no coordinator of rank {id}")));
            };
            (KV_COORDINATOR_NODE_BASE + rank as u32, Some(w))
        }
    };
    if !(1..(1 << 15) - 1).contains(&node) {
        return Err(refuse(format!("node id {node} is out of range (1 to 32766)")));
    }
    for &w in writers {
        if psl_capsule::server_id(w).is_some() {
            return Err(refuse(format!("writer {w} is a capsule server's")));
        }
        if Some(w) == coordinator {
            continue;
        }
        if policy.is_coordinator(w) {
            return Err(refuse(format!("writer {w} is a coordinator's (rank {:?})", policy.coordinator_rank(w))));
        }
        if node_of(w) != Some(node) {
            return Err(refuse(format!("writer {w} is not one of node {node}'s")));
        }
    }
    Ok(())
}

/// The plaintext of a KV bundle for `writers` (checked by [`check_kv_request`] first), from
/// the application key the leader holds. Wiped on drop.
pub fn kv_bundle(meta: &SignedMetadata, app: &AppKey, writers: &[u32]) -> Result<Zeroizing<Vec<u8>>, FaasError> {
    check_kv_capsule(meta)?;
    writers_within_bound(writers)?;
    let n = writers.len();
    let mut b = Zeroizing::new(Vec::with_capacity(HEAD_LEN + n * (WRITER_ENTRY_LEN + WRITER_CERT_LEN)));
    b.extend_from_slice(&meta.name().0 .0);
    b.extend_from_slice(app.data_key().expose_bytes());
    b.extend_from_slice(&(n as u16).to_le_bytes());
    let mut certs = Vec::with_capacity(n);
    for &w in writers {
        let (key, cert) =
            psl_capsule::writer_credentials(meta, app, w).map_err(|e| FaasError::Config(format!("writer {w}: {e}")))?;
        let cert = cert.ok_or_else(|| FaasError::Config(format!("writer {w}: no certificate")))?;
        b.extend_from_slice(&w.to_le_bytes());
        b.extend_from_slice(&key.expose_secret_bytes()[..]);
        certs.push(cert);
    }
    for c in &certs {
        b.extend_from_slice(&c.encode());
    }
    Ok(b)
}

/// Seals [`kv_bundle`] to `channel_public` for `role` `id`.
pub fn seal_kv_bundle(
    meta: &SignedMetadata,
    app: &AppKey,
    role: KvRole,
    id: u32,
    writers: &[u32],
    channel_public: &[u8; 32],
) -> Result<Vec<u8>, FaasError> {
    let b = kv_bundle(meta, app, writers)?;
    seal_to(channel_public, &kv_aad(role, id, &meta.name().0 .0, writers), &b)
}

/// One writer a KV role was granted: its index, signing key and certificate.
pub struct GrantedWriter {
    /// The writer's index in the KV capsule.
    pub writer: u32,
    /// The writer's signing key.
    pub key: SigningKey,
    /// The writer's certificate, signed under the capsule's application key.
    pub cert: WriterCert,
}

/// The keys a KV role got from the leader: the capsule's data key and its own writers' keys
/// and certificates; no application key. In memory only; `Debug` names the writers only.
pub struct KvRoleKeys {
    data_key: DataKey,
    writers: Vec<GrantedWriter>,
}

impl std::fmt::Debug for KvRoleKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvRoleKeys(writers={:?})", self.writer_indices())
    }
}

impl KvRoleKeys {
    /// The capsule's data key.
    pub fn data_key(&self) -> DataKey {
        self.data_key.clone()
    }

    /// The writers granted, in the order asked for.
    pub fn writer_indices(&self) -> Vec<u32> {
        self.writers.iter().map(|g| g.writer).collect()
    }

    /// The writers granted.
    pub fn writers(&self) -> &[GrantedWriter] {
        &self.writers
    }

    /// A copy of writer `w`'s key and its certificate, if granted.
    pub fn credentials(&self, w: u32) -> Option<(SigningKey, WriterCert)> {
        let g = self.writers.iter().find(|g| g.writer == w)?;
        let key = SigningKey::from_bytes(&g.key.expose_secret_bytes()).ok()?;
        Some((key, g.cert.clone()))
    }
}

impl psl_node::KeySource for KvRoleKeys {
    fn data_key(&self) -> DataKey {
        KvRoleKeys::data_key(self)
    }

    fn writer_credentials(
        &self,
        _meta: &SignedMetadata,
        w: u32,
    ) -> Result<(SigningKey, Option<WriterCert>), psl_node::NodeError> {
        self.credentials(w).map(|(k, c)| (k, Some(c))).ok_or_else(|| {
            psl_node::NodeError::Keys(format!(
                "writer {w} was not granted to this role (the leader granted writers {:?})",
                self.writer_indices()
            ))
        })
    }
}

/// Decodes and checks an opened KV bundle for `writers` of the capsule `meta` names: the
/// capsule, the data key (its fingerprint in the metadata), each writer in the order asked
/// for, each key matching its certificate, which the metadata's application key signed.
/// Never panics; any mismatch is [`FaasError::Malformed`].
pub fn parse_kv_bundle(b: &[u8], writers: &[u32], meta: &SignedMetadata) -> Result<KvRoleKeys, FaasError> {
    let bad = |why: &str| FaasError::Malformed { what: "KV key bundle", why: why.into() };
    check_kv_capsule(meta)?;
    let name = meta.name();
    if b.len() < HEAD_LEN || b[..32] != name.0 .0 {
        return Err(bad("not for this capsule, or too short"));
    }
    let mut dk = Zeroizing::new([0u8; 32]);
    dk.copy_from_slice(&b[32..64]);
    let data_key = DataKey::from_bytes(&dk);
    if data_key.fingerprint() != meta.meta.policy.data_key_fp {
        return Err(bad("the data key is not the capsule's"));
    }
    let n = u16::from_le_bytes([b[64], b[65]]) as usize;
    if n > KV_WRITERS_MAX || n != writers.len() {
        return Err(bad("writer count is not what was asked for"));
    }
    if b.len() != HEAD_LEN + n * (WRITER_ENTRY_LEN + WRITER_CERT_LEN) {
        return Err(bad("length"));
    }
    let certs_at = HEAD_LEN + n * WRITER_ENTRY_LEN;
    let mut out = Vec::with_capacity(n);
    for (i, &want) in writers.iter().enumerate() {
        let e = &b[HEAD_LEN + i * WRITER_ENTRY_LEN..HEAD_LEN + (i + 1) * WRITER_ENTRY_LEN];
        let w = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        if w != want {
            return Err(bad("a writer is not the one asked for"));
        }
        let mut sk = Zeroizing::new([0u8; 32]);
        sk.copy_from_slice(&e[4..]);
        let key = SigningKey::from_bytes(&sk).map_err(|_| bad("signing key"))?;
        let c = &b[certs_at + i * WRITER_CERT_LEN..certs_at + (i + 1) * WRITER_CERT_LEN];
        let cert = WriterCert::decode(c).map_err(|e| bad(&format!("certificate: {e}")))?;
        if cert.writer != w || cert.key_gen != 0 || cert.key != key.verifying_key() {
            return Err(bad("a certificate is not its writer's key"));
        }
        KeyStatement::Cert(cert.clone())
            .check(name, &meta.meta.app.point())
            .map_err(|e| bad(&format!("certificate does not verify: {e}")))?;
        out.push(GrantedWriter { writer: w, key, cert });
    }
    Ok(KvRoleKeys { data_key, writers: out })
}

/// Refuses a writer list longer than [`KV_WRITERS_MAX`] (before anything is asked or opened).
pub fn writers_within_bound(writers: &[u32]) -> Result<(), FaasError> {
    if writers.len() > KV_WRITERS_MAX {
        return Err(FaasError::Config(format!("{} writers, at most {KV_WRITERS_MAX}", writers.len())));
    }
    Ok(())
}

/// Opens a KV key bundle sealed to `channel` for `role` `id` and `writers` of the capsule
/// `meta` names ([`parse_kv_bundle`]). The keys stay in memory only.
pub fn open_kv_bundle(
    channel: &ChannelKey,
    sealed: &[u8],
    role: KvRole,
    id: u32,
    writers: &[u32],
    meta: &SignedMetadata,
) -> Result<KvRoleKeys, FaasError> {
    writers_within_bound(writers)?;
    let b = channel.open(sealed, &kv_aad(role, id, &meta.name().0 .0, writers))?;
    parse_kv_bundle(&b, writers, meta)
}
