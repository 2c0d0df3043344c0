//! The NATS backend against real `nats-server` processes on loopback: subject routing by role,
//! no echo, bounded queues, the adversary on top, failover inside a cluster of three.
//! Needs Debian's nats-server (scripts/install-nats-test-deps.sh).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use psl_fabric::natsd::{free_port, NatsServer, NatsServerOptions};
use psl_fabric::{Adversarial, Fabric, FabricError, FaultConfig, Interest, NatsConfig, NatsEndpoint};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const T: Duration = Duration::from_secs(5);

fn server(dir: &std::path::Path, name: &str) -> NatsServer {
    let o = NatsServerOptions::new(name, free_port(LO).unwrap(), dir);
    NatsServer::start(&o, Duration::from_secs(10)).expect("nats-server starts (scripts/install-nats-test-deps.sh)")
}

fn ep(urls: &[String], name: &str, interest: &Interest) -> NatsEndpoint {
    NatsEndpoint::connect(urls, interest, NatsConfig { name: name.into(), ..NatsConfig::default() }).unwrap()
}

/// An SCL-shaped message: version 1, `t`, capsule, payload.
fn msg(t: u8, cap: [u8; 32], body: &[u8]) -> Bytes {
    let mut m = vec![1, t];
    m.extend_from_slice(&cap);
    m.extend_from_slice(body);
    Bytes::from(m)
}

fn ack_for(cap: [u8; 32], writers: &[u32]) -> Bytes {
    let mut p = 0x8000u32.to_le_bytes().to_vec();
    p.extend_from_slice(&(writers.len() as u16).to_le_bytes());
    for w in writers {
        p.extend_from_slice(&w.to_le_bytes());
        p.extend_from_slice(&[0; 48]);
    }
    p.extend_from_slice(&[0; 64]);
    msg(4, cap, &p)
}

/// Everything that arrives within `quiet` of the last message.
fn drain(e: &dyn Fabric, quiet: Duration) -> Vec<Bytes> {
    let mut v = Vec::new();
    while let Some(m) = e.recv_timeout(quiet).unwrap() {
        v.push(m);
    }
    v
}

#[test]
fn each_role_receives_its_capsules_and_messages_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "solo");
    let urls = vec![s.url()];
    let (a, b) = ([0xaa; 32], [0xbb; 32]);
    let node1 = ep(&urls, "node1", &Interest::node(a, 1, false));
    let node2 = ep(&urls, "node2", &Interest::node(a, 2, true));
    let server_a = ep(&urls, "server", &Interest::server(a));
    let db = ep(&urls, "capsuledb", &Interest::capsuledb(a, 30_000));
    let observer = ep(&urls, "observer", &Interest::observer(a));
    let other = ep(&urls, "other-capsule", &Interest::node(b, 1, true));
    let publisher = ep(&urls, "publisher", &Interest::default());

    let rec = msg(1, a, b"record");
    for m in [
        rec.clone(),
        msg(2, a, b"repair"),
        msg(3, a, b"heads"),
        ack_for(a, &[(1 << 16) | 3, (1 << 16) | 4]),
        msg(5, a, b"db-get"),
        msg(6, a, b"db-answer"),
        msg(7, a, b"db-heads"),
        msg(10, a, b"certs"),
        msg(1, b, b"capsule b"),
        Bytes::from_static(b"opaque"),
    ] {
        publisher.publish(m).unwrap();
    }
    let q = Duration::from_millis(400);
    let kinds = |v: Vec<Bytes>| -> Vec<String> {
        let mut k: Vec<String> = v
            .iter()
            .map(|m| if m.len() >= 34 && m[0] == 1 { format!("{}{:02x}", m[1], m[2]) } else { "any".into() })
            .collect();
        k.sort();
        k
    };
    // node 1: records, key statements, repair, heads, its own ack (one copy although it names
    // two writers), opaque.
    assert_eq!(kinds(drain(&node1, q)), ["10aa", "1aa", "2aa", "3aa", "4aa", "any"]);
    // node 2 reads through CapsuleDB: answers and frontiers too, but not node 1's ack.
    assert_eq!(kinds(drain(&node2, q)), ["10aa", "1aa", "2aa", "3aa", "6aa", "7aa", "any"]);
    assert_eq!(kinds(drain(&server_a, q)), ["10aa", "1aa", "2aa", "3aa", "any"]);
    assert_eq!(kinds(drain(&db, q)), ["10aa", "1aa", "2aa", "3aa", "5aa", "any"]);
    assert_eq!(kinds(drain(&observer, q)), ["10aa", "1aa", "any"]);
    assert_eq!(kinds(drain(&other, q)), ["1bb", "any"]);
    // Never echoed to the publisher (no_echo), which subscribed to the catch-all only.
    assert!(drain(&publisher, q).is_empty());
    let st = publisher.stats();
    assert_eq!((st.sent, st.subjects_published), (10, 10));
    assert_eq!(node1.stats().received, 6);
    assert_eq!(node1.subjects().len(), 6);
}

