//! A process's memory budget: each long-running role (`psl node`, `psl coordinator`,
//! `psl memcached`, `psl capsuledb`, `psl capsule-server`, `psl router`) takes
//! `--memory-budget-mb`, sizes its bounded structures (repair caches, item memory) from it,
//! and watches its own resident memory against it: [`watch`] samples `VmRSS` every 250 ms
//! (every 2 s while the process is below half its budget: a sample and the wake-up before it
//! cost some 60–140 µs, which an idle deployment of a dozen roles noticed),
//! keeps the peak, counts the samples above the budget and warns (at most every 10 s) when the
//! process is over it. The figures are in every node's `METRICS` (`psl_process_*`) and
//! `psl bench cluster` reports each role's peak against its budget.
//!
//! A budget is a target the role is sized to stay within, not a hard cap: nothing is killed
//! or refused when it is crossed (the role's own bounds, the queues, caches and item memory,
//! are what hold it), but a crossing is visible at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

static BUDGET_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static LAST_BYTES: AtomicU64 = AtomicU64::new(0);
static OVER_SAMPLES: AtomicU64 = AtomicU64::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);

/// How often [`watch`] samples when the process is at or above half its budget (or has none).
pub const SAMPLE_MS: u64 = 250;
/// How often it samples below half its budget.
pub const SAMPLE_FAR_MS: u64 = 2_000;

/// This process's resident memory now, from `/proc/self/status` (`None` where there is none).
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&s, "VmRSS:").map(|k| k.saturating_mul(1024))
}

/// The value in KiB of a `/proc/<pid>/status` line such as `VmRSS:   1234 kB`.
pub fn kib_field(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The budget this process watches against, in bytes (0: none).
pub fn budget_bytes() -> u64 {
    BUDGET_BYTES.load(Ordering::Relaxed)
}

/// A MiB budget in bytes.
pub fn mib(mb: u64) -> u64 {
    mb.saturating_mul(1 << 20)
}

/// Starts watching this process against `budget_mb` (once per process; a later call only
/// changes the budget). `role` names the process in the warnings.
pub fn watch(role: &str, budget_mb: u64) {
    BUDGET_BYTES.store(mib(budget_mb), Ordering::Relaxed);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let role = role.to_string();
    let spawned = std::thread::Builder::new().name("memory-budget".into()).spawn(move || {
        let mut warned: Option<Instant> = None;
        loop {
            let mut far = false;
            if let Some(now) = resident_bytes() {
                far = now < budget_bytes() / 2;
                LAST_BYTES.store(now, Ordering::Relaxed);
                PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
                let budget = budget_bytes();
                if budget > 0 && now > budget {
                    OVER_SAMPLES.fetch_add(1, Ordering::Relaxed);
                    if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(
                            role = %role,
                            resident_mib = now >> 20,
                            budget_mib = budget >> 20,
                            "resident memory above the role's budget (--memory-budget-mb)"
                        );
                        warned = Some(Instant::now());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(if far { SAMPLE_FAR_MS } else { SAMPLE_MS }));
        }
    });
    if spawned.is_err() {
        tracing::warn!("could not start the memory budget watch");
        STARTED.store(false, Ordering::Release);
    }
}

/// The watch's figures as Prometheus text (empty when no watch runs).
pub fn render_metrics() -> String {
    if !STARTED.load(Ordering::Acquire) {
        return String::new();
    }
    let mut s = String::new();
    for (name, kind, v) in [
        ("process_resident_bytes", "gauge", LAST_BYTES.load(Ordering::Relaxed)),
        ("process_resident_peak_bytes", "gauge", PEAK_BYTES.load(Ordering::Relaxed)),
        ("process_memory_budget_bytes", "gauge", budget_bytes()),
        ("process_over_budget_samples_total", "counter", OVER_SAMPLES.load(Ordering::Relaxed)),
    ] {
        s.push_str(&format!("# TYPE psl_{name} {kind}\npsl_{name} {v}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse_and_this_process_has_a_resident_size() {
        let st = "Name:\tpsl\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(kib_field(st, "VmRSS:"), Some(1024));
        assert_eq!(kib_field(st, "VmHWM:"), Some(2048));
        assert_eq!(kib_field(st, "VmSwap:"), None);
        assert_eq!(kib_field("VmRSS:\tlots kB\n", "VmRSS:"), None);
        assert!(resident_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn the_watch_reports_its_budget_and_counts_samples_above_it() {
        // A budget of 1 MiB: any process is above it.
        watch("test", 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while OVER_SAMPLES.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "no sample above a 1 MiB budget");
            std::thread::sleep(Duration::from_millis(20));
        }
        let m = render_metrics();
        assert!(m.contains("psl_process_memory_budget_bytes 1048576"), "{m}");
        assert!(m.contains("psl_process_resident_peak_bytes "), "{m}");
        assert!(PEAK_BYTES.load(Ordering::Relaxed) >= LAST_BYTES.load(Ordering::Relaxed).min(1));
    }
}
