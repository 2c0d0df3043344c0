//! DCAP collateral fetched from a PCCS (v4 API) and cached: a small HTTP(S) server of the
//! test's own on loopback serves the recorded collateral (tests/data) the way a PCCS does, and
//! the verifier checks the recorded quotes with what the client fetched.

use psl_faas::attest::{AttestVerifier, Evidence};
use psl_faas::attest_dcap::{
    inspect, split_report_data, Collateral, DcapPolicy, DcapVerifier, VerifyTime, DCAP_BACKEND,
};
use psl_faas::attest_pccs::{quote_key, PccsClient, PccsCollateral};
use psl_faas::attest_testkit::{der, oid};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio_rustls::rustls;

/// 2025-06-20, inside the samples' collateral window; 2025-07-30, after its next update.
const JUNE_2025: u64 = 1_750_377_600;
const JULY_30_2025: u64 = 1_753_833_600;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).expect("sample file")
}

/// What the fake PCCS saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    paths: Mutex<Vec<String>>,
}

/// A PCCS serving `collateral` for one (TEE, FMSPC, CA); everything else is a 404. `tls`: serve
/// HTTPS with this server config.
fn serve(
    collateral: Collateral,
    tee: &'static str,
    fmspc: String,
    ca: String,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (u16, Arc<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(tcp) = conn else { continue };
            tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).ok();
            let resp = |path: &str| -> Vec<u8> {
                let enc = |s: &str| urlencoding::encode(s).into_owned();
                let (status, headers, body): (u16, Vec<(String, String)>, Vec<u8>) = if path
                    == format!("/sgx/certification/v4/pckcrl?ca={ca}&encoding=der")
                {
                    (
                        200,
                        vec![("SGX-PCK-CRL-Issuer-Chain".into(), enc(&collateral.pck_crl_issuer_chain))],
                        collateral.pck_crl.clone(),
                    )
                } else if path == format!("/{tee}/certification/v4/tcb?fmspc={fmspc}") {
                    let b = format!(
                        "{{\"tcbInfo\":{},\"signature\":\"{}\"}}",
                        collateral.tcb_info,
                        hex::encode(&collateral.tcb_info_signature)
                    );
                    (
                        200,
                        vec![("TCB-Info-Issuer-Chain".into(), enc(&collateral.tcb_info_issuer_chain))],
                        b.into_bytes(),
                    )
                } else if path == format!("/{tee}/certification/v4/qe/identity") {
                    let b = format!(
                        "{{\"enclaveIdentity\":{},\"signature\":\"{}\"}}",
                        collateral.qe_identity,
                        hex::encode(&collateral.qe_identity_signature)
                    );
                    (
                        200,
                        vec![("SGX-Enclave-Identity-Issuer-Chain".into(), enc(&collateral.qe_identity_issuer_chain))],
                        b.into_bytes(),
                    )
                } else if path == "/sgx/certification/v4/rootcacrl" {
                    // A PCCS answers with the hex of the DER.
                    (200, vec![], hex::encode(&collateral.root_ca_crl).into_bytes())
                } else {
                    (404, vec![], b"no such collateral".to_vec())
                };
                let mut r = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
                for (k, v) in headers {
                    r.push_str(&format!("{k}: {v}\r\n"));
                }
                r.push_str("\r\n");
                let mut out = r.into_bytes();
                out.extend_from_slice(&body);
                out
            };
            let handle = |s: &mut dyn ReadWrite| {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req).lines().next().unwrap_or("").to_string();
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                s2.requests.fetch_add(1, Ordering::SeqCst);
                s2.paths.lock().unwrap().push(path.clone());
                let _ = s.write_all(&resp(&path));
                let _ = s.flush();
            };
            match &tls {
                None => {
                    let mut t = tcp;
                    handle(&mut t);
                }
                Some(cfg) => {
                    let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
                    let mut t = rustls::StreamOwned::new(conn, tcp);
                    handle(&mut t);
                    t.conn.send_close_notify();
                    let _ = t.flush();
                }
            }
        }
    });
    (port, seen)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

struct Sample {
    quote: Vec<u8>,
    collateral: Collateral,
    tee: &'static str,
    fmspc: String,
    ca: String,
}

fn sample(name: &str) -> Sample {
    let quote = data(name);
    let collateral: Collateral = serde_json::from_slice(&data(&format!("{name}_collateral.json"))).unwrap();
    let (tdx, fmspc, ca) = quote_key(&quote).unwrap();
    Sample { quote, collateral, tee: if tdx { "tdx" } else { "sgx" }, fmspc, ca }
}

fn verify(s: &Sample, source: Arc<PccsCollateral>, t: u64) -> Result<(), psl_faas::attest::AttestError> {
    let id = inspect(&s.quote).unwrap();
    let (bind, nonce) = split_report_data(&id.report_data);
    let p = DcapPolicy { time: VerifyTime::At(t), ..DcapPolicy::default() }
        .allowing(psl_faas::attest::AttestPolicy { allowed: [id.digests[0]].into() });
    DcapVerifier::new(p, source)
        .verify(&Evidence { backend: DCAP_BACKEND, bytes: s.quote.clone() }, &nonce, &bind)
        .map(|_| ())
}

