//! One writer revoked across real processes on loopback (issue #21): router, coordinator (it
//! holds the application key on the development path and signs `REVOKE`; the other writers
//! are revoked with revocations the owner key signed outside it, `psl kv revoke`), three capsule
//! servers, CapsuleDB and two nodes of a capsule with certified (hardened) writer keys. Both nodes write
//! and their writes are durable; the coordinator revokes node 1's writer from two epochs ahead;
//! from that epoch on, node 1's writes reach neither node 2, nor CapsuleDB, nor any server
//! (nothing of them is stored, and node 1's durable sync fails), while node 2 keeps writing durably and node 1 still
//! applies node 2's writes. A server's store, exported, verifies, lists the revocation (carried
//! into the log by the coordinator) and holds node 1's records from before the revocation.

use psl_node::control::ControlClient;
use std::process::Command;
use std::time::Duration;

mod common;
use common::{eventually, start, start_durable_cluster, start_node, Proc};

fn client(p: &Proc) -> ControlClient {
    common::control(p.addr())
}

fn stats(p: &Proc) -> serde_json::Value {
    serde_json::from_str(&client(p).call("STATS").unwrap()).unwrap()
}

fn epoch(p: &Proc) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&client(p).call("KEYGEN").unwrap()).unwrap();
    v["epoch"].as_u64().unwrap()
}

#[test]
fn a_revoked_writer_is_refused_by_nodes_and_servers_and_the_others_continue() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let (router, coordinator, servers) = start_durable_cluster(d, "revoke");
    let reads = servers.iter().map(|s| s.line.clone()).collect::<Vec<_>>().join(",");
    let r = router.addr().to_string();
    #[rustfmt::skip]
    let db = start(d, &["capsuledb", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r,
                        "--servers", &reads, "--control", "127.0.0.1:0"], "control");
    let n1 = start_node(d, router.addr(), 1, &["--servers", "3"]);
    let n2 = start_node(d, router.addr(), 2, &["--servers", "3"]);
    let (mut c1, mut c2) = (client(&n1), client(&n2));
    assert_eq!(c1.call("PUT before-1 one").unwrap(), "OK");
    assert_eq!(c2.call("PUT before-2 two").unwrap(), "OK");
    assert_eq!(c1.call("SYNC_DURABLE 20000").unwrap(), "OK");
    assert_eq!(c2.call("SYNC_DURABLE 20000").unwrap(), "OK");
    eventually("node 2 sees node 1's first write", || c2.call("GET before-1").unwrap() == "VALUE one");
    // Node 1's writers (a node runs several writer actors): all revoked, as a RESET would.
    let w1: Vec<u64> = stats(&n1)["writers"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).collect();
    assert!(!w1.is_empty());

    // A node cannot sign a revocation: it holds no application key.
    assert!(c2.call(&format!("REVOKE {}", w1[0])).unwrap().starts_with("ERROR"));
    // Without the operator's signature the coordinator signs nothing.
    let mut anyone = ControlClient::connect(coordinator.addr(), Duration::from_secs(5)).unwrap();
    let a = anyone.call(&format!("REVOKE {}", w1[0])).unwrap();
    assert!(a.starts_with("ERROR unauthenticated"), "an unsigned REVOKE: {a}");
    let mut cc = client(&coordinator);
    let answer = cc.call(&format!("REVOKE {}", w1[0])).unwrap();
    // `REVOKED <w> FROM <epoch> SEQ <seq>`: the seq bound is the next the coordinator expects.
    let parts: Vec<&str> = answer.split_whitespace().collect();
    assert_eq!(parts[..3], ["REVOKED", &w1[0].to_string(), "FROM"], "{answer}");
    assert_eq!(parts[4], "SEQ", "{answer}");
    let from: u64 = parts[3].parse().unwrap();
    // The others the way a coordinator without the application key (`--kv-leader`) takes
    // them: signed here with the owner key (`psl kv revoke`) and handed over (`REVOKE_SIGNED`).
    let key = common::control_key(d);
    for w in &w1[1..] {
        let o = Command::new(env!("CARGO_BIN_EXE_psl"))
            .args(["kv", "--control-key", key.to_str().unwrap(), "revoke", "--node", &coordinator.addr().to_string()])
            .args(["--capsule", "c.capsule", "--owner", "owner.key", &w.to_string(), "--from-epoch", &from.to_string()])
            .current_dir(d)
            .output()
            .unwrap();
        let a = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{a} {}", String::from_utf8_lossy(&o.stderr));
        assert!(a.starts_with(&format!("REVOKED {w} FROM {from} SEQ ")), "{a}");
    }
    // Once both nodes are past the revocation epoch, node 1's writes go nowhere.
    eventually("both nodes reach the revocation epoch", || epoch(&n1) > from && epoch(&n2) > from);
    assert_eq!(c1.call("PUT after-1 stolen").unwrap(), "OK");
    let r = c1.call("SYNC_DURABLE 3000").unwrap();
    assert!(r.starts_with("ERROR"), "no server acks a revoked writer's record: {r}");
    assert_eq!(c2.call("PUT after-2 fine").unwrap(), "OK");
    assert_eq!(c2.call("SYNC_DURABLE 20000").unwrap(), "OK", "the other writers continue");
    eventually("node 1 applies node 2's later write", || c1.call("GET after-2").unwrap() == "VALUE fine");
    eventually("node 2 refuses node 1's records as revoked", || {
        stats(&n2)["rejected"]["revoked"].as_u64().unwrap() > 0
    });
    assert_eq!(c2.call("GET after-1").unwrap(), "NOT_FOUND", "{} / {}", c2.call("DUMP").unwrap(), stats(&n2));
    assert_eq!(c2.call("GET before-1").unwrap(), "VALUE one", "records before the epoch stay valid");
    eventually("CapsuleDB refuses node 1's later records too", || {
        stats(&db)["rejected"]["revoked"].as_u64().unwrap() > 0
    });
    assert!(!client(&db).call("DUMP").unwrap().contains("stolen"));

    // Server 0's store: verifies, names the revocation, holds node 1's early records only.
    drop(servers);
    let exported = d.join("s0.capsule");
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["capsule", "export", "s0", "--out", exported.to_str().unwrap()])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["capsule", "verify", "s0.capsule", "--key", "owner.key", "--json"])
        .current_dir(d)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["capsule", "show", "s0.capsule", "--json"])
        .current_dir(d)
        .output()
        .unwrap();
    let show: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let revs = show["revocations"].as_array().unwrap();
    for w in &w1 {
        assert!(
            revs.iter().any(|r| r["writer"].as_u64() == Some(*w) && r["from_epoch"].as_u64() == Some(from)),
            "{revs:?}"
        );
    }
    let recs = show["records"].as_array().unwrap();
    let of_w1: Vec<&serde_json::Value> =
        recs.iter().filter(|r| r["writer"].as_u64().is_some_and(|w| w1.contains(&w))).collect();
    assert!(of_w1.iter().any(|r| r["kind"] == "data"), "node 1's early records are stored");
    assert!(of_w1.iter().all(|r| r["epoch"].as_u64().unwrap() < from), "nothing of node 1 from epoch {from} on");
    drop((n1, n2, db, coordinator, router));
}
