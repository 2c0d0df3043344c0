//! `psl report --out DIR [--quick]`: every benchmark of this tree in one run, written as
//! `DIR/report.md` (with `DIR/*.png`), `DIR/report.html` (self-contained) and
//! `DIR/results.json` (every benchmark's JSON object, with timings and the machine's load).
//!
//! The report is a list of sections, each mirroring a figure or table of the PSL paper's
//! evaluation or a comparison users would ask for (see [`sections`]). A section names the
//! cases it needs; a case is one `psl bench NAME --json ARGS…` run as a child process of this
//! binary (`psl-tools bench ...`), so that a benchmark that fails or hangs costs its section only, and a benchmark this
//! tree does not have (another branch's `cluster` or `fabric`) is reported as not available
//! rather than failing the report. Each case shows a progress bar (time against its estimate)
//! and the whole run an estimate of the time left, from the estimates scaled by how long the
//! finished cases took against theirs (and from the previous run's timings when `DIR` holds
//! one). `--render-only` redraws the report from `DIR/results.json` without running anything.
//!
//! Module map: `sections` (what runs in each mode, and how each section becomes tables and
//! plots), `plots` (PNG charts with an embedded font), `doc` (Markdown and HTML rendering).

mod doc;
pub(crate) mod plots;
mod sections;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Directory for report.md, report.html, the PNGs and results.json (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Shorter runs and fewer cases: under five minutes on a two-core machine.
    #[arg(long)]
    pub quick: bool,
    /// TEST ONLY: a few seconds of each of a handful of cases (the browser test's report).
    #[arg(long, hide = true)]
    pub tiny: bool,
    /// Only these sections (comma-separated; see the report's contents for names).
    #[arg(long, value_delimiter = ',')]
    pub sections: Vec<String>,
    /// A note printed at the top of the report (e.g. that the machine was shared).
    #[arg(long)]
    pub note: Option<String>,
    /// Redraw the report from DIR/results.json without running any benchmark.
    #[arg(long)]
    pub render_only: bool,
}

/// How long and how wide the run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Tiny,
    Quick,
    Full,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Tiny => "tiny",
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// One benchmark run: `psl bench <bench> --json <args>`.
#[derive(Clone, Debug)]
pub struct Case {
    /// Unique id (also the key in results.json).
    pub id: String,
    pub section: &'static str,
    pub bench: &'static str,
    pub args: Vec<String>,
    /// Expected seconds on this machine.
    pub estimate_s: f64,
}

impl Case {
    pub fn command(&self) -> String {
        format!("psl bench {} --json {}", self.bench, self.args.join(" ")).trim_end().to_string()
    }
}

/// What became of a case.
#[derive(Clone, Debug)]
pub enum Status {
    Ok(Value),
    /// This binary has no such benchmark.
    NotAvailable,
    Failed(String),
}

#[derive(Clone, Debug)]
pub struct CaseResult {
    pub case: Case,
    pub status: Status,
    pub seconds: f64,
    pub load_before: f64,
    pub load_after: f64,
}

impl CaseResult {
    fn to_json(&self) -> Value {
        let (status, result, error) = match &self.status {
            Status::Ok(v) => ("ok", v.clone(), None),
            Status::NotAvailable => ("not_available", Value::Null, None),
            Status::Failed(e) => ("failed", Value::Null, Some(e.clone())),
        };
        json!({
            "id": self.case.id, "section": self.case.section, "bench": self.case.bench,
            "args": self.case.args, "command": self.case.command(), "estimate_s": self.case.estimate_s,
            "status": status, "error": error, "seconds": self.seconds,
            "load_average_before": self.load_before, "load_average_after": self.load_after,
            "result": result,
        })
    }

