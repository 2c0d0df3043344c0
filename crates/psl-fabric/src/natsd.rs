//! [`NatsServer`]: a local `nats-server` process (Debian's `nats-server` package), started with
//! a generated configuration and stopped when dropped. `psl up --fabric nats`, `psl bench
//! fabric` and the tests use it; production deployments run NATS as their operators do.
//!
//! The configuration raises `max_payload` to the fabric's frame limit (a record may be up to
//! 8 MiB; NATS defaults to 1 MiB) and sets a write deadline, so a stalled client is cut as a
//! slow consumer instead of holding the server's memory.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::FRAME_BYTES_MAX_DEFAULT;

/// How to start one server.
#[derive(Debug, Clone)]
pub struct NatsServerOptions {
    /// The `nats-server` binary (default: `nats-server` on the PATH).
    pub binary: PathBuf,
    /// Server name (unique in a cluster).
    pub name: String,
    /// Client address.
    pub listen: SocketAddr,
    /// Client URLs advertised to clients of the cluster (default: what the server sees).
    pub client_advertise: Option<String>,
    /// Cluster (routes) address; `None` for a lone server.
    pub cluster_listen: Option<SocketAddr>,
    /// Cluster URL advertised to the other servers (default: what they see).
    pub cluster_advertise: Option<String>,
    /// Routes to the other servers of the cluster (`nats-route://HOST:PORT`).
    pub routes: Vec<String>,
    /// Where leaf nodes (edge sites) connect, on a cluster member.
    pub leaf_listen: Option<SocketAddr>,
    /// Leaf node links of an edge site's server (`nats-leaf://HOST:PORT` of cluster members).
    pub leaf_remotes: Vec<String>,
    /// HTTP monitoring address (`/varz`, `/connz`: `psl status` reads them).
    pub monitor: Option<SocketAddr>,
    /// Largest message (default: the fabric's frame limit, 16 MiB).
    pub max_payload: usize,
    /// Where the configuration and log files go.
    pub dir: PathBuf,
}

impl NatsServerOptions {
    /// A lone server on `listen`, files in `dir`.
    pub fn new(name: &str, listen: SocketAddr, dir: &Path) -> NatsServerOptions {
        NatsServerOptions {
            binary: "nats-server".into(),
            name: name.into(),
            listen,
            client_advertise: None,
            cluster_listen: None,
            cluster_advertise: None,
            routes: Vec::new(),
            leaf_listen: None,
            leaf_remotes: Vec::new(),
            monitor: None,
            max_payload: FRAME_BYTES_MAX_DEFAULT,
            dir: dir.to_path_buf(),
        }
    }

    /// The configuration file's text.
    pub fn config_text(&self) -> String {
        let mut c = format!(
            "server_name: {}\nlisten: \"{}\"\nmax_payload: {}\nmax_pending: {}\nwrite_deadline: \"5s\"\nping_interval: \"2s\"\nping_max: 2\n",
            self.name,
            self.listen,
            self.max_payload,
            (4 * self.max_payload).max(64 << 20),
        );
        if let Some(a) = &self.client_advertise {
            c.push_str(&format!("client_advertise: \"{a}\"\n"));
        }
        if let Some(m) = self.monitor {
            c.push_str(&format!("http: \"{m}\"\n"));
        }
        if let Some(cl) = self.cluster_listen {
            let routes: Vec<String> = self.routes.iter().map(|r| format!("\"{r}\"")).collect();
            let adv = self.cluster_advertise.as_ref().map(|a| format!("  advertise: \"{a}\"\n")).unwrap_or_default();
            c.push_str(&format!(
                "cluster {{\n  name: psl\n  listen: \"{cl}\"\n{adv}  routes: [{}]\n  connect_retries: 120\n}}\n",
                routes.join(", ")
            ));
        }
        if self.leaf_listen.is_some() || !self.leaf_remotes.is_empty() {
            c.push_str("leafnodes {\n");
            if let Some(l) = self.leaf_listen {
                c.push_str(&format!("  listen: \"{l}\"\n"));
            }
            if !self.leaf_remotes.is_empty() {
                let urls: Vec<String> = self.leaf_remotes.iter().map(|r| format!("\"{r}\"")).collect();
                c.push_str(&format!("  remotes: [ {{ urls: [{}] }} ]\n", urls.join(", ")));
            }
            c.push_str("}\n");
        }
        c
    }

