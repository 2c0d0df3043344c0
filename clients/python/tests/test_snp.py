"""SEV-SNP: the recorded Milan report (/work/shared/testdata/attestation/snp, or
PSL_SNP_TESTDATA), with its VCEK and AMD's chain."""

import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from psl_client import Policy, VerificationError, verify_evidence
from psl_client import snp

DATA = Path(os.environ.get("PSL_SNP_TESTDATA", "/work/shared/testdata/attestation/snp"))
pytestmark = pytest.mark.skipif(not (DATA / "report_milan.hex").exists(), reason="recorded SNP evidence absent")


@pytest.fixture(scope="module")
def case():
    report = bytes.fromhex((DATA / "report_milan.hex").read_text().strip())
    vcek = (DATA / "vcek_milan.der").read_bytes()
    ask, ark = [c.public_bytes(Encoding.DER) for c in x509.load_pem_x509_certificates((DATA / "cert_chain_milan").read_bytes())]
    r = snp.Report.parse(report)
    return report, vcek, ask, ark, r


def policy_for(r, extra=""):
    return Policy.parse(
        f'allowed_kinds = ["snp"]\n[snp]\n{extra}\n[[snp.allow]]\nmeasurement = "{r.measurement.hex()}"\n'
        f'guest_policy = "{r.policy:#x}"\n'
    )


def run(pol, ev, r, **kw):
    return verify_evidence(pol, "snp", ev, kw.get("nonce", r.report_data[32:]), kw.get("rd", r.report_data[:32]), at=kw.get("at"))


def test_recorded_report_verifies(case):
    report, vcek, ask, ark, r = case
    ev = snp.encode_evidence(report, [(snp.GUID_VCEK, vcek), (snp.GUID_ASK, ask), (snp.GUID_ARK, ark)])
    v = run(policy_for(r), ev, r)
    names = [c[0] for c in v.checks]
    for want in ("ASK signed by the ARK", "VCEK signed by the ASK", "report signature", "measurement", "nonce"):
        assert want in names
    # Without the ASK and ARK: AMD's, shipped with the SDK.
    assert run(policy_for(r), snp.encode_evidence(report, [(snp.GUID_VCEK, vcek)]), r).kind == "snp"


def failing(pol, ev, r, **kw):
    with pytest.raises(VerificationError) as e:
        run(pol, ev, r, **kw)
    return e.value.check


def test_refusals(case, tmp_path):
    report, vcek, ask, ark, r = case
    entries = [(snp.GUID_VCEK, vcek), (snp.GUID_ASK, ask), (snp.GUID_ARK, ark)]
    ev = snp.encode_evidence(report, entries)
    pol = policy_for(r)
    assert failing(pol, ev, r, nonce=os.urandom(32)) == "nonce"
    assert failing(pol, ev, r, rd=os.urandom(32)) == "report data binds the channel key"
    other = Policy.parse(f'allowed_kinds = ["snp"]\n[snp]\n[[snp.allow]]\nmeasurement = "{"00" * 48}"\n')
    assert failing(other, ev, r) == "measurement"
    assert failing(policy_for(r, "min_tcb = { snp = 200 }"), ev, r) == "minimum TCB"
    assert failing(policy_for(r, "min_guest_svn = 9"), ev, r) == "guest SVN"
    assert failing(policy_for(r, "allow_smt = false"), ev, r) == "SMT"
    assert failing(policy_for(r, "require_crl = true"), ev, r) == "not built"
    assert failing(pol, ev, r, at=0) == "ARK (trust anchor)"  # not valid in 1970
    sim_only = Policy.parse('allow_insecure_sim = true\n[sim]\nplatform_public = "' + "02" + "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798" + '"\n')
    assert failing(sim_only, ev, r) == "kind allowed"
    # Another chip's id in the report: the VCEK is not its VCEK.
    t = bytearray(report)
    t[0x1A0] ^= 1
    assert failing(pol, snp.encode_evidence(bytes(t), entries), r) == "chip id and reported TCB match the VCEK"
    # A non-canonical table or an unknown GUID.
    assert failing(pol, ev + b"\0", r) == "format"
    assert failing(pol, snp.encode_evidence(report, [(snp.GUID_VLEK, vcek)]), r) == "format"


def test_every_flipped_byte_is_refused(case):
    report, vcek, ask, ark, r = case
    entries = [(snp.GUID_VCEK, vcek), (snp.GUID_ASK, ask), (snp.GUID_ARK, ark)]
    ev = snp.encode_evidence(report, entries)
    pol = policy_for(r)
    nonce, rd = r.report_data[32:], r.report_data[:32]
    # Every byte of the report (the nonce and report data are then refused by their checks).
    for i in range(8, 8 + snp.REPORT_LEN):
        t = bytearray(ev)
        t[i] ^= 0x01
        with pytest.raises(VerificationError):
            verify_evidence(pol, "snp", bytes(t), nonce, rd)
    # Bytes of the certificates: a sample across each.
    head = 8 + snp.REPORT_LEN + 4 + 24 * 4
    for i in range(head, len(ev), 97):
        t = bytearray(ev)
        t[i] ^= 0x01
        with pytest.raises(VerificationError):
            verify_evidence(pol, "snp", bytes(t), nonce, rd)
