//! Prints the boundary crossing benchmark as JSON.
//!
//! ```text
//! cargo run --release -p psl-boundary --features bench --example crossings -- [--round-trips N] [--warmup N]
//!     [--rounds N] [--stream-items N] [--capacity N] [--record-bytes N] [--no-os] [--no-pin]
//! ```

use psl_boundary::{bench_crossings, CrossingConfig};

fn main() {
    let mut cfg = CrossingConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut number = |name: &str| -> usize {
            let v = args.next().unwrap_or_else(|| die(&format!("{name} needs a value")));
            v.parse().unwrap_or_else(|_| die(&format!("{name}: not a number: {v}")))
        };
        match flag.as_str() {
            "--round-trips" => cfg.round_trips = number("--round-trips"),
            "--warmup" => cfg.warmup = number("--warmup"),
            "--rounds" => cfg.rounds = number("--rounds"),
            "--stream-items" => cfg.stream_items = number("--stream-items"),
            "--capacity" => cfg.ring_capacity = number("--capacity"),
            "--record-bytes" => cfg.record_bytes = number("--record-bytes"),
            "--no-os" => cfg.os_cases = false,
            "--no-pin" => cfg.pin = false,
            "-h" | "--help" => {
                println!("see the doc comment of examples/crossings.rs");
                return;
            }
            other => die(&format!("unknown argument {other}")),
        }
    }
    let report = bench_crossings(cfg);
    println!("{}", serde_json::to_string_pretty(&report).expect("the report serializes"));
}

fn die(msg: &str) -> ! {
    eprintln!("crossings: {msg}");
    std::process::exit(2);
}
