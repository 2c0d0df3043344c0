//! `psl-tools plot-scale --out F.png`: the curve of `psl sim --scenario scale --plot F.png`.
//! The simulator runs in `psl`; it hands its JSON rows (one per line) to this hidden
//! subcommand on stdin, so that `psl` links no plotting library.

use anyhow::{Context, Result};
use std::io::BufRead;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct PlotScaleArgs {
    /// The PNG file to draw.
    #[arg(long)]
    out: PathBuf,
}

/// Reads the rows from stdin and draws them into `--out`.
pub fn run(a: PlotScaleArgs) -> Result<i32> {
    let mut rows = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading the rows")?;
        if !line.trim().is_empty() {
            rows.push(serde_json::from_str(&line).context("a row's JSON")?);
        }
    }
    plot(&rows, &a.out)?;
    Ok(0)
}

/// A number of a row, zero where missing.
fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// The curve: per-node KiB/s received (subjects, flood), KiB of memory per node, and the
/// deployment's ops applied per second (its throughput), against N, on log-log axes, with the
/// report's embedded font.
fn plot(rows: &[serde_json::Value], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    crate::report::plots::init_font()?;
    let pts = |key: &str, scale: f64| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|r| (num(&r["config"]["nodes"]), (num(&r[key]["mean"]).max(num(&r[key])) / scale).max(1e-3)))
            .collect()
    };
    let sub = pts("bytes_received_per_s", 1024.0);
    let flood = pts("flood_bytes_received_per_s", 1024.0);
    let mem: Vec<(f64, f64)> =
        rows.iter().map(|r| (num(&r["config"]["nodes"]), (num(&r["rss_per_node_bytes"]) / 1024.0).max(1e-3))).collect();
    let xmax = sub.iter().map(|p| p.0).fold(10.0, f64::max) * 1.5;
    let xmin = sub.iter().map(|p| p.0).fold(f64::MAX, f64::min).min(10.0) / 1.5;
    let ops: Vec<(f64, f64)> =
        rows.iter().map(|r| (num(&r["config"]["nodes"]), num(&r["ops_applied_per_s"]).max(1e-3))).collect();
    let root = BitMapBackend::new(path, (1800, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, rest) = root.split_horizontally(620);
    let (right, third) = rest.split_horizontally(590);
    let ymax = flood.iter().chain(&sub).map(|p| p.1).fold(1.0, f64::max) * 3.0;
    let ymin = flood.iter().chain(&sub).map(|p| p.1).fold(f64::MAX, f64::min).min(1.0) / 3.0;
    let mut c = ChartBuilder::on(&left)
        .caption("KiB/s received per node", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin..xmax).log_scale(), (ymin..ymax).log_scale())?;
    c.configure_mesh().x_desc("nodes (10 per shard)").y_desc("KiB/s").label_style(("sans-serif", 15)).draw()?;
    c.draw_series(LineSeries::new(flood.clone(), RED.stroke_width(2)))?
        .label("unfiltered fan-out (every message to every node)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    c.draw_series(flood.iter().map(|p| Circle::new(*p, 4, RED.filled())))?;
    c.draw_series(LineSeries::new(sub.clone(), BLUE.stroke_width(2)))?
        .label("NATS subjects (own capsule, own role)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    c.draw_series(sub.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))?;
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    one_series(&right, "memory per node (resident)", "KiB", &mem, (xmin, xmax), &GREEN)?;
    one_series(&third, "ops applied per second, whole deployment", "ops/s", &ops, (xmin, xmax), &MAGENTA)?;
    root.present()?;
    Ok(())
}

/// A log-log panel of one series against the node count.
fn one_series<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    pts: &[(f64, f64)],
    (xmin, xmax): (f64, f64),
    color: &plotters::prelude::RGBColor,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    let ymax = pts.iter().map(|p| p.1).fold(1.0, f64::max) * 3.0;
    let ymin = pts.iter().map(|p| p.1).fold(f64::MAX, f64::min).min(1.0) / 3.0;
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin..xmax).log_scale(), (ymin..ymax).log_scale())?;
    c.configure_mesh().x_desc("nodes (10 per shard)").y_desc(y_desc).label_style(("sans-serif", 15)).draw()?;
    c.draw_series(LineSeries::new(pts.to_vec(), color.stroke_width(2)))?;
    c.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    Ok(())
}
