//! The hardware attesters against trees that behave like the real interfaces: configfs-tsm
//! (SEV-SNP and TDX; provider mismatch, a concurrent writer, missing entries) and Gramine's
//! `/dev/attestation`, each checked by the production verifier; and `--attest auto`.

use psl_faas::attest::{AttestError, AttestPolicy, AttestVerifier, Attester, CheckLog, Expected, TeeKind, VerifyTime};
use psl_faas::attest_dcap::{inspect, split_report_data, DcapPolicy, DcapVerifier, StaticCollateral};
use psl_faas::attest_gramine::GramineAttester;
use psl_faas::attest_select::{open_hardware, AttestChoice, HwPaths};
use psl_faas::attest_snp::{snp_measurement_any_policy, SnpCollateral, SnpPolicy, SnpTrustAnchors, SnpVerifier};
use psl_faas::attest_testkit::{FakeGramine, FakeSnpPlatform, FakeTsm, ReportSpec, TsmFault};
use psl_faas::attest_tsm::TsmAttester;
use std::sync::Arc;

const JUNE_2025: u64 = 1_750_377_600;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).expect("sample file")
}

fn snp_verifier(p: &FakeSnpPlatform) -> SnpVerifier {
    let policy = SnpPolicy {
        allowed: AttestPolicy { allowed: [snp_measurement_any_policy(&p.spec.measurement)].into() },
        time: VerifyTime::At(JUNE_2025),
        ..SnpPolicy::default()
    };
    SnpVerifier::new(
        policy,
        SnpTrustAnchors::from_ders(std::slice::from_ref(&p.amd.ark_der)).unwrap(),
        Arc::new(SnpCollateral::new()),
    )
}

#[test]
fn snp_through_configfs_tsm_verifies_and_binds_the_report_data() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(FakeSnpPlatform::new(ReportSpec::default()));
    let fake = FakeTsm::start(dir.path(), "w1", "sev_guest", TsmFault::None, p.maker(None));
    let a = TsmAttester::open(dir.path(), "w1", Some(TeeKind::Snp)).unwrap();
    assert_eq!((a.kind(), a.backend()), (TeeKind::Snp, "snp"));
    let v = snp_verifier(&p);
    for i in 0..3u8 {
        let (nonce, rd) = ([i; 32], [100 + i; 32]);
        let ev = a.attest(&nonce, &rd).unwrap();
        let ok = v.verify(&ev, &nonce, &rd).unwrap();
        assert_eq!(ok.report_data, rd);
        // Another nonce or channel key: refused.
        assert_eq!(v.verify(&ev, &[9; 32], &rd), Err(AttestError::Nonce));
        assert_eq!(v.verify(&ev, &nonce, &[9; 32]), Err(AttestError::ReportData));
    }
    assert_eq!(fake.served(), 3);
    // The report is altered after signing: the verifier refuses it.
    let dir2 = tempfile::tempdir().unwrap();
    let _bad = FakeTsm::start(dir2.path(), "w1", "sev_guest", TsmFault::None, p.maker(Some(|r| r[0x90] ^= 1)));
    let a = TsmAttester::open(dir2.path(), "w1", Some(TeeKind::Snp)).unwrap();
    let ev = a.attest(&[1; 32], &[2; 32]).unwrap();
    assert_eq!(v.verify(&ev, &[1; 32], &[2; 32]).unwrap_err(), AttestError::Signature);
}

#[test]
fn configfs_failure_modes_are_reported() {
    let p = Arc::new(FakeSnpPlatform::new(ReportSpec::default()));
    // Provider mismatch: the tree is a TDX guest's, SNP was asked for.
    let dir = tempfile::tempdir().unwrap();
    let _f = FakeTsm::start(dir.path(), "e", "tdx_guest", TsmFault::None, p.maker(None));
    let e = TsmAttester::open(dir.path(), "e", Some(TeeKind::Snp)).err().unwrap().to_string();
    assert!(e.contains("provider mismatch") && e.contains("tdx_guest"), "{e}");
    // An unknown provider.
    let dir = tempfile::tempdir().unwrap();
    let _f = FakeTsm::start(dir.path(), "e", "arm_cca_guest", TsmFault::None, p.maker(None));
    let e = TsmAttester::open(dir.path(), "e", None).err().unwrap().to_string();
    assert!(e.contains("arm_cca_guest"), "{e}");
    // Another writer moves the generation during every report.
    let dir = tempfile::tempdir().unwrap();
    let f = FakeTsm::start(dir.path(), "e", "sev_guest", TsmFault::GenerationJump, p.maker(None));
    let a = TsmAttester::open(dir.path(), "e", Some(TeeKind::Snp)).unwrap();
    let e = a.attest(&[1; 32], &[2; 32]).unwrap_err().to_string();
    assert!(e.contains("generation changed"), "{e}");
    // The fake counts a report once its last blob is read, which may be just after the
    // attester returns: wait (bounded) for the count.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while f.served() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(f.served(), 3, "retried");
    // No configfs-tsm at all.
    let dir = tempfile::tempdir().unwrap();
    let e = TsmAttester::open(dir.path(), "e", None).err().unwrap().to_string();
    assert!(e.contains("configfs-tsm not found"), "{e}");
    // A report directory whose entry has no attributes (not configfs: mkdir made a plain
    // directory): missing entry attributes.
    std::fs::create_dir_all(dir.path().join("report")).unwrap();
    let e = TsmAttester::open(dir.path(), "e", None).err().unwrap().to_string();
    assert!(e.contains("lacks inblob, outblob, provider, generation"), "{e}");
    assert!(!dir.path().join("report/e").exists(), "the entry it made is removed");
    assert!(TsmAttester::open(dir.path(), "../x", None).is_err());
}

