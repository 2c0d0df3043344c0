//! SecureCached across processes on loopback: a router, a coordinator and two `psl memcached
//! --cluster` front ends (each with its own node) forming one group through `--peer-listen` /
//! `--peers`. Replication through SCL, CAS and incr arbitrated by each key's home front end
//! across processes, and a clear, bounded SERVER_ERROR when a key's home is down. Every wait
//! is bounded; every process is killed when the test ends.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::eventually;
use common::mc::{cas_race, Client};
use common::{start, start_router_and_coordinator, Proc};

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

struct Group {
    _t: tempfile::TempDir,
    _router: Proc,
    _coord: Proc,
    fes: Vec<Option<Proc>>,
}

impl Group {
    fn addr(&self, i: usize) -> SocketAddr {
        self.fes[i].as_ref().unwrap().addr()
    }
}

fn start_group() -> Group {
    let t = tempfile::tempdir().unwrap();
    let d: &Path = t.path();
    let (router, coord) = start_router_and_coordinator(d, "mc", &[]);
    let r = router.addr().to_string();
    let peers = [free_addr(), free_addr()];
    let list = format!("{},{}", peers[0], peers[1]);
    let fes = (0..2)
        .map(|i| {
            let (id, pl) = ((i + 1).to_string(), peers[i].to_string());
            let args = [
                "memcached",
                "--listen",
                "127.0.0.1:0",
                "--cluster",
                &r,
                "--capsule",
                "c.capsule",
                "--owner",
                "owner.key",
                "--id",
                &id,
                "--peer-listen",
                &pl,
                "--peers",
                &list,
                "--peer-timeout-ms",
                "1000",
                "--writers",
                "1",
                "--verifiers",
                "1",
                "--threads",
                "2",
            ];
            Some(start(d, &args, "listening"))
        })
        .collect();
    Group { _t: t, _router: router, _coord: coord, fes }
}

/// Polls `f` until it is true (bounded).
#[test]
fn two_front_end_processes_share_data_and_arbitrate_cas_and_incr_at_each_keys_home() {
    let g = start_group();
    let (a, b) = (g.addr(0), g.addr(1));
    let (mut ca, mut cb) = (Client::connect(a), Client::connect(b));

    // A set through one front end is visible through the other once replicated.
    assert_eq!(ca.call("set shared 42 0 5\r\nhello\r\n"), "STORED");
    eventually("B sees A's set", || cb.gets("shared").is_some());
    assert_eq!(cb.call("get shared\r\n"), "VALUE shared 42 5");
    assert_eq!(cb.line(), "hello");
    assert_eq!(cb.line(), "END");
    assert_eq!(ca.gets("shared").unwrap().2, cb.gets("shared").unwrap().2, "one version, one unique");

    // Two concurrent cas with one unique, one to each front end: exactly one STORED.
    for round in 0..24 {
        let key = format!("race{round}");
        assert_eq!(ca.call(&format!("set {key} 0 0 1\r\n0\r\n")), "STORED");
        let unique = ca.gets(&key).unwrap().2;
        eventually("B holds A's version", || cb.gets(&key).map(|x| x.2) == Some(unique));
        let replies = cas_race([(a, "A"), (b, "B")], &key, unique);
        assert_eq!(replies, vec!["EXISTS".to_string(), "STORED".to_string()], "round {round}");
    }
    // Both homes were exercised: each front end forwarded some keys to the other.
    let (fa, fb) = (ca.stat("forwarded"), cb.stat("forwarded"));
    assert!(fa > 0 && fb > 0, "forwarded: A {fa}, B {fb}");

    // incr from both processes at once on shared counters: none is lost.
    for key in ["ctr0", "ctr1", "ctr2"] {
        assert_eq!(ca.call(&format!("set {key} 0 0 1\r\n0\r\n")), "STORED");
        eventually("B sees the counter", || cb.gets(key).is_some());
    }
    let threads: Vec<_> = [a, b]
        .into_iter()
        .map(|addr| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for i in 0..60 {
                    let r = c.call(&format!("incr ctr{} 1\r\n", i % 3));
                    assert!(r.parse::<u64>().is_ok(), "incr replied {r}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for key in ["ctr0", "ctr1", "ctr2"] {
        eventually("both front ends read 40", || {
            ca.gets(key).map(|x| x.0) == Some(b"40".to_vec()) && cb.gets(key).map(|x| x.0) == Some(b"40".to_vec())
        });
    }
}

#[test]
fn a_conditional_command_whose_home_is_down_fails_with_server_error_in_bounded_time() {
    let mut g = start_group();
    let a = g.addr(0);
    let mut ca = Client::connect(a);
    for i in 0..16 {
        assert_eq!(ca.call(&format!("set k{i} 0 0 1\r\n1\r\n")), "STORED");
    }
    // Freeze front end B (SIGSTOP): its kernel still accepts connections, but it answers
    // nothing; forwarded commands must fail after --peer-timeout-ms (1 s), not hang.
    let pid = g.fes[1].as_ref().unwrap().child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let (mut failed, mut worked) = (0, 0);
    for i in 0..8 {
        let t = Instant::now();
        let r = ca.call(&format!("incr k{i} 1\r\n"));
        assert!(t.elapsed() < Duration::from_secs(4), "incr k{i} took {:?}", t.elapsed());
        if r.starts_with("SERVER_ERROR") {
            failed += 1;
        } else {
            assert_eq!(r, "2", "k{i}");
            worked += 1;
        }
    }
    // Then kill it: connections are refused at once.
    drop(g.fes[1].take());
    for i in 8..16 {
        let t = Instant::now();
        let r = ca.call(&format!("incr k{i} 1\r\n"));
        assert!(t.elapsed() < Duration::from_secs(4), "incr k{i} took {:?}", t.elapsed());
        if r.starts_with("SERVER_ERROR") {
            failed += 1;
        } else {
            assert_eq!(r, "2", "k{i}");
            worked += 1;
        }
    }
    assert!(failed > 0 && worked > 0, "failed {failed}, worked {worked}");
    assert_eq!(ca.stat("forward_failures"), failed);
    // A conditional get (gat) on a key homed at the dead front end fails visibly too.
    let homed_at_b = (0..16).find(|i| ca.call(&format!("touch k{i} 0\r\n")).starts_with("SERVER_ERROR")).unwrap();
    // As in memcached, an error ends the retrieval command: no END follows.
    assert!(ca.call(&format!("gat 0 k{homed_at_b}\r\n")).starts_with("SERVER_ERROR"));
    assert_eq!(ca.call("version\r\n"), format!("VERSION {}", psl_memcached::VERSION));
    // Plain commands stay local and keep working.
    assert_eq!(ca.call("set plain 0 0 2\r\nok\r\n"), "STORED");
    assert_eq!(ca.gets("plain").unwrap().0, b"ok");
    assert_eq!(ca.call("delete k0\r\n"), "DELETED");
}
