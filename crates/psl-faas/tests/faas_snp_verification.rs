//! The `snp` verifier: a real Milan SEV-SNP report with its VCEK and AMD's ARK/ASK chain
//! (tests/data/snp, from the `sev` crate's test data; see tests/data/README.md), and a private
//! AMD-shaped PKI (attest_testkit) for what the recorded report cannot show (CRLs, policy bits,
//! Turin, other chips).

use psl_faas::attest::{
    AttestError, AttestPolicy, AttestVerifier, CheckLog, CheckStatus, Evidence, Expected, VerifyTime,
};
use psl_faas::attest_snp::*;
use psl_faas::attest_testkit::{ReportSpec, TestAmd, PKI_NOT_AFTER, PKI_NOT_BEFORE, TEST_TCB};
use std::sync::Arc;

/// 2025-06-20: inside the recorded VCEK's validity (2023-04-03 to 2030-04-03).
const JUNE_2025: u64 = 1_750_377_600;
/// 2031-01-01: after it.
const JAN_2031: u64 = 1_924_992_000;
/// 2023-01-01: before it.
const JAN_2023: u64 = 1_672_531_200;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/data/snp/{name}", env!("CARGO_MANIFEST_DIR"))).expect("sample file")
}

struct Recorded {
    report: Vec<u8>,
    vcek: Vec<u8>,
    ask: Vec<u8>,
    ark: Vec<u8>,
}

fn recorded() -> Recorded {
    let report = hex::decode(String::from_utf8(data("report_milan.hex")).unwrap().trim()).unwrap();
    let chain = pem::parse_many(data("cert_chain_milan")).unwrap();
    assert_eq!(chain.len(), 2, "ASK then ARK");
    Recorded {
        report,
        vcek: data("vcek_milan.der"),
        ask: chain[0].contents().to_vec(),
        ark: chain[1].contents().to_vec(),
    }
}

fn envelope(report: &[u8], vcek: Option<&[u8]>, ask: Option<&[u8]>, ark: Option<&[u8]>) -> Evidence {
    let mut e = Vec::new();
    for (g, d) in [(GUID_VCEK, vcek), (GUID_ASK, ask), (GUID_ARK, ark)] {
        if let Some(d) = d {
            e.push(TableEntry { guid: g, data: d.to_vec() });
        }
    }
    Evidence { backend: SNP_BACKEND, bytes: encode_evidence(report, &e) }
}

fn full(r: &Recorded) -> Evidence {
    envelope(&r.report, Some(&r.vcek), Some(&r.ask), Some(&r.ark))
}

/// The report's own report data halves: (channel-key commitment, nonce).
fn expect_of(report: &[u8]) -> Expected {
    let p = SnpReport::parse(report).unwrap();
    Expected {
        report_data: Some(p.report_data[..32].try_into().unwrap()),
        nonce: Some(p.report_data[32..].try_into().unwrap()),
    }
}

/// The recorded report's policy: its measurement (any guest policy), the default VMPL 0.
fn recorded_policy(r: &Recorded, t: u64) -> SnpPolicy {
    let p = SnpReport::parse(&r.report).unwrap();
    SnpPolicy {
        allowed: AttestPolicy { allowed: [snp_measurement_any_policy(&p.measurement)].into() },
        time: VerifyTime::At(t),
        ..SnpPolicy::default()
    }
}

fn amd_verifier(policy: SnpPolicy) -> SnpVerifier {
    SnpVerifier::new(policy, SnpTrustAnchors::amd(), Arc::new(SnpCollateral::new()))
}

