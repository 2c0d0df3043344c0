//! PSL on four "hosts" (network namespaces joined by veth pairs to a bridge in a fifth), from
//! one cluster file, over a three-server NATS cluster; then faults: a NATS server killed
//! (clients fail over), a host's link taken down and up (partition, heal), a capsule server's
//! host killed outright and started again. Afterwards every node converges, every durably
//! acknowledged write is present (on a node rebuilt from the capsule servers alone), the
//! memcached front ends agree, and a job's result is correct; a man in the middle at a capsule
//! host's address gets no key (the hosts are authenticated by the TLS keys `--init` pinned,
//! not attested). The control interfaces are the
//! operator's only: the KV coordinators' and CapsuleDB's are not reachable from another
//! namespace (loopback), and an unsigned `REVOKE` is refused on loopback and on a node's
//! routable control port alike.
//!
//! Needs root (`ip netns`), Debian's nats-server and iproute2 (scripts/install-nats-test-deps.sh).
//! Every namespace is named `pslnt<pid>…`: the guard deletes them (and kills what runs in
//! them) when the test ends, pass or fail, and the next run first removes those of runs that
//! died without cleaning up (their pid is gone).

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PREFIX: &str = "pslnt";
const SUBNET: &str = "10.213.7";
const HOSTS: usize = 4;

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip (iproute2) runs");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