    fn from_json(v: &Value) -> Option<CaseResult> {
        let section = sections::section_name(v["section"].as_str()?)?;
        let bench = sections::bench_name(v["bench"].as_str()?);
        let case = Case {
            id: v["id"].as_str()?.to_string(),
            section,
            bench,
            args: v["args"].as_array()?.iter().filter_map(|a| a.as_str().map(String::from)).collect(),
            estimate_s: v["estimate_s"].as_f64().unwrap_or(0.0),
        };
        let status = match v["status"].as_str()? {
            "ok" => Status::Ok(v["result"].clone()),
            "not_available" => Status::NotAvailable,
            _ => Status::Failed(strip_ansi(v["error"].as_str().unwrap_or(""))),
        };
        Some(CaseResult {
            case,
            status,
            seconds: v["seconds"].as_f64().unwrap_or(0.0),
            load_before: v["load_average_before"].as_f64().unwrap_or(0.0),
            load_after: v["load_average_after"].as_f64().unwrap_or(0.0),
        })
    }
}

/// Facts printed on every plot and at the top of the report.
#[derive(Clone, Debug)]
pub struct RunInfo {
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub cores: usize,
    pub profile: &'static str,
    pub mode: Mode,
    pub note: Option<String>,
    pub load_start: f64,
    pub load_end: f64,
}

impl RunInfo {
    /// The footer lines of a plot: machine, date, commit, and what its ratio means.
    pub fn footer(&self, ratio: &str, loads: (f64, f64)) -> Vec<String> {
        vec![
            format!(
                "{} ({} cores, {} build) · {} · commit {} · psl report ({})",
                self.machine,
                self.cores,
                self.profile,
                self.date,
                self.commit,
                self.mode.name()
            ),
            format!("ratio: {ratio}"),
            format!(
                "load average {:.1} → {:.1} while this ran{}",
                loads.0,
                loads.1,
                if loads.0.max(loads.1) > self.cores as f64 * 0.5 {
                    ": the machine was busy with other work, so absolute figures are noisy; compare ratios"
                } else {
                    ""
                }
            ),
        ]
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock.
fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86_400) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=10", "HEAD"]) {
        Some(c) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}+changes")
            } else {
                c
            }
        }
        None => "unknown".into(),
    }
}

/// `s` without terminal colour sequences (`ESC [ … letter`), which a child's log lines carry.
fn strip_ansi(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.next() == Some('[') {
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            o.push(c);
        }
    }
    o
}

