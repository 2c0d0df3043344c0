//! A job's coordinator runs on its own coordinator host, with a shadow on another: stopping
//! the primary's host mid-job (the embedded deployment's fault hook) leaves the job to the
//! shadow, which takes over the SYNCs; every lambda's `sync()` keeps returning and the job's
//! result is the correct one.

use psl_faas::{Deployment, DeploymentConfig, JobRequest};
use psl_sandbox::SandboxLimits;
use std::time::Duration;

/// Rounds of `put` + `sync()` per lambda, then lambda 0 sums every lambda's writes (shared with
/// the multi-process test).
const PROGRAM: &str = include_str!("data/sync_rounds.js");

#[test]
fn faas_coordinator_failover_shadow_takes_over_when_the_primary_is_killed() {
    let d = Deployment::start(DeploymentConfig {
        workers: 2,
        coordinators: 2,
        kill_primary_coordinator_after_ms: Some(300),
        limits: SandboxLimits { wall_time: Duration::from_secs(60), ..SandboxLimits::default() },
        ..DeploymentConfig::default()
    })
    .unwrap();
    let r = d
        .run_job(JobRequest { program: PROGRAM.into(), lambdas: 4, input: None, owner: None, rotate_after_ms: None })
        .unwrap();
    assert!(r.ok, "{:?}", r.lambdas);
    let out: serde_json::Value = serde_json::from_str(&r.lambdas[0].emitted[0]).unwrap();
    assert_eq!(out["missing"], 0, "{out}");
    assert_eq!(out["sum"], 4 * (49 * 50 / 2), "{out}");
    assert_eq!(r.coordinators.len(), 2, "{:?}", r.coordinators);
    let (primary, shadow) = (&r.coordinators[0], &r.coordinators[1]);
    assert_eq!((primary.rank, shadow.rank), (0, 1));
    assert!(!primary.alive, "the primary was killed: {primary:?}");
    assert!(primary.records_written > 0, "the primary ran before it was killed: {primary:?}");
    assert!(shadow.alive, "{shadow:?}");
    // The shadow wrote RTS and SYNC records under a term of its own (term 1 for rank 1).
    assert!(shadow.records_written > 10, "the shadow took over: {shadow:?}");
    assert!(shadow.epoch >> 32 >= 1, "the job ended in the shadow's term: {shadow:?}");
    assert!(shadow.syncs_applied > 0, "{shadow:?}");
}

#[test]
fn faas_coordinator_failover_shadow_stays_passive_while_the_primary_runs() {
    let d = Deployment::start(DeploymentConfig { workers: 2, coordinators: 2, ..DeploymentConfig::default() }).unwrap();
    let r = d
        .run_job(JobRequest { program: PROGRAM.into(), lambdas: 2, input: None, owner: None, rotate_after_ms: None })
        .unwrap();
    assert!(r.ok, "{:?}", r.lambdas);
    let out: serde_json::Value = serde_json::from_str(&r.lambdas[0].emitted[0]).unwrap();
    assert_eq!(out["sum"], 2 * (49 * 50 / 2), "{out}");
    let (primary, shadow) = (&r.coordinators[0], &r.coordinators[1]);
    assert!(primary.alive && shadow.alive, "{:?}", r.coordinators);
    assert!(shadow.syncs_applied > 0, "the shadow follows the SYNCs: {shadow:?}");
    // Unless the primary went silent for 20 epochs (a stall of a loaded machine: the shadow
    // then takes over, which is safe), the shadow stays passive: it writes no RTS or SYNC, only
    // its certificate and the revocations of the job's end (one Cert record each), which every
    // coordinator carries into the log.
    if shadow.epoch >> 32 == 0 {
        assert!(primary.records_written > 10, "{primary:?}");
        assert!(shadow.records_written <= 4, "a passive shadow signs no RTS or SYNC: {shadow:?}");
    }
}
