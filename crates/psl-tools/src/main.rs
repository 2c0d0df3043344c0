//! `psl-tools`: the tools of PSL that are not the product: benchmarks, the report and the chaos
//! runner. Users reach them through `psl bench`, `psl report` and `psl chaos`: the `psl` binary
//! runs this one, found beside it, with the same arguments (`psl::tools`). Keeping them here
//! keeps their dependencies (plotters and its font, HdrHistogram, fjall, the load generator)
//! out of the binary that runs the roles. This binary starts `psl` roles from the `psl` found
//! beside it (`psl::util::sibling_exe`).
//!
//! Module map:
//! - `bench`: benchmarks that print one JSON object (`psl bench NAME --json`); `bench::loadgen`,
//!   the reusable YCSB load generator behind `psl bench ycsb`.
//! - `report`: `psl report --out DIR`: every benchmark, as plots and tables (md, html, json).
//! - `chaos`: seeded fault schedules over real processes and a checker (`psl chaos`).
//! - `scale_plot`: the curve `psl sim --scenario scale --plot F.png` draws (a hidden
//!   subcommand: `psl sim` hands it the rows on stdin).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
mod bench;
mod chaos;
mod report;
mod scale_plot;

use clap::{Parser, Subcommand};

// jemalloc, as in `psl`: the in-process benchmarks measure the allocator the product runs on.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "psl-tools",
    version = psl::VERSION,
    about = "PSL's tools: benchmarks, the report and the chaos runner (also run as `psl bench`, `psl report`, `psl chaos`)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a benchmark; `--json` prints one JSON object.
    Bench(bench::BenchArgs),
    /// Run every benchmark and write a report (markdown, self-contained HTML, PNG plots, JSON).
    Report(report::ReportArgs),
    /// Run seeded fault schedules over real processes on loopback and check the history;
    /// exit 0 only if every seed passes every check.
    Chaos(chaos::ChaosArgs),
    /// Draw `psl sim --scenario scale`'s curve from its JSON rows (one per line, on stdin).
    #[command(hide = true)]
    PlotScale(scale_plot::PlotScaleArgs),
}

fn main() {
    psl::init_tracing();
    let cli = Cli::parse();
    psl::exit_with(match cli.cmd {
        Cmd::Bench(a) => bench::run(a),
        Cmd::Report(a) => report::run(a),
        Cmd::Chaos(a) => chaos::run(a),
        Cmd::PlotScale(a) => scale_plot::run(a),
    })
}