#[test]
fn recorded_milan_report_verifies_under_a_policy_allowing_it() {
    let r = recorded();
    let v = amd_verifier(recorded_policy(&r, JUNE_2025));
    let mut log = CheckLog::default();
    let ok = v.verify_explained(&full(&r), &expect_of(&r.report), &mut log).unwrap();
    let text = log.render();
    for check in [
        "ARK (trust anchor)",
        "ASK signed by the ARK",
        "VCEK signed by the ASK",
        "chip id and reported TCB match the VCEK",
        "report signature",
        "VMPL",
        "measurement",
        "nonce",
    ] {
        assert!(text.contains(&format!("PASS {check}")), "{check} not passed:\n{text}");
    }
    assert!(text.contains("Milan-B0"), "{text}");
    assert_eq!(ok.kind, psl_faas::attest::TeeKind::Snp);
    // The measurement pinned with its guest policy (0x30000) is accepted too.
    let p = SnpReport::parse(&r.report).unwrap();
    assert_eq!(p.policy, 0x30000);
    let pinned = SnpPolicy {
        allowed: AttestPolicy { allowed: [snp_measurement(&p.measurement, 0x30000)].into() },
        ..recorded_policy(&r, JUNE_2025)
    };
    amd_verifier(pinned).verify_explained(&full(&r), &expect_of(&r.report), &mut CheckLog::default()).unwrap();
    // The chain alone (the VCEK from the evidence, AMD's built-in ASK).
    let ev = envelope(&r.report, Some(&r.vcek), None, None);
    amd_verifier(recorded_policy(&r, JUNE_2025))
        .verify_explained(&ev, &expect_of(&r.report), &mut CheckLog::default())
        .unwrap();
}

#[test]
fn a_flipped_bit_in_report_vcek_or_chain_is_refused() {
    let r = recorded();
    let v = amd_verifier(recorded_policy(&r, JUNE_2025));
    let exp = expect_of(&r.report);
    assert!(v.verify_explained(&full(&r), &exp, &mut CheckLog::default()).is_ok());
    // One bit per byte, cycling through the 8 bit positions, of each part.
    let parts: [(&str, &Vec<u8>); 4] = [("report", &r.report), ("VCEK", &r.vcek), ("ASK", &r.ask), ("ARK", &r.ark)];
    for (which, bytes) in parts {
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            let ev = match which {
                "report" => envelope(&b, Some(&r.vcek), Some(&r.ask), Some(&r.ark)),
                "VCEK" => envelope(&r.report, Some(&b), Some(&r.ask), Some(&r.ark)),
                "ASK" => envelope(&r.report, Some(&r.vcek), Some(&b), Some(&r.ark)),
                _ => envelope(&r.report, Some(&r.vcek), Some(&r.ask), Some(&b)),
            };
            // The expected report data stays the genuine one.
            assert!(v.verify_explained(&ev, &exp, &mut CheckLog::default()).is_err(), "{which} byte {i} accepted");
        }
    }
    // And the envelope itself (magic, length, table entries).
    let ev = full(&r);
    for i in (0..8).chain(8 + SNP_REPORT_LEN..8 + SNP_REPORT_LEN + 4 + 24 * 4) {
        let mut b = ev.clone();
        b.bytes[i] ^= 1 << (i % 8);
        assert!(v.verify_explained(&b, &exp, &mut CheckLog::default()).is_err(), "envelope byte {i} accepted");
    }
    assert!(v
        .verify_explained(
            &Evidence { backend: SNP_BACKEND, bytes: ev.bytes[..ev.bytes.len() - 1].to_vec() },
            &exp,
            &mut CheckLog::default()
        )
        .is_err());
}

#[test]
fn chip_id_or_tcb_not_the_vceks_is_refused() {
    let r = recorded();
    let v = amd_verifier(recorded_policy(&r, JUNE_2025));
    let exp = expect_of(&r.report);
    let mut chip = r.report.clone();
    chip[0x1A0] ^= 0x80;
    let e =
        v.verify_explained(&envelope(&chip, Some(&r.vcek), Some(&r.ask), Some(&r.ark)), &exp, &mut CheckLog::default());
    assert!(matches!(&e, Err(AttestError::Chain(m)) if m.contains("chip id")), "{e:?}");
    let mut tcb = r.report.clone();
    tcb[0x187] = 0x74; // reported microcode 116, the VCEK says 115
    let e =
        v.verify_explained(&envelope(&tcb, Some(&r.vcek), Some(&r.ask), Some(&r.ark)), &exp, &mut CheckLog::default());
    assert!(matches!(&e, Err(AttestError::Chain(m)) if m.contains("TCB")), "{e:?}");
}

