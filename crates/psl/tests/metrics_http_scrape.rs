//! Every long-running role of `psl up` serves Prometheus metrics over HTTP (`--metrics`), and a
//! real HTTP client (ureq) scrapes each URL `DIR/cluster.json` lists: the role's own counters
//! are there, and they move with the traffic (a memcached `set` counts on its front end). The
//! front end's attested HTTPS endpoint (`kv.http`) verifies with `psl verify` under the
//! deployment's policy.
//!
//! Every wait is bounded; `psl up`'s children die with it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod common;
use common::mc::Client;
use common::{start, Proc};

fn scrape(url: &str) -> String {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(10))).build().new_agent();
    let mut r = agent.get(url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status(), 200, "{url}");
    let kind = r.headers().get("content-type").expect("a content type").to_str().unwrap().to_string();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{url}: {kind}");
    r.body_mut().read_to_string().unwrap()
}

/// The value of the sample `name` (no labels) in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn every_role_of_psl_up_serves_its_metrics_to_a_real_http_client() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    #[rustfmt::skip]
    let args = ["up", "--kv", "--memcached", "1", "--workers", "1", "--servers", "1", "--dir", "up"];
    let _up: Proc = start(d, &args, "up");
    let text = std::fs::read_to_string(d.join("up/cluster.json")).unwrap();
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let urls: BTreeMap<String, String> = serde_json::from_value(file["metrics"].clone()).expect("a metrics object");
    // What each role must show: its own counters, and every one its process's figures.
    let want = |name: &str| -> &'static str {
        match name {
            n if n.starts_with("memcached") => "psl_memcached_cmd_get",
            n if n.starts_with("kv capsule server") => "psl_server_records_persisted_total",
            "kv capsuledb" => "psl_capsuledb_applied_total",
            "kv coordinator" => "psl_node_records_applied",
            _ => "process_resident_memory_bytes",
        }
    };
    for expected in ["router", "scheduler", "leader", "worker 1", "kv coordinator", "kv capsuledb", "memcached 1"] {
        assert!(urls.contains_key(expected), "no metrics URL for {expected}: {urls:?}");
    }
    assert!(urls.keys().any(|k| k.starts_with("kv capsule server")), "{urls:?}");
    assert!(urls.keys().any(|k| k.starts_with("capsule host")), "{urls:?}");
    for (name, url) in &urls {
        let body = scrape(url);
        assert!(body.contains(want(name)), "{name} at {url} lacks {}:\n{body}", want(name));
        assert!(body.contains("process_cpu_seconds_total "), "{name} at {url} lacks its process figures");
        assert!(body.contains("psl_http_requests_ok_total"), "{name} at {url} lacks the server's own counters");
    }
    // The front end's counters move with its traffic.
    let kv = &file["kv"];
    let fe: SocketAddr = kv["front_ends"][0].as_str().unwrap().parse().unwrap();
    let url = &urls["memcached 1"];
    let before = sample(&scrape(url), "psl_memcached_cmd_set").expect("cmd_set");
    let mut c = Client::connect(fe);
    assert_eq!(c.set("scraped", 0, b"v"), "STORED");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = sample(&scrape(url), "psl_memcached_cmd_set").expect("cmd_set");
        if now >= before + 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "cmd_set stayed at {now} after a set");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The front end's attested HTTPS endpoint verifies under the deployment's policy.
    let https = kv["http"][0].as_str().expect("kv.http lists the front ends' endpoints");
    let policy = d.join("up/attest-policy.toml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["verify", https, "--policy", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("VERIFIED"), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    // A wrong path is refused with a JSON error, as the API's will be.
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let base = url.trim_end_matches("/metrics");
    let mut r = agent.get(&format!("{base}/nope")).call().unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["error"].as_str().unwrap().contains("/nope"), "{v}");
}
