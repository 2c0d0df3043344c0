//! SCL across real processes on loopback: a router that drops and reorders, a coordinator,
//! three nodes. Every wait is bounded; every process is killed when the test ends.

use psl_node::control::ControlClient;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{ok, start, start_node, Proc};

fn client(p: &Proc) -> ControlClient {
    common::control(p.addr())
}

fn node(dir: &Path, router: SocketAddr, id: u32) -> Proc {
    start_node(dir, router, id, &["--epoch-ms", "50"])
}

fn setup(loss: &str) -> (tempfile::TempDir, Proc, Proc) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    ok(d, &["capsule", "new", "--owner", "owner.key", "--label", "scl", "--out", "c.capsule"]);
    let router =
        start(d, &["router", "--listen", "127.0.0.1:0", "--loss", loss, "--reorder", loss, "--seed", "7"], "listening");
    let r = router.addr().to_string();
    let coord = start(
        d,
        &[
            "coordinator",
            "--capsule",
            "c.capsule",
            "--owner",
            "owner.key",
            "--router",
            &r,
            "--epoch-ms",
            "50",
            "--eoe-timeout-ms",
            "200",
        ],
        "control",
    );
    (t, router, coord)
}

fn sync_all(nodes: &[Proc]) {
    for n in nodes {
        let r = client(n).call("SYNC 60000").unwrap();
        assert_eq!(r, "OK", "sync on {}", n.addr());
    }
}

fn dumps(nodes: &[Proc]) -> Vec<serde_json::Value> {
    nodes.iter().map(|n| serde_json::from_str(&client(n).call("DUMP").unwrap()).unwrap()).collect()
}

#[test]
fn three_nodes_converge_through_a_lossy_reordering_router() {
    let (t, router, coord) = setup("0.2");
    let d = t.path();
    let nodes: Vec<Proc> = (1..=3).map(|id| node(d, router.addr(), id)).collect();
    // 10,000 puts spread over the nodes. Keys `own*` are written through one node only, so
    // their expected value is the last one put; keys `hot*` are written through all three.
    let mut rng: u64 = 0x5eed;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut batches: Vec<Vec<String>> = vec![Vec::new(); 3];
    let mut model = std::collections::BTreeMap::new();
    for i in 0..10_000u64 {
        let r = next();
        let n = (r % 3) as usize;
        let key = if r % 5 == 0 { format!("hot{}", (r >> 16) % 40) } else { format!("own{n}-{}", (r >> 8) % 700) };
        let val = format!("v{i}");
        if key.starts_with("own") {
            model.insert(key.clone(), val.clone());
        }
        batches[n].push(format!("PUT {key} {val}"));
    }
    std::thread::scope(|s| {
        for (n, b) in nodes.iter().zip(&batches) {
            s.spawn(move || {
                let replies = client(n).pipeline(b).unwrap();
                assert!(replies.iter().all(|r| r == "OK"), "a put failed");
            });
        }
    });
    sync_all(&nodes);
    let ds = dumps(&nodes);
    assert_eq!(ds[0], ds[1], "node 1 and node 2 differ after sync");
    assert_eq!(ds[0], ds[2], "node 1 and node 3 differ after sync");
    for (k, v) in &model {
        assert_eq!(ds[0][k][0].as_str(), Some(v.as_str()), "key {k}: last-writer-wins value");
    }
    let hot: Vec<_> = ds[0].as_object().unwrap().keys().filter(|k| k.starts_with("hot")).collect();
    assert_eq!(hot.len(), 40);
    // The router did drop and reorder, and the nodes did repair.
    let stats: serde_json::Value = serde_json::from_str(&client(&nodes[0]).call("STATS").unwrap()).unwrap();
    assert!(stats["repair_requests_sent"].as_u64().unwrap() > 0, "{stats}");
    // The coordinator ordered every op but keeps no value: a read from it is an error that
    // says so, not a miss; a miss on a node is "not found" (exit 1).
    let cstats: serde_json::Value = serde_json::from_str(&client(&coord).call("STATS").unwrap()).unwrap();
    assert_eq!(cstats["keys"], 0, "{cstats}");
    assert!(cstats["ops_applied"].as_u64().unwrap() >= 10_000, "{cstats}");
    assert!(cstats["repair_cache_bytes"].as_u64().unwrap() > 0, "{cstats}");
    // Every role runs under a memory budget (its kind's default here) and reports it.
    let budget = |p: &Proc| {
        let m = client(p).metrics().expect("METRICS answers");
        let v = m
            .lines()
            .find_map(|l| l.strip_prefix("psl_process_memory_budget_bytes "))
            .unwrap_or_else(|| panic!("no memory budget in {m}"));
        v.parse::<u64>().unwrap()
    };
    assert_eq!(budget(&coord), 128 << 20);
    assert_eq!(budget(&nodes[0]), 256 << 20);
    let kv_get = |p: &Proc, key: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_psl"))
            .args(["kv", "get", "--node", &p.addr().to_string(), key])
            .env("PSL_CONTROL_KEY", common::control_key(d))
            .output()
            .unwrap()
    };
    let o = kv_get(&coord, "hot1");
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("keeps no values"), "{o:?}");
    let o = kv_get(&nodes[0], "absent");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("absent: not found"), "{o:?}");
    let o = kv_get(&nodes[0], "hot1");
    assert!(o.status.success() && !o.stdout.is_empty(), "{o:?}");
}

