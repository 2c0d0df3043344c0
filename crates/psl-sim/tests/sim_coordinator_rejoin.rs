//! The coordinator-rejoin scenario over several seeds: the primary coordinator crashes and
//! restarts with the same writer index, its own chain taken back from its own-chain log, a
//! repair cache of four records and a rejoin period during which data records keep arriving
//! (so the cache has evicted its chain's head by the end of the rejoin). It must resume its
//! chain after the newest record it signed: no (writer, seq) is ever signed twice with
//! different hashes, and no node reports an equivocation. On the code before `bc2b57e` (the
//! head taken from the repair cache) most seeds re-sign seq 0 and the coordinator's core
//! panics on the chain-order assertion.

use psl_sim::{run_seed, SimConfig};

#[test]
fn a_restarted_coordinator_resumes_after_the_newest_seq_it_signed() {
    let cfg = SimConfig::coordinator_rejoin();
    let cfg2 = cfg.clone();
    let replay = |s: u64| format!("replay: psl sim --scenario coordinator-rejoin --seeds 1 --start {s}");
    let t = std::thread::spawn(move || {
        (4003..4006).map(|s| run_seed(s, &cfg2).unwrap_or_else(|v| panic!("{v}\n{}", replay(s)))).collect::<Vec<_>>()
    });
    let mut reports: Vec<_> =
        (4000..4003).map(|s| run_seed(s, &cfg).unwrap_or_else(|v| panic!("{v}\n{}", replay(s)))).collect();
    reports.extend(t.join().expect("the second half holds too"));
    let restarts: u64 = reports.iter().map(|r| r.coordinator_restarts).sum();
    assert!(restarts >= reports.len() as u64, "too few coordinator restarts: {restarts}");
}
