//! `psl bench|report|chaos` without `psl-tools` beside `psl`: a clear error that names the path
//! it looked at and the command that builds it, exit 2. (With it: psl-tools' `tests/dispatch.rs`.)

use std::process::Command;

#[test]
fn a_missing_psl_tools_is_named_with_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let psl = dir.path().join("psl");
    std::fs::copy(env!("CARGO_BIN_EXE_psl"), &psl).unwrap();
    for sub in ["bench", "report", "chaos"] {
        let o = Command::new(&psl).args([sub, "--help"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{sub}: {err}");
        assert!(err.contains(&dir.path().join("psl-tools").display().to_string()), "{sub}: {err}");
        assert!(err.contains("cargo build --release -p psl-tools"), "{sub}: {err}");
    }
    let o = Command::new(&psl).arg("--help").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    for sub in ["bench", "report", "chaos"] {
        assert!(out.lines().any(|l| l.trim_start().starts_with(sub)), "{sub} missing from psl --help:\n{out}");
    }
}
