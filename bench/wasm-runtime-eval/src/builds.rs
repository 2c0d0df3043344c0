//! Clean release builds of the minimal binaries under `min/`, one at a time, timed.

use crate::report::Build;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// `cargo` with the variables that `cargo run` set for this harness removed, so the inner
/// build sees the same environment as one typed in a shell.
fn cargo(dir: &Path) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (k, _) in std::env::vars() {
        if (k.starts_with("CARGO_") && k != "CARGO_HOME") || k == "CARGO" || k.ends_with("MAKEFLAGS") || k == "MFLAGS" {
            c.env_remove(k);
        }
    }
    c.current_dir(dir);
    c
}

pub fn measure(root: &Path, name: &str) -> Result<Build, String> {
    let dir = root.join("min").join(name.trim_start_matches("min-"));
    eprintln!("build: {name}: cargo clean");
    let st = cargo(&dir).arg("clean").status().map_err(|e| e.to_string())?;
    if !st.success() {
        return Err(format!("cargo clean failed in {}", dir.display()));
    }
    eprintln!("build: {name}: cargo build --release --locked --offline");
    let t = Instant::now();
    let out = cargo(&dir).args(["build", "--release", "--locked", "--offline"]).output().map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("build of {name} failed:\n{log}"));
    }
    let crates = log.lines().filter(|l| l.trim_start().starts_with("Compiling ")).count();
    let bin = dir.join("target/release").join(name);
    let bytes = std::fs::metadata(&bin).map_err(|e| e.to_string())?.len();
    let stripped = dir.join("target/release").join(format!("{name}.stripped"));
    let st = Command::new("strip").arg("-o").arg(&stripped).arg(&bin).status().map_err(|e| e.to_string())?;
    if !st.success() {
        return Err("strip failed".into());
    }
    let stripped_bytes = std::fs::metadata(&stripped).map_err(|e| e.to_string())?.len();
    let ran = Command::new(&bin).output().map_err(|e| e.to_string())?;
    let ran = String::from_utf8_lossy(&ran.stdout).trim().to_string();
    eprintln!("build: {name}: {secs:.1} s, {crates} crates, {bytes} B ({stripped_bytes} B stripped); it printed: {ran}");
    Ok(Build { name: name.to_string(), secs, crates, bytes, stripped_bytes, ran })
}

/// Saved as TSV so a later run without `--builds` can still show them.
pub fn save(path: &Path, builds: &[Build]) {
    let mut s = String::from("crate\tsecs\tcrates\tbytes\tstripped_bytes\tran\n");
    for b in builds {
        s.push_str(&format!("{}\t{:.3}\t{}\t{}\t{}\t{}\n", b.name, b.secs, b.crates, b.bytes, b.stripped_bytes, b.ran.replace(['\t', '\n'], " ")));
    }
    let _ = std::fs::write(path, s);
}

pub fn load(path: &Path) -> Vec<Build> {
    let Ok(s) = std::fs::read_to_string(path) else { return vec![] };
    s.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Some(Build {
                name: f.first()?.to_string(),
                secs: f.get(1)?.parse().ok()?,
                crates: f.get(2)?.parse().ok()?,
                bytes: f.get(3)?.parse().ok()?,
                stripped_bytes: f.get(4)?.parse().ok()?,
                ran: f.get(5).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}
