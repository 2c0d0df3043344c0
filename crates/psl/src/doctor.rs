//! `psl doctor`: what this machine offers PSL and what it lacks, one `PASS`/`WARN`/`FAIL` line
//! per check, each WARN and FAIL with its fix. Exit status 0 unless a check FAILs.
//!
//! Every decision is a pure function over what was observed (paths present, a limit, a byte
//! count, a command's answer), so the unit tests below cover PASS, WARN and FAIL without the
//! machine; [`observe`] does the looking.

use anyhow::Result;
use clap::Args;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Where stores would live (free disk space is measured here).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// One JSON object: `{"ok": bool, "checks": [{"status", "check", "detail", "fix"}]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub status: Status,
    /// A short name: `attestation`, `nats-server`, `fd-limit`, ...
    pub name: &'static str,
    pub detail: String,
    /// What to do about a WARN or FAIL (empty for PASS).
    pub fix: String,
}

impl Check {
    fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check { status: Status::Pass, name, detail: detail.into(), fix: String::new() }
    }
    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { status: Status::Warn, name, detail: detail.into(), fix: fix.into() }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { status: Status::Fail, name, detail: detail.into(), fix: fix.into() }
    }

    /// `STATUS name: detail` and, for WARN and FAIL, `; fix: ...`.
    pub fn line(&self) -> String {
        let mut s = format!("{} {}: {}", self.status.as_str(), self.name, self.detail);
        if !self.fix.is_empty() {
            s.push_str("; fix: ");
            s.push_str(&self.fix);
        }
        s
    }
}

/// What the attestation interfaces on this machine look like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttestSeen {
    /// configfs-tsm's report directory exists (TDX or SEV-SNP guests, Linux 6.7+).
    pub tsm_report: bool,
    /// Gramine's `/dev/attestation/attestation_type` exists (inside a Gramine enclave).
    pub gramine: bool,
    /// SGX device nodes present (`/dev/sgx_enclave`, `/dev/sgx/enclave`, ...).
    pub sgx_nodes: Vec<String>,
}

pub const TSM_REPORT: &str = "/sys/kernel/config/tsm/report";
const SGX_NODES: [&str; 4] = ["/dev/sgx_enclave", "/dev/sgx_provision", "/dev/sgx/enclave", "/dev/isgx"];

/// PASS for each hardware backend found; one WARN when there is none (only the INSECURE sim
/// backend can attest), and one when SGX is there but psl does not run inside Gramine.
pub fn attestation_checks(seen: &AttestSeen) -> Vec<Check> {
    let mut out = Vec::new();
    if seen.tsm_report {
        out.push(Check::pass(
            "attestation",
            format!("configfs-tsm at {TSM_REPORT}: TDX or SEV-SNP reports (--attest tdx|snp|auto)"),
        ));
    }
    if seen.gramine {
        out.push(Check::pass("attestation", "Gramine's /dev/attestation: SGX quotes (--attest sgx|auto)"));
    }
    if !seen.sgx_nodes.is_empty() && !seen.gramine {
        out.push(Check::warn(
            "attestation",
            format!("SGX device nodes ({}) but psl does not run inside Gramine", seen.sgx_nodes.join(", ")),
            "run psl under gramine-sgx with the manifest in deploy/gramine/ to attest with SGX",
        ));
    }
    if !seen.tsm_report && !seen.gramine && seen.sgx_nodes.is_empty() {
        out.push(Check::warn(
            "attestation",
            format!(
                "no TEE interface (no configfs-tsm {TSM_REPORT}, no Gramine /dev/attestation, no SGX device): \
                 only the INSECURE sim backend can attest here (fine for development)"
            ),
            "for production run psl in a TDX or SEV-SNP VM (Linux 6.7+, configfs mounted: mount -t configfs none \
             /sys/kernel/config) or under Gramine on SGX; see docs/security/attestation.md",
        ));
    }
    out
}

/// A program on PATH: PASS with where it is, else WARN with how to install it.
pub fn program_check(name: &'static str, found: Option<&Path>, what_for: &str, fix: &str) -> Check {
    match found {
        Some(p) => Check::pass(name, format!("{} ({what_for})", p.display())),
        None => Check::warn(name, format!("not on PATH (needed for {what_for})"), fix),
    }
}

/// `psl-tools` beside this binary: `psl bench`, `psl report` and `psl chaos` run it (WARN if
/// missing: the roles do not need it).
pub fn tools_check(found: Result<&std::path::PathBuf, String>) -> Check {
    match found {
        Ok(p) => Check::pass("psl-tools", format!("{} (psl bench, psl report, psl chaos)", p.display())),
        Err(e) => Check::warn(
            "psl-tools",
            format!("psl bench, psl report and psl chaos will not run: {e}"),
            "cargo build --release -p psl-tools, and put target/release/psl-tools beside psl",
        ),
    }
}

