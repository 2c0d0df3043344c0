"""Intel SGX / TDX DCAP quotes (backend ``dcap``), checked as PSL's Rust verifier
(crates/psl-faas/src/attest_dcap.rs) checks them, with the ``dcap-qvl`` Python bindings
(``pip install psl-client[dcap]``) doing the quote's cryptography:

1. form: the quote's header names SGX or TDX (the policy's ``allowed_kinds`` applies first);
2. canonical encoding: every length field exact (the quote is header, body, signature data
   and zero padding only), certification data of type 6 wrapping a type 5 PCK chain in
   canonical PEM that ends in Intel's SGX root CA (so no byte can change unnoticed);
3. collateral: from the policy's ``[collateral] file`` (JSON, as dcap-qvl writes it); every
   part (TCB info, QE identity, PCK CRL) inside its window at the verification time and no
   older than ``max_age_days``; its issuer chains canonical, each certificate signed by the
   next, ending in Intel's root;
4. ``dcap_qvl.verify``: PCK chain to Intel's root, CRLs, QE report and identity, attestation
   key, quote signature, TCB info signature and level;
5. the policy: TCB status accepted, debug refused, measurement allowed, ISV SVN;
6. report data and nonce.

Not built: collateral from a PCCS (``[collateral] pccs_url``; the Rust side fetches and
caches it): such a policy is refused with ``VerificationError("not built", ...)``, as is any
DCAP evidence when ``dcap-qvl`` is not installed.
"""

from __future__ import annotations

import base64
import calendar
import datetime
import json
import re
import struct
import time
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from .attest import CheckLog, VerifiedReport, check_report_data
from .policy import DcapSettings, Policy, sgx_mrenclave, sgx_mrsigner, tdx_measurement

QUOTE_BYTES_MAX = 64 * 1024
COLLATERAL_BYTES_MAX = 1 << 20
TEE_SGX = 0x00000000
TEE_TDX = 0x00000081
HEADER_LEN = 48
SGX_BODY_LEN = 384
TD10_BODY_LEN = 584


def intel_root_der() -> bytes:
    """Intel's SGX root CA (DER), the trust anchor of every quote."""
    return resources.files("psl_client").joinpath("intel_sgx_root_ca.der").read_bytes()


def quote_kind(quote: bytes, log: CheckLog) -> str:
    """``sgx`` or ``tdx`` from the quote header (not verified)."""
    if len(quote) > QUOTE_BYTES_MAX:
        raise log.fail("format", f"quote of {len(quote)} bytes, over {QUOTE_BYTES_MAX}")
    if len(quote) < HEADER_LEN:
        raise log.fail("format", f"quote of {len(quote)} bytes, shorter than its header")
    (tee,) = struct.unpack_from("<I", quote, 4)
    if tee == TEE_SGX:
        return "sgx"
    if tee == TEE_TDX:
        return "tdx"
    raise log.fail("format", f"quote: unknown TEE type {tee:#x}")


_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----\n?(.*?)-----END \1-----\n?", re.S)


def _canonical_pems(raw: bytes, what: str) -> List[bytes]:
    """The DER certificates of a PEM chain that is canonical (64-column lines, LF, nothing
    between or around the blocks), at least two, the last Intel's root."""
    ders: List[bytes] = []
    out = b""
    for m in _PEM.finditer(raw):
        if m.group(1) != b"CERTIFICATE":
            raise ValueError(f"{what}: a {m.group(1).decode()} block, expected certificates")
        der = base64.b64decode(b"".join(m.group(2).split()))
        ders.append(der)
        b64 = base64.b64encode(der)
        out += b"-----BEGIN CERTIFICATE-----\n" + b"".join(b64[i : i + 64] + b"\n" for i in range(0, len(b64), 64))
        out += b"-----END CERTIFICATE-----\n"
    if len(ders) < 2:
        raise ValueError(f"{what}: expected at least two certificates")
    if out != raw:
        raise ValueError(f"{what} is not in canonical PEM form")
    if ders[-1] != intel_root_der():
        raise ValueError(f"{what} does not end in the trusted root CA")
    return ders