fn ns_pids(ns: &str) -> Vec<i32> {
    let o = Command::new("ip").args(["netns", "pids", ns]).output();
    o.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

fn kill_ns(ns: &str) {
    for _ in 0..50 {
        let pids = ns_pids(ns);
        if pids.is_empty() {
            return;
        }
        for p in pids {
            // SAFETY: kill(2) on a pid read from `ip netns pids` for a namespace this test made.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn delete_ns(ns: &str) {
    kill_ns(ns);
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// Namespaces of earlier runs of this test whose process is gone.
fn remove_leftovers() {
    let o = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let pid: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let alive = pid.parse::<i32>().is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            eprintln!("removing namespace {name} left by a crashed run");
            delete_ns(name);
        }
    }
}

/// The namespaces: `h1..h4` and the switch `sw`; deleted (with everything in them) on drop.
struct Net {
    tag: String,
}

impl Net {
    fn ns(&self, h: usize) -> String {
        format!("{}h{h}", self.tag)
    }
    fn sw(&self) -> String {
        format!("{}sw", self.tag)
    }
    fn addr(h: usize) -> String {
        format!("{SUBNET}.{h}")
    }

    fn new() -> Net {
        let net = Net { tag: format!("{PREFIX}{}", std::process::id()) };
        let sw = net.sw();
        ip(&["netns", "add", &sw]);
        ip(&["-n", &sw, "link", "set", "lo", "up"]);
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        for h in 1..=HOSTS {
            let ns = net.ns(h);
            let v = format!("v{h}");
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &sw, "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            ip(&["-n", &sw, "link", "set", &v, "master", "br0"]);
            ip(&["-n", &sw, "link", "set", &v, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", Net::addr(h)), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        net
    }

    /// Takes host `h`'s link down (`false`) or up.
    fn link(&self, h: usize, up: bool) {
        ip(&["-n", &self.sw(), "link", "set", &format!("v{h}"), if up { "up" } else { "down" }]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in 1..=HOSTS {
            delete_ns(&self.ns(h));
        }
        delete_ns(&self.sw());
    }
}

/// The whole test's bound. Each step has its own, but a call with none (a `psl run` that never
/// exits, a control read that never returns) would hold CI until its own limit. Past
/// `after`, everything in the test's namespaces is killed, so whatever the test waits on
/// fails and the guards clean up; if the test still has not ended a minute later, the
/// namespaces are deleted and the process exits with a failure.
fn watchdog(tag: String, after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let all: Vec<String> = (1..=HOSTS).map(|h| format!("{tag}h{h}")).chain([format!("{tag}sw")]).collect();
        eprintln!("cluster_netns: still running after {after:?}: killing every process in its namespaces");
        all.iter().for_each(|ns| kill_ns(ns));
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("cluster_netns: did not end after its processes were killed: deleting its namespaces, failing");
        all.iter().for_each(|ns| delete_ns(ns));
        std::process::exit(1);
    });
}

/// Runs `f` on a thread inside namespace `ns` (its sockets live there).
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(move || {
            let fd = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("namespace file");
            // SAFETY: setns(2) on a descriptor this thread holds open; it moves only the
            // calling thread into the network namespace, and the thread ends with the scope.
            let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

/// `psl ARGS` in namespace `ns`, killed on drop; its stdout lines on a channel, its stderr in
/// a log file.
struct Proc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    log: PathBuf,
}

impl Proc {
    fn start(ns: &str, dir: &Path, log: &str, args: &[&str]) -> Proc {
        let log = dir.join(log);
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_psl")])
            .args(args)
            .current_dir(dir)
            .env("PSL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("psl starts");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Proc { child, lines, log }
    }

    /// Waits for a line starting with `prefix`; returns the rest, and every line before it.
    fn wait(&self, prefix: &str, within: Duration) -> (String, Vec<String>) {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) => match l.strip_prefix(prefix) {
                    Some(rest) => return (rest.trim().to_string(), seen),
                    None => seen.push(l),
                },
                Err(_) => panic!("no '{prefix}' line in {within:?}; log {}:\n{}", self.log.display(), tail(&self.log)),
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(p: &Path) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn config() -> String {
    let a = |h: usize| Net::addr(h);
    format!(
        r#"[cluster]
dir = "state"
shared = "shared"
epoch_ms = 100
kv_memory_mb = 16
kv_flow_window_records = 512

[[host]]
name = "h1"
address = "{}"
nats = "cluster"
leader = true
capsule_hosts = [0]
kv_servers = [0]
kv_coordinators = [0]
memcached = [1]

[[host]]
name = "h2"
address = "{}"
nats = "cluster"
scheduler = true
capsule_hosts = [1]
kv_servers = [1]
kv_coordinators = [1]
capsuledb = true
workers = [1]

[[host]]
name = "h3"
address = "{}"
nats = "cluster"
capsule_hosts = [2]
kv_servers = [2]
workers = [2]
memcached = [2]

[[host]]
name = "h4"
address = "{}"
workers = [3, 4]
"#,
        a(1),
        a(2),
        a(3),
        a(4)
    )
}

fn fabric_url() -> String {
    (1..=3).map(|h| format!("nats://{}:4222", Net::addr(h))).collect::<Vec<_>>().join(",")
}

/// The operator's control key `psl up --init` made (in `[cluster] operator`, never shared).
static OPERATOR: std::sync::OnceLock<std::sync::Arc<psl_crypto::SigningKey>> = std::sync::OnceLock::new();

/// A control-interface client (`psl node`) inside a namespace, signing with the operator's key.
fn control(ns: &str, addr: SocketAddr, cmds: Vec<String>) -> Vec<String> {
    let key = OPERATOR.get().expect("the operator key is loaded").clone();
    in_ns(ns, move || {
        let mut c =
            psl_node::control::ControlClient::connect_as(addr, Duration::from_secs(5), key).expect("control connects");
        cmds.iter().map(|cmd| c.call(cmd).expect("control answers")).collect()
    })
}

/// An unsigned command from namespace `ns`: the answer, or why no connection was made.
fn unsigned(ns: &str, addr: SocketAddr, cmd: &str) -> Result<String, std::io::Error> {
    let cmd = cmd.to_string();
    in_ns(ns, move || psl_node::control::ControlClient::connect(addr, Duration::from_secs(3))?.call(&cmd))
}

/// Writes `n` keys on a node and waits until they are durable on f + 1 capsule servers;
/// returns them if acknowledged.
fn durable_round(ns: &str, addr: SocketAddr, tag: &str, n: usize) -> Option<Vec<(String, String)>> {
    durable_within(ns, addr, tag, n, 20_000)
}

fn durable_within(ns: &str, addr: SocketAddr, tag: &str, n: usize, ms: u64) -> Option<Vec<(String, String)>> {
    let kv: Vec<(String, String)> = (0..n).map(|i| (format!("{tag}-{i}"), format!("v-{tag}-{i}"))).collect();
    let mut cmds: Vec<String> = kv.iter().map(|(k, v)| format!("PUT {k} {v}")).collect();
    cmds.push(format!("SYNC_DURABLE {ms}"));
    let r = control(ns, addr, cmds);
    assert!(r[..n].iter().all(|l| l == "OK"), "{tag}: {r:?}");
    (r[n] == "OK").then_some(kv)
}

fn start_node(net: &Net, dir: &Path, h: usize, id: u32, port: u16, extra: &[&str]) -> (Proc, SocketAddr) {
    let control = format!("{}:{port}", Net::addr(h));
    let state = format!("state/node{id}");
    let url = fabric_url();
    let ids = id.to_string();
    // Its keys from the leader (host 1), after attestation: no owner key on its host.
    let leader = format!("{}:7501", Net::addr(1));
    let mut args = vec![
        "node",
        "--capsule",
        "shared/kv.capsule",
        "--kv-leader",
        &leader,
        "--kv-attest-policy",
        "shared/attest-policy.toml",
        "--attest",
        "sim",
        "--sim-platform-key",
        "shared/sim-platform.key",
        "--fabric",
        &url,
        "--id",
        &ids,
        "--state",
        &state,
        "--servers",
        "3",
        "--control",
        &control,
        "--control-pub",
        "shared/control.pub",
        "--epoch-ms",
        "100",
    ];
    args.extend_from_slice(extra);
    let p = Proc::start(&net.ns(h), dir, &format!("node{id}.log"), &args);
    p.wait("control ", Duration::from_secs(120));
    (p, control.parse().unwrap())
}

fn run_job(net: &Net, dir: &Path, input: &Path) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = Command::new("ip")
        .args(["netns", "exec", &net.ns(1), env!("CARGO_BIN_EXE_psl"), "run"])
        .arg(root.join("examples/wordcount.js"))
        .args(["--lambdas", "4", "--json", "--cluster", "state/h1/cluster.json", "--input"])
        .arg(input)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "psl run: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    serde_json::from_str(v["lambdas"][0]["emitted"][1].as_str().unwrap()).unwrap()
}

fn until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_four_host_deployment_on_nats_survives_failover_partition_and_a_host_crash() {
    // SAFETY: geteuid(2) reads a process attribute.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (network namespaces); CI runs as root. Run it with sudo, or skip it with --skip cluster_netns");
    }
    // A namespace a crashed run would leave (its pid, 0, is no process): removed first.
    ip(&["netns", "add", &format!("{PREFIX}0leftover")]);
    remove_leftovers();
    assert!(!Path::new(&format!("/var/run/netns/{PREFIX}0leftover")).exists(), "leftovers removed");
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("cluster.toml"), config()).unwrap();
    common::ok(d, &["up", "--config", "cluster.toml", "--init"]);
    capsule_hosts_are_pinned_not_attested(d);
    // The operator's control key stays in its own directory (0600); the hosts share only its
    // public half.
    {
        use std::os::unix::fs::PermissionsExt;
        let key = d.join("psl-operator/control.key");
        let mode = std::fs::metadata(&key).expect("--init wrote the operator control key").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        assert!(d.join("shared/control.pub").exists() && !d.join("shared/control.key").exists());
        let text = std::fs::read_to_string(&key).unwrap();
        let _ = OPERATOR.set(std::sync::Arc::new(psl_node::control::operator_key_from_text(&text).unwrap()));
    }
    let net = Net::new();
    watchdog(net.tag.clone(), Duration::from_secs(480));

    // Every host's roles, from the one file.
    let mut hosts: Vec<Option<Proc>> = (1..=HOSTS)
        .map(|h| {
            let name = format!("h{h}");
            Some(Proc::start(
                &net.ns(h),
                d,
                &format!("host{h}.log"),
                &["up", "--config", "cluster.toml", "--host", &name],
            ))
        })
        .collect();
    let mut nats_pid = None;
    let mut server_pids = Vec::new();
    let mut kv_pids = Vec::new();
    for (i, p) in hosts.iter().enumerate() {
        let (_, lines) = p.as_ref().unwrap().wait(&format!("up h{}", i + 1), Duration::from_secs(240));
        if i == 0 {
            nats_pid =
                lines.iter().find_map(|l| l.strip_prefix("role nats-server pid ")).map(|p| p.parse::<i32>().unwrap());
        }
        for l in &lines {
            if let Some((id, pid)) = l.strip_prefix("role kv capsule server ").and_then(|r| r.split_once(" pid ")) {
                server_pids.push((format!("h{}", i + 1), id.parse::<u32>().unwrap(), pid.parse::<i32>().unwrap()));
            }
        }
        kv_pids.extend(kv_secret_role_pids(&lines));
    }
    eprintln!("cluster up in {:?}", t0.elapsed());
    capsule_servers_hold_no_kv_secret(d, &server_pids);
    assert_eq!(kv_pids.len(), 5, "two front ends, two KV coordinators and CapsuleDB: {kv_pids:?}");
    kv_roles_get_their_keys_from_the_leader(&kv_pids);
    only_the_leaders_host_holds_kv_secrets(d);
    let (node_a, a) = start_node(&net, d, 4, 101, 7100, &[]);
    let (_node_b, b) = start_node(&net, d, 1, 102, 7100, &[]);
    let (ns_a, ns_b) = (net.ns(4), net.ns(1));

    // Control interfaces. The KV coordinator 0 (host 1) and CapsuleDB (host 2) listen on
    // loopback: another namespace cannot reach them at all.
    let coord0: SocketAddr = format!("{}:7900", Net::addr(1)).parse().unwrap();
    let cdb: SocketAddr = format!("{}:7950", Net::addr(2)).parse().unwrap();
    for (from, at) in [(net.ns(4), coord0), (net.ns(3), cdb)] {
        let r = unsigned(&from, at, "REVOKE 1");
        assert!(r.is_err(), "{at} reachable from {from}: {r:?}");
    }
    // On its own host, an unsigned REVOKE reaches the coordinator (it holds the application
    // key) and is refused; the operator's signed STATS-level commands still work.
    let local0: SocketAddr = "127.0.0.1:7900".parse().unwrap();
    let r = unsigned(&net.ns(1), local0, "REVOKE 1").expect("the coordinator answers on loopback");
    assert!(r.starts_with("ERROR unauthenticated"), "an unsigned REVOKE on loopback: {r}");
    assert!(unsigned(&net.ns(1), local0, "STATS").unwrap().starts_with('{'), "counters need no key");
    // A node whose control port the operator put on a routable address: reachable from
    // another namespace, and an unsigned REVOKE (or PUT) from there is refused.
    for cmd in ["REVOKE 1", "PUT stolen 1"] {
        let r = unsigned(&ns_a, b, cmd).expect("node B's routable control port answers");
        assert!(r.starts_with("ERROR unauthenticated"), "unsigned {cmd} from host 4 to {b}: {r}");
    }

    // A job on the four workers of three hosts.
    let input = d.join("in.txt");
    std::fs::write(&input, "a b a\nc a b\nd\n").unwrap();
    let want = serde_json::json!({"a": 3, "b": 2, "c": 1, "d": 1});
    assert_eq!(run_job(&net, d, &input), want);

    // SecureCached on two front ends (hosts 1 and 3).
    let mc1: SocketAddr = format!("{}:11211", Net::addr(1)).parse().unwrap();
    let mc2: SocketAddr = format!("{}:11212", Net::addr(3)).parse().unwrap();
    let set_many = |ns: String, at: SocketAddr, tag: &'static str| {
        in_ns(&ns, move || {
            let mut c = common::mc::Client::connect(at);
            // The front ends run with the cluster file's tuning.
            assert_eq!(c.stat("psl_flow_window_records"), 512);
            for i in 0..50 {
                assert_eq!(c.set(&format!("mc-{tag}-{i}"), i, format!("{tag}{i}").as_bytes()), "STORED");
            }
        })
    };
    set_many(net.ns(1), mc1, "one");
    set_many(net.ns(3), mc2, "two");

    let mut acked: Vec<(String, String)> = Vec::new();
    acked.extend(durable_round(&ns_a, a, "r0a", 20).expect("durable before faults"));
    acked.extend(durable_round(&ns_b, b, "r0b", 20).expect("durable before faults"));

    // 1. kill -9 the NATS server of host 1: its clients fail over to hosts 2 and 3.
    let pid = nats_pid.expect("host 1 printed its nats-server pid");
    // SAFETY: kill(2) on the pid `psl up` printed for its nats-server child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let r = until("writes durable after the NATS failover", Duration::from_secs(60), || {
        durable_round(&ns_b, b, &format!("r1b-{}", rand_tag()), 10)
    });
    acked.extend(r);
    let h1_log = d.join("host1.log");
    until("host 1 noticed its nats-server died", Duration::from_secs(10), || {
        std::fs::read_to_string(&h1_log).unwrap_or_default().contains("nats-server exited").then_some(())
    });
    acked.extend(durable_round(&ns_a, a, "r1a", 10).expect("durable after failover"));
    set_many(net.ns(1), mc1, "three");

    // 2. Partition host 4 (node A, two workers), write elsewhere meanwhile, heal.
    net.link(4, false);
    acked.extend(durable_round(&ns_b, b, "r2b", 20).expect("durable while host 4 is cut off"));
    assert!(durable_within(&ns_a, a, "cut", 1, 2000).is_none(), "host 4 is really cut off: no acks reach node A");
    std::thread::sleep(Duration::from_secs(3));
    net.link(4, true);
    let r = until("node A durable again after the heal", Duration::from_secs(60), || {
        durable_round(&ns_a, a, &format!("r2a-{}", rand_tag()), 10)
    });
    acked.extend(r);

    // 3. kill -9 everything on host 3 (capsule servers 2 of both capsules, a NATS server, a
    // worker, a front end); f = 1 keeps writes durable; then the host comes back.
    hosts[2] = None;
    kill_ns(&net.ns(3));
    // A man in the middle at capsule host 2's address (host 3's) while it is down: a job still
    // runs (on capsule hosts 0 and 1) and the impostor gets no key, not even a handshake.
    {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mitm = impostor(net.ns(3), format!("{}:7602", Net::addr(3)).parse().unwrap(), stop.clone());
        assert_eq!(run_job(&net, d, &input), want);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let seen = mitm.join().unwrap();
        assert!(seen.connections >= 1, "the leader tried capsule host 2's address: {seen:?}");
        assert_eq!((seen.handshakes, seen.msgs.len()), (0, 0), "the impostor got nothing: {seen:?}");
    }
    acked.extend(durable_round(&ns_a, a, "r3a", 20).expect("durable with host 3 down"));
    acked.extend(durable_round(&ns_b, b, "r3b", 20).expect("durable with host 3 down"));
    let h3 = Proc::start(&net.ns(3), d, "host3-again.log", &["up", "--config", "cluster.toml", "--host", "h3"]);
    let (_, lines) = h3.wait("up h3", Duration::from_secs(240));
    hosts[2] = Some(h3);
    // The restarted front end 2 attested again and got its keys back from the leader (it
    // serves: its ready line came); nothing of them was left on host 3's disk.
    let again = kv_secret_role_pids(&lines);
    assert!(again.iter().any(|(what, _)| what == "memcached 2"), "{lines:?}");
    kv_roles_get_their_keys_from_the_leader(&again);
    only_the_leaders_host_holds_kv_secrets(d);
    acked.extend(durable_round(&ns_a, a, "r4a", 10).expect("durable after host 3 is back"));

    // Every node converges: the same digest on both nodes.
    let digests = until("every node converges", Duration::from_secs(90), || {
        let d =
            [control(&ns_a, a, vec!["DIGEST".into()]).remove(0), control(&ns_b, b, vec!["DIGEST".into()]).remove(0)];
        (d[0] == d[1]).then_some(d)
    });
    eprintln!("converged: {}", digests[0]);

    // Every durably acknowledged write is on the capsule servers: a node rebuilt from them
    // alone (no peer) holds each.
    let reads = (1..=3).map(|h| format!("{}:{}", Net::addr(h), 7799 + h)).collect::<Vec<_>>().join(",");
    let (_node_c, c) = start_node(&net, d, 2, 103, 7100, &["--recover-from", &reads]);
    let gets: Vec<String> = acked.iter().map(|(k, _)| format!("GET {k}")).collect();
    let got = control(&net.ns(2), c, gets);
    for ((k, v), g) in acked.iter().zip(&got) {
        assert_eq!(g, &format!("VALUE {v}"), "durably acknowledged {k} lost");
    }
    eprintln!("{} durably acknowledged writes present", acked.len());

    // The front ends agree on every item (front end 2 restarted empty: it reads through CapsuleDB).
    let read_all = |ns: String, at: SocketAddr| {
        in_ns(&ns, move || {
            let mut c = common::mc::Client::connect(at);
            let mut v = Vec::new();
            for tag in ["one", "two", "three"] {
                for i in 0..50 {
                    v.push(c.gets(&format!("mc-{tag}-{i}")).map(|(d, f, _)| (d, f)));
                }
            }
            v
        })
    };
    until("the memcached front ends agree", Duration::from_secs(60), || {
        let (x, y) = (read_all(net.ns(1), mc1), read_all(net.ns(3), mc2));
        (x == y && x.iter().all(|e| e.is_some())).then_some(())
    });

    // A job after all that: still correct.
    assert_eq!(run_job(&net, d, &input), want);

    // psl status sees every role up but the NATS server killed on host 1 (nothing restarts it).
    let status = until("psl status: every role up but one", Duration::from_secs(60), || {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.ns(1),
                env!("CARGO_BIN_EXE_psl"),
                "status",
                "--config",
                "cluster.toml",
                "--json",
            ])
            .current_dir(d)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        (v["down"] == 1).then_some(v)
    });
    let roles = status["roles"].as_array().unwrap();
    let down: Vec<&serde_json::Value> = roles.iter().filter(|r| r["health"] == "down").collect();
    assert_eq!((down[0]["host"].as_str(), down[0]["role"].as_str()), (Some("h1"), Some("nats-server")), "{status}");
    assert!(roles.iter().any(|r| r["role"] == "nats-server" && r["detail"]["routes"].as_u64() >= Some(1)));
    assert!(roles.iter().filter(|r| r["role"].as_str().unwrap().starts_with("kv-server")).count() == 3);
    // Host 1's own coordinator is probed on loopback; host 2's control interfaces are not
    // reachable from host 1, by design.
    let health = |role: &str| roles.iter().find(|r| r["role"] == role).map(|r| r["health"].clone());
    assert_eq!(health("kv-coordinator 0"), Some("ok".into()), "{status}");
    assert_eq!(health("kv-coordinator 1"), Some("local".into()), "{status}");
    assert_eq!(health("capsuledb"), Some("local".into()), "{status}");
    drop(node_a);
    eprintln!("cluster test done in {:?}", t0.elapsed());
}

