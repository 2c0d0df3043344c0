//! The read-through scenario over several seeds: a third of the ops first read their key
//! through CapsuleDB (the node takes in the newest version another node shows, with its
//! original version, often before it has applied the record that wrote it, with its clock
//! still below that version), then write it. Right after each write, its node must show the
//! write's version, newer than what it showed before: the write supersedes what was read. On
//! the code before `0a5bce8` (the clock not passing a learnt version, a write applied once with
//! the memtable's refusal ignored) every seed fails this at once.

use psl_sim::{run_seed, SimConfig};

#[test]
fn a_write_after_a_read_through_capsuledb_supersedes_what_was_read() {
    let cfg = SimConfig::read_through();
    let cfg2 = cfg.clone();
    let replay = |s: u64| format!("replay: psl sim --scenario read-through --seeds 1 --start {s}");
    let t = std::thread::spawn(move || {
        (3004..3008).map(|s| run_seed(s, &cfg2).unwrap_or_else(|v| panic!("{v}\n{}", replay(s)))).collect::<Vec<_>>()
    });
    let mut reports: Vec<_> =
        (3000..3004).map(|s| run_seed(s, &cfg).unwrap_or_else(|v| panic!("{v}\n{}", replay(s)))).collect();
    reports.extend(t.join().expect("the second half holds too"));
    for r in &reports {
        assert!(r.read_throughs > 0, "seed {}: no op read through CapsuleDB", r.seed);
    }
}