/// The one-minute load average.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Runs one case as a child process, ticking `bar` against its estimate.
fn run_case(case: &Case, logs: &Path, bar: &indicatif::ProgressBar) -> Result<(Status, f64)> {
    // This very binary, even if a rebuild replaced the file since it started (Linux keeps the
    // running image reachable through /proc/self/exe).
    let proc_exe = Path::new("/proc/self/exe");
    let exe = if proc_exe.exists() {
        proc_exe.to_path_buf()
    } else {
        std::env::current_exe().context("finding the psl-tools binary")?
    };
    let out_path = logs.join(format!("{}.json", case.id));
    let err_path = logs.join(format!("{}.stderr", case.id));
    let mut child = Command::new(exe)
        .args(["bench", case.bench, "--json"])
        .args(&case.args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .with_context(|| format!("starting {}", case.command()))?;
    let start = Instant::now();
    let timeout = Duration::from_secs_f64(case.estimate_s * 3.0 + 300.0);
    let est_ms = (case.estimate_s * 1000.0).max(1.0);
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        let el = start.elapsed();
        bar.set_position((el.as_secs_f64() * 1000.0).min(est_ms * 0.99) as u64);
        if el > timeout {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let secs = start.elapsed().as_secs_f64();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let stderr = strip_ansi(&stderr);
    let tail = |s: &str| s.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    let Some(status) = status else {
        return Ok((Status::Failed(format!("timed out after {}", fmt_secs(secs))), secs));
    };
    if !status.success() {
        if stderr.contains("unknown benchmark") {
            return Ok((Status::NotAvailable, secs));
        }
        return Ok((Status::Failed(format!("{status}: {}", tail(&stderr))), secs));
    }
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let last = stdout.lines().rev().find(|l| l.trim_start().starts_with('{'));
    match last.map(serde_json::from_str::<Value>) {
        Some(Ok(v)) => Ok((Status::Ok(v), secs)),
        Some(Err(e)) => Ok((Status::Failed(format!("its output is not JSON: {e}")), secs)),
        None => Ok((Status::Failed(format!("no JSON object on its output; stderr: {}", tail(&stderr))), secs)),
    }
}

fn run_all(cases: &[Case], dir: &Path) -> Result<Vec<CaseResult>> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let mp = indicatif::MultiProgress::new();
    let total_est: f64 = cases.iter().map(|c| c.estimate_s).sum();
    let overall = mp.add(indicatif::ProgressBar::new(cases.len() as u64));
    overall.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>24} [{bar:30}] {pos}/{len} cases  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    overall.set_prefix("psl report");
    let style = indicatif::ProgressStyle::with_template("{prefix:>24} [{bar:30}] {elapsed} of about {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    let (mut est_done, mut actual_done) = (0.0f64, 0.0f64);
    let mut results = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let speed = if est_done > 0.0 { (actual_done / est_done).clamp(0.3, 5.0) } else { 1.0 };
        let left = (total_est - est_done) * speed;
        overall.set_message(format!("about {} left", fmt_secs(left)));
        eprintln!(
            "[{}/{}] {} ({}; about {}; about {} left in all)",
            i + 1,
            cases.len(),
            c.id,
            c.command(),
            fmt_secs(c.estimate_s * speed),
            fmt_secs(left)
        );
        let bar = mp.add(indicatif::ProgressBar::new((c.estimate_s * 1000.0).max(1.0) as u64));
        bar.set_style(style.clone());
        bar.set_prefix(c.id.clone());
        bar.set_message(fmt_secs(c.estimate_s * speed));
        let load_before = load_average();
        // A case that cannot even start costs its section, not the report.
        let (status, secs) = run_case(c, &logs, &bar).unwrap_or_else(|e| (Status::Failed(format!("{e:#}")), 0.0));
        let load_after = load_average();
        bar.finish_and_clear();
        mp.remove(&bar);
        let word = match &status {
            Status::Ok(_) => "ok".to_string(),
            Status::NotAvailable => "not available in this tree".to_string(),
            Status::Failed(e) => format!("FAILED: {}", e.lines().last().unwrap_or("")),
        };
        eprintln!("      {} {} in {}", c.id, word, fmt_secs(secs));
        est_done += c.estimate_s;
        actual_done += secs;
        overall.inc(1);
        results.push(CaseResult { case: c.clone(), status, seconds: secs, load_before, load_after });
        // Keep what is done so far, so that a run cut short can still be rendered.
        write_results(dir, &results, None)?;
    }
    overall.finish_and_clear();
    Ok(results)
}

fn write_results(dir: &Path, results: &[CaseResult], ctx: Option<&RunInfo>) -> Result<()> {
    let mut v = json!({
        "cases": results.iter().map(CaseResult::to_json).collect::<Vec<_>>(),
    });
    if let Some(c) = ctx {
        v["generated"] = json!(c.date);
        v["commit"] = json!(c.commit);
        v["machine"] = json!({"cpu_model": c.machine, "cores": c.cores, "profile": c.profile});
        v["mode"] = json!(c.mode.name());
        v["note"] = json!(c.note);
        v["load_average_start"] = json!(c.load_start);
        v["load_average_end"] = json!(c.load_end);
    }
    psl::util::write_atomic(&dir.join("results.json"), serde_json::to_string_pretty(&v)?.as_bytes(), 0o644)?;
    Ok(())
}