/// The KV capsule's secrets as an attacker on a capsule server's host would grep for them: the
/// owner key (which `--init` keeps in the operator's directory), the application key and the
/// data key, raw and in hex.
fn kv_secrets(d: &Path) -> Vec<(String, Vec<u8>)> {
    // Wherever `--init` put it (the attack is finding it where a host can read it).
    let at = [d.join("psl-operator/kv-owner.key"), d.join("shared/kv-owner.key")].into_iter().find(|p| p.exists());
    let text = std::fs::read_to_string(at.expect("--init made the KV owner key")).unwrap();
    let owner = psl_crypto::OwnerKey::from_file_string(&text).unwrap();
    let meta = psl_capsule::CapsuleFile::parse(&std::fs::read(d.join("shared/kv.capsule")).unwrap()).unwrap().metadata;
    let app = owner.app(meta.meta.app_index).unwrap();
    let mut v = Vec::new();
    let owner_raw = hex::decode(text.lines().nth(1).unwrap().trim()).unwrap();
    let data = app.data_key().expose_bytes().to_vec();
    let app_raw = app.signing_key().expose_secret_bytes().to_vec();
    for (what, raw) in [("owner key", owner_raw), ("data key", data), ("application key", app_raw)] {
        v.push((format!("{what} (hex)"), hex::encode(&raw).into_bytes()));
        v.push((format!("{what} (HEX)"), hex::encode_upper(&raw).into_bytes()));
        v.push((format!("{what} (raw)"), raw));
    }
    v
}

