//! The `dcap` verifier against real SGX and TDX quotes with recorded collateral
//! (tests/data, from the public dcap-qvl samples; see tests/data/README.md).

use psl_faas::attest::{AttestError, AttestPolicy, AttestVerifier, CheckLog, Evidence};
use psl_faas::attest_dcap::{
    inspect, split_report_data, Collateral, DcapPolicy, DcapVerifier, StaticCollateral, VerifyTime, DCAP_BACKEND,
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

/// A verifier of `s`'s collateral whose policy admits exactly `allowed`.
fn verifier_for(s: &Sample, policy: DcapPolicy, allowed: &AttestPolicy) -> DcapVerifier {
    DcapVerifier::new(policy.allowing(allowed.clone()), Arc::new(StaticCollateral::from_json(&s.collateral).unwrap()))
}

/// A verifier of `s` whose policy admits the sample's own measurement.
fn verifier(s: &Sample, policy: DcapPolicy) -> DcapVerifier {
    verifier_for(s, policy, &own_policy(&s.quote).0)
}

fn at(t: u64) -> DcapPolicy {
    DcapPolicy { time: VerifyTime::At(t), ..DcapPolicy::default() }
}

/// The policy that admits exactly this quote's measurement, and the report data halves it binds.
fn own_policy(quote: &[u8]) -> (AttestPolicy, [u8; 32], [u8; 32]) {
    let id = inspect(quote).unwrap();
    let (bind, nonce) = split_report_data(&id.report_data);
    (AttestPolicy { allowed: [id.digests[0]].into() }, bind, nonce)
}

fn evidence(quote: &[u8]) -> Evidence {
    Evidence { backend: DCAP_BACKEND, bytes: quote.to_vec() }
}

#[test]
fn sgx_quote_verifies_with_its_reported_tcb_status() {
    let s = sample("sgx_quote");
    let (policy, bind, nonce) = own_policy(&s.quote);
    let v = verifier_for(&s, at(JUNE_2025), &policy);
    let r = v.verify_quote(&s.quote).unwrap();
    assert_eq!(r.tee, "sgx");
    assert_eq!(r.tcb_status, "ConfigurationAndSWHardeningNeeded");
    let ok = v.verify(&evidence(&s.quote), &nonce, &bind).unwrap();
    assert_eq!(ok.measurement, r.measurement);
    // A policy that accepts only UpToDate platforms refuses it, naming the status.
    let strict = verifier_for(&s, DcapPolicy::strict(VerifyTime::At(JUNE_2025)), &policy);
    match strict.verify_quote(&s.quote) {
        Err(AttestError::TcbStatus { status, .. }) => assert_eq!(status, "ConfigurationAndSWHardeningNeeded"),
        other => panic!("expected a TCB status refusal, got {other:?}"),
    }
    // The enclave's signer identity may stand in for its MRENCLAVE, above a minimum SVN.
    let id = inspect(&s.quote).unwrap();
    let by_signer = AttestPolicy { allowed: [id.digests[1]].into() };
    let v = verifier_for(&s, at(JUNE_2025), &by_signer);
    assert_eq!(v.verify_quote(&s.quote).unwrap().measurement, id.digests[1]);
    let svn = id.isv_svn.unwrap();
    let too_high = DcapPolicy { min_isv_svn: [(id.digests[1], svn + 1)].into(), ..at(JUNE_2025) };
    let e = verifier_for(&s, too_high, &by_signer).verify_quote(&s.quote).unwrap_err();
    assert!(matches!(&e, AttestError::Policy(m) if m.contains("ISV SVN")), "{e}");
}

#[test]
fn tdx_quote_verifies_up_to_date() {
    let s = sample("tdx_quote");
    let (policy, bind, nonce) = own_policy(&s.quote);
    let v = verifier_for(&s, DcapPolicy::strict(VerifyTime::At(JUNE_2025)), &policy);
    let r = v.verify_quote(&s.quote).unwrap();
    assert_eq!((r.tee, r.tcb_status.as_str()), ("tdx", "UpToDate"));
    let mut log = CheckLog::default();
    v.verify_explained(
        &evidence(&s.quote),
        &psl_faas::attest::Expected { nonce: Some(nonce), report_data: Some(bind) },
        &mut log,
    )
    .unwrap();
    let text = log.render();
    for c in [
        "canonical encoding",
        "collateral freshness",
        "signature chain and collateral",
        "TCB status",
        "measurement",
        "nonce",
    ] {
        assert!(text.contains(&format!("PASS {c}")), "{c}:\n{text}");
    }
}

#[test]
fn outdated_tdx_quote_is_refused_after_and_before_its_collateral_issue_date() {
    let s = sample("tdx_quote_outdated");
    let (policy, bind, nonce) = own_policy(&s.quote);
    for t in [FEB_25_2026, FEB_01_2026] {
        let v = verifier_for(&s, at(t), &policy);
        let e = v.verify(&evidence(&s.quote), &nonce, &bind).unwrap_err();
        assert!(matches!(e, AttestError::Collateral(_) | AttestError::TcbStatus { .. }), "at {t}: {e}");
    }
    // The reasons: no TCB level of the collateral matches the platform's (after the issue
    // date); the collateral is not valid yet (before).
    let e = verifier_for(&s, at(FEB_25_2026), &policy).verify_quote(&s.quote).unwrap_err().to_string();
    assert!(e.contains("No matching TCB level"), "{e}");
    let e = verifier_for(&s, at(FEB_01_2026), &policy).verify_quote(&s.quote).unwrap_err().to_string();
    assert!(e.contains("not at 2026-02-01"), "{e}");
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
    assert!(verifier_for(&s, lax, &policy).verify_quote(&s.quote).is_err());
}

#[test]
fn stale_collateral_one_year_later_is_refused() {
    for name in ["sgx_quote", "tdx_quote"] {
        let s = sample(name);
        let (_, bind, nonce) = own_policy(&s.quote);
        let e = verifier(&s, at(JUNE_2026)).verify(&evidence(&s.quote), &nonce, &bind).unwrap_err();
        assert!(matches!(e, AttestError::Collateral(_)), "{name}: {e}");
        // Inside the window but older than the policy's maximum age (issued 2025-06-19).
        let max = DcapPolicy { max_age_secs: Some(86_400), ..at(JUNE_2025 + 3 * 86_400) };
        let e = verifier(&s, max).verify(&evidence(&s.quote), &nonce, &bind).unwrap_err();
        assert!(e.to_string().contains("maximum age"), "{name}: {e}");
        let max = DcapPolicy { max_age_secs: Some(86_400), ..at(JUNE_2025) };
        verifier(&s, max).verify(&evidence(&s.quote), &nonce, &bind).unwrap();
    }
}

#[test]
fn a_flipped_bit_anywhere_is_refused() {
    for name in ["sgx_quote", "tdx_quote"] {
        let s = sample(name);
        let (_, bind, nonce) = own_policy(&s.quote);
        let v = verifier(&s, at(JUNE_2025));
        assert!(v.verify(&evidence(&s.quote), &nonce, &bind).is_ok());
        let n = s.quote.len();
        // Every byte: header, report body (measurements, report data), signature, QE report,
        // QE authentication data, the PEM certificate chain (including the root's copy), padding.
        // One bit per byte, its position cycling through the 8 bits.
        for p in 0..n {
            let bit = 0x01u8 << (p % 8);
            let mut q = s.quote.clone();
            q[p] ^= bit;
            assert!(v.verify(&evidence(&q), &nonce, &bind).is_err(), "{name}: byte {p} bit {bit:#x} accepted");
        }
        // Truncated and empty quotes too (the TDX sample ends in 70 bytes of zero padding, which
        // are not part of the quote: cutting them alone changes nothing).
        for cut in [0, 48, n / 2, n - 100] {
            assert!(v.verify(&evidence(&s.quote[..cut]), &nonce, &bind).is_err());
        }
    }
}

#[test]
fn measurement_not_in_the_policy_and_wrong_binding_are_refused() {
    let s = sample("tdx_quote");
    let (policy, bind, nonce) = own_policy(&s.quote);
    let v = verifier(&s, at(JUNE_2025));
    let other = AttestPolicy { allowed: [psl_crypto::sha256(&[b"some other build"])].into() };
    let e = verifier_for(&s, at(JUNE_2025), &other).verify(&evidence(&s.quote), &nonce, &bind);
    assert!(matches!(&e, Err(AttestError::Measurement(m)) if m.contains("mrtd")), "{e:?}");
    assert!(matches!(
        verifier_for(&s, at(JUNE_2025), &AttestPolicy::default()).verify(&evidence(&s.quote), &nonce, &bind),
        Err(AttestError::Measurement(_))
    ));
    // The report data must commit to the offered channel key, and carry the issued nonce.
    assert_eq!(v.verify(&evidence(&s.quote), &nonce, &[7; 32]), Err(AttestError::ReportData));
    assert_eq!(v.verify(&evidence(&s.quote), &[7; 32], &bind), Err(AttestError::Nonce));
    // Evidence of another backend is not a quote.
    let sim = Evidence { backend: psl_faas::attest::SIM_BACKEND, bytes: s.quote.clone() };
    assert!(matches!(v.verify(&sim, &nonce, &bind), Err(AttestError::Backend { .. })));
    // An SGX quote against TDX collateral does not verify.
    let sgx = sample("sgx_quote");
    let (sgx_policy, _, _) = own_policy(&sgx.quote);
    assert!(verifier_for(&s, at(JUNE_2025), &sgx_policy).verify_quote(&sgx.quote).is_err());
    let _ = policy;
}

/// Every third byte of the signed collateral (CRLs, TCB info, QE identity, signatures) and every
/// byte of the issuer chains, one bit each, positions cycling: none may change without the
/// quote being refused. (Every byte of the signed parts takes a minute on 2 cores; a third of
/// them, with the bit position cycling, still hits every field and every bit position.)
#[test]
fn a_flipped_bit_in_the_collateral_is_refused() {
    for name in ["sgx_quote", "tdx_quote"] {
        let s = sample(name);
        let (policy, bind, nonce) = own_policy(&s.quote);
        let c: Collateral = serde_json::from_slice(&s.collateral).unwrap();
        let check = |c: &Collateral| {
            DcapVerifier::new(at(JUNE_2025).allowing(policy.clone()), Arc::new(StaticCollateral(c.clone()))).verify(
                &evidence(&s.quote),
                &nonce,
                &bind,
            )
        };
        check(&c).unwrap();
        type Field = fn(&mut Collateral) -> &mut Vec<u8>;
        let bytes: [(&str, Field); 5] = [
            ("root_ca_crl", |c| &mut c.root_ca_crl),
            ("pck_crl", |c| &mut c.pck_crl),
            ("tcb_info_signature", |c| &mut c.tcb_info_signature),
            ("qe_identity_signature", |c| &mut c.qe_identity_signature),
            ("tcb_info", |c| unsafe_bytes(&mut c.tcb_info)),
        ];
        for (field, get) in bytes {
            let n = get(&mut c.clone()).len();
            for i in (0..n).step_by(3) {
                let mut m = c.clone();
                let b = get(&mut m);
                b[i] ^= 1 << ((i / 3) % 8);
                if field == "tcb_info" && std::str::from_utf8(b).is_err() {
                    continue; // not a string any more: cannot even be represented
                }
                assert!(check(&m).is_err(), "{name}: {field} byte {i} accepted");
            }
        }
        // The text fields: the QE identity and the PEM issuer chains.
        type Text = fn(&mut Collateral) -> &mut String;
        let texts: [(&str, Text); 4] = [
            ("qe_identity", |c| &mut c.qe_identity), // small: every byte
            ("pck_crl_issuer_chain", |c| &mut c.pck_crl_issuer_chain),
            ("tcb_info_issuer_chain", |c| &mut c.tcb_info_issuer_chain),
            ("qe_identity_issuer_chain", |c| &mut c.qe_identity_issuer_chain),
        ];
        for (field, get) in texts {
            let n = get(&mut c.clone()).len();
            for i in 0..n {
                let mut m = c.clone();
                let mut b = std::mem::take(get(&mut m)).into_bytes();
                b[i] ^= 1 << (i % 8);
                let Ok(t) = String::from_utf8(b) else { continue };
                *get(&mut m) = t;
                assert!(check(&m).is_err(), "{name}: {field} byte {i} accepted");
            }
        }
    }
}

/// The TCB info string's bytes (flipped only where the result is still UTF-8: checked by the caller).
fn unsafe_bytes(s: &mut String) -> &mut Vec<u8> {
    // SAFETY: the caller restores a valid UTF-8 string or skips the case before using it as a str.
    unsafe { s.as_mut_vec() }
}