#[test]
fn tdx_through_configfs_tsm_and_sgx_through_gramine_give_quotes_the_dcap_verifier_checks() {
    for (name, gramine) in [("tdx_quote", false), ("sgx_quote", true)] {
        let quote = data(name);
        let id = inspect(&quote).unwrap();
        let (bind, nonce) = split_report_data(&id.report_data);
        let q = quote.clone();
        let dir = tempfile::tempdir().unwrap();
        let (_fake_tsm, _fake_gramine, a): (Option<FakeTsm>, Option<FakeGramine>, Box<dyn Attester>) = if gramine {
            let f = FakeGramine::start(&dir.path().join("attestation"), Arc::new(move |_| q.clone()));
            let a = GramineAttester::open(&dir.path().join("attestation")).unwrap();
            (None, Some(f), Box::new(a))
        } else {
            let f = FakeTsm::start(
                dir.path(),
                "w",
                "tdx_guest",
                TsmFault::None,
                Arc::new(move |_| (q.clone(), Vec::new())),
            );
            (Some(f), None, Box::new(TsmAttester::open(dir.path(), "w", Some(TeeKind::Tdx)).unwrap()))
        };
        assert_eq!(a.backend(), "dcap");
        // The recorded quote carries fixed report data: asked for exactly that, the attester
        // returns it and the verifier (recorded collateral, at a time inside its window) takes it.
        let ev = a.attest(&nonce, &bind).unwrap();
        assert_eq!(ev.bytes, quote);
        let p = DcapPolicy { time: VerifyTime::At(JUNE_2025), ..DcapPolicy::default() }
            .allowing(AttestPolicy { allowed: [id.digests[0]].into() });
        let v = DcapVerifier::new(
            p,
            Arc::new(StaticCollateral::from_json(&data(&format!("{name}_collateral.json"))).unwrap()),
        );
        let mut log = CheckLog::default();
        v.verify_explained(&ev, &Expected { nonce: Some(nonce), report_data: Some(bind) }, &mut log).unwrap();
        // Asked for other report data, it sees the quote is not over it and says so.
        let e = a.attest(&[1; 32], &[2; 32]).unwrap_err().to_string();
        assert!(e.contains("report data") && e.contains("stale"), "{name}: {e}");
    }
    // Gramine without remote attestation.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("attestation_type"), "none").unwrap();
    let e = GramineAttester::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("sgx.remote_attestation"), "{e}");
}

#[test]
fn auto_says_what_it_chose_and_never_falls_back_to_sim() {
    let p = Arc::new(FakeSnpPlatform::new(ReportSpec::default()));
    let dir = tempfile::tempdir().unwrap();
    let paths = HwPaths {
        tsm_root: dir.path().join("tsm"),
        tsm_entry: Some("auto".into()),
        gramine_dir: dir.path().join("attestation"),
    };
    let e = match open_hardware(AttestChoice::Auto, &paths) {
        Err(e) => e,
        Ok(_) => panic!("found a TEE in an empty directory"),
    };
    assert!(matches!(&e, AttestError::Platform(m) if m.contains("never falls back") && m.contains("Gramine")), "{e}");
    let _f = FakeTsm::start(&paths.tsm_root, "auto", "sev_guest", TsmFault::None, p.maker(None));
    let (a, said) = open_hardware(AttestChoice::Auto, &paths).unwrap();
    assert_eq!(a.kind(), TeeKind::Snp);
    assert!(said.contains("sev_guest") && said.contains("auto"), "{said}");
    drop(a);
    // Asked for TDX by name on an SNP guest: refused, not silently switched.
    assert!(open_hardware(AttestChoice::Tdx, &paths).is_err());
    // Gramine present: chosen first.
    let q = data("sgx_quote");
    let _g = FakeGramine::start(&paths.gramine_dir, Arc::new(move |_| q.clone()));
    let (a, said) = open_hardware(AttestChoice::Auto, &paths).unwrap();
    assert_eq!(a.kind(), TeeKind::Sgx);
    assert!(said.contains("Gramine"), "{said}");
    assert!(open_hardware(AttestChoice::Sim, &paths).is_err());
}
