//! `psl --version` names the version and the commit; `psl completions bash|zsh|fish` prints
//! clap's completion script for each shell; `psl doctor` prints one PASS/WARN/FAIL line per
//! check (a fix with every WARN and FAIL) and exits 0 unless one FAILs.

use std::process::{Command, Output};

fn psl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psl")).args(args).output().expect("psl runs")
}

#[test]
fn version_names_the_version_and_the_commit() {
    let o = psl(&["--version"]);
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    let want = format!("psl {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(out.starts_with(&want), "{out}");
    let commit = out.trim().strip_prefix(&want).and_then(|r| r.strip_suffix(')')).expect("(commit X)");
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "not a short commit hash: {commit:?}"
    );
    // Built from a git checkout (as here and in CI), it is that checkout's HEAD.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if let Ok(g) = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(&root).output() {
        if g.status.success() {
            let head = String::from_utf8_lossy(&g.stdout);
            assert!(head.starts_with(commit), "--version says {commit}, HEAD is {head}");
        }
    }
}

#[test]
fn completions_for_each_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let o = psl(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8(o.stdout).unwrap();
        assert!(out.len() > 1000, "{shell}: {} bytes", out.len());
        for sub in ["capsule", "doctor", "memcached", "completions", "check-proof"] {
            assert!(out.contains(sub), "{shell} completions do not mention {sub}");
        }
    }
    let o = psl(&["completions", "tcsh"]);
    assert!(!o.status.success(), "an unknown shell is refused");
}

#[test]
fn doctor_prints_one_status_line_per_check_with_fixes() {
    let o = psl(&["doctor"]);
    let out = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 8, "{out}");
    let mut fails = 0;
    let mut names = Vec::new();
    for l in &lines {
        let (status, rest) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
        let (name, detail) = rest.split_once(": ").unwrap_or_else(|| panic!("no 'name: detail' in {l:?}"));
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '-'), "{l:?}");
        assert!(!detail.is_empty(), "{l:?}");
        match status {
            "PASS" => assert!(!l.contains("; fix: "), "a PASS with a fix: {l:?}"),
            "WARN" | "FAIL" => assert!(l.contains("; fix: "), "a {status} without its fix: {l:?}"),
            _ => panic!("not PASS/WARN/FAIL: {l:?}"),
        }
        fails += usize::from(status == "FAIL");
        names.push(name.to_string());
    }
    for want in ["attestation", "nats-server", "memcached", "loopback", "ports", "fd-limit", "disk", "clock"] {
        assert!(names.iter().any(|n| n == want), "no {want} check:\n{out}");
    }
    assert_eq!(o.status.success(), fails == 0, "exit {:?} with {fails} FAIL(s):\n{out}", o.status);

    // --json: the same checks for machines.
    let o = psl(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["checks"].as_array().map(Vec::len), Some(lines.len()), "{v}");
    assert_eq!(v["ok"], serde_json::Value::Bool(fails == 0), "{v}");
}

#[test]
fn doctor_warns_when_it_cannot_measure_the_store_directory() {
    let o = psl(&["doctor", "--dir", "/nonexistent/psl-doctor"]);
    let out = String::from_utf8(o.stdout).unwrap();
    let disk = out.lines().find(|l| l.contains(" disk: ")).expect("a disk line");
    assert!(disk.starts_with("WARN disk: cannot measure free space in /nonexistent/psl-doctor"), "{disk}");
}

#[test]
fn sim_backend_warns_once_per_process_without_colour_codes_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = "[[host]]\nname = \"a\"\naddress = \"127.0.0.1\"\nrouter = true\nleader = true\nscheduler = true\n\
               capsule_hosts = [0]\nworkers = [1]\n";
    std::fs::write(dir.path().join("c.toml"), cfg).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["up", "--config", "c.toml", "--init"])
        .current_dir(dir.path())
        .env_remove("PSL_LOG")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8(o.stderr).unwrap();
    // stderr is a pipe here: plain text, no ANSI escapes.
    assert!(!err.contains('\x1b'), "colour codes on a pipe: {err:?}");
    let sim: Vec<&str> = err.lines().filter(|l| l.contains("INSECURE")).collect();
    assert_eq!(sim.len(), 1, "one sim warning per process: {err}");
    assert!(sim[0].contains(" WARN "), "{err}");
}

/// A reader that stops early (`psl … | head`) ends a printing command quietly, as it ends `cat`:
/// no panic from `println!` on the closed pipe. The bash script is larger than a pipe's buffer, so
/// `psl` is still writing when the reader goes away.
#[test]
fn a_printing_command_whose_reader_stops_early_ends_without_a_panic() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psl runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("one line");
    assert!(!first.is_empty());
    // The reader is dropped here: the pipe is closed with most of the script unwritten.
    let out = child.wait_with_output().expect("psl ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "ended with {:?}: {stderr}",
        out.status
    );
}
