//! TLS channels whose certificate key is the key bound into an attestation report.
//!
//! Each attested party makes a fresh Ed25519 key and a self-signed certificate for it
//! ([`TlsIdentity`]). Its report's data commits to `SHA-256(SubjectPublicKeyInfo)` of that
//! certificate ([`TlsIdentity::spki_hash`]). Peers accept any well-formed certificate during the handshake
//! (TLS 1.3 still proves the peer holds the certificate's private key), then compare the hash
//! of the peer certificate's public key with the one the verified report binds. So keys sent
//! over the channel go only to the attested party, with no certificate authority involved.
//!
//! TLS 1.3 only, rustls with the aws-lc-rs provider, blocking I/O over `std::net::TcpStream`.

use crate::error::FaasError;
use psl_crypto::sha256;
use std::net::TcpStream;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// A TLS stream over TCP, client side.
pub type ClientStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;
/// A TLS stream over TCP, server side.
pub type ServerStream = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

fn tls_err(what: &str, e: impl std::fmt::Display) -> FaasError {
    FaasError::Channel(format!("TLS {what}: {e}"))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A fresh Ed25519 key and its self-signed certificate. The private key never leaves it.
pub struct TlsIdentity {
    cert: CertificateDer<'static>,
    pkcs8: zeroize::Zeroizing<Vec<u8>>,
    spki_hash: [u8; 32],
}

/// Signs with a [`TlsIdentity`]'s key (made by [`TlsIdentity::answer_signer`]).
pub struct AnswerSigner(aws_lc_rs::signature::Ed25519KeyPair);

impl AnswerSigner {
    /// The Ed25519 public key (what a client finds in the certificate it pinned).
    pub fn public_key(&self) -> [u8; 32] {
        use aws_lc_rs::signature::KeyPair;
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.public_key().as_ref());
        out
    }

    /// Whether `sig` is `public`'s Ed25519 signature of `msg` (a client's check of an answer).
    pub fn verify(public: &[u8; 32], msg: &[u8], sig: &[u8]) -> bool {
        aws_lc_rs::signature::UnparsedPublicKey::new(&aws_lc_rs::signature::ED25519, public).verify(msg, sig).is_ok()
    }

    /// The 64-byte Ed25519 signature of `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        let mut out = [0u8; 64];
        out.copy_from_slice(self.0.sign(msg).as_ref());
        out
    }
}

impl std::fmt::Debug for AnswerSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerSigner(<Ed25519 key>)")
    }
}

// DER helpers for the one certificate shape we make.
fn der(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    let n = body.len();
    if n < 0x80 {
        v.push(n as u8);
    } else if n < 0x100 {
        v.extend_from_slice(&[0x81, n as u8]);
    } else {
        v.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]);
    }
    v.extend_from_slice(body);
    v
}

const ED25519_ALG: &[u8] = &[0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70];

/// The PEM label of a key file ([`TlsIdentity::key_pem`]).
const KEY_PEM_TAG: &str = "PRIVATE KEY";
/// Largest key file read.
const KEY_FILE_MAX: u64 = 16 << 10;

