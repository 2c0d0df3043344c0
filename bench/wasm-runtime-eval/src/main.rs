//! Issue 37: choose the WebAssembly runtime for PSL lambdas by measurement, wasmtime against
//! wasmi, on the same guests (WAT, converted with the `wat` crate) and the same harness.
//!
//! Usage: `cargo run --release --bin eval -- [--builds] [--js] [--json] [--quick]`
//! - `--builds`: also `cargo clean` + time `cargo build --release` of `min/none`, `min/wasmi`,
//!   `min/wasmtime` (one at a time) and measure their binaries; saved in `results/builds.tsv`,
//!   which later runs without `--builds` show again.
//! - `--js`: also time `examples/montecarlo.js` under PSL's QuickJS sandbox with
//!   `../../target/release/psl run` (or `--psl PATH`), if that binary exists.
//! - `--json`: print the JSON object after the markdown tables.
//! - `--quick`: small iteration counts (a smoke test, not a measurement).
//! Results are also written to `results/results.json` and `results/table.md`.

mod builds;
mod guests;
mod report;
mod stats;
mod wi;
mod wt;

#[path = "../min/guest.rs"]
mod minguest;
pub use minguest::host_get;

use report::{All, Js, Machine, Native, Params};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const LOCK: &str = include_str!("../Cargo.lock");

fn locked_version(name: &str) -> String {
    let mut lines = LOCK.lines();
    while let Some(l) = lines.next() {
        if l == format!("name = \"{name}\"") {
            if let Some(v) = lines.next().and_then(|v| v.strip_prefix("version = \"")) {
                return v.trim_end_matches('"').to_string();
            }
        }
    }
    "?".into()
}

pub fn wasmtime_version() -> String {
    locked_version("wasmtime")
}

pub fn wasmi_version() -> String {
    locked_version("wasmi")
}

fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()))
        .unwrap_or_else(|| "?".into());
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "?".into());
    Machine { nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), cpu, rustc }
}

fn native(p: &Params) -> Native {
    let mut v = Vec::new();
    let mut inside = 0;
    for _ in 0..p.reps {
        let t = Instant::now();
        inside = guests::native_mc(std::hint::black_box(p.points), std::hint::black_box(guests::SEED));
        v.push(t.elapsed().as_secs_f64() * 1e9 / p.points as f64);
    }
    Native { ns_per_point: stats::median(v), inside }
}

/// Runs `examples/montecarlo.js` on one lambda with `points` samples; the lambda's `cpu_ms`
/// and its estimate.
fn js_once(psl: &Path, example: &Path, points: u32) -> Result<(f64, Option<f64>), String> {
    let input = std::env::temp_dir().join(format!("wasm-eval-mc-input-{}", std::process::id()));
    std::fs::write(&input, points.to_string()).map_err(|e| e.to_string())?;
    let out = Command::new(psl)
        .arg("run")
        .arg(example)
        .args(["--lambdas", "1", "--servers", "0", "--cpu-ms", "600000", "--wall-ms", "600000", "--json", "--input"])
        .arg(&input)
        .output()
        .map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&input);
    let out = out?;
    let s = String::from_utf8_lossy(&out.stdout);
    let num_after = |key: &str| -> Option<f64> {
        let i = s.find(key)? + key.len();
        let rest = s[i..].trim_start_matches([' ', ':', '"', '\\']);
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+')).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    let cpu = num_after("\"cpu_ms\"").ok_or_else(|| format!("no cpu_ms in psl output: {s} {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((cpu, num_after("estimate")))
}

fn js(p: &Params, psl: Option<PathBuf>, root: &Path) -> Js {
    let psl = psl.unwrap_or_else(|| root.join("../../target/release/psl"));
    let example = root.join("../../examples/montecarlo.js");
    if !psl.exists() || !example.exists() {
        return Js::Skipped(format!("{} or {} not found", psl.display(), example.display()));
    }
    eprintln!("js: {} run {} ({} points, and 0 points for the fixed cost)", psl.display(), example.display(), p.points);
    let run = || -> Result<Js, String> {
        let (cpu_zero, _) = js_once(&psl, &example, 0)?;
        let mut cpus = Vec::new();
        let mut est = None;
        for _ in 0..p.reps.min(3) {
            let (cpu, e) = js_once(&psl, &example, p.points)?;
            cpus.push(cpu);
            est = e;
        }
        let cpu = stats::median(cpus);
        Ok(Js::Ran {
            ns_per_point: (cpu - cpu_zero) * 1e6 / p.points as f64,
            cpu_ms: cpu,
            cpu_ms_zero: cpu_zero,
            points: p.points,
            inside: est.map(|e| (e * p.points as f64 / 4.0).round() as u32),
        })
    };
    run().unwrap_or_else(Js::Skipped)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    let psl = args.iter().position(|a| a == "--psl").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let results = root.join("results");
    let _ = std::fs::create_dir_all(&results);

    let p = if has("--quick") {
        Params { inst_iters: 100, compile_iters: 20, compile_reps: 3, big_funcs: 100, host_calls: 100_000, points: 1_000_000, reps: 3 }
    } else {
        Params { inst_iters: 1000, compile_iters: 200, compile_reps: 5, big_funcs: 1000, host_calls: 1_000_000, points: 10_000_000, reps: 7 }
    };

    let builds = if has("--builds") {
        let mut v = Vec::new();
        for name in ["min-none", "min-wasmi", "min-wasmtime"] {
            match builds::measure(&root, name) {
                Ok(b) => v.push(b),
                Err(e) => {
                    eprintln!("build {name}: {e}");
                    std::process::exit(2);
                }
            }
        }
        builds::save(&results.join("builds.tsv"), &v);
        v
    } else {
        builds::load(&results.join("builds.tsv"))
    };

    eprintln!("native Monte Carlo");
    let native = native(&p);
    eprintln!("wasmtime");
    let wt = wt::run(&p).unwrap_or_else(|e| {
        eprintln!("wasmtime failed: {e:?}");
        std::process::exit(2)
    });
    eprintln!("wasmi");
    let wi = wi::run(&p).unwrap_or_else(|e| {
        eprintln!("wasmi failed: {e:?}");
        std::process::exit(2)
    });
    let js = if has("--js") || psl.is_some() { js(&p, psl, &root) } else { Js::Skipped("not asked (--js)".into()) };

    let all = All { machine: machine(), params: p, builds, native, js, rts: vec![wt, wi] };
    let md = all.markdown();
    let mut json = String::new();
    all.json().write(&mut json, 0);
    json.push('\n');
    let _ = std::fs::write(results.join("table.md"), &md);
    let _ = std::fs::write(results.join("results.json"), &json);
    println!("{md}");
    if has("--json") {
        println!("{json}");
    }
}
