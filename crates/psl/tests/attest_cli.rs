//! `psl attest measure` and `psl attest verify` on the recorded evidence (TDX quote with its
//! collateral, a Milan SEV-SNP report with its VCEK and AMD chain): a policy made from
//! `measure` verifies its evidence and every check is explained; a flipped bit, a time outside
//! the collateral's window, a measurement not in the policy, or a kind the policy does not allow
//! are refused with the check that failed, and the exit status says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../psl-faas/tests/data").join(name)
}

fn psl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psl")).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `allowed_kinds` plus what `psl attest measure --evidence` prints for `evidence`.
fn policy_from(dir: &Path, head: &str, evidence: &Path) -> PathBuf {
    let m = psl(&["attest", "measure", "--evidence", evidence.to_str().unwrap()]);
    assert!(m.status.success(), "{}", text(&m));
    let entries = String::from_utf8(m.stdout).unwrap();
    assert!(entries.contains(".allow]]"), "measure prints policy entries: {entries}");
    let p = dir.join(format!("policy-{}.toml", evidence.file_name().unwrap().to_str().unwrap()));
    std::fs::write(&p, format!("{head}\n{entries}")).unwrap();
    p
}

#[test]
fn a_tdx_quote_verifies_under_its_measured_policy_and_refusals_name_the_check() {
    let t = tempfile::tempdir().unwrap();
    let quote = data("tdx_quote");
    let coll = data("tdx_quote_collateral.json");
    let policy = policy_from(t.path(), r#"allowed_kinds = ["tdx"]"#, &quote);
    let (q, c, p) = (quote.to_str().unwrap(), coll.to_str().unwrap(), policy.to_str().unwrap());

    let ok = psl(&["attest", "verify", q, "--policy", p, "--collateral", c, "--at", "2025-06-20"]);
    let out = text(&ok);
    assert!(ok.status.success(), "{out}");
    for check in ["PASS kind allowed", "PASS signature chain and collateral", "PASS TCB status", "PASS measurement"] {
        assert!(out.contains(check), "missing {check:?}: {out}");
    }
    assert!(out.contains("VERIFIED: tdx measurement"), "{out}");

    // JSON: one object with every check.
    let j = psl(&["attest", "verify", q, "--policy", p, "--collateral", c, "--at", "2025-06-20", "--json"]);
    assert!(j.status.success(), "{}", text(&j));
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    assert!(checks.len() >= 8 && checks.iter().all(|c| c["status"] != "fail"), "{v}");

    // One flipped bit in the quote body.
    let mut bad = std::fs::read(&quote).unwrap();
    bad[700] ^= 1;
    let badp = t.path().join("flipped");
    std::fs::write(&badp, bad).unwrap();
    let r = psl(&["attest", "verify", badp.to_str().unwrap(), "--policy", p, "--collateral", c, "--at", "2025-06-20"]);
    let out = text(&r);
    assert!(!r.status.success(), "a flipped bit must be refused: {out}");
    assert!(out.contains("FAIL signature chain and collateral") && out.contains("REFUSED"), "{out}");

    // Outside the collateral's validity window.
    let r = psl(&["attest", "verify", q, "--policy", p, "--collateral", c, "--at", "2027-06-20"]);
    let out = text(&r);
    assert!(!r.status.success(), "{out}");
    assert!(out.contains("FAIL collateral freshness") && out.contains("not at 2027-06-20"), "{out}");

    // A policy that allows another measurement only.
    let other = t.path().join("other.toml");
    let body = std::fs::read_to_string(&policy).unwrap();
    let mrtd = body.lines().find(|l| l.starts_with("mrtd = ")).unwrap();
    std::fs::write(&other, body.replace(mrtd, &format!("mrtd = \"{}\"", "ab".repeat(48)))).unwrap();
    let r = psl(&["attest", "verify", q, "--policy", other.to_str().unwrap(), "--collateral", c, "--at", "2025-06-20"]);
    let out = text(&r);
    assert!(!r.status.success(), "{out}");
    assert!(out.contains("FAIL measurement"), "{out}");

    // A policy that does not allow TDX at all.
    let snp_only = t.path().join("snp-only.toml");
    let snp_entry = format!("[[snp.allow]]\nmeasurement = \"{}\"\n", "cd".repeat(48));
    std::fs::write(&snp_only, body.replace(r#"allowed_kinds = ["tdx"]"#, r#"allowed_kinds = ["snp"]"#) + &snp_entry)
        .unwrap();
    let r =
        psl(&["attest", "verify", q, "--policy", snp_only.to_str().unwrap(), "--collateral", c, "--at", "2025-06-20"]);
    let out = text(&r);
    assert!(!r.status.success(), "{out}");
    assert!(out.contains("FAIL kind allowed"), "{out}");
}

#[test]
fn a_milan_snp_report_verifies_with_its_vcek_and_chain_and_a_flipped_bit_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let report = data("snp/report_milan.hex");
    let vcek = data("snp/vcek_milan.der");
    let chain = data("snp/cert_chain_milan");
    // The recorded guest ran with SMT on; the policy must say it accepts that.
    let policy = policy_from(t.path(), "allowed_kinds = [\"snp\"]\n[snp]\nallow_smt = true", &report);
    let (v, c, p) = (vcek.to_str().unwrap(), chain.to_str().unwrap(), policy.to_str().unwrap());

    let ok = psl(&["attest", "verify", report.to_str().unwrap(), "--vcek", v, "--chain", c, "--policy", p]);
    let out = text(&ok);
    assert!(ok.status.success(), "{out}");
    assert!(out.contains("VERIFIED: snp"), "{out}");

    // Flip one bit of the report (hex text: change one digit of the signed body).
    let hex = std::fs::read_to_string(&report).unwrap();
    let i = hex.char_indices().filter(|(_, ch)| ch.is_ascii_hexdigit()).nth(300).unwrap().0;
    let mut flipped = hex.clone();
    let d = u8::from_str_radix(&hex[i..i + 1], 16).unwrap() ^ 1;
    flipped.replace_range(i..i + 1, &format!("{d:x}"));
    let badp = t.path().join("flipped.hex");
    std::fs::write(&badp, flipped).unwrap();
    let r = psl(&["attest", "verify", badp.to_str().unwrap(), "--vcek", v, "--chain", c, "--policy", p]);
    let out = text(&r);
    assert!(!r.status.success(), "a flipped bit must be refused: {out}");
    assert!(out.contains("FAIL") && out.contains("REFUSED"), "{out}");

    // Without allow_smt the same report is refused by the policy checks.
    let strict = t.path().join("strict.toml");
    std::fs::write(&strict, std::fs::read_to_string(&policy).unwrap().replace("allow_smt = true", "allow_smt = false"))
        .unwrap();
    let r = psl(&[
        "attest",
        "verify",
        report.to_str().unwrap(),
        "--vcek",
        v,
        "--chain",
        c,
        "--policy",
        strict.to_str().unwrap(),
    ]);
    let out = text(&r);
    assert!(!r.status.success(), "{out}");
    assert!(out.to_lowercase().contains("smt"), "{out}");
}