fn files_under(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap().map_while(Result::ok) {
            files_under(&e.path(), out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}

/// Every KV capsule server as an attacker who owns its process sees it: its command line and
/// environment, every file its command line names (its store directory included) and the
/// shared directory hold neither the owner key nor the application or data key, and its
/// command line passes no `--owner`; the only secret it is given is its own ack key, from its
/// own host's directory.
fn capsule_servers_hold_no_kv_secret(d: &Path, pids: &[(String, u32, i32)]) {
    assert_eq!(pids.len(), 3, "every host printed its capsule server's pid: {pids:?}");
    let secrets = kv_secrets(d);
    let check = |what: &str, bytes: &[u8]| {
        for (s, n) in &secrets {
            assert!(!bytes.windows(n.len()).any(|w| w == &n[..]), "{what} holds the KV {s}");
        }
    };
    for (host, id, pid) in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the capsule server runs");
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into()).collect();
        let what = format!("capsule server {id} on {host} (pid {pid}: {args:?})");
        assert!(args.iter().any(|a| a == "capsule-server"), "{what}");
        assert!(!args.iter().any(|a| a == "--owner" || a.contains("owner")), "{what} is given the owner key");
        check(&format!("the command line of {what}"), &cmdline);
        check(&format!("the environment of {what}"), &std::fs::read(format!("/proc/{pid}/environ")).unwrap());
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
        let ack = args.iter().position(|a| a == "--ack-key").map(|i| std::fs::canonicalize(cwd.join(&args[i + 1])));
        let mine = std::fs::canonicalize(d.join(format!("state/{host}/kv-server{id}.ack-key"))).ok();
        assert_eq!(ack.map(Result::ok), Some(mine), "{what}: its own ack key");
        let mut named = Vec::new();
        // Every file it is given (not its own executable, args[0]).
        for a in &args[1..] {
            let p = cwd.join(a);
            if a.contains('/') && p.exists() {
                files_under(&p, &mut named);
            }
        }
        assert!(named.len() >= 3, "{what}: the files it was given: {named:?}");
        for f in &named {
            check(&format!("{} (given to {what})", f.display()), &std::fs::read(f).unwrap());
        }
    }
    let mut shared = Vec::new();
    files_under(&d.join("shared"), &mut shared);
    for f in &shared {
        check(&f.display().to_string(), &std::fs::read(f).unwrap());
    }
    assert!(d.join("psl-operator/kv-owner.key").exists(), "the owner key stays in the operator's directory");
}

