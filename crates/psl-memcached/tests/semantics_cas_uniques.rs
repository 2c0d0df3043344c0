//! CAS uniques through touches, as memcached 1.6 keeps them: `touch`, `gat`, `gats` and `mg`
//! with `T` keep an item's unique; data-changing commands give it a new one. The same script
//! runs against `psl memcached` and, when Debian's `memcached` is installed, against the real
//! server side by side: the replies must match once uniques are renamed by first appearance.

mod common;
use common::{start, start_with, Client};
use psl_memcached::{Config, ServerConfig};
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Requests whose replies show how uniques move.
const SCRIPT: &[&str] = &[
    "set a 5 0 3\r\nabc\r\n",
    "gets a\r\n",
    "touch a 100\r\n",
    "gets a\r\n",
    "gat 200 a\r\n",
    "gats 300 a\r\n",
    "gets a\r\n",
    "mg a T30 c t\r\n",
    "mg a c t\r\n",
    "append a 0 0 1\r\nd\r\n",
    "gets a\r\n",
    "touch a 50\r\n",
    "gets a\r\n",
    "set n 0 0 1\r\n1\r\n",
    "gets n\r\n",
    "incr n 1\r\n",
    "gets n\r\n",
    "touch n 10\r\n",
    "gats 20 n\r\n",
    "gets n\r\n",
];

/// Runs the script; each reply read until its terminator (`END`, or one line).
fn run(addr: SocketAddr) -> Vec<String> {
    let mut c = Client::connect(addr);
    let mut out = Vec::new();
    for req in SCRIPT {
        c.send(req.as_bytes());
        let multi = req.starts_with("get") || req.starts_with("gat");
        let mut reply = Vec::new();
        loop {
            let l = c.line();
            let end = !multi || l == "END";
            if let Some(rest) = l.strip_prefix("VALUE ") {
                let n: usize = rest.split(' ').nth(2).unwrap().parse().unwrap();
                reply.push(l.clone());
                reply.push(String::from_utf8(c.bytes(n + 2)).unwrap().trim_end().to_string());
                continue;
            }
            reply.push(l);
            if end {
                break;
            }
        }
        out.push(reply.join(" | "));
    }
    out
}

/// Renames every unique (the 5th word of `VALUE` lines of gets/gats, `c<N>` of meta replies)
/// to its order of first appearance, and every `t<N>` to `t`.
fn normalize(replies: &[String]) -> Vec<String> {
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut name = |u: &str| -> String {
        let n = names.len();
        format!("#{}", names.entry(u.to_string()).or_insert(n))
    };
    replies
        .iter()
        .map(|r| {
            r.split(" | ")
                .map(|part| {
                    let w: Vec<&str> = part.split(' ').collect();
                    if w[0] == "VALUE" && w.len() == 5 {
                        format!("{} {} {} {} {}", w[0], w[1], w[2], w[3], name(w[4]))
                    } else if w[0] == "HD" || w[0] == "VA" {
                        w.iter()
                            .map(|t| match t.strip_prefix('c') {
                                Some(u) if u.parse::<u64>().is_ok() => name(u),
                                _ if t.starts_with('t') && t[1..].parse::<i64>().is_ok() => "t".into(),
                                _ => t.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(" ")
                    } else {
                        part.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect()
}

#[test]
fn touch_gat_gats_and_mg_t_keep_the_unique_data_changes_renew_it() {
    let srv = start();
    let got = normalize(&run(srv.addr()));
    let expect: Vec<String> = [
        "STORED",
        "VALUE a 5 3 #0 | abc | END",
        "TOUCHED",
        "VALUE a 5 3 #0 | abc | END",
        "VALUE a 5 3 | abc | END",
        "VALUE a 5 3 #0 | abc | END",
        "VALUE a 5 3 #0 | abc | END",
        "HD #0 t",
        "HD #0 t",
        "STORED",
        "VALUE a 5 4 #1 | abcd | END",
        "TOUCHED",
        "VALUE a 5 4 #1 | abcd | END",
        "STORED",
        "VALUE n 0 1 #2 | 1 | END",
        "2",
        "VALUE n 0 1 #3 | 2 | END",
        "TOUCHED",
        "VALUE n 0 1 #3 | 2 | END",
        "VALUE n 0 1 #3 | 2 | END",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(got, expect);
}

#[test]
fn a_kept_unique_is_the_same_on_every_front_end_and_cas_with_it_succeeds() {
    let srv = start_with(2, Config::default(), ServerConfig::default());
    let mut a = Client::connect(srv.servers[0].addr());
    let mut b = Client::connect(srv.servers[1].addr());
    a.expect("set t 0 0 1\r\nx\r\n", "STORED\r\n");
    let u = a.gets("t").unwrap().2;
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    // Touch through the other front end (forwarded to the key's home if that is A).
    b.expect("touch t 1000\r\n", "TOUCHED\r\n");
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    assert_eq!(a.gets("t").unwrap().2, u);
    assert_eq!(b.gets("t").unwrap().2, u);
    a.expect(&format!("cas t 0 0 1 {u}\r\ny\r\n"), "STORED\r\n");
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    assert_ne!(a.gets("t").unwrap().2, u, "a data change renews the unique");
}

struct Killed(std::process::Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn same_unique_behaviour_as_real_memcached_side_by_side() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = Command::new("memcached");
    cmd.args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1", "-t", "1"]);
    if Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0")) {
        cmd.args(["-u", "root"]);
    }
    let Ok(child) = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn() else {
        eprintln!(
            "\n!!!!!!!! SKIPPED side-by-side: Debian's memcached is missing; run scripts/install-memcached-test-deps.sh !!!!!!!!\n"
        );
        return;
    };
    let mut real = Killed(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            let mut err = String::new();
            let _ = real.0.stderr.take().unwrap().read_to_string(&mut err);
            panic!("memcached did not start: {err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let theirs = normalize(&run(addr));
    let srv = start();
    let ours = normalize(&run(srv.addr()));
    assert_eq!(ours, theirs);
}
