//! The seeded adversary: repeatable, rates honoured, transparent at rate 0, and usable both on
//! an endpoint and in the router's forwarding path.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{endpoint, recv_n, recv_until_quiet, router_config, tag, untag, wait_until};
use psl_fabric::{Adversarial, Fabric, FabricConfig, FaultConfig, FaultInjector, FaultStats, InProcHub, Router};

fn all_faults(seed: u64) -> FaultConfig {
    FaultConfig {
        seed,
        drop: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
        reorder_window: 5,
        delay: 0.1,
        delay_ms_max: 20,
        corrupt: 0.1,
        replay: 0.05,
        ..FaultConfig::default()
    }
}

/// Runs `n` messages through an injector on a virtual clock (1 ms per message), then flushes.
fn run(cfg: FaultConfig, n: u32) -> (Vec<Bytes>, FaultStats) {
    let mut inj = FaultInjector::new(cfg).unwrap();
    let t0 = Instant::now();
    let mut out = Vec::new();
    for i in 0..n {
        inj.push(tag(1, i, 24), t0 + Duration::from_millis(u64::from(i)), &mut out);
    }
    inj.poll(t0 + Duration::from_secs(3600), &mut out);
    assert_eq!(inj.held(), 0);
    (out, inj.stats())
}

#[test]
fn same_seed_repeats_the_same_fault_sequence() {
    let (a, sa) = run(all_faults(7), 3000);
    let (b, sb) = run(all_faults(7), 3000);
    assert_eq!(sa, sb);
    assert_eq!(a, b, "same seed, same input: the same output, byte for byte and in order");
    let (c, _) = run(all_faults(8), 3000);
    assert_ne!(a, c, "another seed gives other faults");
}

#[test]
fn same_seed_repeats_through_an_adversarial_endpoint() {
    // Faults that do not depend on timing: the receiver sees exactly the same sequence twice.
    let cfg = FaultConfig { seed: 42, drop: 0.2, duplicate: 0.1, corrupt: 0.1, replay: 0.1, ..FaultConfig::default() };
    let once = || {
        let hub = InProcHub::new(FabricConfig::default()).unwrap();
        let tx = Adversarial::on_publish(hub.endpoint("tx"), cfg.clone()).unwrap();
        let rx = hub.endpoint("rx");
        for i in 0..2000 {
            tx.publish(tag(0, i, 16)).unwrap();
        }
        (recv_until_quiet(&rx, Duration::from_millis(50), Duration::from_secs(5)), tx.stats().faults)
    };
    let (a, fa) = once();
    let (b, fb) = once();
    assert_eq!(fa, fb);
    assert_eq!(a, b);
    assert!(fa.dropped > 0 && fa.duplicated > 0 && fa.corrupted > 0 && fa.replayed > 0, "{fa:?}");
}

#[test]
fn rates_are_roughly_honoured_over_10000_messages() {
    let n = 10_000u32;
    let (out, s) = run(all_faults(1), n);
    let near = |what: &str, got: u64, expected: f64| {
        assert!(
            (got as f64 - expected).abs() <= 0.2 * expected,
            "{what}: {got} is not within 20% of the expected {expected:.0} ({s:?})"
        );
    };
    let n = f64::from(n);
    let kept = n * 0.9; // not dropped
    let copies = kept * 1.1; // with duplicates
    near("dropped", s.dropped, n * 0.1);
    near("corrupted", s.corrupted, kept * 0.1);
    near("duplicated", s.duplicated, kept * 0.1);
    near("delayed", s.delayed, copies * 0.1);
    near("reordered", s.reordered, copies * 0.9 * 0.1);
    near("replayed", s.replayed, n * 0.05);
    assert_eq!(s.messages, 10_000);
    // Conservation: everything that went in and was not dropped came out, plus the extras.
    assert_eq!(out.len() as u64, s.messages - s.dropped + s.duplicated + s.replayed);
    // Some reordering is visible in the output.
    let seqs: Vec<u32> = out.iter().map(|m| untag(m).1).collect();
    assert!(seqs.windows(2).filter(|w| w[1] < w[0]).count() > 100);
}

