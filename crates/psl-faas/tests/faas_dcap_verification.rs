//! The `dcap` verifier against real SGX and TDX quotes with recorded collateral
//! (tests/data, from the public dcap-qvl samples; see tests/data/README.md).

use psl_faas::attest::{AttestError, AttestPolicy, AttestVerifier, Evidence};
use psl_faas::attest_dcap::{
    inspect, split_report_data, DcapPolicy, DcapVerifier, StaticCollateral, VerifyTime, DCAP_BACKEND,
};
use std::sync::Arc;

/// 2025-06-20T00:00:00Z, inside the samples' collateral window.
const JUNE_2025: u64 = 1_750_377_600;
/// One year later: the same collateral is stale.
const JUNE_2026: u64 = 1_781_913_600;
/// 2026-02-25, after the outdated sample's collateral was issued (2026-02-18).
const FEB_25_2026: u64 = 1_771_977_600;
/// 2026-02-01, before that issue date.
const FEB_01_2026: u64 = 1_769_904_000;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).expect("sample file")
}

struct Sample {
    quote: Vec<u8>,
    collateral: Vec<u8>,
}

fn sample(name: &str) -> Sample {
    Sample { quote: data(name), collateral: data(&format!("{name}_collateral.json")) }
}

fn verifier(s: &Sample, policy: DcapPolicy) -> DcapVerifier {
    DcapVerifier::new(policy, Arc::new(StaticCollateral::from_json(&s.collateral).unwrap()))
}

fn at(t: u64) -> DcapPolicy {
    DcapPolicy { time: VerifyTime::At(t), ..DcapPolicy::default() }
}

/// The policy that admits exactly this quote's measurement, and the report data halves it binds.
fn own_policy(quote: &[u8]) -> (AttestPolicy, [u8; 32], [u8; 32]) {
    let (_, digests, rd) = inspect(quote).unwrap();
    let (bind, nonce) = split_report_data(&rd);
    (AttestPolicy { allowed: [digests[0]].into() }, bind, nonce)
}

fn evidence(quote: &[u8]) -> Evidence {
    Evidence { backend: DCAP_BACKEND, bytes: quote.to_vec() }
}

#[test]
fn sgx_quote_verifies_with_its_reported_tcb_status() {
    let s = sample("sgx_quote");
    let (policy, bind, nonce) = own_policy(&s.quote);
    let v = verifier(&s, at(JUNE_2025));
    let r = v.verify_quote(&s.quote, &policy).unwrap();
    assert_eq!(r.tee, "sgx");
    assert_eq!(r.tcb_status, "ConfigurationAndSWHardeningNeeded");
    let ok = v.verify(&evidence(&s.quote), &nonce, &bind, &policy).unwrap();
    assert_eq!(ok.measurement, r.measurement);
    // A policy that accepts only UpToDate platforms refuses it, naming the status.
    let strict = verifier(&s, DcapPolicy::strict(VerifyTime::At(JUNE_2025)));
    match strict.verify_quote(&s.quote, &policy) {
        Err(AttestError::TcbStatus { status, .. }) => assert_eq!(status, "ConfigurationAndSWHardeningNeeded"),
        other => panic!("expected a TCB status refusal, got {other:?}"),
    }
    // The enclave's signer identity may stand in for its MRENCLAVE.
    let (_, digests, _) = inspect(&s.quote).unwrap();
    let by_signer = AttestPolicy { allowed: [digests[1]].into() };
    assert_eq!(v.verify_quote(&s.quote, &by_signer).unwrap().measurement, digests[1]);
}

#[test]
fn tdx_quote_verifies_up_to_date() {
    let s = sample("tdx_quote");
    let (policy, bind, nonce) = own_policy(&s.quote);
    let v = verifier(&s, DcapPolicy::strict(VerifyTime::At(JUNE_2025)));
    let r = v.verify_quote(&s.quote, &policy).unwrap();
    assert_eq!((r.tee, r.tcb_status.as_str()), ("tdx", "UpToDate"));
    v.verify(&evidence(&s.quote), &nonce, &bind, &policy).unwrap();
}

