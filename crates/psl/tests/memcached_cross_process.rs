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
    // (A plain `get` reads B's own copy; `gets` would read at the key's home.)
    eventually("B sees A's set", || cb.call("get shared\r\n") != "END" && cb.line() == "hello" && cb.line() == "END");
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

/// A client's read-modify-write (`gets`, then `cas` with its unique) through either front end
/// loses only to a real concurrent write. `gets` reads at the key's home, where the `cas` runs:
/// read where it arrives, a key just written at its home would answer the unique of the copy
/// replicated so far (writers flush every 2 ms), and a `cas` right after a write through the
/// other front end would fail with `EXISTS` although nobody else wrote.
#[test]
fn gets_then_cas_alternating_between_front_ends_never_loses_without_a_race() {
    let g = start_group();
    let mut cs = [Client::connect(g.addr(0)), Client::connect(g.addr(1))];
    let keys: Vec<String> = (0..6).map(|i| format!("rmw{i}")).collect();
    for k in &keys {
        assert_eq!(cs[0].call(&format!("set {k} 0 0 1\r\n0\r\n")), "STORED");
    }
    // Plain sets replicate in the background: start once both front ends hold them.
    for k in &keys {
        for c in cs.iter_mut() {
            eventually("the set replicated", || {
                c.call(&format!("get {k}\r\n")) != "END" && c.line() == "0" && c.line() == "END"
            });
        }
    }
    for round in 0..40u64 {
        for (i, k) in keys.iter().enumerate() {
            // Alternate the front end every step, so each write is followed at once by a read
            // through the front end that did not make it.
            let c = &mut cs[(round as usize + i) % 2];
            let (v, _, unique) = c.gets(k).expect("the key exists");
            let n: u64 = String::from_utf8(v).unwrap().parse().unwrap();
            assert_eq!(n, round, "{k}: the read saw every earlier write");
            let next = (n + 1).to_string();
            let reply = c.call(&format!("cas {k} 0 0 {} {unique}\r\n{next}\r\n", next.len()));
            assert_eq!(reply, "STORED", "{k} round {round}: a cas lost though no one else wrote");
        }
    }
    // The meta protocol's unique (`mg k c v`) is read at the home too: right after a cas
    // through the other front end it is the newest one.
    for (i, k) in keys.iter().enumerate() {
        let (w, r) = (i % 2, 1 - i % 2);
        let (_, _, unique) = cs[w].gets(k).expect("the key exists");
        assert_eq!(cs[w].call(&format!("cas {k} 0 0 2 {unique}\r\n41\r\n")), "STORED");
        let reply = cs[r].call(&format!("mg {k} c v\r\n"));
        let unique: u64 = reply.split(' ').find_map(|t| t.strip_prefix('c')).unwrap().parse().unwrap();
        assert_eq!(cs[r].line(), "41", "{k}: mg read the newest value");
        assert_eq!(cs[r].call(&format!("ms {k} 2 C{unique}\r\n42\r\n")), "HD", "{k}: mg's unique was the newest");
    }
    // A client reads its own plain `set` through `gets` at once, though the set reaches the
    // key's home only later: the home answers that it is behind, and the front end its copy.
    for round in 0..10 {
        for (i, k) in keys.iter().enumerate() {
            let c = &mut cs[i % 2];
            let v = format!("s{round}");
            assert_eq!(c.call(&format!("set {k} 0 0 {}\r\n{v}\r\n", v.len())), "STORED");
            assert_eq!(c.gets(k).map(|x| x.0), Some(v.into_bytes()), "{k}: gets after set on one front end");
        }
    }
    // Both homes served reads for the other front end.
    let (fa, fb) = (cs[0].stat("forwarded"), cs[1].stat("forwarded"));
    assert!(fa > 0 && fb > 0, "forwarded: A {fa}, B {fb}");
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
