//! `psl capsuledb` across real processes on loopback: a router, the CapsuleDB role with two
//! store directories, and a worker whose memtable is bounded to 64 keys. The worker reads
//! evicted keys back through CapsuleDB; `snapshots` and `get --at` read the history; the role
//! restarts from its newest index; a store whose records were altered is detected and the
//! other store is read instead.

use psl_node::control::ControlClient;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{ok, start, start_node, Proc};

const KEYS: usize = 600;

fn client(p: &Proc) -> ControlClient {
    common::control(p.addr())
}

fn psl(dir: &Path, args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_psl")).args(args).current_dir(dir).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
}

fn role(dir: &Path, router: &str) -> Proc {
    start(
        dir,
        &[
            "capsuledb",
            "--capsule",
            "c.capsule",
            "--owner",
            "owner.key",
            "--router",
            router,
            "--store",
            "s1",
            "--store",
            "s2",
            "--memtable-entries",
            "100",
            "--block-entries",
            "100",
        ],
        "ready",
    )
}

fn newest(dir: &Path) -> u64 {
    let (good, out) = psl(
        dir,
        &["capsuledb", "snapshots", "--capsule", "c.capsule", "--owner", "owner.key", "--store", "s1", "--json"],
    );
    assert!(good, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    v["newest"].as_u64().unwrap()
}

fn stats(n: &Proc) -> serde_json::Value {
    serde_json::from_str(&client(n).call("STATS").unwrap()).unwrap()
}

#[test]
fn capsuledb_role_serves_evicted_keys_keeps_history_and_restarts() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    ok(d, &["capsule", "new", "--owner", "owner.key", "--label", "cdb", "--out", "c.capsule"]);
    let router = start(d, &["router", "--listen", "127.0.0.1:0"], "listening");
    let r = router.addr().to_string();
    let db = role(d, &r);
    let writer = db.line.split_whitespace().find_map(|w| w.strip_prefix("writer=")).unwrap().to_string();
    let node = start_node(d, router.addr(), 1, &["--capsuledb", &writer, "--memtable-keys-max", "64"]);
    let mut c = client(&node);
    for i in 0..KEYS {
        assert_eq!(c.call(&format!("PUT k{i:04} first-{i}")).unwrap(), "OK");
    }
    // Wait until CapsuleDB froze the writes into blocks and the worker evicted down to its bound.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&node)["keys"].as_u64().unwrap() > 64 + 16 {
        assert!(Instant::now() < deadline, "the worker never evicted: {}", stats(&node));
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..KEYS {
        assert_eq!(c.call(&format!("GET k{i:04}")).unwrap(), format!("VALUE first-{i}"), "k{i:04}");
    }
    assert_eq!(c.call("GET never-written").unwrap(), "NOT_FOUND");
    let before = newest(d);

    // Overwrite one key; the idle memtable is frozen into a new index within a second.
    assert_eq!(c.call("PUT k0005 second").unwrap(), "OK");
    let deadline = Instant::now() + Duration::from_secs(20);
    while newest(d) == before {
        assert!(Instant::now() < deadline, "no new index after the overwrite");
        std::thread::sleep(Duration::from_millis(200));
    }
    let get = |args: &[&str]| {
        let mut a = vec![
            "capsuledb",
            "get",
            "--capsule",
            "c.capsule",
            "--owner",
            "owner.key",
            "--store",
            "s1",
            "--store",
            "s2",
        ];
        a.extend_from_slice(args);
        psl(d, &a)
    };
    let at = before.to_string();
    let (good, out) = get(&["k0005", "--at", &at]);
    assert!(good && out.starts_with("first-5 "), "{out}");
    let (good, out) = get(&["k0005"]);
    assert!(good && out.starts_with("second "), "{out}");
    let (good, out) = get(&["k0005", "--at", "0"]);
    assert!(!good && out.contains("not found in index 0"), "{out}");

    // Restart the role: it reopens from the newest index and serves the evicted keys again.
    drop(db);
    let db = role(d, &r);
    assert!(db.line.contains(&format!("index={}", newest(d))), "{}", db.line);
    for i in (0..KEYS).step_by(7) {
        let want = if i == 5 { "VALUE second".to_string() } else { format!("VALUE first-{i}") };
        assert_eq!(c.call(&format!("GET k{i:04}")).unwrap(), want, "after restart, k{i:04}");
    }
    drop(db);

    // Alter every record in s1 (a byte in every 256 of its log hits every frame): reads detect
    // it and use s2.
    let log = d.join("s1").join("records.log");
    let mut b = std::fs::read(&log).unwrap();
    assert!(b.len() > 4096, "s1 holds records");
    for i in (100..b.len()).step_by(256) {
        b[i] ^= 0x55;
    }
    std::fs::write(&log, b).unwrap();
    let (good, out) = get(&["k0100"]);
    assert!(good && out.starts_with("first-100 "), "{out}");
    let (good, out) =
        psl(d, &["capsuledb", "get", "k0100", "--capsule", "c.capsule", "--owner", "owner.key", "--store", "s1"]);
    assert!(!good && out.contains("not readable"), "only the altered store: {out}");
}
