//! The metrics server against a real HTTP client (ureq): what a scraper gets, what a wrong
//! request gets, and the bounds an abusive client meets.

use psl_http::{Limits, MetricsServer, Render};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn render() -> Render {
    Arc::new(|| "# TYPE psl_test_total counter\npsl_test_total 7\n".to_string())
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
}

#[test]
fn a_scraper_gets_the_roles_metrics_and_the_servers_own() {
    let s = MetricsServer::start("127.0.0.1:0".parse().unwrap(), render()).unwrap();
    let mut r = agent().get(&s.url()).call().unwrap();
    assert_eq!(r.status(), 200);
    let kind = r.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    let body = r.body_mut().read_to_string().unwrap();
    assert!(body.contains("psl_test_total 7\n"), "{body}");
    assert!(body.contains("psl_http_requests_ok_total 1\n"), "{body}");
    let mut h = agent().get(&format!("http://{}/healthz", s.local_addr())).call().unwrap();
    assert_eq!(h.body_mut().read_to_string().unwrap(), "ok\n");
}

#[test]
fn a_wrong_path_or_method_is_refused_in_json_and_counted() {
    let s = MetricsServer::start("127.0.0.1:0".parse().unwrap(), render()).unwrap();
    let base = format!("http://{}", s.local_addr());
    let mut r = agent().get(&format!("{base}/v1/kv/x")).call().unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers().get("content-type").unwrap(), "application/json");
    let v: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["error"].as_str().unwrap().contains("/v1/kv/x"), "{v}");
    let mut r = agent().post(&s.url()).send("x").unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers().get("allow").unwrap(), "GET, HEAD");
    let v: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["error"].as_str().unwrap().contains("POST"), "{v}");
    assert_eq!(s.stats().refused.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[test]
fn a_client_that_holds_every_connection_slot_is_cut_at_the_head_deadline() {
    let limits = Limits { connections_max: 1, header_read_ms: 300, connection_ms: 5_000, ..Limits::default() };
    let s = MetricsServer::start_with("127.0.0.1:0".parse().unwrap(), render(), limits).unwrap();
    // A slow client takes the only slot: half a request line, then nothing.
    let mut slow = TcpStream::connect(s.local_addr()).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Meanwhile another connection is closed at accept, and counted.
    let mut other = TcpStream::connect(s.local_addr()).unwrap();
    other.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = other.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = Vec::new();
    let _ = other.read_to_end(&mut buf);
    assert!(buf.is_empty(), "a connection beyond the bound is served: {:?}", String::from_utf8_lossy(&buf));
    assert_eq!(s.stats().connections_refused.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The slow client is cut at the head deadline, and its slot serves the next scraper.
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(start.elapsed() < Duration::from_secs(4), "the slow client was not cut");
    let r = agent().get(&s.url()).call().unwrap();
    assert_eq!(r.status(), 200);
}
