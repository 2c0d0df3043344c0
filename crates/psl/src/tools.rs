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

/// How much older than this `psl` its `psl-tools` may be before a tool warns (two builds of
/// one tree finish within this of each other; an install copies both at once).
const TOOLS_OLDER_WARN: std::time::Duration = std::time::Duration::from_secs(600);

/// The warning when `psl-tools` (modified at `tools`) is much older than `psl` (at `psl`): a
/// developer who rebuilt only `psl` (`cargo build -p psl`) would otherwise benchmark, test or
/// report on code that is not the tree's, and nothing would say so.
fn stale_tools_warning(psl: std::time::SystemTime, tools: std::time::SystemTime, exe: &Path) -> Option<String> {
    let behind = psl.duration_since(tools).ok()?;
    (behind > TOOLS_OLDER_WARN).then(|| {
        format!(
            "warning: {} is {} min older than this psl: it may not be built from the same tree \
             (cargo build --release -p psl -p psl-tools)",
            exe.display(),
            behind.as_secs() / 60
        )
    })
}

/// Runs `psl-tools SUB ARGS...` in place of this process; returns only if it cannot start.
pub fn run(sub: &str, a: ToolArgs) -> Result<i32> {
    let exe = tools_exe()?;
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(me), Some(tools)) = (std::env::current_exe().ok().as_deref().and_then(modified), modified(&exe)) {
        if let Some(w) = stale_tools_warning(me, tools, &exe) {
            eprintln!("{w}");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_much_older_psl_tools_is_named_and_a_fresh_one_is_not() {
        let now = SystemTime::now();
        let exe = Path::new("/x/psl-tools");
        let w = stale_tools_warning(now, now - Duration::from_secs(4 * 3600), exe).expect("4 h older warns");
        assert!(w.contains("/x/psl-tools") && w.contains("240 min") && w.contains("-p psl-tools"), "{w}");
        assert_eq!(stale_tools_warning(now, now - Duration::from_secs(60), exe), None);
        // Newer than psl (rebuilt after it): fine.
        assert_eq!(stale_tools_warning(now, now + Duration::from_secs(3600), exe), None);
    }
}