#[test]
fn per_sender_order_limits_and_bounded_queues() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "solo");
    let urls = vec![s.url()];
    let c = [7; 32];
    let small = NatsEndpoint::connect(
        &urls,
        &Interest::observer(c),
        NatsConfig { name: "small".into(), queue_msgs_max: 10, ..NatsConfig::default() },
    )
    .unwrap();
    let tx = ep(&urls, "tx", &Interest::default());
    for i in 0..100u32 {
        tx.publish(msg(1, c, &i.to_le_bytes())).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let got = drain(&small, Duration::from_millis(200));
    assert_eq!(got.len(), 10, "the receive queue holds 10");
    let seqs: Vec<u32> = got.iter().map(|m| u32::from_le_bytes(m[34..38].try_into().unwrap())).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "per-sender order: {seqs:?}");
    assert_eq!(small.stats().dropped_full, 90);
    assert!(matches!(tx.publish(Bytes::new()), Err(FabricError::Empty { .. })));
    let big = Bytes::from(vec![1u8; 17 << 20]);
    assert!(matches!(tx.publish(big), Err(FabricError::TooLarge { .. })));
    // A message of 4 MiB crosses (the server's max_payload is raised to the frame limit).
    let rx = ep(&urls, "rx", &Interest::observer(c));
    tx.publish(msg(1, c, &vec![9u8; 4 << 20])).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap().map(|m| m.len()), Some(34 + (4 << 20)));
}

#[test]
fn a_wrong_url_fails_at_once_and_the_adversary_works_on_top() {
    let dir = tempfile::tempdir().unwrap();
    let dead = free_port(LO).unwrap();
    let t0 = Instant::now();
    let e = NatsEndpoint::connect(&[format!("nats://{dead}")], &Interest::default(), NatsConfig::default());
    assert!(matches!(e, Err(FabricError::Nats { .. })), "no server: an error");
    assert!(t0.elapsed() < Duration::from_secs(20));
    let missing = NatsConfig { creds: Some(dir.path().join("missing.creds")), ..NatsConfig::default() };
    let s = server(dir.path(), "solo");
    let e = NatsEndpoint::connect(&[s.url()], &Interest::default(), missing).err().expect("no creds file");
    assert!(e.to_string().contains("credentials"), "{e}");

    let c = [3; 32];
    let rx = ep(&[s.url()], "rx", &Interest::observer(c));
    let faults = FaultConfig { seed: 11, drop: 0.5, ..FaultConfig::default() };
    let tx = Adversarial::new(ep(&[s.url()], "tx", &Interest::default()), Some(faults), None).unwrap();
    for i in 0..200u32 {
        tx.publish(msg(1, c, &i.to_le_bytes())).unwrap();
    }
    let got = drain(&rx, Duration::from_millis(500)).len() as u64;
    let st = tx.stats();
    assert!(st.faults.dropped > 50 && st.faults.dropped < 150, "{st:?}");
    assert_eq!(got, 200 - st.faults.dropped);
}

#[test]
fn clients_fail_over_when_their_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let clients: Vec<_> = (0..3).map(|_| free_port(LO).unwrap()).collect();
    let routes: Vec<_> = (0..3).map(|_| free_port(LO).unwrap()).collect();
    let mut servers: Vec<NatsServer> = (0..3)
        .map(|i| {
            let mut o = NatsServerOptions::new(&format!("n{i}"), clients[i], dir.path());
            o.cluster_listen = Some(routes[i]);
            o.routes = (0..3).filter(|j| *j != i).map(|j| format!("nats-route://{}", routes[j])).collect();
            NatsServer::start(&o, Duration::from_secs(10)).unwrap()
        })
        .collect();
    let c = [5; 32];
    // rx is told about server 0 only: it must learn the others from the cluster (or be given them).
    let all: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let rx = ep(&[all[0].clone()], "rx", &Interest::observer(c));
    let tx = ep(&[all[1].clone(), all[2].clone()], "tx", &Interest::default());
    // Routes form asynchronously: wait until a message crosses from server 1 (or 2) to 0.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tx.publish(msg(1, c, b"probe")).unwrap();
        if rx.recv_timeout(Duration::from_millis(200)).unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the cluster never formed");
    }
    drain(&rx, Duration::from_millis(200));
    servers[0].kill();
    // rx notices, reconnects to server 1 or 2 (advertised by the cluster) and re-subscribes.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = false;
    while Instant::now() < deadline {
        tx.publish(msg(1, c, b"after")).unwrap();
        if rx.recv_timeout(Duration::from_millis(200)).unwrap().is_some() {
            got = true;
            break;
        }
    }
    assert!(got, "no message after failover: {:?}", rx.stats());
    let st = rx.stats();
    assert!(st.disconnects >= 1 && st.connects >= 2, "{st:?}");
    assert!(rx.is_connected());
}
