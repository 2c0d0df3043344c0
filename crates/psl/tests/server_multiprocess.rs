//! Capsule servers across real processes on loopback: a router, a node that counts acks from
//! three servers, a write load with `SYNC_DURABLE` after every round, and `kill -9` of one
//! server in the middle. Every write acknowledged as durable must be in at least two stores
//! afterwards (decrypted and compared), the load must go on while the server is down, the
//! restarted server must catch up by itself, and with two servers down the durability barrier
//! must time out with a clear error. Every wait is bounded; every process is killed at the end.

use psl_capsule::{Action, Body};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{ok, start, start_node, Proc};

fn addr(p: &Proc) -> SocketAddr {
    p.addr()
}

fn server(dir: &Path, router: SocketAddr, id: u32) -> Proc {
    let (r, ids, d) = (router.to_string(), id.to_string(), format!("s{id}"));
    start(
        dir,
        &[
            "capsule-server",
            "--capsule",
            "c.capsule",
            "--owner",
            "owner.key",
            "--router",
            &r,
            "--dir",
            &d,
            "--id",
            &ids,
        ],
        "ready",
    )
}

/// Every (key, value) put in the store in `dir`, decrypted with the owner's data key.
fn pairs_in_store(dir: &Path, owner: &Path) -> BTreeSet<(String, String)> {
    let meta = psl_store::read_metadata(dir).unwrap();
    let ok = psl_crypto::OwnerKey::from_file_string(&std::fs::read_to_string(owner).unwrap()).unwrap();
    let dk = ok.app(meta.meta.app_index).unwrap().data_key();
    let (st, _) = psl_store::DiskStore::open_readonly(dir, Some(dk)).unwrap();
    let mut out = BTreeSet::new();
    for r in st.records_in_chain_order().unwrap() {
        if let Ok(Body::Data(ops)) = st.verifier().open(&r) {
            for op in ops {
                if let Action::Put(v) = op.action {
                    out.insert((
                        String::from_utf8_lossy(&op.key).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    ));
                }
            }
        }
    }
    out
}

fn heads(dir: &Path) -> BTreeMap<u32, u64> {
    let (st, _) = psl_store::DiskStore::open_readonly(dir, None).unwrap();
    st.heads().into_iter().map(|(w, h)| (w, h.seq)).collect()
}

#[test]
fn server_kill9_loses_no_acknowledged_durable_write() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    ok(d, &["capsule", "new", "--owner", "owner.key", "--label", "dur", "--out", "c.capsule"]);
    let router = start(d, &["router", "--listen", "127.0.0.1:0"], "listening");
    let mut servers: Vec<Option<Proc>> = (0..3).map(|i| Some(server(d, addr(&router), i))).collect();
    let node = start_node(d, addr(&router), 1, &["--servers", "3"]);
    let mut c = common::control(addr(&node));
    let mut acked: Vec<(String, String)> = Vec::new();
    let started = Instant::now();
    for round in 0..24u32 {
        let lines: Vec<String> = (0..200).map(|i| format!("PUT k{round}-{i} v{round}-{i}")).collect();
        for a in c.pipeline(&lines).unwrap() {
            assert_eq!(a, "OK");
        }
        let r = c.call("SYNC_DURABLE 20000").unwrap();
        assert_eq!(r, "OK", "round {round}: the load keeps going with one server down");
        acked.extend((0..200).map(|i| (format!("k{round}-{i}"), format!("v{round}-{i}"))));
        if round == 6 {
            // kill -9 (SIGKILL) in the middle of the load.
            let mut p = servers[1].take().unwrap();
            p.child.kill().unwrap();
            let _ = p.child.wait();
        }
        if round == 16 {
            servers[1] = Some(server(d, addr(&router), 1));
        }
    }
    eprintln!("24 durable rounds in {:?}", started.elapsed());
    // The restarted server catches up by anti-entropy.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (h0, h1) = (heads(&d.join("s0")), heads(&d.join("s1")));
        if h0.iter().all(|(w, s)| h1.get(w).is_some_and(|x| x >= s)) {
            break;
        }
        assert!(Instant::now() < deadline, "restarted server did not catch up: {h1:?} vs {h0:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Two of three down: the barrier times out and says how many acked.
    for i in [0usize, 2] {
        let mut p = servers[i].take().unwrap();
        p.child.kill().unwrap();
        let _ = p.child.wait();
    }
    assert_eq!(c.call("PUT late v").unwrap(), "OK");
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["kv", "sync", "--node", &addr(&node).to_string(), "--durable", "--timeout-ms", "1000"])
        .env("PSL_CONTROL_KEY", common::control_key(d))
        .output()
        .unwrap();
    assert!(!o.status.success(), "nothing is reported durable without f + 1 servers");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("only 1 of the 3"), "clear error: {err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop(servers);
    drop(node);

    // Every acknowledged durable write is in at least two stores (here, after anti-entropy, in
    // all three) and every store checks clean.
    let stores: Vec<BTreeSet<(String, String)>> =
        (0..3).map(|i| pairs_in_store(&d.join(format!("s{i}")), &d.join("owner.key"))).collect();
    for p in &acked {
        let n = stores.iter().filter(|s| s.contains(p)).count();
        assert!(n >= 2, "{p:?} acknowledged durable but on {n} servers");
    }
    for i in 0..3 {
        ok(d, &["capsule-server", "check", "--dir", &format!("s{i}")]);
    }
}
