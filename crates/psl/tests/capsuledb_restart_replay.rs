//! CapsuleDB with its blocks on the capsule servers, across real processes on loopback: router,
//! coordinator, three `psl capsule-server`s, `psl capsuledb --servers ...` with NO directory
//! store, and a worker whose memtable is bounded to 64 keys. Writes are frozen into blocks on
//! the servers; more writes stay in the role's memtable only (no idle freeze); the role is
//! killed with SIGKILL; more writes land while it is down; the restarted role finds its newest
//! index on the servers, replays every write above its frontier from them, and the bounded
//! worker reads every key back through CapsuleDB. Then every block and index record on one
//! server's disk is altered: that server refuses them, the role (restarted with an empty cache)
//! and `psl capsuledb get` read them from another server, and the refused copies are counted.

use psl_capsule::{Kind, Limits, Record};
use psl_node::control::ControlClient;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{start, start_durable_cluster, start_node, Proc};

fn role(dir: &Path, router: SocketAddr, servers: &str, idle_flush_ms: &str) -> Proc {
    let r = router.to_string();
    #[rustfmt::skip]
    let args = [
        "capsuledb", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--servers", servers,
        "--memtable-entries", "100", "--block-entries", "100", "--idle-flush-ms", idle_flush_ms,
    ];
    start(dir, &args, "ready")
}

fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .parse()
        .unwrap()
}

fn client(p: &Proc) -> ControlClient {
    common::control(p.addr())
}

fn stats(n: &Proc) -> serde_json::Value {
    serde_json::from_str(&client(n).call("STATS").unwrap()).unwrap()
}

fn put_all(c: &mut ControlClient, kv: &[(String, String)]) {
    let lines: Vec<String> = kv.iter().map(|(k, v)| format!("PUT {k} {v}")).collect();
    for a in c.pipeline(&lines).unwrap() {
        assert_eq!(a, "OK");
    }
    assert_eq!(c.call("SYNC_DURABLE 20000").unwrap(), "OK");
}

/// Flips a byte in the middle of every db-block and db-index record in a server's log
/// (frames: `u32 LE len | u32 LE crc32 | record`). Returns how many were altered.
fn alter_db_records(log: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let b = std::fs::read(log).unwrap();
    // In place (the running server keeps appending to this file).
    let f = std::fs::OpenOptions::new().write(true).open(log).unwrap();
    let (mut at, mut altered) = (0usize, 0);
    while at + 8 <= b.len() {
        let len = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let start = at + 8;
        if start + len > b.len() {
            break;
        }
        if let Ok(r) = Record::decode(&b[start..start + len], &Limits::default()) {
            if matches!(r.header().kind, Kind::DbBlock | Kind::DbIndex) {
                let i = start + len / 2;
                f.write_all_at(&[b[i] ^ 0x55], i as u64).unwrap();
                altered += 1;
            }
        }
        at = start + len;
    }
    f.sync_all().unwrap();
    altered
}

#[test]
fn capsuledb_on_servers_restarts_from_newest_index_and_replays() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let (router, _coord, servers) = start_durable_cluster(d, "cdbs");
    let reads = servers.iter().map(|s| s.line.clone()).collect::<Vec<_>>().join(",");

    // No idle freeze: what the size rule does not freeze stays in the role's memtable only.
    let db = role(d, router.addr(), &reads, "600000");
    let writer = field(&db.line, "writer").to_string();
    assert_eq!(field(&db.line, "replayed_ops"), 0, "{}", db.line);
    let node =
        start_node(d, router.addr(), 1, &["--servers", "3", "--capsuledb", &writer, "--memtable-keys-max", "64"]);
    let mut c = client(&node);
    let mut model: Vec<(String, String)> = (0..450).map(|i| (format!("k{i:04}"), format!("first-{i}"))).collect();
    put_all(&mut c, &model);
    // 450 writes: four freezes of 101; 46 stay in the role's memtable. 40 more stay there too.
    let late: Vec<(String, String)> = (0..40).map(|i| (format!("n{i:04}"), format!("late-{i}"))).collect();
    put_all(&mut c, &late);
    model.extend(late);
    // The worker evicts what the role's published frontier covers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&node)["keys"].as_u64().unwrap() > 200 {
        assert!(Instant::now() < deadline, "the worker never evicted: {}", stats(&node));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(db); // SIGKILL: the role's memtable (86 writes) is lost.

    // Written while the role is down.
    let down: Vec<(String, String)> = (0..30)
        .map(|i| (format!("m{i:04}"), format!("down-{i}")))
        .chain([("k0005".to_string(), "second".to_string())])
        .collect();
    put_all(&mut c, &down);
    for (k, v) in down {
        model.retain(|(mk, _)| *mk != k);
        model.push((k, v));
    }

    // Restart: newest index from the servers, replay above its frontier, then answers.
    let db = role(d, router.addr(), &reads, "500");
    eprintln!("restarted: {}", db.line);
    let replayed = field(&db.line, "replayed_ops");
    assert!(replayed >= 86 + 31, "replayed {replayed} ops: {}", db.line);
    assert!(field(&db.line, "index") >= 4, "{}", db.line);
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&node)["keys"].as_u64().unwrap() > 64 + 16 {
        assert!(Instant::now() < deadline, "the worker never evicted after the restart: {}", stats(&node));
        std::thread::sleep(Duration::from_millis(100));
    }
    for (k, v) in &model {
        assert_eq!(c.call(&format!("GET {k}")).unwrap(), format!("VALUE {v}"), "{k} after the restart");
    }
    // Each start took a new block-writer incarnation: no record of the worker's view conflicts.
    assert_eq!(stats(&node)["rejected"]["equivocation"].as_u64(), Some(0), "{}", stats(&node));

    // Alter every block and index on server 0's disk (no role running, so none is rewritten).
    drop(db);
    let altered = alter_db_records(&d.join("s0").join("records.log"));
    assert!(altered >= 5, "altered {altered} records");
    // A one-shot reader: server 0 refuses the altered index and block; others serve them.
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["capsuledb", "get", "k0100", "--capsule", "c.capsule", "--owner", "owner.key", "--servers", &reads])
        .current_dir(d)
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.starts_with("first-100 "), "{out}{err}");
    let line = err.lines().find(|l| l.starts_with("read: ")).unwrap_or_else(|| panic!("{err}"));
    eprintln!("altered {altered} records on server 0; psl capsuledb get: {line}");
    assert!(field(line, "missing_copies") + field(line, "rejected_copies") >= 2, "index and block: {line}");
    // The role restarted with an empty cache reads around server 0 too.
    let db = role(d, router.addr(), &reads, "500");
    for (k, v) in model.iter().step_by(7) {
        assert_eq!(c.call(&format!("GET {k}")).unwrap(), format!("VALUE {v}"), "{k} with server 0 altered");
    }
    drop(db);
}
