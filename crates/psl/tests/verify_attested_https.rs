//! `psl verify` against a front end's attested HTTPS endpoint (`psl memcached --http --attest
//! sim`), and the attacks it must refuse:
//!
//! - the honest endpoint under a policy that accepts this build on the sim platform: VERIFIED;
//! - the same endpoint under a policy without `allow_insecure_sim`: refused;
//! - a man in the middle with its own TLS key relaying the honest endpoint's evidence for the
//!   client's nonce: refused (the evidence binds another key);
//! - a replayed answer (evidence for another nonce, served under the honest key's relay):
//!   refused;
//! - a flipped byte in the evidence: refused.
//!
//! The hostile servers run in this test process on `psl-http`, as the honest one does.

use psl_http::{Attest, HttpServer, Limits, Routes};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

mod common;
use common::{start, Proc};

fn psl() -> &'static str {
    env!("CARGO_BIN_EXE_psl")
}

/// A policy accepting this build on the sim platform whose secret is `[0x42; 32]`, with or
/// without `allow_insecure_sim`.
fn policy(dir: &Path, name: &str, allow_sim: bool) -> String {
    let o = Command::new(psl()).args(["attest", "measure"]).output().unwrap();
    let m = String::from_utf8(o.stdout).unwrap();
    let m = m.lines().find_map(|l| l.strip_prefix("measurement = ")).unwrap().trim_matches('"').to_string();
    let platform = psl_faas::SimPlatform::from_secret(&[0x42; 32]).unwrap();
    let text = format!(
        "allowed_kinds = [\"sim\"]\nallow_insecure_sim = {allow_sim}\n[sim]\nplatform_public = \"{}\"\n[[sim.allow]]\nmeasurement = \"{m}\"\n",
        hex::encode(platform.public().to_bytes())
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Runs `psl verify URL --policy P [--nonce N] --json`: (exit 0, the JSON).
fn verify(url: &str, policy: &str, nonce: Option<&str>) -> (bool, serde_json::Value) {
    let mut args = vec!["verify", url, "--policy", policy, "--json", "--timeout-ms", "20000"];
    if let Some(n) = nonce {
        args.extend(["--nonce", n]);
    }
    let o = Command::new(psl()).args(&args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("psl verify printed no JSON ({e}): {out}\n{}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(o.status.success(), v["verified"] == true, "{v}");
    (o.status.success(), v)
}

/// The status of the check named `name` in a `psl verify --json` answer.
fn check(v: &serde_json::Value, name: &str) -> String {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .map(|c| c["status"].as_str().unwrap().to_string())
        .unwrap_or_else(|| "absent".into())
}

/// An HTTPS server with a TLS key of its own that answers every attestation request with
/// `answer` (evidence taken from the honest endpoint).
fn hostile(answer: serde_json::Value) -> HttpServer {
    let id = psl_faas::tls::TlsIdentity::generate("mallory").unwrap();
    let attest: Attest = Arc::new(move |_nonce| Ok(answer.clone()));
    let routes = Routes { metrics: None, attestation: Some(attest), api: None };
    HttpServer::serve("127.0.0.1:0".parse().unwrap(), routes, Some(id.server_config(false).unwrap()), Limits::default())
        .unwrap()
}

/// This build's sim measurement, as `psl attest measure` prints it.
fn measurement() -> [u8; 32] {
    let o = Command::new(psl()).args(["attest", "measure"]).output().unwrap();
    let m = String::from_utf8(o.stdout).unwrap();
    let m = m.lines().find_map(|l| l.strip_prefix("measurement = ")).unwrap().trim_matches('"').to_string();
    let mut b = [0u8; 32];
    hex::decode_to_slice(m, &mut b).unwrap();
    b
}

/// An endpoint whose evidence is genuine (the sim platform's key, this build's measurement) and
/// binds its own TLS key, but always for `old_nonce`, whatever the client asks.
fn stale_endpoint(m: &[u8; 32], old_nonce: [u8; 32]) -> HttpServer {
    use psl_faas::attest::Attester;
    let id = psl_faas::tls::TlsIdentity::generate("stale").unwrap();
    let rd = psl_faas::attest::bind_https_tls(&id.spki_hash());
    let platform = psl_faas::SimPlatform::from_secret(&[0x42; 32]).unwrap();
    let att = psl_faas::attest::SimAttester::new(platform, psl_crypto::Hash256(*m));
    let ev = att.attest(&old_nonce, &rd).unwrap();
    let answer = serde_json::json!({"role": "memcached", "backend": ev.backend, "evidence": hex::encode(&ev.bytes)});
    let attest: Attest = Arc::new(move |_nonce| Ok(answer.clone()));
    let routes = Routes { metrics: None, attestation: Some(attest), api: None };
    HttpServer::serve("127.0.0.1:0".parse().unwrap(), routes, Some(id.server_config(false).unwrap()), Limits::default())
        .unwrap()
}

/// The honest endpoint's answer for `nonce`, fetched as a relay would (accepting its key).
fn relay_answer(url: &str, nonce: &str) -> serde_json::Value {
    let addr: std::net::SocketAddr = url.trim_start_matches("https://").parse().unwrap();
    let tls = psl_faas::tls::TlsIdentity::generate("relay").unwrap().client_config().unwrap();
    let f = psl_http::client::get_tls(
        addr,
        "127.0.0.1",
        &format!("/v1/attestation?nonce={nonce}"),
        tls,
        std::time::Duration::from_secs(20),
        1 << 20,
    )
    .unwrap();
    assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
    serde_json::from_slice(&f.body).unwrap()
}

#[test]
fn psl_verify_accepts_the_attested_endpoint_and_refuses_every_impostor() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::write(d.join("sim.key"), hex::encode([0x42u8; 32])).unwrap();
    let ok_policy = policy(d, "policy.toml", true);
    let no_sim = policy(d, "no-sim.toml", false);
    #[rustfmt::skip]
    let args = ["memcached", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                "--attest", "sim", "--sim-platform-key", "sim.key"];
    let fe: Proc = start(d, &args, "https");
    let url = fe.line.clone();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    // The honest endpoint, under a policy that accepts the sim platform.
    let (ok, v) = verify(&url, &ok_policy, None);
    assert!(ok, "{v}");
    assert_eq!(v["role"], "memcached", "{v}");
    for c in ["answer", "report data binds the channel key", "nonce"] {
        assert_eq!(check(&v, c), "pass", "{c}: {v}");
    }

    // The same evidence is refused by a policy that does not accept the sim backend.
    let (ok, v) = verify(&url, &no_sim, None);
    assert!(!ok, "{v}");
    assert!(v["refused"].as_str().unwrap().contains("allow_insecure_sim"), "{v}");

    // A man in the middle relays the honest evidence for the client's own nonce under its key.
    let n1 = hex::encode([7u8; 32]);
    let mitm = hostile(relay_answer(&url, &n1));
    let (ok, v) = verify(&mitm.base_url(), &ok_policy, Some(&n1));
    assert!(!ok, "a relayed answer under another TLS key verified: {v}");
    assert_eq!(check(&v, "report data binds the channel key"), "fail", "{v}");

    // A replay: genuine evidence that binds the very TLS key the client talks to, but was
    // made for an old nonce (an endpoint answering from a cache of old reports).
    let stale = stale_endpoint(&measurement(), [8u8; 32]);
    let (ok, v) = verify(&stale.base_url(), &ok_policy, Some(&hex::encode([9u8; 32])));
    assert!(!ok, "a replayed answer verified: {v}");
    assert_eq!(
        check(&v, "report data binds the channel key"),
        "pass",
        "the key binding holds, so only the nonce refuses it: {v}"
    );
    assert_eq!(check(&v, "nonce"), "fail", "{v}");

    // A flipped byte in the evidence.
    let mut a = relay_answer(&url, &n1);
    let mut ev = hex::decode(a["evidence"].as_str().unwrap()).unwrap();
    let mid = ev.len() / 2;
    ev[mid] ^= 1;
    a["evidence"] = hex::encode(ev).into();
    let flipped = hostile(a);
    let (ok, v) = verify(&flipped.base_url(), &ok_policy, Some(&n1));
    assert!(!ok, "flipped evidence verified: {v}");
}
