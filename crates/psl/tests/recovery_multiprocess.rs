//! A worker node that restarts empty rebuilds its memtable from the capsule servers, across
//! real processes on loopback: router, coordinator, three servers (each with its read
//! address), two nodes writing durably; `kill -9` of one node (with writes of its in flight,
//! and its state directory gone); it restarts with `--recover-from`, holds every acknowledged
//! write as soon as it serves (before any peer could have helped), takes an incarnation above
//! the one the servers saw, and converges with its peer and with the model after writing again.
//! Every wait is bounded; every process is killed at the end.

use psl_node::control::ControlClient;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{start_durable_cluster, start_node, Proc};

fn client(p: &Proc) -> ControlClient {
    common::control(p.addr())
}

fn dump(p: &Proc) -> serde_json::Value {
    serde_json::from_str(&client(p).call("DUMP").unwrap()).unwrap()
}

/// Puts `round` on node `id`: keys `n{id}-k{0..150}`, acknowledged durable. Returns what it put.
fn durable_round(c: &mut ControlClient, id: u32, round: u32) -> Vec<(String, String)> {
    let kv: Vec<(String, String)> =
        (0..200).map(|i| (format!("n{id}-k{}", i % 150), format!("n{id}-r{round}-{i}"))).collect();
    let lines: Vec<String> = kv.iter().map(|(k, v)| format!("PUT {k} {v}")).collect();
    for a in c.pipeline(&lines).unwrap() {
        assert_eq!(a, "OK");
    }
    assert_eq!(c.call("SYNC_DURABLE 20000").unwrap(), "OK", "node {id} round {round} durable");
    kv
}

/// Starts a node that recovers from `reads`; returns it and the `recovered ...` line.
fn start_recovering(dir: &Path, router: SocketAddr, id: u32, reads: &str) -> (Proc, String) {
    let (r, ids, state) = (router.to_string(), id.to_string(), format!("state{id}"));
    #[rustfmt::skip]
    let args = [
        "node", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--id", &ids, "--state", &state,
        "--servers", "3", "--recover-from", reads,
    ];
    let child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(args)
        .env("PSL_CONTROL_PUB", common::control_pub(dir))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // Killed and waited for on drop, whatever happens below.
    let mut p = Proc { child, line: String::new() };
    let out = p.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut recovered = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("the recovering node did not come up within 60 s");
        if line.starts_with("recovered ") {
            recovered = Some(line);
        } else if let Some(a) = line.strip_prefix("control ") {
            p.line = a.trim().to_string();
            return (p, recovered.expect("`recovered` is printed before `control`"));
        }
    }
}

#[test]
fn recovery_node_restarted_empty_rebuilds_from_servers_and_converges() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let (router, _coord, servers) = start_durable_cluster(d, "rec");
    let reads: Vec<String> = servers.iter().map(|s| s.line.clone()).collect();
    let mut n1 = start_node(d, router.addr(), 1, &["--servers", "3"]);
    let n2 = start_node(d, router.addr(), 2, &["--servers", "3"]);
    let (mut c1, mut c2) = (client(&n1), client(&n2));
    let mut model: BTreeMap<String, String> = BTreeMap::new();
    for round in 0..5 {
        model.extend(durable_round(&mut c1, 1, round));
        model.extend(durable_round(&mut c2, 2, round));
    }
    // The servers hold a SYNC, so the recovering node has something to check freshness with.
    let v = psl_capsule::Verifier::new(psl_store::read_metadata(d.join("s0")).unwrap(), None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while psl_server::read::ReadClient::connect(servers[0].addr()).unwrap().latest_sync(&v).unwrap().is_none() {
        assert!(Instant::now() < deadline, "no SYNC reached the servers");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A batch in flight when the node dies: never acknowledged, on keys of its own.
    let unacked: Vec<String> = (0..300).map(|i| format!("PUT n1-unacked{i} u{i}")).collect();
    for a in c1.pipeline(&unacked).unwrap() {
        assert_eq!(a, "OK");
    }
    n1.child.kill().unwrap(); // SIGKILL
    let _ = n1.child.wait();
    drop(c1);
    // The restarted node has lost everything local, its incarnation counter included.
    std::fs::remove_dir_all(d.join("state1")).unwrap();

    let (n1, line) = start_recovering(d, router.addr(), 1, &reads.join(","));
    eprintln!("{line}");
    assert!(!line.contains("newest-sync-epoch none"), "{line}");
    let inc: u32 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(inc >= 2, "the node took incarnation {inc}, not above the one (1) the servers hold records of");
    // Before any peer could help: the memtable holds every acknowledged write already.
    let first = dump(&n1);
    for (k, v) in &model {
        assert_eq!(first[k][0].as_str(), Some(v.as_str()), "key {k}: acknowledged write missing after recovery");
    }

    // It rejoins: writes again (over its own earlier keys: the new writes must win, so its
    // clock is past the recovered ones), and both nodes converge to the model.
    let mut c1 = client(&n1);
    for round in 5..7 {
        model.extend(durable_round(&mut c1, 1, round));
        model.extend(durable_round(&mut c2, 2, round));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(c1.call("SYNC 20000").unwrap(), "OK");
        assert_eq!(c2.call("SYNC 20000").unwrap(), "OK");
        let (a, b) = (dump(&n1), dump(&n2));
        let model_ok = model.iter().all(|(k, v)| a[k][0].as_str() == Some(v.as_str()));
        // The unacknowledged batch may or may not have survived, but the same on both nodes.
        if a == b && model_ok {
            for (k, e) in a.as_object().unwrap() {
                if let Some(i) = k.strip_prefix("n1-unacked") {
                    assert_eq!(e[0].as_str(), Some(format!("u{i}").as_str()));
                } else {
                    assert_eq!(model.get(k).map(String::as_str), e[0].as_str(), "key {k} not in the model");
                }
            }
            break;
        }
        assert!(Instant::now() < deadline, "nodes did not converge to the model: equal={} model_ok={model_ok}", a == b);
        std::thread::sleep(Duration::from_millis(200));
    }
}
