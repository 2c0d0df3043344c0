"""Policy loading and the sim backend's evidence, accepted or refused as the Rust verifier does."""

import os

import pytest

from helpers import sim_platform, sim_policy_text, sim_report
from psl_client import Policy, PolicyError, VerificationError, verify_evidence
from psl_client.wire import sha256


def test_policy_loading(tmp_path):
    _, pub = sim_platform()
    p = tmp_path / "p.toml"
    p.write_text(sim_policy_text(pub, [b"\1" * 32]))
    pol = Policy.load(p)
    assert pol.allowed_kinds == ["sim"] and pol.allow_insecure_sim
    assert pol.measurements["sim"] == {b"\1" * 32}
    refused = [
        'allowed_kinds = ["sim"]\n',  # sim without allow_insecure_sim
        'allowed_kinds = []\n',
        'allowed_kinds = ["sev"]\n',
        'allowed_kinds = ["snp"]\n',  # no [snp] section
        'allowed_kinds = ["snp"]\nsurprise = 1\n[snp]\n',  # unknown key
        'allowed_kinds = ["snp"]\n[snp]\n[[snp.allow]]\nmeasurement = "00"\n',  # short hex
        'allow_insecure_sim = true\n[sim]\nplatform_public = "zz"\n',
        'allowed_kinds = ["sgx"]\n[sgx]\n[[sgx.allow]]\nmrsigner = "' + "00" * 32 + '"\n',  # needs isv_prod_id
        "not toml [",
    ]
    for text in refused:
        with pytest.raises(PolicyError):
            Policy.parse(text)
    with pytest.raises(PolicyError):
        Policy.load(tmp_path / "missing.toml")


def test_snp_policy_measurement_digests():
    m = "ab" * 48
    pol = Policy.parse(f'allowed_kinds = ["snp"]\n[snp]\n[[snp.allow]]\nmeasurement = "{m}"\nguest_policy = "0x30000"\n')
    want = sha256(b"psl/snp/v1", bytes.fromhex(m), (0x30000).to_bytes(8, "little"))
    assert pol.measurements["snp"] == {want}
    assert pol.snp is not None and pol.snp.vmpls == [0] and pol.snp.allow_smt


def _sim_case():
    key, pub = sim_platform()
    m, rd, nonce = os.urandom(32), os.urandom(32), os.urandom(32)
    return key, pub, m, rd, nonce, sim_report(key, m, rd, nonce)


def test_sim_accepted_only_with_allow_insecure_sim():
    key, pub, m, rd, nonce, ev = _sim_case()
    ok = Policy.parse(sim_policy_text(pub, [m]))
    v = verify_evidence(ok, "sim-INSECURE", ev, nonce, rd)
    assert v.kind == "sim" and v.measurement == m
    no = Policy.parse(sim_policy_text(pub, [m], allow=False))
    with pytest.raises(VerificationError) as e:
        verify_evidence(no, "sim-INSECURE", ev, nonce, rd)
    assert e.value.check == "kind allowed" and "allow_insecure_sim" in e.value.detail


def test_sim_refusals_name_the_check():
    key, pub, m, rd, nonce, ev = _sim_case()
    pol = Policy.parse(sim_policy_text(pub, [m]))

    def check(**kw):
        args = dict(policy=pol, backend="sim-INSECURE", evidence=ev, nonce=nonce, report_data=rd)
        args.update(kw)
        with pytest.raises(VerificationError) as e:
            verify_evidence(**args)
        return e.value.check

    assert check(nonce=os.urandom(32)) == "nonce"
    assert check(report_data=os.urandom(32)) == "report data binds the channel key"
    assert check(policy=Policy.parse(sim_policy_text(pub, [os.urandom(32)]))) == "measurement"
    _, other = sim_platform()
    assert check(policy=Policy.parse(sim_policy_text(other, [m]))) == "signature"
    assert check(evidence=ev[:-1]) == "format"
    assert check(backend="sim") == "backend"
    for i in range(len(ev)):
        t = bytearray(ev)
        t[i] ^= 1
        with pytest.raises(VerificationError):
            verify_evidence(pol, "sim-INSECURE", bytes(t), nonce, rd)