/// The KV roles that need the capsule's secrets (front ends, KV coordinators, CapsuleDB), by
/// the `role NAME pid N` lines of `psl up --host`.
fn kv_secret_role_pids(lines: &[String]) -> Vec<(String, i32)> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("role ")?.split_once(" pid "))
        .filter(|(what, _)| {
            what.starts_with("memcached") || what.starts_with("kv coordinator") || *what == "kv capsuledb"
        })
        .map(|(what, pid)| (what.to_string(), pid.parse().unwrap()))
        .collect()
}

/// Each such role is told the leader, not given a key file: no `--owner` on its command line.
fn kv_roles_get_their_keys_from_the_leader(pids: &[(String, i32)]) {
    for (what, pid) in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the KV role runs");
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into()).collect();
        assert!(args.iter().any(|a| a == "--kv-leader"), "{what} (pid {pid}) does not ask the leader: {args:?}");
        assert!(!args.iter().any(|a| a == "--owner" || a.contains("owner")), "{what} is given the owner key: {args:?}");
    }
}

/// The attacker who owns a host's disk: no file under any host's directory holds the owner,
/// application or data key of the KV capsule, but the leader's host's (h1) copy of the owner
/// key, for `psl leader --kv-owner`.
fn only_the_leaders_host_holds_kv_secrets(d: &Path) {
    let secrets = kv_secrets(d);
    let leader_copy = d.join("state/h1/kv-owner.key");
    assert!(leader_copy.exists(), "the leader's host holds the owner key");
    let mut files = Vec::new();
    files_under(&d.join("state"), &mut files);
    assert!(files.len() > 20, "the hosts' directories: {files:?}");
    for f in files.iter().filter(|f| **f != leader_copy) {
        let Ok(bytes) = std::fs::read(f) else { continue };
        for (s, n) in &secrets {
            assert!(!bytes.windows(n.len()).any(|w| w == &n[..]), "{} holds the KV {s}", f.display());
        }
    }
    for h in ["h2", "h3", "h4"] {
        assert!(!d.join(format!("state/{h}/kv-owner.key")).exists(), "host {h} has an owner key copy");
    }
}

