//! `psl bench http`: the HTTPS KV API against the memcached protocol on the same front end, in
//! the same run (docs/client.md).
//!
//! One in-process front end (the embedded default deployment) serves both: memcached's text
//! protocol on plain TCP, and the attested HTTPS endpoint with the KV routes (`psl::api`),
//! credentials checked and every answer signed. Clients: `CLIENTS` threads, each on one
//! keep-alive connection, one request at a time. The HTTPS clients do what the SDK does per
//! request: a fresh nonce, a secp256k1 signature over the request, the answer's Ed25519
//! signature checked. Cases alternate (memcached, HTTPS) for `ROUNDS` rounds; the headline is
//! the ratio of the medians. Then connect + verify: a TLS handshake and a sim attestation
//! checked under a policy, then the answer key pinned, timed `VERIFY_RUNS` times.

use anyhow::{bail, Context, Result};
use psl_capsule::{ClientCert, Permissions};
use psl_crypto::{OwnerKey, SigningKey};
use psl_faas::attest::{AttestPolicy, AttestVerifier, Attester, Evidence, SimAttester, SimPlatform, SimVerifier};
use psl_faas::tls::{AnswerSigner, TlsIdentity};
use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::{Server, ServerConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 4;
const ROUNDS: usize = 3;
const KEYS: usize = 1000;
const VALUE_BYTES: usize = 100;
const VERIFY_RUNS: usize = 40;

fn key(i: usize) -> String {
    format!("bench:{i:06}")
}

/// One memcached-protocol client: `get` (or `set`) over one connection until `stop`.
fn mc_client(addr: SocketAddr, put: bool, stop: &AtomicBool) -> Result<u64> {
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let value = "v".repeat(VALUE_BYTES);
    let (mut n, mut line) = (0u64, String::new());
    while !stop.load(Ordering::Relaxed) {
        let k = key(n as usize % KEYS);
        if put {
            write!(w, "set {k} 0 0 {VALUE_BYTES}\r\n{value}\r\n")?;
            line.clear();
            r.read_line(&mut line)?;
            if line != "STORED\r\n" {
                bail!("memcached set answered {line:?}");
            }
        } else {
            write!(w, "get {k}\r\n")?;
            loop {
                line.clear();
                if r.read_line(&mut line)? == 0 {
                    bail!("memcached closed the connection");
                }
                if line == "END\r\n" {
                    break;
                }
            }
        }
        n += 1;
    }
    Ok(n)
}

/// What an HTTPS client needs: the endpoint, its pinned keys and a credential.
#[derive(Clone)]
struct Endpoint {
    addr: SocketAddr,
    client: Arc<psl::api::ClientSide>,
    /// Sign every request, not only each connection's first.
    sign_every: bool,
}

/// One request on `s` (signed when `sign`: a connection's first); checks the answer's
/// signature; returns the status.
fn signed(
    s: &mut psl_http::client::Session,
    e: &Endpoint,
    sign: bool,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<u16> {
    let sent = e.client.request(method, path, body, sign);
    let a = s.request(method, path, &sent.headers, body.to_vec(), 1 << 20)?;
    let given = a.psl_headers.iter().find(|(n, _)| n == "psl-signature").map(|(_, v)| v.as_str());
    if !e.client.answer_checks(&sent, a.status, &a.body, given) {
        bail!("an answer whose signature does not check");
    }
    Ok(a.status)
}

fn http_client(e: &Endpoint, put: bool, stop: &AtomicBool) -> Result<u64> {
    // Any certificate at the TLS layer: the key is pinned by the endpoint's spki below.
    let any_cert = TlsIdentity::generate("psl bench http")?.client_config()?;
    let mut s = psl_http::client::Session::connect(e.addr, "localhost", any_cert.clone(), Duration::from_secs(10))?;
    let value = [b'v'; VALUE_BYTES];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let path = format!("/v1/kv/{}", key(n as usize % KEYS).replace(':', "%3A"));
        let (method, body) = if put { ("PUT", &value[..]) } else { ("GET", &b""[..]) };
        let status = signed(&mut s, e, e.sign_every || n == 0, method, &path, body)?;
        if status != 200 {
            bail!("HTTPS {} {path} answered {status}", if put { "PUT" } else { "GET" });
        }
        n += 1;
    }
    Ok(n)
}

/// What one load run measured.
struct Run {
    ops_per_s: f64,
    /// CPU of everything in the process but the clients (the server's side), per operation.
    server_cpu_us_per_op: f64,
}

/// Runs `CLIENTS` clients for `secs`. Each client counts its own thread's CPU, so the rest of
/// the process's CPU is the server's (the front end, its node, the HTTP workers).
fn load(secs: f64, client: impl Fn(&AtomicBool) -> Result<u64> + Sync) -> Result<Run> {
    use super::loadgen::{process_cpu_seconds, thread_cpu_seconds};
    let stop = AtomicBool::new(false);
    let (start, cpu0) = (Instant::now(), process_cpu_seconds());
    let done = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..CLIENTS)
            .map(|_| {
                sc.spawn(|| {
                    let c0 = thread_cpu_seconds();
                    client(&stop).map(|n| (n, thread_cpu_seconds() - c0))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("a client panicked"))?).collect::<Result<Vec<_>>>()
    })?;
    let (cpu, took) = (process_cpu_seconds() - cpu0, start.elapsed().as_secs_f64());
    let ops: u64 = done.iter().map(|(n, _)| n).sum();
    let clients_cpu: f64 = done.iter().map(|(_, c)| c).sum();
    Ok(Run {
        ops_per_s: ops as f64 / took,
        server_cpu_us_per_op: (cpu - clients_cpu).max(0.0) * 1e6 / (ops.max(1) as f64),
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The public-key operations of one request, each timed alone (µs): what bounds the API's
/// rate below the memcached protocol's on the same cores.
fn crypto_costs(e: &Endpoint, id: &TlsIdentity) -> Result<Value> {
    const N: u32 = 2000;
    let signer = id.answer_signer()?;
    let rh = psl_capsule::client::request_hash("GET", "/v1/kv/bench%3A000001", b"");
    let d = psl_capsule::client::request_digest(&e.client.spki_hash, &[7; 32], &rh);
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..N {
            f();
        }
        t.elapsed().as_secs_f64() * 1e6 / f64::from(N)
    };
    let sig = e.client.key.sign(&d);
    let pk = e.client.key.verifying_key();
    let m = psl::api::answer_message(&[7; 32], &rh, 200, b"{}");
    let asig = signer.sign(&m);
    Ok(json!({
        "client_signs_request_secp256k1": time(&mut || { std::hint::black_box(e.client.key.sign(&d)); }),
        "server_verifies_request_secp256k1": time(&mut || { std::hint::black_box(pk.verify(&d, &sig).is_ok()); }),
        "server_signs_answer_ed25519": time(&mut || { std::hint::black_box(signer.sign(&m)); }),
        "client_verifies_answer_ed25519": time(&mut || { std::hint::black_box(AnswerSigner::verify(&e.client.answer_key, &m, &asig)); }),
    }))
}

/// `psl bench http --json`.
pub fn run(seconds: f64, show_progress: bool) -> Result<Value> {
    let secs = seconds.max(0.5);
    let emb = Embedded::start(&EmbeddedOptions::default())?;
    let fe = emb.front_ends[0].clone();
    let mc = Server::start(fe.clone(), "127.0.0.1:0".parse()?, ServerConfig { threads: 1, ..ServerConfig::default() })?;

    // The endpoint: a fresh TLS key, sim evidence over it, the KV routes behind a guard.
    let id = TlsIdentity::generate("psl bench http")?;
    let (spki, signer) = (id.spki_hash(), id.answer_signer()?);
    let answer_key = signer.public_key();
    let owner = OwnerKey::generate();
    let guard = psl::api::Guard::new(emb.meta.name(), owner.public(), spki, signer);
    let platform = SimPlatform::new();
    let measurement = psl_crypto::sha256(&[b"psl bench http"]);
    let attester = Arc::new(SimAttester::new(platform.clone(), measurement));
    let att = attester.clone();
    let attestation: psl_http::Attest = Arc::new(move |nonce: [u8; 32]| {
        let rd = psl_faas::attest::bind_https_tls(&spki);
        let ev = att.attest(&nonce, &rd).map_err(|e| e.to_string())?;
        Ok(json!({ "backend": ev.backend, "evidence": hex::encode(&ev.bytes), "nonce": hex::encode(nonce) }))
    });
    let routes = psl_http::Routes {
        metrics: None,
        attestation: Some(attestation),
        api: Some(psl::api::kv(fe, Arc::new(guard))),
    };
    let limits = psl_http::Limits { connections_max: 256, ..psl_http::Limits::default() };
    let https = psl_http::HttpServer::serve("127.0.0.1:0".parse()?, routes, Some(id.server_config(false)?), limits)?;

    let cred_key = SigningKey::generate();
    let can = Permissions::parse("read,write").map_err(anyhow::Error::msg)?;
    let cert = ClientCert::issue(&owner.signing_key(), emb.meta.name(), cred_key.verifying_key(), can, 0, u64::MAX);
    let client =
        psl::api::ClientSide { key: cred_key, cert_hex: hex::encode(cert.encode()), spki_hash: spki, answer_key };
    let e = Endpoint { addr: https.local_addr(), client: Arc::new(client), sign_every: false };

    let cases = ["get", "put"];
    let pb = if show_progress {
        super::progress((ROUNDS * 2 * cases.len() + 1) as u64, "bench http")
    } else {
        indicatif::ProgressBar::hidden()
    };
    // Fill the keys once, so gets hit.
    load(0.5, |stop| mc_client(mc.addr(), true, stop))?;
    let mut out = serde_json::Map::new();
    let every = Endpoint { sign_every: true, ..e.clone() };
    for case in cases {
        let put = case == "put";
        let (mut m, mut h, mut hs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut mcpu, mut hcpu) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let r = load(secs, |stop| mc_client(mc.addr(), put, stop))?;
            m.push(r.ops_per_s);
            mcpu.push(r.server_cpu_us_per_op);
            pb.inc(1);
            let r = load(secs, |stop| http_client(&e, put, stop))?;
            h.push(r.ops_per_s);
            hcpu.push(r.server_cpu_us_per_op);
            hs.push(load(secs, |stop| http_client(&every, put, stop))?.ops_per_s);
            pb.inc(1);
        }
        let (mc_cpu, https_cpu) = (median(&mut mcpu), median(&mut hcpu));
        out.insert(format!("server_cpu_us_per_{case}_memcached_protocol"), json!(mc_cpu));
        out.insert(format!("server_cpu_us_per_{case}_https"), json!(https_cpu));
        // The server's side alone: what the rate ratio would approach with clients elsewhere.
        out.insert(format!("ratio_{case}_server_cpu"), json!(mc_cpu / https_cpu.max(1e-9)));
        let (mm, hm, hsm) = (median(&mut m), median(&mut h), median(&mut hs));
        out.insert(format!("memcached_protocol_{case}s_per_s"), json!(mm));
        out.insert(format!("https_{case}s_per_s"), json!(hm));
        out.insert(format!("https_signed_every_{case}s_per_s"), json!(hsm));
        out.insert(format!("ratio_{case}"), json!(hm / mm.max(1e-9)));
        out.insert(format!("ratio_{case}_signed_every"), json!(hsm / mm.max(1e-9)));
        out.insert(format!("rounds_{case}"), json!({ "memcached_protocol": m, "https": h, "https_signed_every": hs }));
    }

    // Connect + verify, as the SDK does before its first request.
    let verifier = SimVerifier::new(platform.public(), AttestPolicy { allowed: [measurement].into_iter().collect() });
    let any_cert = TlsIdentity::generate("psl bench http")?.client_config()?;
    let mut took = Vec::new();
    for _ in 0..VERIFY_RUNS {
        let t = Instant::now();
        let nonce: [u8; 32] = rand::random();
        let mut s = psl_http::client::Session::connect(e.addr, "localhost", any_cert.clone(), Duration::from_secs(10))?;
        let seen = psl_faas::tls::peer_spki_hash(Some(&s.peer_certs))?;
        let a = s.request("GET", &format!("/v1/attestation?nonce={}", hex::encode(nonce)), &[], Vec::new(), 1 << 20)?;
        let j: Value = serde_json::from_slice(&a.body)?;
        let bytes = hex::decode(j["evidence"].as_str().context("no evidence")?)?;
        let backend = psl_faas::attest::backend_by_name(j["backend"].as_str().unwrap_or("")).context("a backend")?;
        verifier.verify(&Evidence { backend, bytes }, &nonce, &psl_faas::attest::bind_https_tls(&seen))?;
        took.push(t.elapsed().as_secs_f64() * 1e3);
    }
    pb.inc(1);
    pb.finish_and_clear();
    out.insert("crypto_us_per_request".into(), crypto_costs(&e, &id)?);
    out.insert("connect_verify_p50_ms".into(), json!(median(&mut took)));
    out.insert("connect_verify_max_ms".into(), json!(took.iter().copied().fold(0.0, f64::max)));
    out.insert("goal_ratio_get".into(), json!(0.5));
    out.insert("goal_connect_verify_p50_ms".into(), json!(50.0));
    out.insert(
        "load".into(),
        json!({ "clients": CLIENTS, "connections_per_client": 1, "pipelining": false, "keys": KEYS,
                "value_bytes": VALUE_BYTES, "seconds_per_run": secs, "rounds": ROUNDS,
                "https_per_request": "fresh nonce and Ed25519 answer signature checked; the secp256k1 request signature on each connection's first request (https_signed_every_*: on every request)",
                "server": "one in-process front end serving both protocols (memcached on 1 event-loop thread)",
                "verify_runs": VERIFY_RUNS, "evidence": "sim" }),
    );
    out.insert("machine".into(), super::machine());
    drop(https);
    drop(mc);
    drop(emb);
    Ok(Value::Object(out))
}
