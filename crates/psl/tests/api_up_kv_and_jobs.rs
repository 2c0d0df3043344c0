//! The HTTPS API of a whole `psl up --kv` deployment, as a user reaches it: a credential from
//! `psl keys client`, the front end's KV routes (`kv.http` in `DIR/cluster.json`) and the
//! leader's jobs routes (`faas.http`), every answer's signature checked against the key of
//! the certificate the endpoint presented. A job submitted over HTTPS runs on the deployment's
//! workers (in a capsule of its own, as `psl run --cluster` runs it) and its report, the
//! lambdas' output included, comes back over HTTPS.
//!
//! Every wait is bounded; `psl up`'s children die with it.

use psl_crypto::SigningKey;
use psl_http::client::Session;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{start, Proc};

struct Client {
    s: Session,
    side: psl::api::ClientSide,
    signed_once: bool,
}

impl Client {
    fn connect(url: &str, cred: &Path) -> Client {
        let addr: SocketAddr = url.trim_start_matches("https://").parse().unwrap();
        let tls = psl_faas::tls::TlsIdentity::generate("test client").unwrap().client_config().unwrap();
        let s = Session::connect(addr, "localhost", tls, Duration::from_secs(10)).unwrap();
        let spki = psl_faas::tls::peer_spki_hash(Some(&s.peer_certs)).unwrap();
        let answer_key = psl_faas::tls::peer_answer_key(Some(&s.peer_certs)).unwrap();
        let c: serde_json::Value = serde_json::from_slice(&std::fs::read(cred).unwrap()).unwrap();
        let mut k = [0u8; 32];
        hex::decode_to_slice(c["key"].as_str().unwrap(), &mut k).unwrap();
        let key = SigningKey::from_bytes(&k).unwrap();
        let cert_hex = c["cert"].as_str().unwrap().to_string();
        Client { s, side: psl::api::ClientSide { key, cert_hex, spki_hash: spki, answer_key }, signed_once: false }
    }

    /// A request (signed when it is the connection's first); the answer's signature checks.
    fn call(&mut self, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let sent = self.side.request(method, path, body, !self.signed_once);
        self.signed_once = true;
        let a = self.s.request(method, path, &sent.headers, body.to_vec(), 16 << 20).unwrap();
        let given = a.psl_headers.iter().find(|(n, _)| n == "psl-signature").map(|(_, v)| v.as_str());
        assert!(given.is_some(), "{method} {path}: an unsigned answer");
        assert!(
            self.side.answer_checks(&sent, a.status, &a.body, given),
            "{method} {path}: the answer's signature does not check"
        );
        (a.status, serde_json::from_slice(&a.body).unwrap())
    }
}

fn credential(d: &Path, can: &str, out: &str) {
    let st = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["keys", "client", "--owner", "up/kv/owner.key", "--capsule", "up/kv/kv.capsule", "--can", can])
        .args(["--out", out])
        .current_dir(d)
        .status()
        .unwrap();
    assert!(st.success(), "psl keys client failed");
}

#[test]
fn a_user_with_a_credential_uses_the_store_and_runs_a_job_over_https() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    #[rustfmt::skip]
    let args = ["up", "--kv", "--memcached", "1", "--workers", "1", "--servers", "1", "--no-metrics", "--dir", "up"];
    let _up: Proc = start(d, &args, "up");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("up/cluster.json")).unwrap()).unwrap();
    let kv_url = file["kv"]["http"][0].as_str().expect("kv.http in the cluster file").to_string();
    let jobs_url = file["faas"]["http"].as_str().expect("faas.http in the cluster file").to_string();
    credential(d, "read,write", "kv.cred");
    credential(d, "run", "run.cred");

    // The store, through the front end.
    let mut kv = Client::connect(&kv_url, &d.join("kv.cred"));
    assert_eq!(kv.call("PUT", "/v1/kv/greeting", b"hello").0, 200);
    let (s, got) = kv.call("GET", "/v1/kv/greeting", b"");
    assert_eq!((s, got["value"].as_str()), (200, Some("aGVsbG8=")), "{got}");
    let (s, sync) = kv.call("POST", "/v1/sync?durable=true", b"");
    assert_eq!((s, &sync["durable"]), (200, &serde_json::json!(true)), "{sync}");
    // A KV credential does not run jobs.
    let mut wrong = Client::connect(&jobs_url, &d.join("kv.cred"));
    let (s, e) = wrong.call("POST", "/v1/jobs", br#"{"program": "emit(1)", "lambdas": 1}"#);
    assert_eq!(s, 403, "{e}");

    // A job, through the leader.
    let program =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/wordcount.js")).unwrap();
    let body = serde_json::json!({ "program": program, "lambdas": 2, "input": "a b a\nc a" }).to_string();
    let mut jobs = Client::connect(&jobs_url, &d.join("run.cred"));
    let (s, sub) = jobs.call("POST", "/v1/jobs", body.as_bytes());
    assert_eq!(s, 202, "{sub}");
    let id = sub["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let (s, st) = jobs.call("GET", &format!("/v1/jobs/{id}"), b"");
        assert_eq!(s, 200, "{st}");
        if st["status"] != "running" {
            break st;
        }
        assert!(Instant::now() < deadline, "the job did not end within 120 s: {st}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(done["status"], "done", "{done}");
    let report = &done["report"];
    assert_eq!(report["lambdas"].as_array().map(Vec::len), Some(2), "{report}");
    assert_eq!(report["ok"], true, "{report}");
    // Lambda 0 reduces: the words of the input, counted across both lambdas.
    let emitted = &report["lambdas"][0]["emitted"];
    assert_eq!(emitted[1].as_str(), Some(r#"{"a":3,"b":1,"c":1}"#), "{report}");
}
