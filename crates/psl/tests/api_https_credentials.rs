//! The HTTPS KV API over real TLS and HTTP (hyper on both sides): a front end's routes behind
//! client credentials, as `psl memcached --http` serves them. A client with an owner-signed
//! credential reads and writes over one keep-alive connection and checks every answer's
//! signature with the key it pinned; the refusals (no credential, a forged one, a reader that
//! writes, a body over the bound) get 401, 403 and 413, and the endpoint's metrics count them.

use psl_capsule::{ClientCert, Permissions};
use psl_crypto::{OwnerKey, SigningKey};
use psl_faas::tls::TlsIdentity;
use psl_http::client::Session;
use std::sync::Arc;
use std::time::Duration;

struct Endpoint {
    _emb: psl_memcached::deploy::Embedded,
    server: psl_http::HttpServer,
    spki: [u8; 32],
    answer_key: [u8; 32],
    owner: OwnerKey,
    capsule: psl_capsule::CapsuleName,
}

fn endpoint() -> Endpoint {
    let emb = psl_memcached::deploy::Embedded::start(&Default::default()).unwrap();
    let id = TlsIdentity::generate("psl test").unwrap();
    let (spki, signer) = (id.spki_hash(), id.answer_signer().unwrap());
    let answer_key = signer.public_key();
    let owner = OwnerKey::generate();
    let capsule = emb.meta.name();
    let guard = psl::api::Guard::new(capsule, owner.public(), spki, signer);
    let routes = psl_http::Routes {
        metrics: Some(Arc::new(String::new)),
        attestation: None,
        api: Some(psl::api::kv(emb.front_ends[0].clone(), Arc::new(guard))),
    };
    let limits = psl_http::Limits { body_bytes_max: 4096, ..psl_http::Limits::default() };
    let server = psl_http::HttpServer::serve(
        "127.0.0.1:0".parse().unwrap(),
        routes,
        Some(id.server_config(false).unwrap()),
        limits,
    )
    .unwrap();
    Endpoint { _emb: emb, server, spki, answer_key, owner, capsule }
}

struct Client {
    s: Session,
    side: psl::api::ClientSide,
}

impl Client {
    fn new(e: &Endpoint, owner: &OwnerKey, can: &str) -> Client {
        let tls = TlsIdentity::generate("client").unwrap().client_config().unwrap();
        let s = Session::connect(e.server.local_addr(), "localhost", tls, Duration::from_secs(10)).unwrap();
        // The client pins the key it was shown (here: the endpoint's own; an attested client
        // takes it from verified evidence).
        assert_eq!(psl_faas::tls::peer_spki_hash(Some(&s.peer_certs)).unwrap(), e.spki);
        let key = SigningKey::generate();
        let can = Permissions::parse(can).unwrap();
        let cert = ClientCert::issue(&owner.signing_key(), e.capsule, key.verifying_key(), can, 0, u64::MAX);
        let side = psl::api::ClientSide {
            key,
            cert_hex: hex::encode(cert.encode()),
            spki_hash: e.spki,
            answer_key: e.answer_key,
        };
        Client { s, side }
    }

    /// A signed request; the answer's signature is checked against the pinned key.
    fn call(&mut self, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let sent = self.side.request(method, path, body, true);
        let a = self.s.request(method, path, &sent.headers, body.to_vec(), 1 << 20).unwrap();
        if a.status != 413 {
            let given = a.psl_headers.iter().find(|(n, _)| n == "psl-signature").map(|(_, v)| v.as_str());
            assert!(given.is_some(), "{method} {path}: an unsigned answer");
            assert!(self.side.answer_checks(&sent, a.status, &a.body, given), "{method} {path}");
        }
        (a.status, serde_json::from_slice(&a.body).unwrap())
    }
}

fn metric(e: &Endpoint, outcome: &str) -> u64 {
    let tls = TlsIdentity::generate("scraper").unwrap().client_config().unwrap();
    let f =
        psl_http::client::get_tls(e.server.local_addr(), "localhost", "/metrics", tls, Duration::from_secs(5), 1 << 20)
            .unwrap();
    let text = String::from_utf8(f.body).unwrap();
    let line = format!("psl_http_api_requests_total{{outcome=\"{outcome}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&line)?.parse().ok()).unwrap_or_else(|| panic!("no {line} in\n{text}"))
}

#[test]
fn a_credentialed_client_uses_the_store_over_https_and_the_refusals_are_counted() {
    let e = endpoint();
    let mut c = Client::new(&e, &e.owner, "read,write");
    for i in 0..20 {
        let (s, b) = c.call("PUT", &format!("/v1/kv/k{i}"), format!("v{i}").as_bytes());
        assert_eq!(s, 200, "{b}");
    }
    let (s, b) = c.call("GET", "/v1/kv/k7", b"");
    assert_eq!((s, b["value"].as_str()), (200, Some("djc=")), "{b}"); // base64("v7")
    let (s, b) = c.call("GET", "/v1/kv?prefix=k1&limit=100", b"");
    assert_eq!((s, b["items"].as_array().map(Vec::len)), (200, Some(11)), "{b}"); // k1, k10..k19
    let ok = metric(&e, "ok");
    assert!(ok >= 22, "{ok}");

    // No credential at all: 401.
    let tls = TlsIdentity::generate("anon").unwrap().client_config().unwrap();
    let mut anon = Session::connect(e.server.local_addr(), "localhost", tls, Duration::from_secs(10)).unwrap();
    assert_eq!(anon.request("GET", "/v1/kv/k1", &[], Vec::new(), 1 << 20).unwrap().status, 401);
    // A credential its holder signed itself: 401.
    let mallory = OwnerKey::generate();
    assert_eq!(Client::new(&e, &mallory, "read,write").call("PUT", "/v1/kv/k1", b"x").0, 401);
    // A reader that writes: 403, and the value is unchanged.
    let mut reader = Client::new(&e, &e.owner, "read");
    assert_eq!(reader.call("PUT", "/v1/kv/k1", b"x").0, 403);
    assert_eq!(reader.call("GET", "/v1/kv/k1", b"").1["value"].as_str(), Some("djE="));
    assert_eq!(metric(&e, "unauthenticated"), 2);
    assert_eq!(metric(&e, "forbidden"), 1);
    // A body over the bound: 413 before any credential is looked at.
    assert_eq!(c.call("PUT", "/v1/kv/big", &vec![b'x'; 5000]).0, 413);
    assert_eq!(metric(&e, "bad_request"), 1);
}
