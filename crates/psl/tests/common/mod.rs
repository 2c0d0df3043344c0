//! Helpers for tests that run `psl` processes on loopback: start one, read the address it
//! prints, and kill it when the test ends.
#![allow(dead_code)]

pub mod faas;
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

/// The tests' operator control key (fixed: test processes only).
pub fn operator() -> std::sync::Arc<psl_crypto::SigningKey> {
    std::sync::Arc::new(psl_node::control::operator_key_from_text(&"11".repeat(32)).expect("a key"))
}

/// Writes [`operator`]'s public key to `dir/control.pub` (what the roles [`start`] starts get
/// through `PSL_CONTROL_PUB`); returns its path.
pub fn control_pub(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("control.pub");
    std::fs::write(&p, psl_node::control::operator_pub_text(&operator().verifying_key())).expect("control.pub");
    p
}

/// Writes [`operator`]'s secret key to `dir/control.key` (mode 0600), for `psl kv
/// --control-key`; returns its path.
pub fn control_key(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join("control.key");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&p).unwrap();
    f.write_all(psl_node::control::operator_key_text(&operator()).as_bytes()).unwrap();
    p
}

/// A control client of `addr` that signs with [`operator`].
pub fn control(addr: SocketAddr) -> psl_node::control::ControlClient {
    psl_node::control::ControlClient::connect_as(addr, Duration::from_secs(5), operator()).expect("control connects")
}

/// Starts `psl ARGS` in `dir` and waits (bounded) for the line `PREFIX <address>` it prints
/// when ready. Roles get the tests' operator control key ([`control_pub`]).
pub fn start(dir: &Path, args: &[&str], prefix: &str) -> Proc {
    let control_pub = control_pub(dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(args)
        .env("PSL_CONTROL_PUB", control_pub)
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

/// A `psl capsule-server` (id `id`, store `s<id>`, n = 3, f = 1, group commit) for capsule
/// `c.capsule` on `router`, with its read API on a free port; `line` is the read address.
pub fn start_read_server(dir: &Path, router: SocketAddr, id: u32) -> Proc {
    let (r, ids, d) = (router.to_string(), id.to_string(), format!("s{id}"));
    #[rustfmt::skip]
    let args = [
        "capsule-server", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--dir", &d,
        "--id", &ids, "--n", "3", "--f", "1", "--fsync", "group", "--read", "127.0.0.1:0",
    ];
    start(dir, &args, "reads")
}

/// In `dir`: an owner key `owner.key`, a capsule `c.capsule` labelled `label`, a router, a
/// coordinator (50 ms epochs) and three read servers ([`start_read_server`]). Returns
/// (router, coordinator, servers).
pub fn start_durable_cluster(dir: &Path, label: &str) -> (Proc, Proc, Vec<Proc>) {
    let (router, coordinator) = start_router_and_coordinator(dir, label, &["--eoe-timeout-ms", "200"]);
    let servers = (0..3).map(|i| start_read_server(dir, router.addr(), i)).collect();
    (router, coordinator, servers)
}

/// In `dir`: an owner key `owner.key`, a capsule `c.capsule` labelled `label`, a router and a
/// coordinator (50 ms epochs, with `extra` arguments). Returns (router, coordinator).
pub fn start_router_and_coordinator(dir: &Path, label: &str, extra: &[&str]) -> (Proc, Proc) {
    ok(dir, &["keys", "new", "--out", "owner.key"]);
    ok(dir, &["capsule", "new", "--owner", "owner.key", "--label", label, "--out", "c.capsule"]);
    let router = start(dir, &["router", "--listen", "127.0.0.1:0"], "listening");
    let r = router.addr().to_string();
    let mut args =
        vec!["coordinator", "--capsule", "c.capsule", "--owner", "owner.key", "--router", &r, "--epoch-ms", "50"];
    args.extend_from_slice(extra);
    let coordinator = start(dir, &args, "control");
    (router, coordinator)
}
