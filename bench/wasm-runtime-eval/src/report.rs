//! What each measurement produces, and the markdown and JSON made of it.

use crate::stats::{r2, r3, Dist, J};
use std::fmt::Write;

/// The CPU limit a run is armed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    None,
    Fuel,
    Epoch,
}

impl Limit {
    pub fn name(self) -> &'static str {
        match self {
            Limit::None => "none",
            Limit::Fuel => "fuel",
            Limit::Epoch => "epoch",
        }
    }
}

/// Iteration counts.
#[derive(Debug, Clone)]
pub struct Params {
    pub inst_iters: usize,
    pub compile_iters: usize,
    pub compile_reps: usize,
    pub big_funcs: usize,
    pub host_calls: u32,
    pub points: u32,
    pub reps: usize,
}

impl Params {
    pub fn json(&self) -> J {
        J::obj(vec![
            ("instantiations", J::n(self.inst_iters as f64)),
            ("compile_and_instantiate_iterations", J::n(self.compile_iters as f64)),
            ("compile_repetitions", J::n(self.compile_reps as f64)),
            ("big_module_functions", J::n(self.big_funcs as f64)),
            ("host_calls_per_run", J::n(self.host_calls as f64)),
            ("montecarlo_points", J::n(self.points as f64)),
            ("repetitions_median_of", J::n(self.reps as f64)),
        ])
    }
}

/// One runtime's results.
pub struct RtReport {
    pub name: &'static str,
    pub version: String,
    /// (variant, store + instantiate, that + one call + drop)
    pub inst: Vec<(String, Dist, Dist)>,
    /// (module, how, median ms)
    pub compile: Vec<(String, String, f64)>,
    /// (limit, ns per iteration with a host call, ns per iteration without, fuel per iteration)
    pub hostcall: Vec<(Limit, f64, f64, Option<f64>)>,
    /// (limit, ns per point, inside, fuel per point)
    pub mc: Vec<(Limit, f64, u32, Option<f64>)>,
    /// (check, passed, detail)
    pub limits: Vec<(String, bool, String)>,
}

impl RtReport {
    pub fn new(name: &'static str, version: &str) -> RtReport {
        RtReport {
            name,
            version: version.to_string(),
            inst: vec![],
            compile: vec![],
            hostcall: vec![],
            mc: vec![],
            limits: vec![],
        }
    }
    fn mc_ns(&self, l: Limit) -> Option<f64> {
        self.mc.iter().find(|m| m.0 == l).map(|m| m.1)
    }
    /// Per call, the loop's own cost (the same loop with a load instead) subtracted.
    fn call_ns(&self, l: Limit) -> Option<f64> {
        self.hostcall.iter().find(|m| m.0 == l).map(|m| m.1 - m.2)
    }
}

/// A clean release build of one minimal binary.
#[derive(Debug, Clone)]
pub struct Build {
    pub name: String,
    pub secs: f64,
    pub crates: usize,
    pub bytes: u64,
    pub stripped_bytes: u64,
    pub ran: String,
}

pub struct Native {
    pub ns_per_point: f64,
    pub inside: u32,
}

pub enum Js {
    Skipped(String),
    Ran { ns_per_point: f64, cpu_ms: f64, cpu_ms_zero: f64, points: u32, inside: Option<u32> },
}

pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub rustc: String,
}

pub struct All {
    pub machine: Machine,
    pub params: Params,
    pub builds: Vec<Build>,
    pub native: Native,
    pub js: Js,
    pub rts: Vec<RtReport>,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn f(v: Option<f64>, dec: usize) -> String {
    v.map(|v| format!("{v:.dec$}")).unwrap_or_else(|| "–".into())
}

impl All {
    fn build(&self, name: &str) -> Option<&Build> {
        self.builds.iter().find(|b| b.name == name)
    }