/// Loopback: binding 127.0.0.1:0 must work (FAIL otherwise); each default port in use is a WARN.
pub fn loopback_checks(ephemeral: Result<(), String>, ports: &[(u16, &str, bool)]) -> Vec<Check> {
    let mut out = Vec::new();
    match ephemeral {
        Ok(()) => out.push(Check::pass("loopback", "127.0.0.1 accepts listeners on free ports")),
        Err(e) => out.push(Check::fail(
            "loopback",
            format!("cannot listen on 127.0.0.1:0: {e}"),
            "bring the loopback interface up (ip link set lo up) and allow listening sockets",
        )),
    }
    let busy: Vec<String> =
        ports.iter().filter(|(_, _, free)| !free).map(|(p, what, _)| format!("{p} ({what})")).collect();
    let all: Vec<String> = ports.iter().map(|(p, _, _)| p.to_string()).collect();
    if busy.is_empty() {
        out.push(Check::pass("ports", format!("the default ports are free: {}", all.join(", "))));
    } else {
        out.push(Check::warn(
            "ports",
            format!("in use on 127.0.0.1: {}", busy.join(", ")),
            "stop what holds them (ss -ltnp shows it) or give the roles other ports (--listen, --router, \
             --control, [ports] in a cluster file); psl up picks free ports itself",
        ));
    }
    out
}

pub const FD_WARN_BELOW: u64 = 4096;
pub const FD_FAIL_BELOW: u64 = 256;

/// The soft open-files limit: FAIL below 256, WARN below 4096 (every connection, store file
/// and fabric link is a descriptor), with `ulimit -n` as the fix.
pub fn fd_check(soft: u64, hard: u64) -> Check {
    let target = if hard >= 65536 { 65536 } else { hard };
    let fix = if hard >= FD_WARN_BELOW {
        format!("ulimit -n {target} in the shell that starts psl (the hard limit is {hard})")
    } else {
        format!(
            "raise the hard limit (nofile in /etc/security/limits.conf, or LimitNOFILE= in a systemd unit), \
             then ulimit -n {FD_WARN_BELOW}"
        )
    };
    if soft < FD_FAIL_BELOW {
        Check::fail("fd-limit", format!("open files limit is {soft}, below {FD_FAIL_BELOW}"), fix)
    } else if soft < FD_WARN_BELOW {
        Check::warn("fd-limit", format!("open files limit is {soft}, below {FD_WARN_BELOW}"), fix)
    } else {
        Check::pass("fd-limit", format!("open files limit is {soft}"))
    }
}

pub const DISK_WARN_BELOW_BYTES: u64 = 1 << 30;
pub const DISK_FAIL_BELOW_BYTES: u64 = 100 << 20;

/// Free space where stores would go: FAIL below 100 MiB, WARN below 1 GiB.
pub fn disk_check(dir: &Path, free_bytes: Result<u64, String>) -> Check {
    let fix = "free space there, or run psl where there is more (psl up --dir, --state, --dir of the roles)";
    match free_bytes {
        Err(e) => Check::warn("disk", format!("cannot measure free space in {}: {e}", dir.display()), fix),
        Ok(b) => {
            let what = format!("{} free in {}", human_bytes(b), dir.display());
            if b < DISK_FAIL_BELOW_BYTES {
                Check::fail("disk", what, fix)
            } else if b < DISK_WARN_BELOW_BYTES {
                Check::warn("disk", what, fix)
            } else {
                Check::pass("disk", what)
            }
        }
    }
}

fn human_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b as f64 >= GIB {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{:.1} MiB", b as f64 / MIB)
    }
}

/// What the clock's synchronization looks like from here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClockSeen {
    /// `timedatectl show -p NTPSynchronized --value`, if it answered.
    pub timedatectl: Option<String>,
    /// `/run/systemd/timesync/synchronized` exists.
    pub timesync_file: bool,
    /// The kernel's own flag (adjtimex): `Some(true)` synchronized, `Some(false)` not.
    pub kernel: Option<bool>,
}