def check_canonical(quote: bytes) -> None:
    """Every length field exact, zero padding only, a canonical PCK chain ending in Intel's
    root; ``ValueError`` otherwise."""
    version, _ak, tee = struct.unpack_from("<HHI", quote, 0)
    at = HEADER_LEN
    if version in (3, 4):
        at += SGX_BODY_LEN if tee == TEE_SGX else TD10_BODY_LEN
    elif version == 5:
        _body_type, body_len = struct.unpack_from("<HI", quote, at)
        at += 6 + body_len
    else:
        raise ValueError(f"quote version {version}, expected 3 to 5")
    (sig_len,) = struct.unpack_from("<I", quote, at)
    at += 4
    sig = quote[at : at + sig_len]
    if len(sig) != sig_len or any(quote[at + sig_len :]):
        raise ValueError("quote is not in canonical form (lengths, or non-zero trailing bytes)")

    def cert_data(b: bytes, o: int) -> Tuple[int, bytes, int]:
        t, n = struct.unpack_from("<HI", b, o)
        d = b[o + 6 : o + 6 + n]
        if len(d) != n:
            raise ValueError("quote certification data runs past its container")
        return t, d, o + 6 + n

    def qe_part(b: bytes, o: int) -> int:
        o += 384 + 64  # QE report, its signature
        (auth,) = struct.unpack_from("<H", b, o)
        return o + 2 + int(auth)

    if version == 3:
        o = qe_part(sig, 128)
        t, pem, end = cert_data(sig, o)
    else:
        t6, inner, end = cert_data(sig, 128)
        if t6 != 6:
            raise ValueError(f"certification data type {t6}, expected 6 (QE report certification data)")
        o = qe_part(inner, 0)
        t, pem, iend = cert_data(inner, o)
        if iend != len(inner):
            raise ValueError("quote is not in canonical form (QE certification data length)")
    if end != len(sig):
        raise ValueError("quote is not in canonical form (signature data length)")
    if t != 5:
        raise ValueError(f"PCK certification data type {t}, expected 5 (PEM chain)")
    _canonical_pems(pem.rstrip(b"\0"), "PCK certificate chain")


def _parse_time(s: Any, what: str) -> int:
    if not isinstance(s, str):
        raise ValueError(f"{what}: no valid time")
    t = s.strip()
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(Z|\+00:00)", t)
    if not m:
        raise ValueError(f"{what}: no valid time in {s!r}")
    y, mo, d, h, mi, se = (int(x) for x in m.groups()[:6])
    return int(calendar.timegm((y, mo, d, h, mi, se, 0, 0, 0)))


