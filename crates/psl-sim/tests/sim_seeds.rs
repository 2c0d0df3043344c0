//! The simulator over many seeds: every invariant holds on every seed.

use psl_sim::{run_seed, SimConfig};

fn run_range(start: u64, count: u64, cfg: &SimConfig) {
    // Two threads: the suite runs on two cores.
    let half = count / 2;
    let cfg2 = cfg.clone();
    let t = std::thread::spawn(move || {
        for s in start + half..start + count {
            if let Err(v) = run_seed(s, &cfg2) {
                panic!("{v}\nreplay: psl sim --seeds 1 --start {s}");
            }
        }
    });
    for s in start..start + half {
        if let Err(v) = run_seed(s, cfg) {
            panic!("{v}\nreplay: psl sim --seeds 1 --start {s}");
        }
    }
    t.join().expect("second half holds too");
}

#[test]
fn calm_network_converges_to_the_model() {
    run_range(0, 4, &SimConfig::calm());
}

/// A sample of seeds (the suite stays fast); `psl sim --seeds 1000` runs the many.
#[test]
fn faulty_seeds_hold_every_invariant() {
    run_range(1000, 64, &SimConfig::default());
}

#[test]
fn a_seed_replays_exactly() {
    let cfg = SimConfig::default();
    let a = run_seed(77, &cfg).expect("holds");
    let b = run_seed(77, &cfg).expect("holds");
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