#[test]
fn outdated_tdx_quote_is_refused_after_and_before_its_collateral_issue_date() {
    let s = sample("tdx_quote_outdated");
    let (policy, bind, nonce) = own_policy(&s.quote);
    for t in [FEB_25_2026, FEB_01_2026] {
        let v = verifier(&s, at(t));
        let e = v.verify(&evidence(&s.quote), &nonce, &bind, &policy).unwrap_err();
        assert!(matches!(e, AttestError::Collateral(_) | AttestError::TcbStatus { .. }), "at {t}: {e}");
    }
    // Even a policy accepting every status does not admit it (no TCB level matches).
    let lax = DcapPolicy {
        accepted: vec![
            dcap_qvl::TcbStatus::UpToDate,
            dcap_qvl::TcbStatus::OutOfDate,
            dcap_qvl::TcbStatus::OutOfDateConfigurationNeeded,
            dcap_qvl::TcbStatus::Revoked,
        ],
        ..at(FEB_25_2026)
    };
    assert!(verifier(&s, lax).verify_quote(&s.quote, &policy).is_err());
}

#[test]
fn stale_collateral_one_year_later_is_refused() {
    for name in ["sgx_quote", "tdx_quote"] {
        let s = sample(name);
        let (policy, bind, nonce) = own_policy(&s.quote);
        let e = verifier(&s, at(JUNE_2026)).verify(&evidence(&s.quote), &nonce, &bind, &policy).unwrap_err();
        assert!(matches!(e, AttestError::Collateral(_)), "{name}: {e}");
    }
}

#[test]
fn a_flipped_bit_anywhere_is_refused() {
    for name in ["sgx_quote", "tdx_quote"] {
        let s = sample(name);
        let (policy, bind, nonce) = own_policy(&s.quote);
        let v = verifier(&s, at(JUNE_2025));
        assert!(v.verify(&evidence(&s.quote), &nonce, &bind, &policy).is_ok());
        let n = s.quote.len();
        // Every byte: header, report body (measurements, report data), signature, QE report,
        // QE authentication data, the PEM certificate chain (including the root's copy), padding.
        // One bit per byte, its position cycling through the 8 bits.
        for p in 0..n {
            let bit = 0x01u8 << (p % 8);
            let mut q = s.quote.clone();
            q[p] ^= bit;
            assert!(v.verify(&evidence(&q), &nonce, &bind, &policy).is_err(), "{name}: byte {p} bit {bit:#x} accepted");
        }
        // Truncated and empty quotes too (the TDX sample ends in 70 bytes of zero padding, which
        // are not part of the quote: cutting them alone changes nothing).
        for cut in [0, 48, n / 2, n - 100] {
            assert!(v.verify(&evidence(&s.quote[..cut]), &nonce, &bind, &policy).is_err());
        }
    }
}

#[test]
fn measurement_not_in_the_policy_and_wrong_binding_are_refused() {
    let s = sample("tdx_quote");
    let (policy, bind, nonce) = own_policy(&s.quote);
    let v = verifier(&s, at(JUNE_2025));
    let other = AttestPolicy { allowed: [psl_crypto::sha256(&[b"some other build"])].into() };
    assert!(matches!(v.verify(&evidence(&s.quote), &nonce, &bind, &other), Err(AttestError::Measurement(_))));
    assert!(matches!(
        v.verify(&evidence(&s.quote), &nonce, &bind, &AttestPolicy::default()),
        Err(AttestError::Measurement(_))
    ));
    // The report data must commit to the offered channel key, and carry the issued nonce.
    assert_eq!(v.verify(&evidence(&s.quote), &nonce, &[7; 32], &policy), Err(AttestError::ReportData));
    assert_eq!(v.verify(&evidence(&s.quote), &[7; 32], &bind, &policy), Err(AttestError::Nonce));
    // Evidence of another backend is not a quote.
    let sim = Evidence { backend: psl_faas::attest::SIM_BACKEND, bytes: s.quote.clone() };
    assert!(matches!(v.verify(&sim, &nonce, &bind, &policy), Err(AttestError::Backend { .. })));
    // An SGX quote against TDX collateral does not verify.
    let sgx = sample("sgx_quote");
    let (sgx_policy, _, _) = own_policy(&sgx.quote);
    assert!(v.verify_quote(&sgx.quote, &sgx_policy).is_err());
}
