//! The durability scenario over many seeds: capsule servers with crash-prone disks (unsynced
//! writes lost or torn on a crash), nodes crashing and restarting empty, partitions and loss.
//! Every write a node counted durable stays on f + 1 servers' synced storage after every step
//! and reaches every memtable in the end; a node restarted empty and rebuilt from a majority of
//! the servers holds every durable write at once; no server stores a record no honest writer
//! sealed.

use psl_sim::{run_seed, SimConfig, Violation};

fn run_range(start: u64, count: u64, cfg: &SimConfig) -> Vec<psl_sim::SimReport> {
    let half = count / 2;
    let cfg2 = cfg.clone();
    let t = std::thread::spawn(move || {
        (start + half..start + count)
            .map(|s| {
                run_seed(s, &cfg2)
                    .unwrap_or_else(|v| panic!("{v}\nreplay: psl sim --scenario durability --seeds 1 --start {s}"))
            })
            .collect::<Vec<_>>()
    });
    let mut out: Vec<_> = (start..start + half)
        .map(|s| {
            run_seed(s, cfg)
                .unwrap_or_else(|v| panic!("{v}\nreplay: psl sim --scenario durability --seeds 1 --start {s}"))
        })
        .collect();
    out.extend(t.join().expect("second half holds too"));
    out
}

#[test]
fn durability_seeds_hold_every_invariant() {
    let reports = run_range(5000, 16, &SimConfig::durability());
    // The scenario must actually exercise what it claims to check.
    let sum = |f: fn(&psl_sim::SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    assert!(sum(|r| r.server_crashes) > 0, "no server crashed");
    assert!(sum(|r| r.crashes) > 0, "no node crashed");
    assert!(sum(|r| r.recoveries) > 0, "no node was rebuilt from the servers");
    assert!(sum(|r| r.records_lost_on_crash) > 0, "no crash lost an unsynced write");
    assert!(sum(|r| r.torn_writes) > 0, "no crash tore a write");
    assert!(reports.iter().all(|r| r.durable_records > 0), "a seed made nothing durable");
}

#[test]
fn servers_that_ack_before_the_fsync_are_caught() {
    let cfg = SimConfig { bug_ack_before_sync: true, server_crash: 0.01, ..SimConfig::durability() };
    let caught = (7000..7008).any(|s| matches!(run_seed(s, &cfg), Err(Violation::NotDurable { .. })));
    assert!(caught, "acking before the fsync went unnoticed on every seed");
}

#[test]
fn a_durability_seed_replays_exactly() {
    let cfg = SimConfig::durability();
    let a = run_seed(5003, &cfg).expect("holds");
    let b = run_seed(5003, &cfg).expect("holds");
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
