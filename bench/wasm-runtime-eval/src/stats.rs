//! Timing helpers and a tiny JSON writer (no serde: the harness stays small).
#![allow(dead_code)]

use std::fmt::Write;
use std::time::Duration;

/// A distribution of per-iteration times, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Dist {
    pub n: usize,
    pub median_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub min_us: f64,
}

pub fn dist(mut v: Vec<Duration>) -> Dist {
    assert!(!v.is_empty());
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let n = v.len();
    let pick = |q: f64| us(v[((n as f64 * q).ceil() as usize).clamp(1, n) - 1]);
    Dist {
        n,
        median_us: pick(0.5),
        p99_us: pick(0.99),
        mean_us: v.iter().map(|d| us(*d)).sum::<f64>() / n as f64,
        min_us: us(v[0]),
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[(v.len() - 1) / 2]
}

/// A JSON value.
#[derive(Debug, Clone)]
pub enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    pub fn obj(fields: Vec<(&str, J)>) -> J {
        J::Obj(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
    pub fn s(v: impl Into<String>) -> J {
        J::Str(v.into())
    }
    pub fn n(v: f64) -> J {
        if v.is_finite() { J::Num(v) } else { J::Null }
    }
    pub fn opt(v: Option<f64>) -> J {
        v.map(J::n).unwrap_or(J::Null)
    }
    pub fn dist(d: &Dist) -> J {
        J::obj(vec![
            ("n", J::n(d.n as f64)),
            ("median_us", J::n(r3(d.median_us))),
            ("p99_us", J::n(r3(d.p99_us))),
            ("mean_us", J::n(r3(d.mean_us))),
            ("min_us", J::n(r3(d.min_us))),
        ])
    }
    pub fn write(&self, out: &mut String, indent: usize) {
        let pad = |out: &mut String, i: usize| out.push_str(&"  ".repeat(i));
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Num(v) => {
                if v.fract() == 0.0 && v.abs() < 1e15 {
                    let _ = write!(out, "{}", *v as i64);
                } else {
                    let _ = write!(out, "{v}");
                }
            }
            J::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => {
                            let _ = write!(out, "\\u{:04x}", c as u32);
                        }
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            J::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push('\n');
                    pad(out, indent + 1);
                    v.write(out, indent + 1);
                }
                if !items.is_empty() {
                    out.push('\n');
                    pad(out, indent);
                }
                out.push(']');
            }
            J::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push('\n');
                    pad(out, indent + 1);
                    J::Str(k.clone()).write(out, indent + 1);
                    out.push_str(": ");
                    v.write(out, indent + 1);
                }
                if !fields.is_empty() {
                    out.push('\n');
                    pad(out, indent);
                }
                out.push('}');
            }
        }
    }
    pub fn get(&self, key: &str) -> Option<&J> {
        match self {
            J::Obj(f) => f.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn num(&self) -> Option<f64> {
        match self {
            J::Num(v) => Some(*v),
            _ => None,
        }
    }
}

/// Rounds to 3 decimals for the report.
pub fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Rounds to 2 decimals for the report.
pub fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