#[test]
fn pccs_collateral_verifies_quotes_and_is_cached_until_it_expires() {
    for name in ["sgx_quote", "tdx_quote"] {
        let s = sample(name);
        let (port, seen) = serve(s.collateral.clone(), s.tee, s.fmspc.clone(), s.ca.clone(), None);
        let dir = tempfile::tempdir().unwrap();
        let cache = |max| {
            Arc::new(PccsCollateral::new(
                PccsClient::new(&format!("http://127.0.0.1:{port}")).unwrap(),
                Some(dir.path().to_path_buf()),
                max,
            ))
        };
        let c = cache(86_400);
        verify(&s, c.clone(), JUNE_2025).unwrap();
        assert_eq!(seen.requests.load(Ordering::SeqCst), 4, "{name}: {:?}", seen.paths.lock().unwrap());
        // Cached: in memory, then on disk for a new process.
        verify(&s, c.clone(), JUNE_2025 + 3600).unwrap();
        verify(&s, cache(86_400), JUNE_2025 + 7200).unwrap();
        assert_eq!(seen.requests.load(Ordering::SeqCst), 4, "{name}: served from the cache");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Older than the cache's bound: fetched again.
        verify(&s, cache(600), JUNE_2025 + 7200).unwrap();
        assert_eq!(seen.requests.load(Ordering::SeqCst), 8, "{name}: refetched after cache_max_secs");
        // Past its next update: fetched again, and the PCCS's copy is stale too: refused.
        let e = verify(&s, c, JULY_30_2025).unwrap_err();
        assert_eq!(seen.requests.load(Ordering::SeqCst), 12, "{name}: refetched after nextUpdate");
        assert!(e.to_string().contains("not at 2025-07-30"), "{name}: {e}");
    }
}

#[test]
fn pccs_failures_are_clear_and_altered_collateral_is_refused() {
    let s = sample("tdx_quote");
    // A PCCS that knows another FMSPC: 404.
    let (port, _) = serve(s.collateral.clone(), s.tee, "00606A000000".into(), s.ca.clone(), None);
    let c = Arc::new(PccsCollateral::new(PccsClient::new(&format!("http://127.0.0.1:{port}")).unwrap(), None, 3600));
    let e = verify(&s, c, JUNE_2025).unwrap_err().to_string();
    assert!(e.contains("HTTP 404") && e.contains(&s.fmspc), "{e}");
    // Nobody listening.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let c = Arc::new(PccsCollateral::new(PccsClient::new(&format!("http://127.0.0.1:{dead}")).unwrap(), None, 3600));
    let e = verify(&s, c, JUNE_2025).unwrap_err().to_string();
    assert!(e.contains("connecting to 127.0.0.1"), "{e}");
    // A PCCS serving a TCB info with one changed character.
    let mut bad = s.collateral.clone();
    bad.tcb_info = bad.tcb_info.replacen("\"UpToDate\"", "\"OutOfDate\"", 1);
    assert_ne!(bad.tcb_info, s.collateral.tcb_info);
    let (port, _) = serve(bad, s.tee, s.fmspc.clone(), s.ca.clone(), None);
    let c = Arc::new(PccsCollateral::new(PccsClient::new(&format!("http://127.0.0.1:{port}")).unwrap(), None, 3600));
    assert!(verify(&s, c, JUNE_2025).is_err());
}

/// A self-signed P-256 certificate for 127.0.0.1 (a PCCS's usual self-signed certificate).
fn loopback_cert() -> (Vec<u8>, Vec<u8>) {
    use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let kp = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
    let alg = der(0x30, &oid("1.2.840.10045.4.3.2"));
    let mut bits = vec![0u8];
    bits.extend_from_slice(kp.public_key().as_ref());
    let spki = der(
        0x30,
        &[der(0x30, &[oid("1.2.840.10045.2.1"), oid("1.2.840.10045.3.1.7")].concat()), der(0x03, &bits)].concat(),
    );
    let name = der(0x30, &der(0x31, &der(0x30, &[oid("2.5.4.3"), der(0x0c, b"test pccs")].concat())));
    let validity = der(0x30, &[der(0x17, b"200101000000Z"), der(0x17, b"491231235959Z")].concat());
    let san = der(0x30, &[oid("2.5.29.17"), der(0x04, &der(0x30, &der(0x87, &[127, 0, 0, 1])))].concat());
    let tbs = der(
        0x30,
        &[
            der(0xa0, &der(0x02, &[2])),
            der(0x02, &[0x11]),
            alg.clone(),
            name.clone(),
            validity,
            name,
            spki,
            der(0xa3, &der(0x30, &san)),
        ]
        .concat(),
    );
    let sig = kp.sign(&rng, &tbs).unwrap();
    let mut sig_bits = vec![0u8];
    sig_bits.extend_from_slice(sig.as_ref());
    (der(0x30, &[tbs, alg, der(0x03, &sig_bits)].concat()), pkcs8.as_ref().to_vec())
}

#[test]
fn pccs_over_tls_with_its_ca_given() {
    let s = sample("sgx_quote");
    let (cert, key) = loopback_cert();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(cert.clone())],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
        )
        .unwrap();
    let (port, seen) = serve(s.collateral.clone(), s.tee, s.fmspc.clone(), s.ca.clone(), Some(Arc::new(cfg)));
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("pccs-ca.pem");
    std::fs::write(&ca, pem::encode(&pem::Pem::new("CERTIFICATE", cert))).unwrap();
    let url = format!("https://127.0.0.1:{port}/sgx/certification/v4");
    let client = PccsClient::new(&url).unwrap().with_ca_file(&ca).unwrap();
    verify(&s, Arc::new(PccsCollateral::new(client, None, 3600)), JUNE_2025).unwrap();
    assert_eq!(seen.requests.load(Ordering::SeqCst), 4);
    // Without that CA (the system's roots do not know it) the TLS handshake fails.
    if let Ok(client) = PccsClient::new(&url) {
        let e = verify(&s, Arc::new(PccsCollateral::new(client, None, 3600)), JUNE_2025).unwrap_err().to_string();
        assert!(e.contains("PCCS"), "{e}");
    }
}