/// Clock sync matters: certificates, attestation collateral and leases are checked against
/// the clock. The first source that answers decides; none answering is a WARN "unknown".
pub fn clock_check(seen: &ClockSeen) -> Check {
    let fix = "run an NTP client (timedatectl set-ntp true, or chrony / ntpd / systemd-timesyncd)";
    match seen.timedatectl.as_deref().map(str::trim) {
        Some("yes") => return Check::pass("clock", "synchronized (timedatectl NTPSynchronized=yes)"),
        Some("no") => return Check::warn("clock", "not synchronized (timedatectl NTPSynchronized=no)", fix),
        _ => {}
    }
    if seen.timesync_file {
        return Check::pass("clock", "synchronized (/run/systemd/timesync/synchronized)");
    }
    match seen.kernel {
        Some(true) => Check::pass("clock", "synchronized (the kernel's adjtimex status)"),
        Some(false) => Check::warn("clock", "the kernel says the clock is not synchronized (adjtimex)", fix),
        None => Check::warn("clock", "unknown (no timedatectl, no systemd-timesyncd flag, no adjtimex)", fix),
    }
}

/// Looks at this machine and returns every check, in the order they print.
pub fn observe(dir: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    let sgx_nodes = SGX_NODES.iter().filter(|p| Path::new(p).exists()).map(|p| p.to_string()).collect();
    out.extend(attestation_checks(&AttestSeen {
        tsm_report: Path::new(TSM_REPORT).is_dir(),
        gramine: Path::new(psl_faas::attest_gramine::GRAMINE_DIR_DEFAULT).join("attestation_type").exists(),
        sgx_nodes,
    }));
    out.push(tools_check(crate::tools::tools_exe().as_ref().map_err(|e| format!("{e:#}"))));
    out.push(program_check(
        "nats-server",
        which("nats-server").as_deref(),
        "the NATS fabric: psl up --fabric nats, cluster files, psl bench fabric",
        "scripts/install-nats-test-deps.sh (or apt-get install nats-server)",
    ));
    out.push(program_check(
        "memcached",
        which("memcached").as_deref(),
        "comparing SecureCached with memcached: psl bench cluster, psl report",
        "scripts/install-memcached-test-deps.sh (or apt-get install memcached)",
    ));
    let ephemeral = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map(|_| ()).map_err(|e| e.to_string());
    let d = crate::cluster::Ports::default();
    let ports: Vec<(u16, &str, bool)> = [
        (d.router, "router"),
        (d.scheduler, "scheduler, or a node's control"),
        (d.leader, "leader, or a node's control"),
        (d.nats, "nats-server"),
        (d.memcached, "memcached"),
    ]
    .into_iter()
    .map(|(p, what)| (p, what, TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, p))).is_ok()))
    .collect();
    out.extend(loopback_checks(ephemeral, &ports));
    let (soft, hard) = nofile();
    out.push(fd_check(soft, hard));
    out.push(disk_check(dir, free_bytes(dir)));
    out.push(clock_check(&ClockSeen {
        timedatectl: timedatectl(),
        timesync_file: Path::new("/run/systemd/timesync/synchronized").exists(),
        kernel: kernel_synchronized(),
    }));
    out
}

pub fn run(a: DoctorArgs) -> Result<i32> {
    let checks = observe(&a.dir);
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    if a.json {
        let list: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "status": c.status.as_str(), "check": c.name, "detail": c.detail, "fix": c.fix,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "ok": ok, "checks": list }));
    } else {
        for c in &checks {
            println!("{}", c.line());
        }
    }
    Ok(if ok { 0 } else { 1 })
}

/// The first executable file called `name` in a directory of PATH.
fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false))
}

/// The soft and hard RLIMIT_NOFILE (infinity as u64::MAX).
fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (0, 0);
    }
    (r.rlim_cur, r.rlim_max)
}

/// Bytes an unprivileged user may still write on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: an all-zero statvfs is a valid value for statvfs to overwrite.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