#[test]
fn all_rates_zero_is_transparent() {
    let (out, s) = run(FaultConfig { seed: 9, ..FaultConfig::default() }, 1000);
    assert_eq!(out, (0..1000).map(|i| tag(1, i, 24)).collect::<Vec<_>>());
    assert_eq!((s.messages, s.total()), (1000, 0));

    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let zero = FaultConfig::default();
    let a = Adversarial::new(hub.endpoint("a"), Some(zero.clone()), Some(zero.clone())).unwrap();
    let b = Adversarial::new(hub.endpoint("b"), Some(zero.clone()), Some(zero)).unwrap();
    for i in 0..500 {
        a.publish(tag(0, i, 40)).unwrap();
    }
    let got = recv_n(&b, 500, Duration::from_secs(5));
    assert_eq!(got, (0..500).map(|i| tag(0, i, 40)).collect::<Vec<_>>());
    assert_eq!(b.try_recv().unwrap(), None);
    assert_eq!(a.stats().faults.total() + b.stats().faults.total(), 0);
    assert_eq!(a.stats().faults.messages, 500);
}

#[test]
fn held_messages_are_released_on_both_sides_when_traffic_stops() {
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let hold = FaultConfig {
        seed: 3,
        delay: 0.5,
        delay_ms_max: 30,
        reorder: 0.5,
        reorder_window: 100, // more than will ever come: released by reorder_hold_ms_max
        reorder_hold_ms_max: 40,
        ..FaultConfig::default()
    };
    let tx = Adversarial::on_publish(hub.endpoint("tx"), hold.clone()).unwrap();
    let rx = Adversarial::on_receive(hub.endpoint("rx"), hold.for_stream(1)).unwrap();
    for i in 0..200 {
        tx.publish(tag(0, i, 16)).unwrap();
    }
    let got = recv_n(&rx, 200, Duration::from_secs(5));
    let mut seqs: Vec<u32> = got.iter().map(|m| untag(m).1).collect();
    assert_ne!(seqs, (0..200).collect::<Vec<_>>(), "the order was disturbed");
    seqs.sort_unstable();
    assert_eq!(seqs, (0..200).collect::<Vec<_>>(), "every message arrived once");
    let (p, r) = (tx.fault_stats().publish, rx.fault_stats().receive);
    assert!(p.delayed > 0 && p.reordered > 0 && r.delayed > 0 && r.reordered > 0, "{p:?} {r:?}");
}

#[test]
fn router_injects_faults_independently_on_each_link() {
    let cfg = FaultConfig { seed: 7, drop: 0.2, ..FaultConfig::default() };
    let r = Router::spawn(psl_fabric::RouterConfig { faults: Some(cfg), ..router_config(None) }).unwrap();
    let tx = endpoint(r.local_addr(), "tx");
    let rx1 = endpoint(r.local_addr(), "rx1");
    let rx2 = endpoint(r.local_addr(), "rx2");
    wait_until(Duration::from_secs(5), "three links", || r.stats().children() == 3);
    let n = 2000u32;
    for i in 0..n {
        tx.publish(tag(0, i, 32)).unwrap();
    }
    wait_until(Duration::from_secs(10), "every frame through both receivers' injectors", || {
        r.stats().links.iter().filter(|l| l.totals.faults.messages == u64::from(n)).count() == 2
    });
    let got1 = recv_until_quiet(&rx1, Duration::from_millis(200), Duration::from_secs(5));
    let got2 = recv_until_quiet(&rx2, Duration::from_millis(200), Duration::from_secs(5));
    for got in [&got1, &got2] {
        let frac = got.len() as f64 / f64::from(n);
        assert!((0.74..=0.86).contains(&frac), "about 80% delivered, got {frac}");
    }
    assert_ne!(got1, got2, "each link loses different frames");
    let s = r.stats();
    let dropped: u64 = s.links.iter().map(|l| l.totals.faults.dropped).sum();
    assert_eq!(dropped, 2 * u64::from(n) - (got1.len() + got2.len()) as u64, "every loss is counted");
    // Nothing travels back to the sender, faults or not.
    assert_eq!(tx.try_recv().unwrap(), None);
}