impl TlsIdentity {
    /// A fresh Ed25519 key and its self-signed certificate for `common_name`;
    /// `FaasError::Channel` if key generation fails.
    pub fn generate(common_name: &str) -> Result<TlsIdentity, FaasError> {
        use aws_lc_rs::signature::Ed25519KeyPair;
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| tls_err("key", "Ed25519 generation failed"))?;
        Self::from_pkcs8(zeroize::Zeroizing::new(doc.as_ref().to_vec()), common_name)
    }

    /// A persistent identity: the Ed25519 key of a PEM `PRIVATE KEY` (PKCS#8) file, such as
    /// [`TlsIdentity::key_pem`] wrote (what `psl up --init` makes for a capsule host, whose
    /// [`TlsIdentity::spki_hash`] the leader pins). The certificate is made afresh.
    pub fn from_key_pem(text: &str, common_name: &str) -> Result<TlsIdentity, FaasError> {
        let p = pem::parse(text.trim()).map_err(|e| tls_err("key file", e))?;
        if p.tag() != KEY_PEM_TAG {
            return Err(tls_err("key file", format!("expected a PEM {KEY_PEM_TAG}, found {}", p.tag())));
        }
        Self::from_pkcs8(zeroize::Zeroizing::new(p.into_contents()), common_name)
    }

    /// [`TlsIdentity::from_key_pem`] of a file.
    pub fn load(path: &std::path::Path, common_name: &str) -> Result<TlsIdentity, FaasError> {
        let what = format!("key file {}", path.display());
        let len = std::fs::metadata(path).map_err(|e| tls_err(&what, e))?.len();
        if len > KEY_FILE_MAX {
            return Err(tls_err(&what, format!("{len} bytes, over {KEY_FILE_MAX}")));
        }
        let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).map_err(|e| tls_err(&what, e))?);
        Self::from_key_pem(&text, common_name).map_err(|e| tls_err(&what, e))
    }

    /// The private key as a PEM `PRIVATE KEY` (PKCS#8): secret, for a file only its owner reads.
    pub fn key_pem(&self) -> zeroize::Zeroizing<String> {
        zeroize::Zeroizing::new(pem::encode(&pem::Pem::new(KEY_PEM_TAG, self.pkcs8.to_vec())))
    }

    fn from_pkcs8(pkcs8: zeroize::Zeroizing<Vec<u8>>, common_name: &str) -> Result<TlsIdentity, FaasError> {
        use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
        let kp = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&pkcs8)
            .map_err(|_| tls_err("key", "not an Ed25519 PKCS#8 key"))?;
        let public = kp.public_key().as_ref().to_vec();
        let mut bits = vec![0u8];
        bits.extend_from_slice(&public);
        let spki = der(0x30, &[ED25519_ALG, &der(0x03, &bits)].concat());
        let cn = der(0x0c, common_name.as_bytes());
        let name = der(0x30, &der(0x31, &der(0x30, &[&[0x06, 0x03, 0x55, 0x04, 0x03][..], &cn].concat())));
        let validity = der(0x30, &[der(0x17, b"250101000000Z"), der(0x17, b"491231235959Z")].concat());
        let mut serial = rand::random::<[u8; 8]>().to_vec();
        serial[0] = (serial[0] & 0x7f) | 0x01;
        let tbs = der(
            0x30,
            &[&[0xa0, 0x03, 0x02, 0x01, 0x02][..], &der(0x02, &serial), ED25519_ALG, &name, &validity, &name, &spki]
                .concat(),
        );
        let sig = kp.sign(&tbs);
        let mut sig_bits = vec![0u8];
        sig_bits.extend_from_slice(sig.as_ref());
        let cert = der(0x30, &[&tbs[..], ED25519_ALG, &der(0x03, &sig_bits)].concat());
        Ok(TlsIdentity { cert: CertificateDer::from(cert), pkcs8, spki_hash: hash_spki(&spki) })
    }

    /// What the report data must commit to.
    pub fn spki_hash(&self) -> [u8; 32] {
        self.spki_hash
    }

    /// A signer with this identity's Ed25519 key, for the HTTPS API's answer signatures
    /// (docs/client.md, "Answers"): a client that pinned the attested TLS key checks them with
    /// that same key. Every message it signs starts with a `psl/` label, and TLS 1.3 signs 64
    /// bytes of 0x20 first (RFC 8446, 4.4.3), so neither use can pass for the other.
    pub fn answer_signer(&self) -> Result<AnswerSigner, FaasError> {
        let kp = aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&self.pkcs8)
            .map_err(|_| tls_err("key", "not an Ed25519 PKCS#8 key"))?;
        Ok(AnswerSigner(kp))
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.pkcs8.to_vec()))
    }

    /// Server side; `require_client_cert` makes the client present its (attested) certificate.
    pub fn server_config(&self, require_client_cert: bool) -> Result<Arc<rustls::ServerConfig>, FaasError> {
        let p = provider();
        let cfg = rustls::ServerConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_err("config", e))?
            .with_client_cert_verifier(Arc::new(AnyCert { provider: p, mandatory: require_client_cert, pin: None }))
            .with_single_cert(vec![self.cert.clone()], self.key())
            .map_err(|e| tls_err("certificate", e))?;
        Ok(Arc::new(cfg))
    }

    /// Client side presenting this identity.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, FaasError> {
        self.client_config_pinned(None)
    }

    /// Client side presenting this identity; with `pin`, the handshake fails unless the
    /// server's certificate key hashes ([`TlsIdentity::spki_hash`]) to it.
    pub fn client_config_pinned(&self, pin: Option<[u8; 32]>) -> Result<Arc<rustls::ClientConfig>, FaasError> {
        let p = provider();
        let cfg = rustls::ClientConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_err("config", e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert { provider: p, mandatory: true, pin }))
            .with_client_auth_cert(vec![self.cert.clone()], self.key())
            .map_err(|e| tls_err("certificate", e))?;
        Ok(Arc::new(cfg))
    }
}

fn hash_spki(spki_der: &[u8]) -> [u8; 32] {
    sha256(&[b"psl/tls-spki/v1", spki_der]).0
}

