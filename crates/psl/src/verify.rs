//! `psl verify URL --policy FILE [--nonce HEX] [--json]`: checks, before anything is sent to
//! it, that a role's HTTPS endpoint (`--http`) runs code the policy accepts and that the TLS key
//! this client is talking to is the one that code holds:
//!
//! 1. a TLS handshake with the endpoint, keeping the certificate it presents (any: the evidence
//!    is what vouches for the key, not a CA);
//! 2. `GET /v1/attestation?nonce=N` with a fresh 32-byte nonce (or `--nonce`);
//! 3. the evidence verified under the policy, exactly as `psl attest verify` does (platform,
//!    measurement, TCB, ...), with the report data required to be the binding of the key hash
//!    of *the certificate this client saw* (`bind_https_tls`) and the nonce required to be N.
//!
//! A proxy that terminates TLS with its own key and relays the real evidence fails step 3 (the
//! evidence binds another key), and so does a replayed or stale answer (another nonce). Each
//! check prints as a PASS/FAIL/SKIP line; exit 0 only if the evidence verifies.

use anyhow::{Context, Result};
use clap::Args;
use psl_faas::attest::{
    backend_by_name, bind_https_tls, AttestVerifier, Check, CheckLog, CheckStatus, Evidence, Expected, VerifyTime,
};
use psl_faas::attest_policy::{Policy, PolicyVerifier};
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

/// Most bytes of evidence answer read (a DCAP quote with its certificates is a few KiB).
const ANSWER_BYTES_MAX: usize = 1 << 20;

/// `psl verify`.
#[derive(Args, Debug)]
pub struct VerifyUrlArgs {
    /// The role's HTTPS endpoint: `https://HOST:PORT` (what `--http` printed).
    pub url: String,
    /// The attestation policy (the format `psl attest verify` reads).
    #[arg(long)]
    pub policy: PathBuf,
    /// The challenge, 64 hex digits (default: 32 fresh random bytes).
    #[arg(long)]
    pub nonce: Option<String>,
    /// One JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
    /// Give up on the endpoint after this long (milliseconds).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
}

/// Runs `psl verify`; exit 0 only if the evidence verifies under the policy.
pub fn run(a: VerifyUrlArgs) -> Result<i32> {
    let rest = a
        .url
        .strip_prefix("https://")
        .with_context(|| format!("{}: give the endpoint as https://HOST:PORT (psl verify checks TLS)", a.url))?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h).trim_matches(['[', ']']);
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))?;
    let nonce: [u8; 32] = match &a.nonce {
        Some(h) => {
            let mut n = [0u8; 32];
            hex::decode_to_slice(h.trim(), &mut n).context("--nonce must be 64 hex digits")?;
            n
        }
        None => rand::random(),
    };
    // A policy that does not load refuses everything: said as a failed check, like the others.
    let verifier = Policy::load(&a.policy)
        .map_err(|e| e.to_string())
        .and_then(|p| PolicyVerifier::new(p, VerifyTime::Now).map_err(|e| e.to_string()));
    // Any server certificate: the evidence decides whether its key is the attested one.
    let tls = psl_faas::tls::TlsIdentity::generate("psl verify")?.client_config()?;
    let path = format!("/v1/attestation?nonce={}", hex::encode(nonce));
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut log = CheckLog::default();
    // The endpoint is asked only under a policy that loads.
    let outcome = match verifier {
        Err(e) => {
            failed(&mut log, "policy", e.clone());
            Outcome { refused: Some(e), ..Outcome::default() }
        }
        Ok(v) => match psl_http::client::get_tls(addr, host, &path, tls, timeout, ANSWER_BYTES_MAX) {
            Err(e) => {
                failed(&mut log, "endpoint", e.to_string());
                Outcome::default()
            }
            Ok(f) => check_answer(&f, &nonce, &v, &mut log),
        },
    };
    let verified = outcome.verified.is_some();
    if a.json {
        let checks = crate::attest::checks_json(&log);
        let mut o = serde_json::json!({
            "url": a.url, "policy": a.policy.display().to_string(), "nonce": hex::encode(nonce),
            "tls_key": outcome.spki.map(hex::encode), "role": outcome.role, "checks": checks, "verified": verified,
        });
        if let Some((kind, m)) = &outcome.verified {
            o["kind"] = kind.clone().into();
            o["measurement"] = m.clone().into();
        }
        if let Some(e) = &outcome.refused {
            o["refused"] = e.clone().into();
        }
        println!("{o}");
    } else {
        println!("endpoint {} ({addr}), policy {}, nonce {}", a.url, a.policy.display(), hex::encode(nonce));
        if let Some(s) = outcome.spki {
            println!("tls key {} (the hash of the certificate's public key this client saw)", hex::encode(s));
        }
        print!("{}", log.render());
        match &outcome.verified {
            Some((kind, m)) => {
                println!("VERIFIED: {kind} measurement {m}; its TLS key is the one this client talks to")
            }
            None => println!("REFUSED: {}", outcome.refused.as_deref().unwrap_or("see the failed check above")),
        }
    }
    Ok(if verified { 0 } else { 1 })
}

