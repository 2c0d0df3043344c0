//! `psl bench|report|chaos` run the `psl-tools` beside `psl`: the arguments pass through
//! (`--help` included), the exit code comes back, and `psl sim --plot` draws through it. The
//! `psl` binary is the one beside this package's binary (`cargo test --workspace` builds both;
//! with `-p psl-tools` alone, build `psl` first: `cargo build -p psl`).

use std::path::PathBuf;
use std::process::Command;

fn psl() -> Command {
    let p: PathBuf = PathBuf::from(env!("CARGO_BIN_EXE_psl-tools")).with_file_name("psl");
    assert!(p.is_file(), "{} is missing: build it with `cargo build -p psl`", p.display());
    Command::new(p)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn psl_bench_help_is_the_tools_help() {
    let via = psl().args(["bench", "--help"]).output().unwrap();
    assert!(via.status.success(), "{}", text(&via.stderr));
    let direct = Command::new(env!("CARGO_BIN_EXE_psl-tools")).args(["bench", "--help"]).output().unwrap();
    assert!(text(&via.stdout).contains("Usage: psl bench [OPTIONS] <NAME>"), "{}", text(&via.stdout));
    assert_eq!(text(&via.stdout), text(&direct.stdout).replace("psl-tools bench", "psl bench"));
    assert!(text(&via.stdout).contains("--seconds"), "{}", text(&via.stdout));
    for sub in ["report", "chaos"] {
        let o = psl().args([sub, "--help"]).output().unwrap();
        assert!(o.status.success(), "{sub}: {}", text(&o.stderr));
        assert!(text(&o.stdout).contains(&format!("Usage: psl {sub} [OPTIONS]")), "{sub}: {}", text(&o.stdout));
    }
}

#[test]
fn psl_help_lists_the_tools() {
    let o = psl().arg("--help").output().unwrap();
    let out = text(&o.stdout);
    for sub in ["bench", "report", "chaos", "node", "memcached"] {
        assert!(out.lines().any(|l| l.trim_start().starts_with(sub)), "{sub} missing from:\n{out}");
    }
}

#[test]
fn the_tools_exit_code_and_output_come_back() {
    let o = psl().args(["bench", "no-such-benchmark", "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("unknown benchmark \"no-such-benchmark\""), "{}", text(&o.stderr));
    let o = psl().args(["chaos", "--seeds", "1", "--start", "4", "--dry-run"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
    assert_eq!(v["seed"], 4);
}

#[test]
fn psl_sim_plot_draws_through_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("scale.png");
    let o = psl()
        .args(["sim", "--scenario", "scale", "--nodes", "10", "--work-ms", "200", "--plot"])
        .arg(&png)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "not a PNG: {} bytes", bytes.len());
}
