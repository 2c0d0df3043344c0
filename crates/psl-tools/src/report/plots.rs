//! PNG plots for the report (`plotters`' bitmap backend). Text is drawn with DejaVu Sans,
//! embedded in the binary (`crates/psl-tools/assets/fonts`, Bitstream Vera licence, which allows
//! redistribution with the notice kept beside it) and registered with plotters' `ab_glyph`
//! backend, so no system font library or font file is needed where the report runs.
//!
//! Every plot carries a footer: the machine, the date, the commit, and what its ratio means.
//! Log scales are drawn as a linear axis over log10 of the values, labelled with the values.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const W: u32 = 1000;
const H: u32 = 560;
const FOOT_H: u32 = 64;
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

pub(crate) fn init_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded font did not load"))
    }
}

pub fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// 1234567 → "1.23M", 12345 → "12.3k", 0.0123 → "0.0123".
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let ax = x.abs();
    let s = if ax >= 100.0 || ax == 0.0 {
        format!("{x:.0}")
    } else if ax >= 10.0 {
        format!("{x:.1}")
    } else if ax >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    };
    s + suffix
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// A named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn footer(area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>, lines: &[String]) -> Result<()> {
    let style = ("sans-serif", 13).into_font().color(&RGBColor(90, 90, 90));
    for (i, l) in lines.iter().take(4).enumerate() {
        area.draw(&Text::new(l.clone(), (12, 4 + 15 * i as i32), style.clone())).map_err(err)?;
    }
    Ok(())
}

fn y_range(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let v: Vec<f64> = vals.filter(|v| v.is_finite() && (!log || *v > 0.0)).collect();
    if v.is_empty() {
        return (0.0, 1.0);
    }
    let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    if log {
        let (l, h) = (lo.log10(), hi.log10());
        ((l - 0.15).floor().min(l - 0.1), h + 0.15)
    } else {
        (0.0, if hi > 0.0 { hi * 1.15 } else { 1.0 })
    }
}

fn yv(v: f64, log: bool) -> f64 {
    if log {
        v.max(1e-12).log10()
    } else {
        v
    }
}

/// Lines with points; `log_y` for values over orders of magnitude; `x_log2` for counts that
/// double (1, 2, 4, 8, 16).
#[allow(clippy::too_many_arguments)]
pub fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
    x_log2: bool,
    foot: &[String],
) -> Result<()> {
    init_font()?;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (main, bottom) = root.split_vertically(H - FOOT_H);
    footer(&bottom, foot)?;
    let xf = |x: f64| if x_log2 { x.max(1e-9).log2() } else { x };
    let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| xf(p.0))).collect();
    let (x0, x1) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    let (x0, x1) = if x0 > x1 { (0.0, 1.0) } else { (x0 - 0.3, x1 + 0.3) };
    let (y0, y1) = y_range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), log_y);
    let mut chart = ChartBuilder::on(&main)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let xfmt = |x: &f64| {
        if x_log2 {
            let r = x.round();
            if (x - r).abs() < 1e-6 {
                format!("{}", 2f64.powf(r))
            } else {
                String::new()
            }
        } else {
            fmt_num(*x)
        }
    };
    let yfmt = |y: &f64| if log_y { fmt_num(10f64.powf(*y)) } else { fmt_num(*y) };
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .x_labels(if x_log2 { ((x1 - x0) * 4.0).ceil() as usize + 1 } else { 10 })
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.1.is_finite() && (!log_y || p.1 > 0.0))
            .map(|p| (xf(p.0), yv(p.1, log_y)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Grouped bars: one group per category, one bar per series in each (values ≤ 0 or NaN are
/// left out); `stacked` stacks the series instead.
#[allow(clippy::too_many_arguments)]
pub fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
    log_y: bool,
    stacked: bool,
    foot: &[String],
) -> Result<()> {
    init_font()?;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (main, bottom) = root.split_vertically(H - FOOT_H);
    footer(&bottom, foot)?;
    let n = categories.len().max(1);
    let totals: Vec<f64> =
        (0..n).map(|i| series.iter().map(|s| s.1.get(i).copied().unwrap_or(0.0).max(0.0)).sum()).collect();
    let (y0, y1) = if stacked {
        y_range(totals.iter().copied(), log_y)
    } else {
        y_range(series.iter().flat_map(|s| s.1.iter().copied()), log_y)
    };
    let mut chart = ChartBuilder::on(&main)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), y0..y1)
        .map_err(err)?;
    let cats = categories.to_vec();
    let xfmt = move |x: &f64| {
        let r = x.round();
        if (x - r).abs() < 1e-6 && r >= 0.0 {
            cats.get(r as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let yfmt = |y: &f64| if log_y { fmt_num(10f64.powf(*y)) } else { fmt_num(*y) };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(2 * n + 1)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / if stacked { 1.0 } else { k };
    let mut base = vec![0.0f64; n];
    for (j, (name, vals)) in series.iter().enumerate() {
        let c = color(j);
        let mut rects = Vec::new();
        for (i, v) in vals.iter().enumerate().take(n) {
            if !v.is_finite() || *v <= 0.0 {
                continue;
            }
            let left = i as f64 - 0.4 + if stacked { 0.0 } else { j as f64 * width };
            let (lo, hi) = if stacked { (base[i], base[i] + v) } else { (0.0, *v) };
            base[i] += if stacked { *v } else { 0.0 };
            let bottom = if log_y {
                if lo > 0.0 {
                    yv(lo, true)
                } else {
                    y0
                }
            } else {
                lo
            };
            rects.push(Rectangle::new([(left, bottom), (left + width * 0.95, yv(hi, log_y))], c.filled()));
        }
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_format_compactly() {
        assert_eq!(fmt_num(1_234_567.0), "1.23M");
        assert_eq!(fmt_num(12_345.0), "12.3k");
        assert_eq!(fmt_num(461.0), "461");
        assert_eq!(fmt_num(0.5), "0.50");
        assert_eq!(fmt_num(0.0), "0");
    }

    #[test]
    fn plots_render_with_the_embedded_font() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("l.png");
        let s = vec![Series { name: "a".into(), points: vec![(1.0, 10.0), (2.0, 1000.0), (4.0, 0.0)] }];
        lines(&p, "title", "x", "y", &s, true, true, &["footer".into()]).unwrap();
        let b = d.path().join("b.png");
        bars(&b, "t", "y", &["x".into(), "y".into()], &[("s".into(), vec![1.0, f64::NAN])], false, true, &[]).unwrap();
        for f in [p, b] {
            let bytes = std::fs::read(&f).unwrap();
            assert!(bytes.starts_with(b"\x89PNG"), "{}", f.display());
        }
    }
}
