//! Each seed's report as a JSON line, as `psl sim --json` prints it (without the `psl` binary):
//! `cargo run -p psl-sim --example sim_json -- SCENARIO SEEDS [START]`. Used to check that a
//! refactor of the simulator changes no seed's run (diff the output before and after).

use psl_sim::{run_seed, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let scenario = args.get(1).map(String::as_str).unwrap_or("scl");
    let seeds: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(60);
    let start: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    let cfg = match scenario {
        "durability" => SimConfig::durability(),
        "revocation" => SimConfig::revocation(),
        "read-through" => SimConfig::read_through(),
        "coordinator-rejoin" => SimConfig::coordinator_rejoin(),
        "scl" => SimConfig::default(),
        other => panic!("unknown scenario {other}"),
    };
    for s in start..start + seeds {
        match run_seed(s, &cfg) {
            Ok(r) => println!("{}", serde_json::to_string(&r).unwrap_or_default()),
            Err(v) => println!("FAILED {v}"),
        }
    }
}