    pub fn markdown(&self) -> String {
        let mut o = String::new();
        let nat = self.native.ns_per_point;
        let _ = writeln!(o, "Machine: {} cores, {}; {}.\n", self.machine.nproc, self.machine.cpu, self.machine.rustc);
        let _ = writeln!(o, "### Summary\n");
        let _ = writeln!(
            o,
            "| runtime | clean release build, s (2 cores) | binary MiB (unstripped / stripped) | instantiate µs, median (p99) | compile + instantiate µs, median | ns per host call, loop cost subtracted (no limit / fuel / epoch) | Monte Carlo ns per point (no limit / fuel / epoch) | × native (no limit / fuel / epoch) |"
        );
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- | --- |");
        for rt in &self.rts {
            let b = self.build(&format!("min-{}", rt.name));
            let (pre, cold) = match rt.name {
                "wasmtime" => ("instantiate (InstancePre)", "compile + instantiate"),
                _ => ("instantiate (pre-parsed Module)", "parse + validate + instantiate"),
            };
            let pre = rt.inst.iter().find(|i| i.0 == pre);
            let cold = rt.inst.iter().find(|i| i.0 == cold);
            let _ = writeln!(
                o,
                "| {} {} | {} | {} | {} | {} | {} / {} / {} | {} / {} / {} | {} / {} / {} |",
                rt.name,
                rt.version,
                f(b.map(|b| b.secs), 1),
                b.map(|b| format!("{:.2} / {:.2}", mib(b.bytes), mib(b.stripped_bytes))).unwrap_or_else(|| "–".into()),
                pre.map(|i| format!("{:.1} ({:.1})", i.1.median_us, i.1.p99_us)).unwrap_or_default(),
                cold.map(|i| format!("{:.0}", i.1.median_us)).unwrap_or_default(),
                f(rt.call_ns(Limit::None), 1),
                f(rt.call_ns(Limit::Fuel), 1),
                f(rt.call_ns(Limit::Epoch), 1),
                f(rt.mc_ns(Limit::None), 2),
                f(rt.mc_ns(Limit::Fuel), 2),
                f(rt.mc_ns(Limit::Epoch), 2),
                f(rt.mc_ns(Limit::None).map(|v| v / nat), 1),
                f(rt.mc_ns(Limit::Fuel).map(|v| v / nat), 1),
                f(rt.mc_ns(Limit::Epoch).map(|v| v / nat), 1),
            );
        }
        if let Some(b) = self.build("min-none") {
            let _ = writeln!(
                o,
                "| native Rust (no runtime) | {:.1} | {:.2} / {:.2} | – | – | – | {:.2} | 1.0 |",
                b.secs,
                mib(b.bytes),
                mib(b.stripped_bytes),
                nat
            );
        } else {
            let _ = writeln!(o, "| native Rust (no runtime) | – | – | – | – | – | {nat:.2} | 1.0 |");
        }
        match &self.js {
            Js::Ran { ns_per_point, .. } => {
                let _ = writeln!(
                    o,
                    "| PSL JS today (QuickJS, `psl run examples/montecarlo.js`) | – | – | – | – | – | {ns_per_point:.1} | {:.0} |",
                    ns_per_point / nat
                );
            }
            Js::Skipped(why) => {
                let _ = writeln!(o, "\nPSL JS (QuickJS): skipped: {why}");
            }
        }

        let _ = writeln!(o, "\n### Instantiation (small module: 1 import, 1 page, 1 data segment; fuel engine; {} iterations)\n", self.params.inst_iters);
        let _ = writeln!(o, "`instantiate` = new Store with limiter and fuel + instantiate + memory export looked up; `cycle` = that + one call of `run()` (one host call) + drop of the store.\n");
        let _ = writeln!(o, "| runtime | variant | instantiate median µs | p99 µs | cycle median µs | cycle p99 µs |");
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
        for rt in &self.rts {
            for (name, i, c) in &rt.inst {
                let _ = writeln!(
                    o,
                    "| {} | {} (n={}) | {:.1} | {:.1} | {:.1} | {:.1} |",
                    rt.name, name, i.n, i.median_us, i.p99_us, c.median_us, c.p99_us
                );
            }
        }

        let _ = writeln!(o, "\n### Compile / parse time (median of {})\n", self.params.compile_reps);
        let _ = writeln!(o, "| runtime | module | how | ms |");
        let _ = writeln!(o, "| --- | --- | --- | --- |");
        for rt in &self.rts {
            for (m, how, ms) in &rt.compile {
                let _ = writeln!(o, "| {} | {} | {} | {:.3} |", rt.name, m, how, ms);
            }
        }

        let _ = writeln!(
            o,
            "\n### Host calls (`get(ptr, len)` reads the guest's memory; {} calls per run, median of {})\n",
            self.params.host_calls, self.params.reps
        );
        let _ = writeln!(o, "| runtime | CPU limit | ns per loop iteration with the call | ns per iteration, call replaced by a load | ≈ ns per call | fuel per iteration |");
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
        for rt in &self.rts {
            for (l, c, n, fuel) in &rt.hostcall {
                let _ = writeln!(o, "| {} | {} | {:.2} | {:.2} | {:.2} | {} |", rt.name, l.name(), c, n, c - n, f(*fuel, 1));
            }
        }

        let _ = writeln!(o, "\n### Monte Carlo ({} points, median of {}; native Rust {:.2} ns per point, inside = {})\n", self.params.points, self.params.reps, nat, self.native.inside);
        let _ = writeln!(o, "| runtime | CPU limit | ns per point | × native | inside (must equal native) | fuel per point |");
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
        for rt in &self.rts {
            for (l, ns, inside, fuel) in &rt.mc {
                let _ = writeln!(o, "| {} | {} | {:.2} | {:.2} | {} | {} |", rt.name, l.name(), ns, ns / nat, inside, f(*fuel, 1));
            }
        }
        if let Js::Ran { ns_per_point, cpu_ms, cpu_ms_zero, points, inside } = &self.js {
            let _ = writeln!(
                o,
                "| PSL JS (QuickJS) | PSL's CPU-time interrupt | {:.1} | {:.0} | {} | – |\n\nJS: lambda `cpu_ms` {:.0} for {} points minus {:.1} for 0 points.",
                ns_per_point,
                ns_per_point / nat,
                inside.map(|v| v.to_string()).unwrap_or("?".into()),
                cpu_ms,
                points,
                cpu_ms_zero
            );
        }

        let _ = writeln!(o, "\n### Limits enforced\n");
        let _ = writeln!(o, "| runtime | check | ok | detail |");
        let _ = writeln!(o, "| --- | --- | --- | --- |");
        for rt in &self.rts {
            for (c, ok, d) in &rt.limits {
                let _ = writeln!(o, "| {} | {} | {} | {} |", rt.name, c, if *ok { "yes" } else { "NO" }, d.replace('\n', " "));
            }
        }

        if !self.builds.is_empty() {
            let _ = writeln!(o, "\n### Builds (`cargo clean` then `cargo build --release --locked --offline`, warm registry)\n");
            let _ = writeln!(o, "| crate | wall s | crates compiled | binary bytes | stripped bytes | the binary printed |");
            let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
            for b in &self.builds {
                let _ = writeln!(o, "| {} | {:.1} | {} | {} | {} | {} |", b.name, b.secs, b.crates, b.bytes, b.stripped_bytes, b.ran);
            }
        }
        o
    }

