//! SecureCached home failover across processes on loopback: a router, a coordinator and three
//! `psl memcached --cluster` front ends forming one group with home failover
//! (`--home-lease-ms`). Clients of the project's own and pymemcache run `gets`/`cas`
//! increment loops on counters of every slot through all three front ends; the home of one
//! slot is killed with `kill -9` in the middle and restarted later from its state directory.
//!
//! What must hold: no two `STORED` for one key and one unique, no two `STORED` that wrote the
//! same new value of one key (a lost update), every counter at least its number of `STORED`
//! at the end on every front end, every counter incremented while the killed home was down
//! (its slot was taken over), and the restarted front end home of its slot again. Every wait
//! is bounded; every process is killed when the test ends.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::mc::Client;
use common::{eventually, start, start_router_and_coordinator, Proc};

const KEYS: usize = 12;
const LEASE_MS: &str = "400";

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn key(i: usize) -> String {
    format!("ctr{i}")
}

struct Group {
    t: tempfile::TempDir,
    _router: Proc,
    _coord: Proc,
    router: String,
    peers: Vec<SocketAddr>,
    fes: Vec<Option<Proc>>,
}

impl Group {
    fn start_fe(&self, i: usize) -> Proc {
        let list: Vec<String> = self.peers.iter().map(|p| p.to_string()).collect();
        let (id, state, pl, list) = ((i + 1).to_string(), format!("mc{i}"), self.peers[i].to_string(), list.join(","));
        let args = [
            "memcached",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &self.router,
            "--capsule",
            "c.capsule",
            "--owner",
            "owner.key",
            "--id",
            &id,
            "--state",
            &state,
            "--peer-listen",
            &pl,
            "--peers",
            &list,
            "--home-lease-ms",
            LEASE_MS,
            "--peer-timeout-ms",
            "1000",
            "--writers",
            "1",
            "--verifiers",
            "1",
            "--threads",
            "2",
        ];
        start(self.t.path(), &args, "listening")
    }

    fn addr(&self, i: usize) -> Option<SocketAddr> {
        self.fes[i].as_ref().map(|p| p.addr())
    }
}

fn start_group() -> Group {
    let t = tempfile::tempdir().unwrap();
    let d: &Path = t.path();
    let (router, coord) = start_router_and_coordinator(d, "mc", &[]);
    let r = router.addr().to_string();
    let mut g = Group {
        t,
        _router: router,
        _coord: coord,
        router: r,
        peers: (0..3).map(|_| free_addr()).collect(),
        fes: Vec::new(),
    };
    g.fes = (0..3).map(|i| Some(g.start_fe(i))).collect();
    g
}

/// A client that reports I/O errors instead of panicking (its front end may be killed).
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    fn connect(a: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&a, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Conn { r: BufReader::new(s.try_clone()?), w: s })
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l.trim_end().to_string())
    }

    fn gets(&mut self, key: &str) -> std::io::Result<Option<(u64, u64)>> {
        self.w.write_all(format!("gets {key}\r\n").as_bytes())?;
        let head = self.line()?;
        if head == "END" {
            return Ok(None);
        }
        let p: Vec<&str> = head.split(' ').collect();
        assert_eq!(p[0], "VALUE", "gets {key}: {head}");
        let len: usize = p[3].parse().unwrap();
        let mut data = vec![0u8; len + 2];
        self.r.read_exact(&mut data)?;
        data.truncate(len);
        assert_eq!(self.line()?, "END");
        let v = std::str::from_utf8(&data).unwrap().parse().unwrap();
        Ok(Some((v, p[4].parse().unwrap())))
    }

    fn cas(&mut self, key: &str, value: u64, unique: u64) -> std::io::Result<String> {
        let v = value.to_string();
        self.w.write_all(format!("cas {key} 0 0 {} {unique}\r\n{v}\r\n", v.len()).as_bytes())?;
        self.line()
    }
}

/// One `STORED`: key, the unique it was given, the value it wrote, when (since the start).
type Stored = (String, u64, u64, Duration);

