//! Helpers for tests that run `psl` processes on loopback: start one, read the address it
//! prints, and kill it when the test ends.
#![allow(dead_code)]

pub mod mc;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Proc {
    pub child: Child,
    /// What the process printed after its ready prefix (an address).
    pub line: String,
}

impl Proc {
    pub fn addr(&self) -> SocketAddr {
        self.line.parse().expect("an address")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `psl ARGS` in `dir` and waits (bounded) for the line `PREFIX <address>` it prints
/// when ready.
pub fn start(dir: &Path, args: &[&str], prefix: &str) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("psl starts");
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix(&format!("{prefix} ")) {
                let _ = tx.send(a.trim().to_string());
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("psl {args:?} did not start"));
    Proc { child, line }
}

/// Runs `psl ARGS` to completion and requires success.
pub fn ok(dir: &Path, args: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_psl")).args(args).current_dir(dir).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// Starts `psl node` number `id` on `router` (capsule `c.capsule`, key `owner.key`, state
/// directory `state<id>`), with `extra` arguments, and waits for its control address.
pub fn start_node(dir: &Path, router: SocketAddr, id: u32, extra: &[&str]) -> Proc {
    let r = router.to_string();
    let ids = id.to_string();
    let state = format!("state{id}");
    let mut args =
        vec!["node", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--id", &ids, "--state", &state];
    args.extend_from_slice(extra);
    start(dir, &args, "control")
}

/// Polls `f` every 20 ms until it holds; fails the test after 20 s, naming `what`.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