/// The hash of the public key in a peer's end-entity certificate.
pub fn peer_spki_hash(certs: Option<&[CertificateDer<'_>]>) -> Result<[u8; 32], FaasError> {
    let cert = certs.and_then(|c| c.first()).ok_or_else(|| tls_err("peer", "presented no certificate"))?;
    let parsed = rustls::server::ParsedCertificate::try_from(cert).map_err(|e| tls_err("peer certificate", e))?;
    Ok(hash_spki(parsed.subject_public_key_info().as_ref()))
}

/// The Ed25519 public key in a peer's end-entity certificate: what verifies the HTTPS API's
/// answer signatures ([`TlsIdentity::answer_signer`]). Refuses a key of any other type.
pub fn peer_answer_key(certs: Option<&[CertificateDer<'_>]>) -> Result<[u8; 32], FaasError> {
    let cert = certs.and_then(|c| c.first()).ok_or_else(|| tls_err("peer", "presented no certificate"))?;
    let parsed = rustls::server::ParsedCertificate::try_from(cert).map_err(|e| tls_err("peer certificate", e))?;
    let spki = parsed.subject_public_key_info();
    // SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING { 0, 32 key bytes } }: 44 bytes.
    let prefix = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
    match spki.as_ref().strip_prefix(&prefix[..]).and_then(|k| <[u8; 32]>::try_from(k).ok()) {
        Some(k) => Ok(k),
        None => Err(tls_err("peer certificate", "its key is not an Ed25519 key")),
    }
}

/// Accepts any well-formed certificate (a server's: only one whose key hashes to `pin`, when
/// set); still checks every handshake signature. The binding to an attestation report is
/// checked after the handshake, by the caller.
#[derive(Debug)]
struct AnyCert {
    provider: Arc<rustls::crypto::CryptoProvider>,
    mandatory: bool,
    pin: Option<[u8; 32]>,
}

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        if let Some(pin) = &self.pin {
            if hash_spki(parsed.subject_public_key_info().as_ref()) != *pin {
                return Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ));
            }
        }
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _m: &[u8],
        _c: &CertificateDer<'_>,
        _d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not accepted".into()))
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for AnyCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        rustls::server::ParsedCertificate::try_from(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _m: &[u8],
        _c: &CertificateDer<'_>,
        _d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not accepted".into()))
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Connects to `addr` as a TLS client presenting `me`; returns the stream (handshake done) and
/// the hash of the server certificate's public key.
pub fn connect(addr: std::net::SocketAddr, me: &TlsIdentity) -> Result<(ClientStream, [u8; 32]), FaasError> {
    connect_pinned(addr, me, None)
}

/// [`connect`]; with `pin`, the handshake fails (and nothing is sent but the handshake) unless
/// the server's certificate key hashes to `pin` ([`FaasError::NotPinned`]).
pub fn connect_pinned(
    addr: std::net::SocketAddr,
    me: &TlsIdentity,
    pin: Option<[u8; 32]>,
) -> Result<(ClientStream, [u8; 32]), FaasError> {
    let tcp = TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        .map_err(|e| tls_err(&format!("connecting to {addr}"), e))?;
    tcp.set_nodelay(true).ok();
    let name = ServerName::try_from("psl-leader").map_err(|e| tls_err("server name", e))?;
    let conn = rustls::ClientConnection::new(me.client_config_pinned(pin)?, name).map_err(|e| tls_err("client", e))?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        if let Err(e) = s.conn.complete_io(&mut s.sock) {
            let refused = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).is_some_and(|r| {
                matches!(r, rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure))
            });
            return Err(match pin {
                Some(pin) if refused => FaasError::NotPinned { addr: addr.to_string(), pin: hex::encode(pin) },
                _ => tls_err(&format!("handshake with {addr}"), e),
            });
        }
    }
    let h = peer_spki_hash(s.conn.peer_certificates())?;
    if pin.is_some_and(|p| p != h) {
        // The verifier refused it already; checked again on the connection's own certificate.
        return Err(FaasError::NotPinned { addr: addr.to_string(), pin: hex::encode(pin.unwrap_or_default()) });
    }
    Ok((s, h))
}

/// Completes the server side of a handshake on an accepted socket; returns the hash of the
/// client certificate's public key when it presented one.
pub fn accept(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> Result<(ServerStream, Option<[u8; 32]>), FaasError> {
    tcp.set_nodelay(true).ok();
    let conn = rustls::ServerConnection::new(config).map_err(|e| tls_err("server", e))?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).map_err(|e| tls_err("handshake", e))?;
    }
    let h = match s.conn.peer_certificates() {
        Some(c) if !c.is_empty() => Some(peer_spki_hash(Some(c))?),
        _ => None,
    };
    Ok((s, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn handshake_binds_the_certificate_keys() {
        let server_id = TlsIdentity::generate("server").unwrap();
        let client_id = TlsIdentity::generate("client").unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let cfg = server_id.server_config(true).unwrap();
        let want_client = client_id.spki_hash();
        let t = std::thread::spawn(move || {
            let (tcp, _) = l.accept().unwrap();
            let (mut s, h) = accept(tcp, cfg).unwrap();
            assert_eq!(h, Some(want_client));
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
            s.flush().unwrap();
        });
        let (mut c, h) = connect(addr, &client_id).unwrap();
        assert_eq!(h, server_id.spki_hash());
        assert_ne!(h, client_id.spki_hash());
        c.write_all(b"hello").unwrap();
        c.flush().unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
        t.join().unwrap();
    }
}
