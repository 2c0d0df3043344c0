//! `psl bench|report|chaos ...`: the tools are not in this binary. They live in `psl-tools`
//! (`crates/psl-tools`), a binary of their own installed beside `psl`, so that the binary that
//! runs the roles links none of their libraries (plots, fonts, histograms, fjall). `psl` runs
//! it as git runs an external subcommand: the subcommand and every argument passed through
//! unchanged (`--help` included, and its usage lines say `psl`), stdio inherited, and its exit
//! code `psl`'s: on Unix `psl` execs it, so it also keeps `psl`'s process id and gets its signals.

use crate::util::sibling_exe;
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// The arguments of a tool's subcommand, passed through to `psl-tools` as given.
#[derive(clap::Args, Debug)]
pub struct ToolArgs {
    /// The tool's arguments (see `psl bench --help`, `psl report --help`, `psl chaos --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// The `psl-tools` binary beside this one.
pub fn tools_exe() -> Result<std::path::PathBuf> {
    sibling_exe("psl-tools")
}

/// Runs `psl-tools SUB ARGS...` in place of this process; returns only if it cannot start.
pub fn run(sub: &str, a: ToolArgs) -> Result<i32> {
    let exe = tools_exe()?;
    let mut cmd = Command::new(&exe);
    cmd.arg(sub).args(&a.args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Under this binary's name, so that the tool's usage lines say `psl bench ...`.
        cmd.arg0(std::env::args_os().next().unwrap_or_else(|| "psl".into()));
        let e = cmd.exec();
        Err(e).with_context(|| format!("running {}", exe.display()))
    }
    #[cfg(not(unix))]
    {
        let st = cmd.status().with_context(|| format!("running {}", exe.display()))?;
        Ok(st.code().unwrap_or(2))
    }
}

/// `psl sim --scenario scale --plot FILE.png`: `psl-tools plot-scale` draws the rows (handed to
/// it as JSON lines on stdin), so that `psl` links no plotting library.
pub fn plot_scale(rows: &[serde_json::Value], path: &Path) -> Result<()> {
    let exe = tools_exe()?;
    let mut child = Command::new(&exe)
        .args(["plot-scale", "--out"])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", exe.display()))?;
    {
        let mut stdin = child.stdin.take().context("psl-tools plot-scale's stdin")?;
        for r in rows {
            writeln!(stdin, "{r}")?;
        }
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("psl-tools plot-scale --out {} failed ({st})", path.display());
    }
    Ok(())
}