/// Previous timings (case id → seconds) from `DIR/results.json`, to refine the estimates.
fn previous_timings(dir: &Path) -> std::collections::HashMap<String, f64> {
    let mut m = std::collections::HashMap::new();
    if let Some(v) =
        std::fs::read_to_string(dir.join("results.json")).ok().and_then(|s| serde_json::from_str::<Value>(&s).ok())
    {
        for c in v["cases"].as_array().into_iter().flatten() {
            if let (Some(id), Some(s), Some("ok")) = (c["id"].as_str(), c["seconds"].as_f64(), c["status"].as_str()) {
                m.insert(id.to_string(), s);
            }
        }
    }
    m
}

pub fn run(a: ReportArgs) -> Result<i32> {
    let mode = match (a.tiny, a.quick) {
        (true, _) => Mode::Tiny,
        (false, true) => Mode::Quick,
        (false, false) => Mode::Full,
    };
    for s in &a.sections {
        if sections::section_name(s).is_none() {
            bail!(
                "unknown section {s:?}; sections: {}",
                sections::SECTIONS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let m = crate::bench::machine();
    let mut ctx = RunInfo {
        date: today(),
        commit: commit(),
        machine: m["cpu_model"].as_str().unwrap_or("unknown CPU").to_string(),
        cores: m["cpus"].as_u64().unwrap_or(1) as usize,
        profile: if cfg!(debug_assertions) { "debug" } else { "release" },
        mode,
        note: a.note.clone(),
        load_start: load_average(),
        load_end: 0.0,
    };
    let results = if a.render_only {
        let text = std::fs::read_to_string(a.out.join("results.json"))
            .with_context(|| format!("reading {}", a.out.join("results.json").display()))?;
        let v: Value = serde_json::from_str(&text)?;
        if let Some(d) = v["generated"].as_str() {
            ctx.date = d.to_string();
        }
        if let Some(c) = v["commit"].as_str() {
            ctx.commit = c.to_string();
        }
        if let Some(n) = v["note"].as_str() {
            ctx.note = ctx.note.or(Some(n.to_string()));
        }
        ctx.mode = match v["mode"].as_str() {
            Some("tiny") => Mode::Tiny,
            Some("quick") => Mode::Quick,
            _ => Mode::Full,
        };
        ctx.load_start = v["load_average_start"].as_f64().unwrap_or(0.0);
        ctx.load_end = v["load_average_end"].as_f64().unwrap_or(0.0);
        v["cases"].as_array().into_iter().flatten().filter_map(CaseResult::from_json).collect()
    } else {
        let prev = previous_timings(&a.out);
        let mut cases = sections::plan(mode, &a.sections);
        for c in &mut cases {
            if let Some(s) = prev.get(&c.id) {
                c.estimate_s = *s;
            }
        }
        let r = run_all(&cases, &a.out)?;
        ctx.load_end = load_average();
        r
    };
    if !a.render_only {
        write_results(&a.out, &results, Some(&ctx))?;
    }
    let blocks = sections::render(&ctx, &results, &a.out)?;
    let md = doc::markdown(&blocks);
    psl::util::write_atomic(&a.out.join("report.md"), md.as_bytes(), 0o644)?;
    let html = doc::html("PSL report", &blocks, &a.out)?;
    psl::util::write_atomic(&a.out.join("report.html"), html.as_bytes(), 0o644)?;
    let failed = results.iter().filter(|r| matches!(r.status, Status::Failed(_))).count();
    println!("report {}", a.out.join("report.html").display());
    println!("markdown {}", a.out.join("report.md").display());
    println!(
        "cases {} ok, {} not available, {} failed",
        results.iter().filter(|r| matches!(r.status, Status::Ok(_))).count(),
        results.iter().filter(|r| matches!(r.status, Status::NotAvailable)).count(),
        failed
    );
    Ok(if failed > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_sequences_are_stripped() {
        assert_eq!(super::strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"), "2026  WARN x");
        assert_eq!(super::strip_ansi("plain é"), "plain é");
    }

    #[test]
    fn dates_are_civil() {
        let d = super::today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"), "{d}");
    }
}