/// What the checks found.
#[derive(Default)]
struct Outcome {
    spki: Option<[u8; 32]>,
    role: Option<String>,
    /// The TEE kind and measurement, when the evidence verified.
    verified: Option<(String, String)>,
    /// Why the verifier refused the evidence.
    refused: Option<String>,
}

/// Checks one answer of the endpoint: the status, the TLS key it was served under, the JSON,
/// then the evidence under the policy with the report data and nonce this client requires.
fn check_answer(f: &psl_http::client::Fetched, nonce: &[u8; 32], v: &PolicyVerifier, log: &mut CheckLog) -> Outcome {
    let mut out = Outcome::default();
    let spki = match psl_faas::tls::peer_spki_hash(Some(&f.peer_certs)) {
        Ok(s) => s,
        Err(e) => {
            failed(log, "tls key", e.to_string());
            return out;
        }
    };
    out.spki = Some(spki);
    if f.status != 200 {
        let why = String::from_utf8_lossy(&f.body[..f.body.len().min(300)]).to_string();
        failed(log, "answer", format!("HTTP {}: {why}", f.status));
        return out;
    }
    let parsed: Result<(String, Vec<u8>, Option<String>), String> =
        serde_json::from_slice::<serde_json::Value>(&f.body).map_err(|e| format!("not JSON: {e}")).and_then(|j| {
            let backend = j["backend"].as_str().ok_or("no backend")?.to_string();
            let ev = hex::decode(j["evidence"].as_str().ok_or("no evidence")?).map_err(|e| format!("evidence: {e}"))?;
            Ok((backend, ev, j["role"].as_str().map(str::to_string)))
        });
    let (backend, bytes, role) = match parsed {
        Ok(p) => p,
        Err(e) => {
            failed(log, "answer", e);
            return out;
        }
    };
    out.role = role.clone();
    let Some(backend) = backend_by_name(&backend) else {
        failed(log, "answer", format!("unknown evidence backend {backend:?}"));
        return out;
    };
    log.pass(
        "answer",
        format!("evidence from {} ({} bytes, backend {backend})", role.as_deref().unwrap_or("?"), bytes.len()),
    );
    let expect = Expected { nonce: Some(*nonce), report_data: Some(bind_https_tls(&spki)) };
    match v.verify_explained(&Evidence { backend, bytes }, &expect, log) {
        Ok(r) => out.verified = Some((r.kind.as_str().to_string(), r.measurement.to_hex())),
        // The verifier logged the failing check.
        Err(e) => out.refused = Some(e.to_string()),
    }
    out
}

/// Records a failed check of this command's own (the verifier's are logged by it).
fn failed(log: &mut CheckLog, name: &str, detail: impl Into<String>) {
    log.checks.push(Check { name: name.into(), status: CheckStatus::Fail, detail: detail.into() });
}
