"""SGX / TDX DCAP quotes: the recorded quotes and collateral (/work/shared/testdata/attestation,
or PSL_DCAP_TESTDATA), verified at a fixed time inside the collateral's window."""

import calendar
import os
from pathlib import Path

import pytest

from psl_client import Policy, VerificationError, verify_evidence
from psl_client import dcap

dcap_qvl = pytest.importorskip("dcap_qvl")
DATA = Path(os.environ.get("PSL_DCAP_TESTDATA", "/work/shared/testdata/attestation"))
pytestmark = pytest.mark.skipif(not (DATA / "sgx_quote").exists(), reason="recorded DCAP quotes absent")
JUNE_2025 = calendar.timegm((2025, 6, 20, 0, 0, 0))


def sgx_policy(quote, extra=""):
    r = dcap_qvl.parse_quote(quote).report
    return Policy.parse(
        f'allowed_kinds = ["sgx"]\n[collateral]\nfile = "{DATA}/sgx_quote_collateral.json"\n{extra}\n'
        f'[sgx]\naccepted_tcb_statuses = ["ConfigurationAndSWHardeningNeeded"]\n'
        f'[[sgx.allow]]\nmrenclave = "{r.mr_enclave.hex()}"\n'
    ), r.report_data


def tdx_policy(name, quote, statuses='["UpToDate"]'):
    r = dcap_qvl.parse_quote(quote).report
    regs = {n: getattr(r, n).hex() for n in ("mr_td", "rt_mr0", "rt_mr1", "rt_mr2", "rt_mr3")}
    return Policy.parse(
        f'allowed_kinds = ["tdx"]\n[collateral]\nfile = "{DATA}/{name}_collateral.json"\n'
        f"[tdx]\naccepted_tcb_statuses = {statuses}\n"
        f'[[tdx.allow]]\nmrtd = "{regs["mr_td"]}"\nrtmr0 = "{regs["rt_mr0"]}"\nrtmr1 = "{regs["rt_mr1"]}"\n'
        f'rtmr2 = "{regs["rt_mr2"]}"\nrtmr3 = "{regs["rt_mr3"]}"\n'
    ), r.report_data


def check_of(pol, q, rd, at, nonce=None):
    with pytest.raises(VerificationError) as e:
        verify_evidence(pol, "dcap", q, rd[32:] if nonce is None else nonce, rd[:32], at=at)
    return e.value.check


def test_sgx_quote_verifies_and_refusals():
    q = (DATA / "sgx_quote").read_bytes()
    pol, rd = sgx_policy(q)
    v = verify_evidence(pol, "dcap", q, rd[32:], rd[:32], at=JUNE_2025)
    assert v.kind == "sgx"
    assert check_of(pol, q, rd, JUNE_2025, nonce=os.urandom(32)) == "nonce"
    # One year later the same collateral is stale.
    assert check_of(pol, q, rd, JUNE_2025 + 365 * 86400) == "collateral freshness and issuer chains"
    # The default accepted statuses do not include this platform's.
    strict = Policy.parse(pol_text := f'allowed_kinds = ["sgx"]\n[collateral]\nfile = "{DATA}/sgx_quote_collateral.json"\n'
                          f'[sgx]\naccepted_tcb_statuses = ["UpToDate"]\n[[sgx.allow]]\nmrenclave = "{"00" * 32}"\n')
    assert check_of(strict, q, rd, JUNE_2025) == "TCB status"
    assert check_of(sgx_policy(q, "max_age_days = 0")[0], q, rd, JUNE_2025) == "collateral freshness and issuer chains"
    # Trailing bytes, and flipped bytes anywhere.
    assert check_of(pol, q + b"\1", rd, JUNE_2025) == "canonical encoding"
    for i in list(range(0, len(q), 37)) + [len(q) - 1]:
        t = bytearray(q)
        t[i] ^= 1
        with pytest.raises(VerificationError):
            verify_evidence(pol, "dcap", bytes(t), rd[32:], rd[:32], at=JUNE_2025)


def test_tdx_quotes():
    q = (DATA / "tdx_quote").read_bytes()
    pol, rd = tdx_policy("tdx_quote", q)
    assert verify_evidence(pol, "dcap", q, rd[32:], rd[:32], at=JUNE_2025).kind == "tdx"
    old = (DATA / "tdx_quote_outdated").read_bytes()
    pol, rd = tdx_policy("tdx_quote_outdated", old, statuses='["UpToDate", "OutOfDate"]')
    assert check_of(pol, old, rd, calendar.timegm((2026, 2, 25, 0, 0, 0))) == "signature chain and collateral (dcap-qvl)"
    assert check_of(pol, old, rd, calendar.timegm((2026, 2, 17, 0, 0, 0))) == "collateral freshness and issuer chains"


def test_policy_without_collateral_file_is_refused_as_not_built():
    q = (DATA / "sgx_quote").read_bytes()
    pol = Policy.parse(f'allowed_kinds = ["sgx"]\n[collateral]\npccs_url = "https://pccs.example"\n[sgx]\n')
    assert check_of(pol, q, b"\0" * 64, JUNE_2025) == "not built"
    sim_only = Policy.parse('allowed_kinds = ["snp"]\n[snp]\n')
    assert check_of(sim_only, q, b"\0" * 64, JUNE_2025) == "kind allowed"