def _fmt(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_collateral(c: Dict[str, Any], t: int, max_age: Optional[int]) -> str:
    """Windows and age of the collateral's parts, and its issuer chains; ``ValueError``."""
    parts = []
    for what, key in (("TCB info", "tcb_info"), ("QE identity", "qe_identity")):
        body = json.loads(c[key])
        parts.append((what, _parse_time(body.get("issueDate"), what), _parse_time(body.get("nextUpdate"), what)))
    crl = x509.load_der_x509_crl(bytes.fromhex(c["pck_crl"]) if isinstance(c["pck_crl"], str) else bytes(c["pck_crl"]))
    if crl.next_update_utc is None:
        raise ValueError("PCK CRL: no nextUpdate")
    parts.append(("PCK CRL", int(crl.last_update_utc.timestamp()), int(crl.next_update_utc.timestamp())))
    for what, issued, nxt in parts:
        if t < issued or t > nxt:
            raise ValueError(f"{what} is valid from {_fmt(issued)} to {_fmt(nxt)}, not at {_fmt(t)}")
        if max_age is not None and t - issued > max_age:
            raise ValueError(f"{what} was issued {_fmt(issued)}, over the policy's maximum age of {max_age} s")
    for what, key in (
        ("PCK CRL issuer chain", "pck_crl_issuer_chain"),
        ("TCB info issuer chain", "tcb_info_issuer_chain"),
        ("QE identity issuer chain", "qe_identity_issuer_chain"),
    ):
        ders = _canonical_pems(c[key].encode(), what)
        certs = [x509.load_der_x509_certificate(d) for d in ders]
        for a, b in zip(certs, certs[1:]):
            try:
                a.verify_directly_issued_by(b)
            except (InvalidSignature, ValueError, TypeError) as e:
                raise ValueError(f"{what}: a certificate is not signed by the next: {e}") from None
    return f"TCB info, QE identity and PCK CRL valid at {_fmt(t)}"


def _identity(report: Dict[str, Any]) -> Tuple[List[bytes], bytes, Optional[int], bool]:
    """(measurement digests, report data, ISV SVN, debug) of a verified report's JSON."""
    h = bytes.fromhex
    if "SgxEnclave" in report:
        r = report["SgxEnclave"]
        digests = [sgx_mrenclave(h(r["mr_enclave"])), sgx_mrsigner(h(r["mr_signer"]), int(r["isv_prod_id"]))]
        return digests, h(r["report_data"]), int(r["isv_svn"]), bool(h(r["attributes"])[0] & 2)
    for k in ("TD10", "TD15", "TD15Ex"):
        if k in report:
            r = report[k]
            while "base" in r:  # TD15 wraps TD10
                r = r["base"]
            regs = [h(r[n]) for n in ("rt_mr0", "rt_mr1", "rt_mr2", "rt_mr3")]
            return [tdx_measurement(h(r["mr_td"]), regs)], h(r["report_data"]), None, bool(h(r["td_attributes"])[0] & 1)
    raise ValueError(f"unknown report kind {sorted(report)}")


def verify_dcap(
    policy: Policy, kind: str, quote: bytes, nonce: bytes, report_data: bytes, log: CheckLog, at: Optional[int] = None
) -> VerifiedReport:
    """Verifies a DCAP quote (see the module docs); raises ``VerificationError``."""
    try:
        import dcap_qvl  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise log.fail(
            "not built",
            f"{kind} DCAP quotes need the dcap-qvl package (pip install psl-client[dcap]); without it the quote's "
            "signature chain, collateral, TCB status and measurement would remain unchecked: refused",
        ) from None
    settings: Optional[DcapSettings] = policy.sgx if kind == "sgx" else policy.tdx
    assert settings is not None
    t = int(time.time()) if at is None else at
    log.ok("format", f"DCAP quote of {len(quote)} bytes, TEE {kind}")
    try:
        check_canonical(quote)
    except (ValueError, struct.error) as e:
        raise log.fail("canonical encoding", str(e)) from None
    log.ok("canonical encoding", "exact lengths, zero padding only, canonical PEM chain ending in the trusted root CA")
    file = policy.collateral.get("file")
    if not file:
        raise log.fail(
            "not built",
            "this SDK reads DCAP collateral only from the policy's [collateral] file (fetching from a PCCS is not "
            "built): refused",
        )
    path = Path(file) if Path(file).is_absolute() else policy.base / file
    try:
        text = path.read_bytes()[: COLLATERAL_BYTES_MAX + 1]
        if len(text) > COLLATERAL_BYTES_MAX:
            raise ValueError("over 1 MiB")
        coll = json.loads(text)
        collateral = dcap_qvl.QuoteCollateralV3.from_json(text.decode())
    except (OSError, ValueError, TypeError) as e:
        raise log.fail("collateral", f"{path}: {e}") from None
    log.ok("collateral", str(path))
    days = policy.collateral.get("max_age_days")
    try:
        detail = check_collateral(coll, t, None if days is None else int(days) * 86400)
    except (ValueError, KeyError, TypeError) as e:
        raise log.fail("collateral freshness and issuer chains", str(e)) from None
    log.ok("collateral freshness and issuer chains", detail)
    try:
        v = dcap_qvl.verify(quote, collateral, t)
        verified = json.loads(v.to_json())
    except Exception as e:  # the bindings raise ValueError, or their own errors
        raise log.fail("signature chain and collateral (dcap-qvl)", f"quote or collateral refused at {_fmt(t)}: {e}") from None
    log.ok("signature chain and collateral (dcap-qvl)", "PCK chain to Intel's root, CRLs, QE report, quote signature, TCB level")
    status = verified.get("status")
    if status not in settings.accepted_tcb_statuses:
        raise log.fail(
            "TCB status",
            f"platform TCB status {status} is not accepted by the policy (advisories: {','.join(verified.get('advisory_ids') or [])})",
        )
    log.ok("TCB status", str(status))
    try:
        digests, rd, isv_svn, debug = _identity(verified["report"])
    except (KeyError, ValueError, TypeError) as e:
        raise log.fail("format", f"the verified report: {e}") from None
    if debug and not settings.allow_debug:
        raise log.fail("debug", f"a debug {kind}")
    log.ok("debug", "not a debug enclave or TD" if not debug else "debug, allowed by the policy")
    allowed = policy.measurements.get(kind, set())
    m = next((d for d in digests if d in allowed), None)
    if m is None:
        raise log.fail("measurement", f"{kind} measurement {digests[0].hex()} is not in the policy")
    log.ok("measurement", m.hex())
    if isv_svn is not None and m in settings.min_svn and isv_svn < settings.min_svn[m]:
        raise log.fail("ISV SVN", f"ISV SVN {isv_svn} < the minimum {settings.min_svn[m]}")
    check_report_data(rd, nonce, report_data, log)
    return VerifiedReport(kind, m, report_data, log.checks)