    pub fn json(&self) -> J {
        let nat = self.native.ns_per_point;
        let rts = self
            .rts
            .iter()
            .map(|rt| {
                J::obj(vec![
                    ("runtime", J::s(rt.name)),
                    ("version", J::s(rt.version.clone())),
                    (
                        "instantiate",
                        J::Arr(
                            rt.inst
                                .iter()
                                .map(|(n, i, c)| J::obj(vec![("variant", J::s(n.clone())), ("instantiate", J::dist(i)), ("cycle", J::dist(c))]))
                                .collect(),
                        ),
                    ),
                    (
                        "compile_ms",
                        J::Arr(
                            rt.compile
                                .iter()
                                .map(|(m, h, ms)| J::obj(vec![("module", J::s(m.clone())), ("how", J::s(h.clone())), ("ms", J::n(r3(*ms)))]))
                                .collect(),
                        ),
                    ),
                    (
                        "host_call",
                        J::Arr(
                            rt.hostcall
                                .iter()
                                .map(|(l, c, n, fuel)| {
                                    J::obj(vec![
                                        ("limit", J::s(l.name())),
                                        ("ns_per_iteration_with_call", J::n(r3(*c))),
                                        ("ns_per_iteration_without_call", J::n(r3(*n))),
                                        ("ns_per_call", J::n(r3(c - n))),
                                        ("fuel_per_iteration", J::opt(*fuel)),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                    (
                        "montecarlo",
                        J::Arr(
                            rt.mc
                                .iter()
                                .map(|(l, ns, inside, fuel)| {
                                    J::obj(vec![
                                        ("limit", J::s(l.name())),
                                        ("ns_per_point", J::n(r3(*ns))),
                                        ("ratio_to_native", J::n(r2(ns / nat))),
                                        ("inside", J::n(*inside as f64)),
                                        ("matches_native", J::Bool(*inside == self.native.inside)),
                                        ("fuel_per_point", J::opt(*fuel)),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                    (
                        "limits",
                        J::Arr(
                            rt.limits
                                .iter()
                                .map(|(c, ok, d)| J::obj(vec![("check", J::s(c.clone())), ("ok", J::Bool(*ok)), ("detail", J::s(d.clone()))]))
                                .collect(),
                        ),
                    ),
                ])
            })
            .collect();
        J::obj(vec![
            (
                "machine",
                J::obj(vec![
                    ("nproc", J::n(self.machine.nproc as f64)),
                    ("cpu", J::s(self.machine.cpu.clone())),
                    ("rustc", J::s(self.machine.rustc.clone())),
                ]),
            ),
            ("params", self.params.json()),
            (
                "builds",
                J::Arr(
                    self.builds
                        .iter()
                        .map(|b| {
                            J::obj(vec![
                                ("crate", J::s(b.name.clone())),
                                ("wall_s", J::n(r2(b.secs))),
                                ("crates_compiled", J::n(b.crates as f64)),
                                ("binary_bytes", J::n(b.bytes as f64)),
                                ("stripped_bytes", J::n(b.stripped_bytes as f64)),
                                ("binary_mib", J::n(r2(mib(b.bytes)))),
                                ("stripped_mib", J::n(r2(mib(b.stripped_bytes)))),
                                ("ran", J::s(b.ran.clone())),
                            ])
                        })
                        .collect(),
                ),
            ),
            ("native", J::obj(vec![("ns_per_point", J::n(r3(nat))), ("inside", J::n(self.native.inside as f64))])),
            (
                "js",
                match &self.js {
                    Js::Skipped(why) => J::obj(vec![("skipped", J::s(why.clone()))]),
                    Js::Ran { ns_per_point, cpu_ms, cpu_ms_zero, points, inside } => J::obj(vec![
                        ("ns_per_point", J::n(r2(*ns_per_point))),
                        ("ratio_to_native", J::n(r2(ns_per_point / nat))),
                        ("lambda_cpu_ms", J::n(*cpu_ms)),
                        ("lambda_cpu_ms_zero_points", J::n(*cpu_ms_zero)),
                        ("points", J::n(*points as f64)),
                        ("inside", J::opt(inside.map(|v| v as f64))),
                    ]),
                },
            ),
            ("runtimes", J::Arr(rts)),
        ])
    }
}