fn timedatectl() -> Option<String> {
    let out = std::process::Command::new("timedatectl")
        .args(["show", "-p", "NTPSynchronized", "--value"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The kernel's view (adjtimex with no changes): unsynchronized when it answers TIME_ERROR.
fn kernel_synchronized() -> Option<bool> {
    // SAFETY: an all-zero timex with modes 0 only reads the kernel's state.
    let mut t: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid timex; modes = 0 asks for no change.
    let state = unsafe { libc::adjtimex(&mut t) };
    if state < 0 {
        return None;
    }
    Some(state != libc::TIME_ERROR && t.status & libc::STA_UNSYNC == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_missing_is_a_warn_with_the_build_command() {
        let p = std::path::PathBuf::from("/opt/psl/psl-tools");
        assert_eq!(tools_check(Ok(&p)).status, Status::Pass);
        let c = tools_check(Err("/opt/psl/psl-tools not found".into()));
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("/opt/psl/psl-tools"), "{c:?}");
        assert!(c.fix.contains("cargo build --release -p psl-tools"), "{c:?}");
    }

    #[test]
    fn attestation_without_any_tee_is_one_warn_with_a_fix() {
        let c = attestation_checks(&AttestSeen::default());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Warn);
        assert!(c[0].detail.contains("sim"), "{c:?}");
        assert!(c[0].fix.contains("TDX"), "{c:?}");
    }

    #[test]
    fn attestation_passes_for_each_backend_present() {
        let c = attestation_checks(&AttestSeen {
            tsm_report: true,
            gramine: true,
            sgx_nodes: vec!["/dev/sgx_enclave".into()],
        });
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(c.iter().all(|c| c.status == Status::Pass), "{c:?}");
        assert!(c[0].detail.contains("configfs-tsm") && c[1].detail.contains("Gramine"), "{c:?}");
    }

    #[test]
    fn sgx_outside_gramine_warns() {
        let c = attestation_checks(&AttestSeen { sgx_nodes: vec!["/dev/sgx_enclave".into()], ..Default::default() });
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].status, Status::Warn);
        assert!(c[0].fix.contains("gramine"), "{c:?}");
    }

    #[test]
    fn programs_pass_when_found_and_warn_with_the_install_when_not() {
        let p = program_check("nats-server", Some(Path::new("/usr/bin/nats-server")), "x", "install it");
        assert_eq!(p.status, Status::Pass);
        assert!(p.line().starts_with("PASS nats-server: /usr/bin/nats-server"), "{}", p.line());
        let w = program_check("memcached", None, "x", "apt-get install memcached");
        assert_eq!(w.status, Status::Warn);
        assert!(w.line().ends_with("; fix: apt-get install memcached"), "{}", w.line());
    }

    #[test]
    fn loopback_fails_without_listeners_and_busy_ports_warn() {
        let c = loopback_checks(Err("denied".into()), &[(7400, "router", true)]);
        assert_eq!(c[0].status, Status::Fail);
        assert_eq!(c[1].status, Status::Pass);
        let c = loopback_checks(Ok(()), &[(7400, "router", true), (11211, "memcached", false)]);
        assert_eq!(c[0].status, Status::Pass);
        assert_eq!(c[1].status, Status::Warn);
        assert!(c[1].detail.contains("11211 (memcached)") && !c[1].detail.contains("7400"), "{c:?}");
    }

    #[test]
    fn fd_limit_thresholds_and_fixes() {
        assert_eq!(fd_check(1 << 20, 1 << 20).status, Status::Pass);
        assert_eq!(fd_check(4096, 4096).status, Status::Pass);
        let w = fd_check(1024, 1 << 20);
        assert_eq!(w.status, Status::Warn);
        assert!(w.fix.contains("ulimit -n 65536"), "{w:?}");
        let w = fd_check(1024, 1024);
        assert!(w.fix.contains("limits.conf"), "{w:?}");
        assert_eq!(fd_check(100, 100).status, Status::Fail);
    }

    #[test]
    fn disk_thresholds() {
        let d = Path::new("/x");
        assert_eq!(disk_check(d, Ok(10 << 30)).status, Status::Pass);
        assert_eq!(disk_check(d, Ok(500 << 20)).status, Status::Warn);
        assert_eq!(disk_check(d, Ok(10 << 20)).status, Status::Fail);
        assert_eq!(disk_check(d, Err("no".into())).status, Status::Warn);
        assert!(disk_check(d, Ok(10 << 30)).detail.contains("10.0 GiB free in /x"));
    }

    #[test]
    fn clock_sources_in_order_and_unknown_warns() {
        let yes = ClockSeen { timedatectl: Some("yes".into()), kernel: Some(false), ..Default::default() };
        assert_eq!(clock_check(&yes).status, Status::Pass);
        let no = ClockSeen { timedatectl: Some("no\n".into()), timesync_file: true, ..Default::default() };
        assert_eq!(clock_check(&no).status, Status::Warn);
        let file = ClockSeen { timesync_file: true, ..Default::default() };
        assert_eq!(clock_check(&file).status, Status::Pass);
        assert_eq!(clock_check(&ClockSeen { kernel: Some(true), ..Default::default() }).status, Status::Pass);
        assert_eq!(clock_check(&ClockSeen { kernel: Some(false), ..Default::default() }).status, Status::Warn);
        let unknown = clock_check(&ClockSeen::default());
        assert_eq!(unknown.status, Status::Warn);
        assert!(unknown.detail.starts_with("unknown") && unknown.fix.contains("NTP"), "{unknown:?}");
    }

    #[test]
    fn lines_have_the_documented_shape() {
        assert_eq!(Check::pass("disk", "ok").line(), "PASS disk: ok");
        assert_eq!(Check::fail("disk", "full", "free it").line(), "FAIL disk: full; fix: free it");
    }
}
