//! Supervised child processes of `psl up` and `psl up --config` (a cluster host): spawned
//! with a parent-death signal, their ready lines read, stopped together (SIGTERM, then SIGKILL
//! after 3 s); Ctrl-C and SIGTERM set `STOP`; and the fabric flags every child role gets.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The `--fabric URL` and NATS flags every child role gets.
pub(crate) fn fabric_flags(spec: &psl_fabric::FabricSpec) -> Vec<String> {
    let mut v = vec!["--fabric".to_string(), spec.url.to_string()];
    if let Some(c) = &spec.nats_creds {
        v.extend(["--nats-creds".into(), c.display().to_string()]);
    }
    if let Some(c) = &spec.nats_tls_ca {
        v.extend(["--nats-tls-ca".into(), c.display().to_string()]);
    }
    if spec.nats_prefix != psl_fabric::subject::SUBJECT_PREFIX_DEFAULT {
        v.extend(["--nats-prefix".into(), spec.nats_prefix.clone()]);
    }
    v
}

pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM set [`STOP`].
pub(crate) fn catch_signals() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// A child process of this one (`gone`: already reaped).
pub(crate) struct Kid {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) gone: bool,
}

/// The roles that serve `--metrics` (every long-running `psl` role).
const METRICS_ROLES: [&str; 11] = [
    "node",
    "coordinator",
    "router",
    "leader",
    "scheduler",
    "worker",
    "capsule-host",
    "coordinator-host",
    "capsule-server",
    "memcached",
    "capsuledb",
];

/// Where the roles [`spawn`] starts serve their metrics (`None`: they do not), and the scrape
/// URL of each by child name.
static METRICS: std::sync::Mutex<(Option<std::net::IpAddr>, BTreeMap<String, String>)> =
    std::sync::Mutex::new((None, BTreeMap::new()));

/// Every role [`spawn`] starts from now on serves its Prometheus metrics on a free port of
/// `ip` (`--metrics`); [`metrics_urls`] says where.
pub(crate) fn serve_metrics_on(ip: std::net::IpAddr) {
    METRICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0 = Some(ip);
}

/// The scrape URL of each role started with `--metrics`, by child name (the newest start of a
/// restarted child).
pub(crate) fn metrics_urls() -> BTreeMap<String, String> {
    METRICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1.clone()
}

/// Spawns `psl ARGS`; the child gets SIGTERM if this process dies (even by SIGKILL). A
/// long-running role gets `--metrics` when [`serve_metrics_on`] was called.
pub(crate) fn spawn(name: &str, args: &[String]) -> Result<(Kid, std::sync::mpsc::Receiver<String>)> {
    let exe = std::env::current_exe().context("finding the psl binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(args);
    let ip = METRICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0;
    if let (Some(ip), Some(role)) = (ip, args.first()) {
        if METRICS_ROLES.contains(&role.as_str()) && !args.iter().any(|x| x == "--metrics") {
            let addr = psl_fabric::natsd::free_port(ip).with_context(|| format!("a free metrics port for {name}"))?;
            cmd.args(["--metrics".to_string(), addr.to_string()]);
            let reach = if ip.is_unspecified() {
                std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
            } else {
                addr
            };
            let mut m = METRICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            m.1.insert(name.to_string(), format!("http://{reach}/metrics"));
        }
    }
    spawn_cmd(name, cmd)
}

/// Has the child `cmd` starts get `signal` when this process dies, even by SIGKILL
/// (`PR_SET_PDEATHSIG`).
pub fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which
    // is async-signal-safe; it touches no memory of the parent and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Spawns `cmd` (stdout piped to the returned receiver line by line, stderr inherited); the
/// child gets SIGTERM if this process dies (even by SIGKILL).
pub(crate) fn spawn_cmd(name: &str, mut cmd: Command) -> Result<(Kid, std::sync::mpsc::Receiver<String>)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    die_with_parent(&mut cmd, libc::SIGTERM);
    let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
    let out = child.stdout.take().context("child stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Ok((Kid { name: name.into(), child, gone: false }, rx))
}

pub(crate) fn wait_line(
    kid: &str,
    rx: &std::sync::mpsc::Receiver<String>,
    prefix: &str,
    deadline: Instant,
) -> Result<String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                if let Some(rest) = l.strip_prefix(prefix) {
                    return Ok(rest.trim().to_string());
                }
            }
            Err(_) => bail!("{kid} did not report ready (line '{prefix}...') in time"),
        }
    }
}

pub(crate) fn stop_all(kids: &mut [Kid]) {
    for k in kids.iter().filter(|k| !k.gone) {
        // SAFETY: kill(2) with a pid of our own child (not yet reaped, so not reused).
        unsafe {
            libc::kill(k.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    for k in kids.iter_mut().filter(|k| !k.gone) {
        loop {
            match k.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    tracing::warn!("{} did not stop on SIGTERM; killing it", k.name);
                    let _ = k.child.kill();
                    let _ = k.child.wait();
                    break;
                }
            }
        }
    }
}
