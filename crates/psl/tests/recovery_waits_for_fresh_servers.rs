//! Recovery racing continuous epochs (issue 15, finding 1): the coordinator seals an epoch every
//! 50 ms while a node keeps writing; server 1 is killed, misses a stretch of acknowledged
//! writes, and is restarted just before server 2 is killed. A node that then starts empty with
//! `--recover-from` all three servers finds only one fresh copy (server 0) and one server that
//! is catching up by anti-entropy. It must wait (bounded, a log line per retry) until server 1
//! holds everything the newest SYNC links, not give up, and must then hold every write
//! acknowledged durable before it serves. Before the fix it exited at once with "no server
//! holds a fresh copy: 1 fresh copies of the 2 needed".
//! Every wait is bounded; every process is killed at the end.

use psl_node::control::ControlClient;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{start_durable_cluster, start_node, start_read_server, Proc};

fn client(p: &Proc) -> ControlClient {
    common::control(p.addr())
}

/// One round of 200 puts on `c`, then SYNC_DURABLE: the pairs if it was acknowledged.
fn round(c: &mut ControlClient, tag: &str, round: u32) -> Option<Vec<(String, String)>> {
    let kv: Vec<(String, String)> =
        (0..200).map(|i| (format!("{tag}-k{}", i % 120), format!("{tag}-r{round}-{i}"))).collect();
    let lines: Vec<String> = kv.iter().map(|(k, v)| format!("PUT {k} {v}")).collect();
    if c.pipeline(&lines).ok()?.iter().any(|a| a != "OK") {
        return None;
    }
    (c.call("SYNC_DURABLE 20000").ok()? == "OK").then_some(kv)
}

/// Starts a node that recovers; returns its exit (with stderr) if it ends before serving, or
/// the node and its `recovered ...` line, and the retry lines it logged meanwhile.
fn recover(dir: &Path, router: SocketAddr, id: u32, reads: &str) -> Result<(Proc, String, Vec<String>), String> {
    let (r, ids, state) = (router.to_string(), id.to_string(), format!("state{id}"));
    #[rustfmt::skip]
    let args = [
        "node", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--id", &ids, "--state", &state,
        "--servers", "3", "--recover-from", reads, "--recover-timeout-ms", "60000",
    ];
    let child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(args)
        .env("PSL_CONTROL_PUB", common::control_pub(dir))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut p = Proc { child, line: String::new() };
    let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
    for (is_err, pipe) in [
        (false, Box::new(p.child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>),
        (true, Box::new(p.child.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if is_err {
                    eprintln!("[recovering node] {line}");
                }
                let _ = tx.send((is_err, line));
            }
        });
    }
    drop(tx);
    let (mut recovered, mut retries, mut errors) = (None, Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, line)) => {
                if line.contains("waiting for") {
                    retries.push(line.clone());
                }
                errors.push(line);
            }
            Ok((false, line)) => {
                if line.starts_with("recovered ") {
                    recovered = Some(line);
                } else if let Some(a) = line.strip_prefix("control ") {
                    p.line = a.trim().to_string();
                    return Ok((p, recovered.expect("`recovered` is printed before `control`"), retries));
                }
            }
            Err(_) => {
                let st = p.child.try_wait().ok().flatten();
                return Err(format!("the recovering node ended ({st:?}) without serving: {}", errors.join(" | ")));
            }
        }
    }
}

#[test]
fn recovery_waits_for_a_restarted_server_to_catch_up_instead_of_giving_up() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let (router, _coord, mut servers) = start_durable_cluster(d, "rec-race");
    let n1 = start_node(d, router.addr(), 1, &["--servers", "3"]);
    let mut c1 = client(&n1);
    let model: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    for r in 0..3 {
        model.lock().unwrap().extend(round(&mut c1, "a", r).expect("durable round with all servers up"));
    }
    // The servers hold a SYNC: freshness is judged against it.
    let v = psl_capsule::Verifier::new(psl_store::read_metadata(d.join("s0")).unwrap(), None);
    common::eventually("a SYNC on server 0", || {
        psl_server::read::ReadClient::connect(servers[0].addr()).unwrap().latest_sync(&v).unwrap().is_some()
    });
    // Server 1 goes down; acknowledged writes it never saw pile up on servers 0 and 2.
    servers[1].child.kill().unwrap();
    let _ = servers[1].child.wait();
    for r in 3..40 {
        model.lock().unwrap().extend(round(&mut c1, "a", r).expect("durable round with two servers up"));
    }
    // A writer that never stops (epochs keep racing), recording what was acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let bg = {
        let (stop, model, addr) = (stop.clone(), model.clone(), n1.addr());
        std::thread::spawn(move || {
            let mut c = common::control(addr);
            let mut r = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Some(kv) = round(&mut c, "b", r) {
                    model.lock().unwrap().extend(kv);
                }
                r += 1;
            }
        })
    };
    // Server 1 comes back with its (old) store and catches up by anti-entropy; server 2 dies.
    servers[1] = start_read_server(d, router.addr(), 1);
    servers[2].child.kill().unwrap();
    let _ = servers[2].child.wait();
    let reads: Vec<String> = servers.iter().map(|s| s.line.clone()).collect();
    let acked_before = model.lock().unwrap().clone();

    let got = recover(d, router.addr(), 9, &reads.join(","));
    stop.store(true, Ordering::Relaxed);
    bg.join().unwrap();
    let (n9, line, retries) = got.unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{line}; {} retry line(s)", retries.len());
    // Before any peer could help: every write acknowledged before the recovery began is there.
    let dump: serde_json::Value = serde_json::from_str(&client(&n9).call("DUMP").unwrap()).unwrap();
    let missing: Vec<&String> = acked_before.keys().filter(|k| dump[k.as_str()].is_null()).collect();
    assert!(missing.is_empty(), "{} acknowledged keys missing after recovery, e.g. {:?}", missing.len(), &missing[..3]);
    // Versions may only be newer than the acknowledged ones (the background writer kept going).
    for (k, v) in &acked_before {
        let got = dump[k.as_str()][0].as_str().unwrap();
        if got != v {
            let round_of = |s: &str| s.split('-').nth(1).and_then(|r| r[1..].parse::<u32>().ok());
            assert!(round_of(got) >= round_of(v), "key {k}: recovered {got}, older than acknowledged {v}");
        }
    }
}