#[test]
fn a_killed_node_restarts_and_catches_up() {
    let (t, router, _coord) = setup("0.05");
    let d = t.path();
    let mut nodes: Vec<Proc> = (1..=3).map(|id| node(d, router.addr(), id)).collect();
    let puts = |n: &Proc, from: u32, to: u32| {
        let lines: Vec<String> = (from..to).map(|i| format!("PUT k{} n{}", i % 500, i)).collect();
        assert!(client(n).pipeline(&lines).unwrap().iter().all(|r| r == "OK"));
    };
    puts(&nodes[0], 0, 2000);
    puts(&nodes[1], 2000, 3000);
    sync_all(&nodes);
    // SIGKILL node 2 mid-load, keep writing elsewhere, restart it.
    let mut victim = nodes.remove(1);
    let _ = victim.child.kill();
    let _ = victim.child.wait();
    puts(&nodes[0], 3000, 4000);
    let restarted = node(d, router.addr(), 2);
    nodes.insert(1, restarted);
    puts(&nodes[2], 4000, 5000);
    puts(&nodes[1], 5000, 5200);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        sync_all(&nodes);
        let ds = dumps(&nodes);
        if ds[0] == ds[1] && ds[1] == ds[2] {
            assert_eq!(ds[0].as_object().unwrap().len(), 500);
            break;
        }
        assert!(Instant::now() < deadline, "the restarted node did not converge");
    }
}

#[test]
fn a_role_over_its_memory_budget_counts_it_in_its_metrics() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    ok(d, &["keys", "new", "--out", "owner.key"]);
    ok(d, &["capsule", "new", "--owner", "owner.key", "--label", "budget", "--out", "c.capsule"]);
    let router = start(d, &["router", "--listen", "127.0.0.1:0", "--memory-budget-mb", "64"], "listening");
    let r = router.addr().to_string();
    #[rustfmt::skip]
    let coord = start(
        d,
        &["coordinator", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--memory-budget-mb", "1"],
        "control",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = client(&coord).metrics().expect("METRICS answers");
        let get = |name: &str| {
            m.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse::<u64>().ok())
        };
        assert_eq!(get("psl_process_memory_budget_bytes"), Some(1 << 20), "{m}");
        // No process fits in 1 MiB: the watch counts samples above the budget.
        if get("psl_process_over_budget_samples_total").is_some_and(|n| n > 0) {
            assert!(get("psl_process_resident_peak_bytes").is_some_and(|p| p > 1 << 20), "{m}");
            break;
        }
        assert!(Instant::now() < deadline, "no sample over budget counted: {m}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
