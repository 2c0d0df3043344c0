//! `psl up` for the FaaS tests: started in a directory, ready when it prints `up`, stopped on
//! drop; `psl` commands run with a bound.

use psl_faas::net::ClusterInfo;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Up {
    pub child: Child,
    pub info: ClusterInfo,
    /// The cluster file.
    pub file: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Up {
    /// The process id of the role `psl up` started as `name` ("leader", "coordinator host 0").
    pub fn pid(&self, name: &str) -> u32 {
        self.info.pids.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name} in {:?}", self.info.pids)).1
    }
}

/// Starts `psl up ARGS --dir DIR/c` (its stderr in `DIR/up.log`) and waits (bounded) for it.
pub fn up(dir: &Path, args: &[&str]) -> Up {
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .arg("up")
        .args(args)
        .arg("--dir")
        .arg(dir.join("c"))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("up.log")).unwrap())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("up ") {
                let _ = tx.send(());
            }
        }
    });
    let file = dir.join("c/cluster.json");
    let ready = rx.recv_timeout(Duration::from_secs(30));
    let info =
        ready.ok().and_then(|()| std::fs::read_to_string(&file).ok()).and_then(|t| serde_json::from_str(&t).ok());
    match info {
        Some(info) => Up { child, info, file },
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("psl up did not report ready: {}", std::fs::read_to_string(dir.join("up.log")).unwrap_or_default());
        }
    }
}

/// Starts `psl ARGS` with its output captured.
pub fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_psl")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// Waits (at most `secs`) for a child from [`spawn`] and returns its output.
pub fn finish(mut child: Child, secs: u64, what: &str) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{what} did not finish in {secs} s: {}", String::from_utf8_lossy(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `kill -9 PID`.
pub fn kill9(pid: u32) {
    let ok = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -9 {pid}");
}
