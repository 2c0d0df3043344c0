fn main() {
    let seed: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    match psl_sim::run_seed(seed, &psl_sim::SimConfig::default()) {
        Ok(r) => println!("{r:?}"),
        Err(v) => println!("VIOLATION {v}"),
    }
}
