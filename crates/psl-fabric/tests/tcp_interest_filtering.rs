//! The router forwards each endpoint only what its interest wants (`Interest::encode_frame`,
//! sent first on every connection), at the last hop of a tree; endpoints without an interest,
//! and routers, get everything.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{recv_until_quiet, router, tcp_config, wait_until};
use psl_fabric::{Fabric, Interest, TcpEndpoint};

/// An SCL wire message of `kind` for capsule `cap` (the public prefix the router classifies).
fn msg(kind: u8, cap: u8, payload: &[u8]) -> Bytes {
    let mut m = vec![1, kind];
    m.extend_from_slice(&[cap; 32]);
    m.extend_from_slice(payload);
    Bytes::from(m)
}

/// An ack (type 4) naming one writer of node `node`.
fn ack(cap: u8, node: u32) -> Bytes {
    let mut p = 7u32.to_le_bytes().to_vec();
    p.extend_from_slice(&1u16.to_le_bytes());
    p.extend_from_slice(&(node << 16).to_le_bytes());
    p.extend_from_slice(&[0; 48]);
    msg(4, cap, &p)
}

fn with_interest(addr: std::net::SocketAddr, name: &str, interest: Interest) -> TcpEndpoint {
    TcpEndpoint::connect(addr, psl_fabric::TcpConfig { interest: Some(interest), ..tcp_config(name) })
        .expect("endpoint connects")
}

fn names(got: &[Bytes], all: &[(&'static str, Bytes)]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> =
        got.iter().map(|m| all.iter().find(|(_, b)| b == m).map_or("?", |(n, _)| *n)).collect();
    out.sort_unstable();
    out
}

#[test]
fn each_endpoint_gets_what_its_interest_wants_and_the_rest_get_everything() {
    let root = router(None);
    let child = router(Some(root.local_addr()));
    wait_until(Duration::from_secs(5), "the child router connected", || child.stats().parent_connected());
    // A node of capsule 1 (node 1), a node of capsule 2 (node 2) behind the child router, an
    // endpoint that says nothing (everything), and the publisher.
    let a = with_interest(root.local_addr(), "a", Interest::node([1; 32], 1, false));
    let b = with_interest(child.local_addr(), "b", Interest::node([2; 32], 2, false));
    let c = common::endpoint(root.local_addr(), "c");
    let p = common::endpoint(child.local_addr(), "p");
    wait_until(Duration::from_secs(5), "every link registered", || {
        root.stats().children() == 3 && child.stats().children() == 2
    });
    // The interest frames travel before anything else; give them a moment to be read.
    std::thread::sleep(Duration::from_millis(100));

    let all = [
        ("rec1", msg(1, 1, b"record of capsule 1")),
        ("rec2", msg(1, 2, b"record of capsule 2")),
        ("ack1.n1", ack(1, 1)),
        ("ack1.n2", ack(1, 2)),
        ("dbget1", msg(5, 1, b"a CapsuleDB get")),
        ("certs2", msg(10, 2, b"statements")),
        ("other", Bytes::from_static(b"\x09not an SCL message the classifier knows")),
    ];
    for (_, m) in &all {
        p.publish(m.clone()).unwrap();
    }
    let quiet = Duration::from_millis(300);
    let got = |ep: &TcpEndpoint| names(&recv_until_quiet(ep, quiet, Duration::from_secs(10)), &all);
    assert_eq!(got(&a), vec!["ack1.n1", "other", "rec1"]);
    assert_eq!(got(&b), vec!["certs2", "other", "rec2"]);
    let mut everything: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
    everything.sort_unstable();
    assert_eq!(got(&c), everything);
    // The filters counted what they held back: 4 for a (at the root), 4 for b (at the child).
    let filtered = |r: &psl_fabric::RouterHandle| r.stats().totals().frames_filtered;
    assert_eq!(filtered(&root), 4);
    assert_eq!(filtered(&child), 4);
    // No interest frame reached an endpoint.
    assert!(recv_until_quiet(&c, quiet, Duration::from_secs(2)).is_empty());
}

#[test]
fn interest_frames_round_trip_and_garbage_is_not_one() {
    for i in [
        Interest::node([3; 32], 9, true),
        Interest::coordinator([4; 32]),
        Interest::capsuledb([5; 32], u32::MAX),
        Interest::everything(vec![]),
        Interest::everything(vec![[6; 32], [7; 32]]),
    ] {
        assert_eq!(Interest::decode_frame(&i.encode_frame()), Some(i));
    }
    let f = Interest::node([3; 32], 9, false).encode_frame();
    for cut in 0..f.len() {
        assert_eq!(Interest::decode_frame(&f[..cut]), None, "cut at {cut}");
    }
    let mut long = f.clone();
    long.push(0);
    assert_eq!(Interest::decode_frame(&long), None);
    let mut flags = f.clone();
    flags[2] |= 0x80;
    assert_eq!(Interest::decode_frame(&flags), None);
    // Too many capsules to name: sent as everything, a superset.
    let many = Interest { capsules: vec![[1; 32]; 1025], records: true, ..Interest::default() };
    assert_eq!(Interest::decode_frame(&many.encode_frame()), Some(Interest::everything(vec![])));
}