#[test]
fn measurement_time_binding_and_policy_refusals_name_their_reason() {
    let r = recorded();
    let exp = expect_of(&r.report);
    let check =
        |p: SnpPolicy, exp: &Expected| amd_verifier(p).verify_explained(&full(&r), exp, &mut CheckLog::default());
    // Measurement not in the policy.
    let e = check(SnpPolicy { allowed: AttestPolicy::default(), ..recorded_policy(&r, JUNE_2025) }, &exp);
    assert!(matches!(e, Err(AttestError::Measurement(_))), "{e:?}");
    // Outside the VCEK's validity window.
    for t in [JAN_2031, JAN_2023] {
        let e = check(recorded_policy(&r, t), &exp);
        assert!(matches!(&e, Err(AttestError::Chain(m)) if m.contains("valid from")), "at {t}: {e:?}");
    }
    // Report data not binding the channel key, or a stale nonce.
    let wrong = Expected { report_data: Some([7; 32]), ..exp };
    assert_eq!(check(recorded_policy(&r, JUNE_2025), &wrong).unwrap_err(), AttestError::ReportData);
    let stale = Expected { nonce: Some([7; 32]), ..exp };
    assert_eq!(check(recorded_policy(&r, JUNE_2025), &stale).unwrap_err(), AttestError::Nonce);
    // The recorded report was requested at VMPL 0: a policy for VMPL 1 (an SVSM guest) refuses it.
    let e = check(SnpPolicy { vmpls: vec![1], ..recorded_policy(&r, JUNE_2025) }, &exp);
    assert!(matches!(&e, Err(AttestError::Policy(m)) if m.contains("VMPL 0")), "{e:?}");
    // A minimum microcode above the platform's.
    let min = MinTcb { microcode: 116, ..MinTcb::default() };
    let e = check(SnpPolicy { min_tcb: min, ..recorded_policy(&r, JUNE_2025) }, &exp);
    assert!(matches!(&e, Err(AttestError::Policy(m)) if m.contains("microcode 115 < 116")), "{e:?}");
    // SMT is enabled on the recorded platform.
    let e = check(SnpPolicy { allow_smt: false, ..recorded_policy(&r, JUNE_2025) }, &exp);
    assert!(matches!(&e, Err(AttestError::Policy(m)) if m.contains("SMT")), "{e:?}");
    // A CRL is required and none is known.
    let e = check(SnpPolicy { require_crl: true, ..recorded_policy(&r, JUNE_2025) }, &exp);
    assert!(matches!(&e, Err(AttestError::Collateral(m)) if m.contains("CRL")), "{e:?}");
}