/// Increment loops through the front ends in `addrs` (re-read on every reconnect).
fn cas_loop(
    addrs: Arc<Mutex<Vec<Option<SocketAddr>>>>,
    first: usize,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> (Vec<Stored>, BTreeMap<String, u64>) {
    let mut out = Vec::new();
    let mut replies: BTreeMap<String, u64> = BTreeMap::new();
    let mut at = first;
    let mut rng = first as u64 * 7919 + 1;
    while !stop.load(Ordering::Relaxed) {
        let a = addrs.lock().unwrap()[at % 3];
        let Some(a) = a else {
            at += 1;
            continue;
        };
        let Ok(mut c) = Conn::connect(a) else {
            at += 1;
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k = key((rng >> 33) as usize % KEYS);
            let r = c.gets(&k).and_then(|g| match g {
                None => Ok("MISS".to_string()),
                Some((v, unique)) => {
                    let r = c.cas(&k, v + 1, unique)?;
                    if r == "STORED" {
                        out.push((k.clone(), unique, v + 1, t0.elapsed()));
                    }
                    Ok(r)
                }
            });
            match r {
                Ok(r) => {
                    let kind = r.split(' ').next().unwrap_or("").to_string();
                    *replies.entry(kind.clone()).or_default() += 1;
                    if kind == "SERVER_ERROR" {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                Err(_) => {
                    *replies.entry("reconnect".into()).or_default() += 1;
                    at += 1;
                    break;
                }
            }
        }
    }
    (out, replies)
}

fn stat(a: SocketAddr, name: &str) -> u64 {
    Client::connect(a).stat(name)
}

fn pymemcache() -> bool {
    Command::new("python3").args(["-c", "import pymemcache"]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn killing_a_home_during_concurrent_cas_loops_loses_no_update_and_its_slot_moves_and_comes_back() {
    let mut g = start_group();
    let addrs: Vec<SocketAddr> = (0..3).map(|i| g.addr(i).unwrap()).collect();
    // Every member home of its own slot.
    eventually("every front end home of its slot", || addrs.iter().all(|a| stat(*a, "psl_home_slots_served") == 1));
    let mut c0 = Client::connect(addrs[0]);
    for i in 0..KEYS {
        assert_eq!(c0.set(&key(i), 0, b"0"), "STORED");
    }
    eventually("the counters replicated", || {
        addrs.iter().all(|a| {
            let mut c = Client::connect(*a);
            (0..KEYS).all(|i| c.gets(&key(i)).is_some())
        })
    });

    let shared = Arc::new(Mutex::new(g.fes.iter().map(|p| p.as_ref().map(|p| p.addr())).collect::<Vec<_>>()));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let loops: Vec<_> = (0..4)
        .map(|i| {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || cas_loop(shared, i % 3, stop, t0))
        })
        .collect();
    // Killed if the test fails before it waits for it.
    struct Py(Option<std::process::Child>);
    impl Drop for Py {
        fn drop(&mut self) {
            if let Some(c) = self.0.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut python = Py(pymemcache().then(|| {
        let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let keys: Vec<String> = (0..KEYS).map(key).collect();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../psl-memcached/tests/clients/pymemcache_cas_loop.py");
        Command::new("python3")
            .args([script, "7.5", &keys.join(","), &list.join(",")])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs")
    }));
    if python.0.is_none() {
        eprintln!("\n!!!!!!!! pymemcache missing: only the project's client runs; run scripts/install-memcached-test-deps.sh !!!!!!!!\n");
    }

    // Kill front end 0 (home of slot 0) mid-run; restart it from its state directory later.
    std::thread::sleep(Duration::from_millis(1500));
    shared.lock().unwrap()[0] = None;
    let mut victim = g.fes[0].take().unwrap();
    victim.child.kill().unwrap(); // SIGKILL
    let _ = victim.child.wait();
    let killed_at = t0.elapsed();
    std::thread::sleep(Duration::from_millis(3000));
    let restarted_at = t0.elapsed();
    g.fes[0] = Some(g.start_fe(0));
    shared.lock().unwrap()[0] = g.addr(0);
    std::thread::sleep(Duration::from_millis(3000));
    stop.store(true, Ordering::Relaxed);

    let mut stored: Vec<Stored> = Vec::new();
    for l in loops {
        let (s, replies) = l.join().unwrap();
        eprintln!("client: {} STORED, replies {replies:?}", s.len());
        stored.extend(s);
    }
    if let Some(p) = python.0.take() {
        let out = p.wait_with_output().unwrap();
        assert!(out.status.success(), "the pymemcache loop failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut py = 0;
        for l in text.lines() {
            let f: Vec<&str> = l.split(' ').collect();
            match f[0] {
                "STORED" => {
                    // The script does not time its lines: count them as before the kill
                    // for the liveness check below (they only add to the safety checks).
                    stored.push((f[1].to_string(), f[2].parse().unwrap(), f[3].parse().unwrap(), Duration::ZERO));
                    py += 1;
                }
                "DONE" => eprintln!("pymemcache: {l}"),
                _ => {}
            }
        }
        assert!(py > 0, "the pymemcache loop stored nothing: {text}");
    }

    // Safety: no two STORED for one key and unique, no lost update.
    let mut uniques = BTreeSet::new();
    let mut values = BTreeSet::new();
    let mut per_key: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (k, u, v, _) in &stored {
        assert!(uniques.insert((k.clone(), *u)), "two STORED for {k} with unique {u}");
        assert!(values.insert((k.clone(), *v)), "two STORED wrote {k} = {v}: a lost update");
        let e = per_key.entry(k.clone()).or_default();
        e.0 += 1;
        e.1 = e.1.max(*v);
    }
    // Liveness: every counter incremented while front end 0 was down (after its slot moved).
    let window = (killed_at + Duration::from_millis(2000), restarted_at);
    for i in 0..KEYS {
        let k = key(i);
        assert!(
            stored.iter().any(|(sk, _, _, at)| *sk == k && *at >= window.0 && *at < window.1),
            "{k} was not incremented between {window:?} (front end 0 killed at {killed_at:?})"
        );
    }
    // Every front end ends with each counter at least its number of STOREDs and its highest
    // stored value (a command that failed with SERVER_ERROR may still have been applied).
    let now: Vec<SocketAddr> = (0..3).map(|i| g.addr(i).unwrap()).collect();
    eventually("every counter at its stored count on every front end", || {
        now.iter().all(|a| {
            let mut c = Client::connect(*a);
            per_key.iter().all(|(k, (n, max))| {
                c.gets(k).is_some_and(|(v, _, _)| {
                    let v: u64 = String::from_utf8(v).unwrap().parse().unwrap();
                    v >= *n && v >= *max
                })
            })
        })
    });
    let takeovers: u64 = now[1..].iter().map(|a| stat(*a, "psl_home_takeovers")).sum();
    assert!(takeovers >= 1, "no surviving front end took a slot over");
    // The restarted front end, home of its slot again after its quarantine.
    eventually("front end 0 home of its slot again", || stat(now[0], "psl_home_slots_served") == 1);
    eprintln!("{} STORED in all, {} keys; takeovers {takeovers}", stored.len(), per_key.len());
}
