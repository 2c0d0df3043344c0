//! Helpers shared by the integration tests: loopback routers and endpoints with short timings,
//! tagged messages, and bounded waits.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use psl_fabric::{Fabric, LinkTiming, RouterConfig, RouterHandle, TcpConfig, TcpEndpoint};

/// Timings short enough for tests: reconnects within ~0.2 s.
pub fn timing() -> LinkTiming {
    LinkTiming {
        connect_timeout: Duration::from_secs(1),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        heartbeat_interval: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(3),
        write_timeout: Duration::from_secs(3),
    }
}

pub fn router_config(parent: Option<SocketAddr>) -> RouterConfig {
    RouterConfig { parent, timing: timing(), ..RouterConfig::default() }
}

pub fn router(parent: Option<SocketAddr>) -> RouterHandle {
    psl_fabric::Router::spawn(router_config(parent)).expect("router starts")
}

pub fn tcp_config(name: &str) -> TcpConfig {
    TcpConfig { name: name.into(), timing: timing(), ..TcpConfig::default() }
}

pub fn endpoint(addr: SocketAddr, name: &str) -> TcpEndpoint {
    TcpEndpoint::connect(addr, tcp_config(name)).expect("endpoint connects")
}

/// Polls `cond` every 5 ms; panics naming `what` if it is not true within `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A message naming its sender and sequence number, padded to `len` bytes (at least 5).
pub fn tag(sender: u8, seq: u32, len: usize) -> Bytes {
    let mut v = vec![0xa5u8; len.max(5)];
    v[0] = sender;
    v[1..5].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(v)
}

pub fn untag(m: &[u8]) -> (u8, u32) {
    (m[0], u32::from_le_bytes(m[1..5].try_into().unwrap()))
}

/// Receives until `n` messages came or `timeout` passed.
pub fn recv_n(ep: &dyn Fabric, n: usize, timeout: Duration) -> Vec<Bytes> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if let Some(m) = ep.recv_timeout(left.min(Duration::from_millis(50))).unwrap() {
            got.push(m);
        }
    }
    got
}

/// Receives until nothing arrives for `quiet` (bounded by `timeout` overall).
pub fn recv_until_quiet(ep: &dyn Fabric, quiet: Duration, timeout: Duration) -> Vec<Bytes> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    while Instant::now() < deadline {
        match ep.recv_timeout(quiet).unwrap() {
            Some(m) => got.push(m),
            None => break,
        }
    }
    got
}

/// Checks `got` holds every `(sender, seq)` for `seq < per_sender` of each sender in `from`
/// exactly once and nothing else, in per-sender order.
pub fn assert_exactly_once(who: &str, got: &[Bytes], from: &[u8], per_sender: u32) {
    let mut next: HashMap<u8, u32> = from.iter().map(|s| (*s, 0)).collect();
    for m in got {
        let (s, q) = untag(m);
        let want = next.get_mut(&s).unwrap_or_else(|| panic!("{who}: message from unexpected sender {s}"));
        assert_eq!(q, *want, "{who}: from sender {s}: got seq {q}, expected {want} (lost, duplicated or reordered)");
        *want += 1;
    }
    for (s, n) in next {
        assert_eq!(n, per_sender, "{who}: got {n} of {per_sender} messages from sender {s}");
    }
}