/// After `--init`: each capsule host's TLS key is in its own host's directory only (0600), its
/// pin in the shared one; and the policy is made not to attest capsule hosts, so that their
/// pinned keys alone authenticate them (what the impostor step checks).
fn capsule_hosts_are_pinned_not_attested(d: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for (host, id) in [("h1", 0), ("h2", 1), ("h3", 2)] {
        let key = d.join(format!("state/{host}/capsule-host{id}.tls-key"));
        let mode = std::fs::metadata(&key).expect("--init made the host's TLS key").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        let pin = std::fs::read_to_string(d.join(format!("shared/capsule-host{id}.tls-pin"))).unwrap();
        assert_eq!(pin.trim().len(), 64, "{pin}");
        assert!(!d.join(format!("shared/capsule-host{id}.tls-key")).exists());
    }
    let p = d.join("shared/attest-policy.toml");
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains("require_attestation = true"), "{text}");
    std::fs::write(&p, text.replace("require_attestation = true", "require_attestation = false")).unwrap();
}

#[derive(Debug, Default)]
struct Seen {
    connections: usize,
    handshakes: usize,
    msgs: Vec<String>,
}

/// A man in the middle listening at `addr` in namespace `ns` until `stop`: it answers TLS
/// with its own key and records every message that reaches it.
fn impostor(
    ns: String,
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let fd = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("namespace file");
        // SAFETY: setns(2) on a descriptor this thread holds open; it moves only this thread.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
        let me = psl_faas::tls::TlsIdentity::generate("psl-capsule-host").unwrap();
        let cfg = me.server_config(false).unwrap();
        let l = std::net::TcpListener::bind(addr).expect("the impostor binds the capsule host's address");
        l.set_nonblocking(true).unwrap();
        let mut seen = Seen::default();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let Ok((tcp, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            seen.connections += 1;
            tcp.set_nonblocking(false).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let Ok((mut s, _)) = psl_faas::tls::accept(tcp, cfg.clone()) else { continue };
            seen.handshakes += 1;
            while let Ok(m) = psl_faas::net::wire::read_msg(&mut s) {
                seen.msgs.push(m.name().to_string());
            }
        }
        seen
    })
}

fn rand_tag() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
}
