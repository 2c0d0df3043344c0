//! A scheduler that flips one byte of the sealed program: the job fails with an integrity
//! error and no lambda runs.
mod common;
use psl_faas::FaasError;

#[test]
fn faas_flipped_program_byte_is_an_integrity_error_and_nothing_runs() {
    let d = common::deployment(2, vec![]);
    for pos in [0usize, 30, 60, 70] {
        d.scheduler.set_tamper(Some(Box::new(move |j| {
            let n = j.program.bytes.len();
            j.program.bytes[pos.min(n - 1)] ^= 0x20;
        })));
        let e = d
            .run_job(psl_faas::JobRequest {
                program: "put('ran', 'yes'); emit('ran')".into(),
                lambdas: 2,
                input: None,
                owner: None,
                rotate_after_ms: None,
            })
            .unwrap_err();
        assert!(matches!(e, FaasError::Integrity { .. }), "byte {pos}: {e}");
        assert!(e.to_string().contains("no lambda ran"), "{e}");
        for w in &d.workers {
            assert!(!w.debug().holds_keys);
        }
    }
    // The same deployment runs an honest job afterwards.
    d.scheduler.set_tamper(None);
    let r = common::run(&d, "emit('ran')", 2, None);
    assert!(r.ok);
}