    /// The command that runs the server (the configuration file written to `dir`).
    pub fn command(&self) -> std::io::Result<Command> {
        std::fs::create_dir_all(&self.dir)?;
        let conf = self.dir.join(format!("{}.conf", self.name));
        std::fs::write(&conf, self.config_text())?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("-c").arg(&conf);
        Ok(cmd)
    }
}

/// A running `nats-server`; killed (SIGKILL) and reaped when dropped.
pub struct NatsServer {
    child: Option<Child>,
    addr: SocketAddr,
    name: String,
    log: PathBuf,
}

impl NatsServer {
    /// Starts the server and waits (at most `timeout`) until it answers with its INFO line.
    pub fn start(opts: &NatsServerOptions, timeout: Duration) -> std::io::Result<NatsServer> {
        let log = opts.dir.join(format!("{}.log", opts.name));
        let mut cmd = opts.command()?;
        let logf = std::fs::File::create(&log)?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(logf);
        let child = cmd.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("starting {} ({e}); install it with scripts/install-nats-test-deps.sh", opts.binary.display()),
            )
        })?;
        let mut s = NatsServer { child: Some(child), addr: opts.listen, name: opts.name.clone(), log };
        s.wait_ready(timeout)?;
        Ok(s)
    }

    fn wait_ready(&mut self, timeout: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = &mut self.child {
                if let Some(st) = c.try_wait()? {
                    return Err(std::io::Error::other(format!(
                        "nats-server {} exited ({st}): {}",
                        self.name,
                        self.log_tail()
                    )));
                }
            }
            if answers_info(self.addr) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "nats-server {} did not answer on {} in {timeout:?}: {}",
                        self.name,
                        self.addr,
                        self.log_tail()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join(" | ")
    }

    /// The client URL (`nats://ADDR`).
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// The client address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id; `None` once it was killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the server at once (SIGKILL: no goodbye to its clients or routes).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True if a NATS server at `addr` sends its `INFO` line.
pub fn answers_info(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut line = String::new();
    let mut reader = BufReader::new((&mut s).take(64 << 10));
    reader.read_line(&mut line).is_ok() && line.starts_with("INFO ")
}

/// A free TCP port on `ip` (bound, then released, for a process started a moment later).
///
/// Drawn at random *below* the kernel's ephemeral range (`ip_local_port_range`, 32768 by
/// default), from 10000 up: a port the kernel hands out for `bind(:0)` is also what it picks as
/// the local port of outgoing connections, so between the release and the child's own bind an
/// unrelated connection could take it (`Address already in use`; `psl chaos` hit this).
///
/// Drawn from a block of [`PORT_BLOCK`] ports that this process holds for its whole life
/// (see `PortBlocks`): a port a child releases while it is down (a crashed node before its
/// restart) must not be drawn by another process meanwhile (two `psl chaos` runs side by side
/// hit this too). A port is handed out at most once per process (two draws must not name the
/// same port for two children that have not bound yet). Falls back to a kernel-chosen port if
/// no block can be held or every port of the blocks held is taken.
pub fn free_port(ip: std::net::IpAddr) -> std::io::Result<SocketAddr> {
    static BLOCKS: std::sync::Mutex<Option<PortBlocks>> = std::sync::Mutex::new(None);
    let mut blocks = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    let blocks = blocks.get_or_insert_with(|| PortBlocks::new(ephemeral_low()));
    if let Some(a) = blocks.draw(ip) {
        return Ok(a);
    }
    std::net::TcpListener::bind(SocketAddr::new(ip, 0))?.local_addr()
}

/// Ports in one block that [`free_port`] holds for a process.
pub const PORT_BLOCK: u16 = 256;

/// The port blocks one process holds, below the ephemeral range from port 10000 on. A block is
/// held by an exclusive `flock` on `psl-port-blocks/<first port>` in the temporary directory,
/// which the kernel drops when the process ends (however it ends), so processes on one machine
/// draw from disjoint blocks.
struct PortBlocks {
    low: u16,
    /// The lock files of the blocks held (kept open: closing one releases its lock), with the
    /// first port of each.
    held: Vec<(std::fs::File, u16)>,
    /// Ports handed out so far.
    given: std::collections::BTreeSet<u16>,
}

