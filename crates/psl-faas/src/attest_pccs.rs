//! DCAP collateral from a PCCS (Intel's Provisioning Certification Caching Service, or Intel's
//! PCS itself), version 4 of its REST API, with a local cache.
//!
//! For a quote the client reads the FMSPC and the PCK CA (processor or platform) from the
//! quote's PCK certificate, then fetches:
//!
//! | request | body | issuer chain header |
//! | --- | --- | --- |
//! | `GET {base}/sgx/certification/v4/pckcrl?ca={ca}&encoding=der` | PCK CRL (DER) | `SGX-PCK-CRL-Issuer-Chain` |
//! | `GET {base}/{sgx,tdx}/certification/v4/tcb?fmspc={fmspc}` | `{"tcbInfo":…,"signature":hex}` | `TCB-Info-Issuer-Chain` (or `SGX-TCB-Info-Issuer-Chain`) |
//! | `GET {base}/{sgx,tdx}/certification/v4/qe/identity` | `{"enclaveIdentity":…,"signature":hex}` | `SGX-Enclave-Identity-Issuer-Chain` |
//! | `GET {base}/sgx/certification/v4/rootcacrl` | root CA CRL (hex of DER from a PCCS, DER from the PCS) | |
//!
//! Headers are percent-encoded PEM chains. Nothing fetched is trusted: every part is signed
//! by Intel and checked by the verifier ([`crate::attest_dcap`]); the transport only protects
//! availability, and TLS to the PCCS (its CA given in the policy, or the system's roots) keeps
//! out a network attacker who would serve stale but authentic collateral.
//!
//! The cache ([`PccsCollateral`]) keeps one collateral set per (TEE, FMSPC, CA) in memory and,
//! if given a directory, on disk (`dcap-{tee}-{fmspc}-{ca}.json`); an entry is fetched again
//! when the verification time passes its earliest `nextUpdate` or the entry is older than
//! `cache_max_secs`.
//!
//! The HTTP client is PSL's own, deliberately small: HTTP/1.1 `GET` with `Connection: close`,
//! over a `TcpStream` or rustls (the aws-lc-rs provider the workspace already builds), the
//! response read to its end under a size limit, then parsed by [`parse_response`] (a pure
//! function, fuzzed). No HTTP crate: `ureq`/`reqwest` would add `ring` or hyper for four GETs.

use crate::attest::AttestError;
use crate::attest_dcap::{collateral_expiry, Collateral, CollateralSource};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls;

/// Largest HTTP response read (headers and body).
pub const RESPONSE_BYTES_MAX: usize = 4 << 20;
/// Largest header section.
pub const HEADER_BYTES_MAX: usize = 64 << 10;
/// Default bound on how long a cached collateral set is used inside its validity window.
pub const CACHE_MAX_SECS_DEFAULT: u64 = 24 * 3600;
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed HTTP response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    /// The HTTP status code.
    pub status: u16,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header named `name` (case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        let n = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str())
    }
}

fn http_err(why: impl Into<String>) -> AttestError {
    AttestError::Collateral(format!("PCCS: {}", why.into()))
}

