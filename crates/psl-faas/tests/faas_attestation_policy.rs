//! A worker whose measurement is not in the policy gets no key: the job runs on the others, or
//! fails clearly when none remain.
mod common;
use psl_faas::{FaasError, JobRequest};

#[test]
fn faas_unmeasured_worker_gets_no_key_and_job_completes_on_others() {
    let d = common::deployment(3, vec![2]);
    let r = common::run(&d, "put('k' + lambda.id, 'v'); emit(lambda.id);", 3, None);
    assert!(r.ok);
    assert_eq!(r.refused_workers.len(), 1);
    assert_eq!(r.refused_workers[0].0, 2);
    assert!(r.refused_workers[0].1.contains("measurement"), "{:?}", r.refused_workers);
    assert!(r.lambdas.iter().all(|l| l.worker != 2), "worker 2 ran a lambda");
    let mut ids: Vec<u32> = r.lambdas.iter().map(|l| l.lambda).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1, 2], "every lambda ran on the attested workers");
    assert!(!d.workers[1].debug().holds_keys);
}

#[test]
fn faas_job_fails_clearly_when_no_worker_attests() {
    let d = common::deployment(2, vec![1, 2]);
    let e = d
        .run_job(JobRequest { program: "emit(1)".into(), lambdas: 2, input: None, owner: None, rotate_after_ms: None })
        .unwrap_err();
    assert!(matches!(e, FaasError::TooFewWorkers { attested: 0, .. }), "{e}");
    assert!(e.to_string().contains("measurement"), "{e}");
    for w in &d.workers {
        assert!(!w.debug().holds_keys);
    }
    assert!(!d.leader.holds_keys());
}