impl PortBlocks {
    fn new(ephemeral_low: u16) -> PortBlocks {
        PortBlocks {
            low: ephemeral_low.clamp(10_000 + PORT_BLOCK, 65_535),
            held: Vec::new(),
            given: Default::default(),
        }
    }

    /// A free port from a block held, holding one more block when those are used up.
    fn draw(&mut self, ip: std::net::IpAddr) -> Option<SocketAddr> {
        use rand::Rng;
        let mut rng = rand::rng();
        for _ in 0..4 {
            for &(_, first) in &self.held {
                for _ in 0..64 {
                    let port = first + rng.random_range(0..PORT_BLOCK);
                    if self.given.contains(&port) {
                        continue;
                    }
                    if let Ok(l) = std::net::TcpListener::bind(SocketAddr::new(ip, port)) {
                        self.given.insert(port);
                        return l.local_addr().ok();
                    }
                }
            }
            self.hold_another()?;
        }
        None
    }

    /// Holds one more block (a random free one); `None` if none can be held.
    fn hold_another(&mut self) -> Option<()> {
        use rand::Rng;
        let dir = std::env::temp_dir().join("psl-port-blocks");
        std::fs::create_dir_all(&dir).ok()?;
        let blocks = (self.low - 10_000) / PORT_BLOCK;
        let mut rng = rand::rng();
        for _ in 0..64 {
            let first = 10_000 + rng.random_range(0..blocks) * PORT_BLOCK;
            if self.held.iter().any(|(_, f)| *f == first) {
                continue;
            }
            let Ok(f) =
                std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(first.to_string()))
            else {
                continue;
            };
            if f.try_lock().is_ok() {
                self.held.push((f, first));
                return Some(());
            }
        }
        None
    }
}

/// The first port of the kernel's ephemeral range (32768 where it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two holders (two processes: `flock` locks of two open files conflict even within one
    /// process) draw from disjoint blocks, so a port one releases is never the other's.
    #[test]
    fn two_holders_draw_ports_from_disjoint_blocks() {
        let low = ephemeral_low();
        let (mut a, mut b) = (PortBlocks::new(low), PortBlocks::new(low));
        let ip = "127.0.0.1".parse().unwrap();
        let pa: Vec<u16> = (0..40).map(|_| a.draw(ip).unwrap().port()).collect();
        let pb: Vec<u16> = (0..40).map(|_| b.draw(ip).unwrap().port()).collect();
        let firsts = |h: &PortBlocks| h.held.iter().map(|(_, f)| *f).collect::<Vec<_>>();
        let (fa, fb) = (firsts(&a), firsts(&b));
        assert!(!fa.is_empty() && !fb.is_empty());
        assert!(fa.iter().all(|f| !fb.contains(f)), "blocks {fa:?} and {fb:?} overlap");
        let inside = |p: &u16, fs: &[u16]| fs.iter().any(|f| (*f..*f + PORT_BLOCK).contains(p));
        assert!(pa.iter().all(|p| inside(p, &fa) && !inside(p, &fb)));
        assert!(pb.iter().all(|p| inside(p, &fb) && !inside(p, &fa)));
        // Once dropped, a block can be held again.
        drop(a);
        let mut c = PortBlocks::new(low);
        assert!(c.draw(ip).is_some());
    }

    #[test]
    fn free_ports_come_from_below_the_ephemeral_range() {
        let low = ephemeral_low();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let a = free_port("127.0.0.1".parse().unwrap()).unwrap();
            assert!(a.port() >= 10_000 && (a.port() < low || low <= 10_001), "{a} (ephemeral from {low})");
            assert!(seen.insert(a.port()), "{a} handed out twice");
        }
    }

    #[test]
    fn the_config_names_the_cluster_and_limits() {
        let mut o = NatsServerOptions::new("n1", "127.0.0.1:4222".parse().unwrap(), Path::new("/tmp"));
        o.cluster_listen = Some("127.0.0.1:6222".parse().unwrap());
        o.routes = vec!["nats-route://127.0.0.1:6223".into()];
        let t = o.config_text();
        assert!(t.contains("max_payload: 16777216"), "{t}");
        assert!(t.contains("routes: [\"nats-route://127.0.0.1:6223\"]"), "{t}");
        assert!(t.contains("server_name: n1"));
    }
}
