//! The FaaS deployment as processes on loopback (`psl up`: router, capsule hosts, coordinator
//! hosts, scheduler, leader, workers)
//! and `psl run --cluster`: a word count end to end with its capsule verified, stored by three
//! capsule hosts, and every worker wiped by RESET; a worker outside the policy gets no key; a scheduler that flips a program
//! byte is caught; a worker whose heartbeats stop is dropped from the registry, and one that
//! stalls and resumes registers again.

use psl_faas::net::wire::{read_msg, write_msg, Msg};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

/// `psl up` in a directory of its own; the deployment stops before the directory goes.
struct Up {
    up: common::faas::Up,
    dir: tempfile::TempDir,
}

fn psl() -> &'static str {
    env!("CARGO_BIN_EXE_psl")
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples").join(name)
}

/// Starts `psl up ARGS` and waits (bounded) for it to report ready.
fn up(args: &[&str]) -> Up {
    let dir = tempfile::tempdir().unwrap();
    Up { up: common::faas::up(dir.path(), args), dir }
}

impl Up {
    fn run(&self, program: &str, lambdas: u32, extra: &[&str]) -> Output {
        let mut c = Command::new(psl());
        c.arg("run").arg(example(program)).args(["--lambdas", &lambdas.to_string(), "--json", "--cluster"]);
        c.arg(self.dir.path().join("c/cluster.json")).args(extra);
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "psl run did not finish in 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }

    fn debug(&self, worker: usize) -> serde_json::Value {
        let mut s = TcpStream::connect(self.up.info.workers[worker].control).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"DEBUG\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// The worker ids in the scheduler's registry.
    fn registered(&self) -> Vec<u32> {
        let mut s = TcpStream::connect(self.up.info.scheduler).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write_msg(&mut s, &Msg::Status).unwrap();
        match read_msg(&mut s).unwrap() {
            Msg::StatusReply { workers } => workers.into_iter().map(|w| w.worker).collect(),
            m => panic!("unexpected {}", m.name()),
        }
    }
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "psl run failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn assert_wiped(d: &serde_json::Value) {
    assert_eq!(d["holds_keys"], false, "{d}");
    assert_eq!(d["node_running"], false, "{d}");
    assert_eq!(d["memtable_entries"], 0, "{d}");
    assert_eq!(d["attested"], false, "{d}");
}

#[test]
fn faas_multiprocess_wordcount_capsule_reset_and_clean_stop() {
    let mut u = up(&["--workers", "4"]);
    let input = u.dir.path().join("in.txt");
    std::fs::write(&input, "a b a\nc a b\nd\n").unwrap();
    let cap = u.dir.path().join("job.capsule");
    let (i, c) = (input.display().to_string(), cap.display().to_string());
    let v = json(&u.run("wordcount.js", 4, &["--input", &i, "--capsule-out", &c]));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["deployment"], "cluster");
    let counts: serde_json::Value = serde_json::from_str(v["lambdas"][0]["emitted"][1].as_str().unwrap()).unwrap();
    assert_eq!(counts, serde_json::json!({"a": 3, "b": 2, "c": 1, "d": 1}));
    // Four workers took part, one lambda each.
    let mut workers: Vec<u64> =
        v["lambdas"].as_array().unwrap().iter().map(|l| l["worker"].as_u64().unwrap()).collect();
    workers.sort();
    assert_eq!(workers, vec![1, 2, 3, 4]);
    for k in ["leader_attest_ms", "client_to_scheduler_ms", "attestation_ms", "key_delivery_ms", "launch_ms"] {
        assert!(v["launch"][k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    let st = Command::new(psl()).args(["capsule", "verify"]).arg(&cap).output().unwrap();
    assert!(st.status.success(), "capsule verify: {}", String::from_utf8_lossy(&st.stdout));
    assert!(v["capsule_records"].as_u64().unwrap() > 4);
    // Each of the three capsule hosts stored the job's capsule; each store checks clean.
    let stored = v["stored_records"].as_array().unwrap();
    assert_eq!(stored.len(), 3, "{v}");
    for (id, addr, dir) in &u.up.info.capsule_hosts {
        let _ = addr;
        let n = stored.iter().find(|s| s[0] == *id).unwrap()[1].as_u64().unwrap();
        assert!(n > 4, "host {id} stored {n} records");
        let store = dir.join(v["capsule"].as_str().unwrap());
        let o = Command::new(psl()).args(["capsule-server", "check", "--json", "--dir"]).arg(&store).output().unwrap();
        assert!(o.status.success(), "host {id}: {}", String::from_utf8_lossy(&o.stdout));
        let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(c["records"].as_u64().unwrap(), n, "{c}");
    }
    // RESET: the leader's report of each worker, and each worker's own control interface.
    let resets = v["resets"].as_array().unwrap();
    assert_eq!(resets.len(), 4, "{v}");
    for r in resets {
        assert_wiped(&r[1]);
    }
    for w in 0..4 {
        let d = u.debug(w);
        assert_wiped(&d);
        assert_eq!(d["jobs"], 1);
    }
    // Reset workers are attested again for the next jobs; two clients at once both complete
    // (the leader runs one job at a time, the second waits for the first).
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| u.run("wordcount.js", 2, &[]));
        let b = s.spawn(|| u.run("montecarlo.js", 3, &[]));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(json(&a)["ok"], true);
    assert_eq!(json(&b)["ok"], true);
    // SIGTERM stops every child and `psl up` itself, cleanly.
    let pids: Vec<u32> = u.up.info.pids.iter().map(|(_, p)| *p).collect();
    // router, scheduler, leader; three capsule hosts; two coordinator hosts; four workers.
    assert_eq!(pids.len(), 3 + 3 + 2 + 4);
    assert!(Command::new("kill").args(["-TERM", &u.up.child.id().to_string()]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        if let Some(st) = u.up.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "psl up did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success());
    for p in pids {
        assert!(!Path::new(&format!("/proc/{p}")).exists(), "child {p} still runs");
    }
}

#[test]
fn faas_multiprocess_worker_outside_policy_gets_no_key() {
    let u = up(&["--workers", "3", "--test-rogue-workers", "2"]);
    let v = json(&u.run("montecarlo.js", 3, &[]));
    assert_eq!(v["ok"], true, "{v}");
    let refused = v["refused_workers"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{v}");
    assert_eq!(refused[0][0], 2);
    assert!(refused[0][1].as_str().unwrap().contains("not in the policy"), "{v}");
    assert_eq!(v["lambdas"].as_array().unwrap().len(), 3);
    assert!(v["lambdas"].as_array().unwrap().iter().all(|l| l["worker"] != 2));
    let d = u.debug(1);
    assert_wiped(&d);
    // A client whose policy does not hold the leader's measurement refuses the leader before
    // it hands over the owner key; no worker is ever forwarded the job.
    let mut info = u.up.info.clone();
    let policy = std::fs::read_to_string(&info.attest_policy).unwrap();
    let m = policy.lines().find_map(|l| l.strip_prefix("measurement = ")).unwrap().trim_matches('"').to_string();
    let other_policy = u.dir.path().join("other-policy.toml");
    std::fs::write(&other_policy, policy.replace(&m, &"00".repeat(32))).unwrap();
    info.attest_policy = other_policy;
    let other = u.dir.path().join("other.json");
    std::fs::write(&other, serde_json::to_string(&info).unwrap()).unwrap();
    let o = Command::new(psl())
        .arg("run")
        .arg(example("montecarlo.js"))
        .args(["--lambdas", "1", "--cluster"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("attestation of leader refused") && err.contains("not in the policy"), "{err}");
    for w in 0..3 {
        assert_eq!(u.debug(w)["jobs"], 1, "worker {w} saw a job it should not have");
    }
    // Only rogue workers: the job fails, clearly.
    let u = up(&["--workers", "1", "--test-rogue-workers", "1"]);
    let o = u.run("montecarlo.js", 2, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("attested worker") && err.contains("not in the policy"), "{err}");
    assert_wiped(&u.debug(0));
}

#[test]
fn faas_multiprocess_scheduler_flipping_a_program_byte_is_caught() {
    let u = up(&["--workers", "2", "--test-scheduler-flip-byte", "70"]);
    let o = u.run("wordcount.js", 2, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("integrity check failed") && err.contains("no lambda ran it"), "{err}");
    for w in 0..2 {
        let d = u.debug(w);
        assert_wiped(&d);
        assert_eq!(d["jobs"], 1, "{d}");
    }
}

#[test]
fn faas_multiprocess_worker_without_heartbeats_is_dropped() {
    // Worker 2 stops heartbeating 500 ms after it starts; worker 1 beats every 200 ms, well
    // inside the 2 s timeout even on a loaded machine.
    let u = up(&["--workers", "2", "--heartbeat-timeout-ms", "2000", "--test-hung-workers", "2"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while u.registered() != vec![1] {
        assert!(Instant::now() < deadline, "worker 2 is still registered: {:?}", u.registered());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Worker 1 stalls (SIGSTOP) past the timeout: dropped; it resumes (SIGCONT): it notices
    // and registers again.
    let pid = u.up.pid("worker 1").to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(15);
    while !u.registered().is_empty() {
        assert!(Instant::now() < deadline, "stopped worker 1 is still registered");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(15);
    while u.registered() != vec![1] {
        assert!(Instant::now() < deadline, "worker 1 did not register again: {:?}", u.registered());
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = json(&u.run("montecarlo.js", 2, &[]));
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["lambdas"].as_array().unwrap().iter().all(|l| l["worker"] == 1), "{v}");
}

/// Durability inside lambdas against the deployment's real capsule hosts (three, f = 1): with
/// one host killed, durable syncs and puts succeed and the job ends durable; with a second one
/// killed, they throw a `DurabilityError` after their bound with the acks that arrived (at most
/// one: never durable on fewer than f + 1), and the report says the job did not end durable.
#[test]
fn faas_multiprocess_durable_lambdas_survive_one_host_down_and_fail_with_two() {
    let u = up(&["--workers", "2"]);
    let program = u.dir.path().join("durable.js");
    std::fs::write(
        &program,
        r#"
for (let i = 0; i < 20; i++) put("k/" + lambda.id + "/" + i, "v" + i);
const out = {};
try { sync({ durable: true, timeoutMs: 1500 }); out.sync = "durable"; }
catch (e) { out.sync = { name: e.name, acked: e.acked, quorum: e.quorum, servers: e.servers }; }
try { put("last/" + lambda.id, "x", { durable: true, timeoutMs: 1500 }); out.put = "durable"; }
catch (e) { out.put = { name: e.name, acked: e.acked }; }
emit(JSON.stringify(out));
"#,
    )
    .unwrap();
    let program = program.to_str().unwrap();
    let kill = |host: u32| {
        let name = format!("capsule host {host}");
        let pid = u.up.pid(&name).to_string();
        assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    };
    let outs = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        let ls = v["lambdas"].as_array().unwrap();
        assert_eq!(ls.len(), 2, "{v}");
        ls.iter().map(|l| serde_json::from_str(l["emitted"][0].as_str().unwrap()).unwrap()).collect()
    };

    kill(2);
    let v = json(&u.run(program, 2, &[]));
    for o in outs(&v) {
        assert_eq!((o["sync"].as_str(), o["put"].as_str()), (Some("durable"), Some("durable")), "{v}");
    }
    assert_eq!(v["durable"], true, "{v}");
    let stored: Vec<u64> = v["stored_records"].as_array().unwrap().iter().map(|p| p[0].as_u64().unwrap()).collect();
    assert_eq!(stored, vec![0, 1], "the killed host takes no part: {v}");

    kill(1);
    let v = json(&u.run(program, 2, &[]));
    for o in outs(&v) {
        let s = &o["sync"];
        assert_eq!(s["name"], "DurabilityError", "{v}");
        assert!(s["acked"].as_u64().unwrap() <= 1, "{v}");
        assert_eq!((s["quorum"].as_u64(), s["servers"].as_u64()), (Some(2), Some(3)), "{v}");
        assert_eq!(o["put"]["name"], "DurabilityError", "{v}");
    }
    assert_eq!(v["ok"], true, "the lambdas caught their errors: {v}");
    assert_eq!(v["durable"], false, "{v}");
    for d in v["durability"].as_array().unwrap() {
        let e = d[1]["error"].as_str().unwrap_or_default();
        assert!(e.contains("of the 3 capsule servers acked") && e.contains("2 must"), "{v}");
    }
}
