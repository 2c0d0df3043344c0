//! `bench_crossings` runs end to end with tiny numbers. No timing is asserted.

use psl_boundary::{bench_crossings, CrossingConfig};

fn tiny() -> CrossingConfig {
    CrossingConfig {
        round_trips: 60,
        warmup: 5,
        rounds: 2,
        record_bytes: 64,
        ring_capacity: 8,
        stream_items: 500,
        stream_batch: 16,
        os_cases: true,
        pin: true,
    }
}

#[test]
fn bench_smoke() {
    let report = bench_crossings(tiny());
    let names: Vec<&str> = report.cases.iter().map(|c| c.name).collect();
    assert_eq!(names, ["ring", "ring_unpaired", "floor", "floor_two_line", "rtrb", "mpsc", "pipe"]);
    for case in &report.cases {
        assert_eq!(case.samples, 60, "{}", case.name);
        assert!(case.p10 <= case.median && case.median <= case.p90, "{case:?}");
    }
    assert_eq!(report.pinned, report.cores.len() == 2);
    if !report.pinned {
        assert!(!report.notes.is_empty(), "an unpinned run must say why");
    }

    let json = serde_json::to_value(&report).unwrap();
    for key in psl_boundary::HEADLINE_KEYS {
        assert!(json.get(key).is_some(), "report lacks {key}");
    }
    assert!(json["ring_cycles_median"].is_number());
    assert!(json["pinned"].is_boolean());
}

#[test]
fn bench_smoke_unpinned_without_os_cases() {
    let report = bench_crossings(CrossingConfig { pin: false, os_cases: false, stream_items: 0, ..tiny() });
    assert!(!report.pinned);
    assert!(report.cores.is_empty());
    assert_eq!(report.cases.len(), 5);
    assert_eq!(report.mpsc_cycles_median, 0.0);
    assert_eq!(report.ring_stream_items_per_s, 0.0);
    assert!(report.notes.iter().any(|n| n.contains("unpinned")));
}