/// Parses a whole HTTP/1.x response (status line, headers, body by `Content-Length`, chunked
/// encoding, or to the end). Bounded; never panics on any bytes.
pub fn parse_response(b: &[u8]) -> Result<HttpResponse, AttestError> {
    if b.len() > RESPONSE_BYTES_MAX {
        return Err(http_err(format!("response of {} bytes, over {RESPONSE_BYTES_MAX}", b.len())));
    }
    let end = b
        .windows(4)
        .take(HEADER_BYTES_MAX)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| http_err("no end of headers"))?;
    let head = std::str::from_utf8(&b[..end]).map_err(|_| http_err("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(http_err(format!("not an HTTP/1.x response: {:?}", &status_line[..status_line.len().min(40)])));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..=999).contains(s))
        .ok_or_else(|| http_err("bad status code"))?;
    let mut headers = Vec::new();
    for l in lines {
        let (k, v) =
            l.split_once(':').ok_or_else(|| http_err(format!("bad header line {:?}", &l[..l.len().min(40)])))?;
        if k.is_empty() || k.bytes().any(|c| c.is_ascii_whitespace() || c.is_ascii_control()) {
            return Err(http_err("bad header name"));
        }
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        if headers.len() > 256 {
            return Err(http_err("more than 256 headers"));
        }
    }
    let rest = &b[end + 4..];
    let find = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let body = if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(cl) = find("content-length") {
        let n: usize = cl.parse().map_err(|_| http_err("bad Content-Length"))?;
        if rest.len() < n {
            return Err(http_err(format!("body of {} bytes, Content-Length says {n}", rest.len())));
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(HttpResponse { status, headers, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, AttestError> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").ok_or_else(|| http_err("chunk size line"))?;
        let line = std::str::from_utf8(&b[..eol]).map_err(|_| http_err("chunk size line"))?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| http_err("chunk size"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if size > RESPONSE_BYTES_MAX || b.len() < size + 2 || &b[size..size + 2] != b"\r\n" {
            return Err(http_err("truncated chunk"));
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Where a PCCS is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    /// Whether the PCCS speaks HTTPS (else plain HTTP).
    pub https: bool,
    /// Host name or address.
    pub host: String,
    /// TCP port (default 443 for HTTPS, 80 for HTTP).
    pub port: u16,
    /// Path prefix without a trailing slash (`""`, or `/pccs`).
    pub prefix: String,
}

impl BaseUrl {
    /// `http[s]://host[:port][/prefix]`; a trailing `/sgx/certification/v4` or
    /// `/tdx/certification/v4` is dropped.
    pub fn parse(url: &str) -> Result<BaseUrl, AttestError> {
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(http_err(format!("{url:?}: the PCCS URL must start with https:// or http://")));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h.trim_start_matches('[').trim_end_matches(']'), p.parse().map_err(|_| http_err("bad port"))?)
            }
            _ => (authority, if https { 443 } else { 80 }),
        };
        if host.is_empty() || host.contains(['@', ' ', '?', '#']) {
            return Err(http_err(format!("{url:?}: bad host")));
        }
        let prefix = path
            .trim_end_matches('/')
            .trim_end_matches("/sgx/certification/v4")
            .trim_end_matches("/tdx/certification/v4")
            .trim_end_matches('/')
            .to_string();
        Ok(BaseUrl { https, host: host.to_string(), port, prefix })
    }
}

/// A blocking HTTP(S) client for one PCCS.
pub struct PccsClient {
    base: BaseUrl,
    tls: Option<Arc<rustls::ClientConfig>>,
    extra_roots: Vec<Vec<u8>>,
}

impl PccsClient {
    /// A client of the PCCS at `url` (`https://host[:port][/prefix]`); `AttestError::Collateral`
    /// if the URL is not one or the TLS setup fails.
    pub fn new(url: &str) -> Result<PccsClient, AttestError> {
        let base = BaseUrl::parse(url)?;
        let mut c = PccsClient { base, tls: None, extra_roots: Vec::new() };
        if c.base.https {
            c.tls = Some(c.tls_config()?);
        }
        Ok(c)
    }

    /// Trust these CA certificates (PEM) for the PCCS's TLS certificate instead of the system's.
    pub fn with_ca_file(mut self, path: &Path) -> Result<PccsClient, AttestError> {
        let text = std::fs::read(path).map_err(|e| http_err(format!("reading {}: {e}", path.display())))?;
        let pems = pem::parse_many(&text).map_err(|e| http_err(format!("{}: {e}", path.display())))?;
        self.extra_roots = pems.into_iter().filter(|p| p.tag() == "CERTIFICATE").map(|p| p.into_contents()).collect();
        if self.extra_roots.is_empty() {
            return Err(http_err(format!("{}: no certificate", path.display())));
        }
        if self.base.https {
            self.tls = Some(self.tls_config()?);
        }
        Ok(self)
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, AttestError> {
        let mut roots = rustls::RootCertStore::empty();
        let ders: Vec<Vec<u8>> = if self.extra_roots.is_empty() {
            // The system's roots (Debian's bundle).
            let bundle = std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
            pem::parse_many(&bundle).unwrap_or_default().into_iter().map(|p| p.into_contents()).collect()
        } else {
            self.extra_roots.clone()
        };
        for d in ders {
            let _ = roots.add(rustls::pki_types::CertificateDer::from(d));
        }
        if roots.is_empty() {
            return Err(http_err("no CA certificate to check the PCCS's TLS certificate with (set pccs_ca)"));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| http_err(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(cfg))
    }

    /// `GET {prefix}{path_and_query}`.
    pub fn get(&self, path_and_query: &str) -> Result<HttpResponse, AttestError> {
        let b = &self.base;
        let target = format!("{}{path_and_query}", b.prefix);
        let addr = (b.host.as_str(), b.port)
            .to_socket_addrs()
            .map_err(|e| http_err(format!("resolving {}: {e}", b.host)))?
            .next()
            .ok_or_else(|| http_err(format!("{} has no address", b.host)))?;
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| http_err(format!("connecting to {addr}: {e}")))?;
        tcp.set_read_timeout(Some(IO_TIMEOUT)).ok();
        tcp.set_write_timeout(Some(IO_TIMEOUT)).ok();
        let host_header = if (b.https && b.port == 443) || (!b.https && b.port == 80) {
            b.host.clone()
        } else {
            format!("{}:{}", b.host, b.port)
        };
        let req = format!(
            "GET {target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: psl/{}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            env!("CARGO_PKG_VERSION")
        );
        let mut raw = Vec::new();
        let io = |e: std::io::Error| http_err(format!("GET {target}: {e}"));
        match &self.tls {
            None => {
                let mut s = tcp;
                s.write_all(req.as_bytes()).map_err(io)?;
                read_bounded(&mut s, &mut raw).map_err(io)?;
            }
            Some(cfg) => {
                let name = rustls::pki_types::ServerName::try_from(b.host.clone())
                    .map_err(|e| http_err(format!("server name {}: {e}", b.host)))?;
                let conn =
                    rustls::ClientConnection::new(cfg.clone(), name).map_err(|e| http_err(format!("TLS: {e}")))?;
                let mut s = rustls::StreamOwned::new(conn, tcp);
                s.write_all(req.as_bytes()).map_err(io)?;
                read_bounded(&mut s, &mut raw).map_err(io)?;
            }
        }
        let r = parse_response(&raw)?;
        if !(200..300).contains(&r.status) {
            return Err(http_err(format!("GET {target}: HTTP {}", r.status)));
        }
        Ok(r)
    }

    /// Fetches the collateral of one (TEE, FMSPC, CA).
    pub fn fetch(&self, tdx: bool, fmspc: &str, ca: &str) -> Result<Collateral, AttestError> {
        let tee = if tdx { "tdx" } else { "sgx" };
        let chain = |r: &HttpResponse, names: &[&str]| -> Result<String, AttestError> {
            let v =
                names.iter().find_map(|n| r.header(n)).ok_or_else(|| http_err(format!("no {} header", names[0])))?;
            urlencoding::decode(v).map(|s| s.into_owned()).map_err(|e| http_err(format!("{}: {e}", names[0])))
        };
        let crl = self.get(&format!("/sgx/certification/v4/pckcrl?ca={ca}&encoding=der"))?;
        let pck_crl_issuer_chain = chain(&crl, &["SGX-PCK-CRL-Issuer-Chain"])?;
        let pck_crl = der_or_hex(crl.body, "PCK CRL")?;
        let tcb = self.get(&format!("/{tee}/certification/v4/tcb?fmspc={fmspc}"))?;
        let tcb_info_issuer_chain = chain(&tcb, &["TCB-Info-Issuer-Chain", "SGX-TCB-Info-Issuer-Chain"])?;
        let (tcb_info, tcb_info_signature) = signed_json(&tcb.body, "tcbInfo")?;
        let qe = self.get(&format!("/{tee}/certification/v4/qe/identity"))?;
        let qe_identity_issuer_chain = chain(&qe, &["SGX-Enclave-Identity-Issuer-Chain"])?;
        let (qe_identity, qe_identity_signature) = signed_json(&qe.body, "enclaveIdentity")?;
        let root = self.get("/sgx/certification/v4/rootcacrl")?;
        let root_ca_crl = der_or_hex(root.body, "root CA CRL")?;
        Ok(Collateral {
            pck_crl_issuer_chain,
            root_ca_crl,
            pck_crl,
            tcb_info_issuer_chain,
            tcb_info,
            tcb_info_signature,
            qe_identity_issuer_chain,
            qe_identity,
            qe_identity_signature,
            pck_certificate_chain: None,
        })
    }
}

fn read_bounded(r: &mut impl Read, out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if out.len() + n > RESPONSE_BYTES_MAX {
                    return Err(std::io::Error::other(format!("response over {RESPONSE_BYTES_MAX} bytes")));
                }
                out.extend_from_slice(&buf[..n]);
            }
            // A peer that closes without TLS close_notify after a complete response.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A CRL body: DER (starts with a SEQUENCE) or the hex of it (a PCCS's `rootcacrl`).
fn der_or_hex(body: Vec<u8>, what: &str) -> Result<Vec<u8>, AttestError> {
    if body.first() == Some(&0x30) {
        return Ok(body);
    }
    let text = std::str::from_utf8(&body).map_err(|_| http_err(format!("{what}: neither DER nor hex")))?;
    hex::decode(text.trim()).map_err(|_| http_err(format!("{what}: neither DER nor hex")))
}

/// `{"<field>": {...}, "signature": "<hex>"}` → (the signed object as compact JSON, signature).
/// The object is re-serialized in its original key order, which is how Intel signs it (compact
/// JSON); a PCCS that reformatted it would be caught by the signature check.
fn signed_json(body: &[u8], field: &str) -> Result<(String, Vec<u8>), AttestError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| http_err(format!("{field} response is not JSON: {e}")))?;
    let obj = v.get(field).ok_or_else(|| http_err(format!("response has no {field}")))?;
    let sig = v
        .get("signature")
        .and_then(|s| s.as_str())
        .and_then(|s| hex::decode(s).ok())
        .ok_or_else(|| http_err(format!("{field}: no hex signature")))?;
    Ok((obj.to_string(), sig))
}

/// The cache key of a quote: TEE, FMSPC (hex) and PCK CA (`processor` or `platform`).
pub fn quote_key(quote: &[u8]) -> Result<(bool, String, String), AttestError> {
    let q = dcap_qvl::quote::Quote::parse(quote).map_err(|e| AttestError::Malformed(format!("quote: {e}")))?;
    let fmspc = dcap_qvl::intel::quote_fmspc(&q).map_err(|e| AttestError::Malformed(format!("quote FMSPC: {e}")))?;
    let ca = dcap_qvl::intel::quote_ca(&q).map_err(|e| AttestError::Malformed(format!("quote PCK CA: {e}")))?;
    let tdx = !matches!(q.report, dcap_qvl::quote::Report::SgxEnclave(_));
    Ok((tdx, hex::encode_upper(fmspc), ca.as_id_str().to_string()))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CacheEntry {
    /// Verification time it was fetched at.
    fetched_at: u64,
    /// Earliest `nextUpdate` of its parts.
    expires_at: u64,
    collateral: Collateral,
}

/// A [`CollateralSource`] backed by a PCCS, with a memory and (optionally) disk cache.
pub struct PccsCollateral {
    client: PccsClient,
    dir: Option<PathBuf>,
    max_secs: u64,
    mem: Mutex<HashMap<String, CacheEntry>>,
}

impl PccsCollateral {
    /// Collateral fetched through `client`, cached in memory and in `dir` if given, refetched
    /// after `max_secs` seconds even inside its validity window.
    pub fn new(client: PccsClient, dir: Option<PathBuf>, max_secs: u64) -> PccsCollateral {
        PccsCollateral { client, dir, max_secs, mem: Mutex::new(HashMap::new()) }
    }

    fn fresh(&self, e: &CacheEntry, now: u64) -> bool {
        now >= e.fetched_at && now < e.expires_at && now - e.fetched_at < self.max_secs
    }

    fn disk_path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("dcap-{key}.json")))
    }
}

impl CollateralSource for PccsCollateral {
    fn collateral(&self, quote: &[u8], now: u64) -> Result<Collateral, AttestError> {
        let (tdx, fmspc, ca) = quote_key(quote)?;
        let key = format!("{}-{fmspc}-{ca}", if tdx { "tdx" } else { "sgx" });
        let mut mem = self.mem.lock();
        if let Some(e) = mem.get(&key) {
            if self.fresh(e, now) {
                return Ok(e.collateral.clone());
            }
        }
        if let Some(p) = self.disk_path(&key) {
            if let Some(e) = std::fs::read(&p).ok().and_then(|b| serde_json::from_slice::<CacheEntry>(&b).ok()) {
                if self.fresh(&e, now) {
                    let c = e.collateral.clone();
                    mem.insert(key, e);
                    return Ok(c);
                }
            }
        }
        tracing::info!("fetching DCAP collateral for {key} from the PCCS");
        let c = self.client.fetch(tdx, &fmspc, &ca)?;
        let e = CacheEntry { fetched_at: now, expires_at: collateral_expiry(&c)?, collateral: c.clone() };
        if let Some(p) = self.disk_path(&key) {
            let write = || -> std::io::Result<()> {
                std::fs::create_dir_all(p.parent().expect("has a parent"))?;
                let tmp = p.with_extension("tmp");
                std::fs::write(&tmp, serde_json::to_vec(&e).map_err(std::io::Error::other)?)?;
                std::fs::rename(&tmp, &p)
            };
            if let Err(err) = write() {
                tracing::warn!("cannot keep DCAP collateral in {}: {err}", p.display());
            }
        }
        mem.insert(key, e);
        Ok(c)
    }

    fn describe(&self) -> String {
        let b = &self.client.base;
        format!(
            "PCCS {}://{}:{}{} (cache {})",
            if b.https { "https" } else { "http" },
            b.host,
            b.port,
            b.prefix,
            self.dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "in memory".into())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_by_length_chunks_or_end() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: b%20c\r\n\r\nabcdef").unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.header("x-a")), (200, &b"abc"[..], Some("b%20c")));
        let r =
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!(r.body, b"abcde");
        let r = parse_response(b"HTTP/1.0 404 Not Found\r\n\r\nnope").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
        for bad in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\n",
            b"SSH-2.0\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nabc",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        ] {
            assert!(parse_response(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn base_urls() {
        let u = BaseUrl::parse("https://pccs.example:8081/sgx/certification/v4/").unwrap();
        assert_eq!((u.https, u.host.as_str(), u.port, u.prefix.as_str()), (true, "pccs.example", 8081, ""));
        let u = BaseUrl::parse("http://127.0.0.1/pccs").unwrap();
        assert_eq!((u.https, u.port, u.prefix.as_str()), (false, 80, "/pccs"));
        assert!(BaseUrl::parse("ftp://x").is_err());
        assert!(BaseUrl::parse("https://:80").is_err());
    }
}