#[test]
fn vcek_comes_from_the_cache_when_the_evidence_has_none() {
    let r = recorded();
    let exp = expect_of(&r.report);
    let bare = envelope(&r.report, None, None, None);
    let e = amd_verifier(recorded_policy(&r, JUNE_2025)).verify_explained(&bare, &exp, &mut CheckLog::default());
    assert!(
        matches!(&e, Err(AttestError::Collateral(m)) if m.contains("kdsintf.amd.com/vcek/v1/Milan/d49554ec") && m.contains("ucodeSPL=115")),
        "{e:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("milan.der"), &r.vcek).unwrap();
    let cache = SnpCollateral::with_dir(dir.path()).unwrap();
    assert_eq!(cache.len(), 1);
    let v = SnpVerifier::new(recorded_policy(&r, JUNE_2025), SnpTrustAnchors::amd(), Arc::new(cache));
    v.verify_explained(&bare, &exp, &mut CheckLog::default()).unwrap();
    // A VCEK that arrived with evidence is kept for the next report.
    let dir = tempfile::tempdir().unwrap();
    let v = SnpVerifier::new(
        recorded_policy(&r, JUNE_2025),
        SnpTrustAnchors::amd(),
        Arc::new(SnpCollateral::with_dir(dir.path()).unwrap()),
    );
    v.verify_explained(&full(&r), &exp, &mut CheckLog::default()).unwrap();
    v.verify_explained(&bare, &exp, &mut CheckLog::default()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "written to the cache directory");
}

fn test_policy(amd_measurement: [u8; 48], t: u64) -> SnpPolicy {
    SnpPolicy {
        allowed: AttestPolicy { allowed: [snp_measurement_any_policy(&amd_measurement)].into() },
        time: VerifyTime::At(t),
        ..SnpPolicy::default()
    }
}

fn test_evidence(amd: &TestAmd, vcek: &psl_faas::attest_testkit::TestVcek, report: &[u8]) -> Evidence {
    envelope(report, Some(&vcek.der), Some(&amd.ask_der), Some(&amd.ark_der))
}

#[test]
fn private_pki_reports_verify_only_under_their_own_anchor() {
    let amd = TestAmd::new(Product::Milan);
    let vcek = amd.vcek(&[9; 64], TEST_TCB, PKI_NOT_BEFORE, PKI_NOT_AFTER);
    let spec = ReportSpec { report_data: [3; 64], ..ReportSpec::default() };
    let report = vcek.report(&spec);
    let ev = test_evidence(&amd, &vcek, &report);
    let exp = expect_of(&report);
    let anchors = SnpTrustAnchors::from_ders(std::slice::from_ref(&amd.ark_der)).unwrap();
    let v = SnpVerifier::new(test_policy(spec.measurement, JUNE_2025), anchors.clone(), Arc::new(SnpCollateral::new()));
    v.verify_explained(&ev, &exp, &mut CheckLog::default()).unwrap();
    // AMD's anchors do not know this ARK.
    let e =
        amd_verifier(test_policy(spec.measurement, JUNE_2025)).verify_explained(&ev, &exp, &mut CheckLog::default());
    assert!(matches!(&e, Err(AttestError::Chain(m)) if m.contains("not one of the trust anchors")), "{e:?}");
    // Another PKI's VCEK for the same chip (an impostor ASK) is refused.
    let other = TestAmd::new(Product::Milan);
    let forged = other.vcek(&[9; 64], TEST_TCB, PKI_NOT_BEFORE, PKI_NOT_AFTER);
    let forged_report = forged.report(&spec);
    let ev = envelope(&forged_report, Some(&forged.der), Some(&other.ask_der), None);
    let e = v.verify_explained(&ev, &exp, &mut CheckLog::default());
    assert!(matches!(&e, Err(AttestError::Chain(_))), "{e:?}");
    // A report signed by another chip's key under the right VCEK's certificate.
    let ev = envelope(&forged_report, Some(&vcek.der), Some(&amd.ask_der), None);
    assert_eq!(v.verify_explained(&ev, &exp, &mut CheckLog::default()).unwrap_err(), AttestError::Signature);
}

#[test]
fn guest_policy_bits_signing_key_and_crls() {
    let amd = TestAmd::new(Product::Milan);
    let vcek = amd.vcek(&[9; 64], TEST_TCB, PKI_NOT_BEFORE, PKI_NOT_AFTER);
    let anchors = SnpTrustAnchors::from_ders(std::slice::from_ref(&amd.ark_der)).unwrap();
    let run = |spec: &ReportSpec, policy: SnpPolicy, coll: SnpCollateral| {
        let report = vcek.report(spec);
        SnpVerifier::new(policy, anchors.clone(), Arc::new(coll)).verify_explained(
            &test_evidence(&amd, &vcek, &report),
            &expect_of(&report),
            &mut CheckLog::default(),
        )
    };
    let base = ReportSpec::default();
    let pol = || test_policy(base.measurement, JUNE_2025);
    run(&base, pol(), SnpCollateral::new()).unwrap();
    let debug = ReportSpec { policy: base.policy | POLICY_DEBUG, ..base.clone() };
    assert!(matches!(run(&debug, pol(), SnpCollateral::new()), Err(AttestError::Policy(m)) if m.contains("debug")));
    run(&debug, SnpPolicy { allow_debug: true, ..pol() }, SnpCollateral::new()).unwrap();
    let ma = ReportSpec { policy: base.policy | POLICY_MIGRATE_MA, ..base.clone() };
    assert!(
        matches!(run(&ma, pol(), SnpCollateral::new()), Err(AttestError::Policy(m)) if m.contains("migration agent"))
    );
    let bound = ReportSpec { report_id_ma: [1; 32], ..base.clone() };
    assert!(
        matches!(run(&bound, pol(), SnpCollateral::new()), Err(AttestError::Policy(m)) if m.contains("migration agent"))
    );
    let svn = SnpPolicy { min_guest_svn: 2, ..pol() };
    assert!(matches!(run(&base, svn, SnpCollateral::new()), Err(AttestError::Policy(m)) if m.contains("guest SVN")));
    // A VLEK-signed report (SIGNING_KEY = 1) is refused: the key info is signed, so re-sign.
    let mut vlek = vcek.report(&base);
    vlek[0x48] = 1 << 2;
    vcek.sign(&mut vlek);
    let e = SnpVerifier::new(pol(), anchors.clone(), Arc::new(SnpCollateral::new())).verify_explained(
        &test_evidence(&amd, &vcek, &vlek),
        &expect_of(&vlek),
        &mut CheckLog::default(),
    );
    assert!(matches!(&e, Err(AttestError::Policy(m)) if m.contains("VCEK-signed")), "{e:?}");
    // CRLs: a fresh one not listing the ASK passes; one listing it, a stale one, one too old for
    // the policy, and one signed by another ARK are refused.
    let day = 86_400;
    let with_crl = |der: Vec<u8>| {
        let mut c = SnpCollateral::new();
        c.add_crl(der);
        c
    };
    let mut log = CheckLog::default();
    let report = vcek.report(&base);
    SnpVerifier::new(
        SnpPolicy { require_crl: true, ..pol() },
        anchors.clone(),
        Arc::new(with_crl(amd.crl(&[77], JUNE_2025 - day, JUNE_2025 + day))),
    )
    .verify_explained(&test_evidence(&amd, &vcek, &report), &expect_of(&report), &mut log)
    .unwrap();
    assert!(log.checks.iter().any(|c| c.name.contains("CRL") && c.status == CheckStatus::Pass), "{}", log.render());
    let revoked = run(&base, pol(), with_crl(amd.crl(&[2], JUNE_2025 - day, JUNE_2025 + day)));
    assert!(matches!(&revoked, Err(AttestError::Chain(m)) if m.contains("revoked")), "{revoked:?}");
    let stale = run(&base, pol(), with_crl(amd.crl(&[], JUNE_2025 - 10 * day, JUNE_2025 - day)));
    assert!(matches!(&stale, Err(AttestError::Collateral(m)) if m.contains("not at")), "{stale:?}");
    let old = run(
        &base,
        SnpPolicy { crl_max_age_secs: Some(3 * day), ..pol() },
        with_crl(amd.crl(&[], JUNE_2025 - 5 * day, JUNE_2025 + day)),
    );
    assert!(
        matches!(&old, Err(AttestError::Collateral(m)) if m.contains("maximum") || m.contains("over the policy")),
        "{old:?}"
    );
    let other = TestAmd::new(Product::Milan);
    let mut alien = other.crl(&[], JUNE_2025 - day, JUNE_2025 + day);
    // Same issuer name, other key: the signature check catches it.
    let flip = alien.len() - 5;
    alien[flip] ^= 1;
    let e = run(&base, pol(), with_crl(alien));
    assert!(e.is_err(), "{e:?}");
}

#[test]
fn turin_layout_with_fmc_and_short_hardware_id() {
    let amd = TestAmd::new(Product::Turin);
    let tcb = u64::from_le_bytes([1, 4, 0, 22, 0, 0, 0, 72]);
    let vcek = amd.vcek(&[6; 64], tcb, PKI_NOT_BEFORE, PKI_NOT_AFTER);
    let spec = ReportSpec { report_data: [1; 64], ..ReportSpec::default() };
    let report = vcek.report(&spec);
    let anchors = SnpTrustAnchors::from_ders(std::slice::from_ref(&amd.ark_der)).unwrap();
    let min = MinTcb { fmc: 2, ..MinTcb::default() };
    let p = |min_tcb| SnpPolicy { min_tcb, ..test_policy(spec.measurement, JUNE_2025) };
    let mut log = CheckLog::default();
    SnpVerifier::new(p(MinTcb::default()), anchors.clone(), Arc::new(SnpCollateral::new()))
        .verify_explained(&test_evidence(&amd, &vcek, &report), &expect_of(&report), &mut log)
        .unwrap();
    assert!(log.render().contains("fmc 1"), "{}", log.render());
    let e = SnpVerifier::new(p(min), anchors, Arc::new(SnpCollateral::new())).verify_explained(
        &test_evidence(&amd, &vcek, &report),
        &expect_of(&report),
        &mut CheckLog::default(),
    );
    assert!(matches!(&e, Err(AttestError::Policy(m)) if m.contains("fmc 1 < 2")), "{e:?}");
}
