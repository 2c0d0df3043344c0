"""Evidence verification under a :class:`~psl_client.policy.Policy`, as PSL's Rust
``PolicyVerifier`` does: the backend names the TEE kind, the policy must allow that kind, then
the kind's verifier checks the evidence, its measurement, and the two bindings the client
computes itself (report data and nonce).

Backends: ``sim-INSECURE`` (the simulated platform: accepted only with
``allow_insecure_sim = true``), ``snp`` (AMD SEV-SNP, :mod:`psl_client.snp`) and ``dcap``
(Intel SGX / TDX quotes, :mod:`psl_client.dcap`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .errors import VerificationError
from .policy import Policy
from .wire import secp256k1_public, sha256, verify_digest

SIM_BACKEND = "sim-INSECURE"
SNP_BACKEND = "snp"
DCAP_BACKEND = "dcap"

SIM_MAGIC = b"PSLSIMR1"
SIM_BODY = 8 + 32 + 32 + 32
SIM_LEN = SIM_BODY + 64


@dataclass
class VerifiedReport:
    """What a verification established, and the checks it made (``(name, detail)``)."""

    kind: str
    measurement: bytes
    report_data: bytes
    checks: List[Tuple[str, str]] = field(default_factory=list)


class CheckLog:
    """The checks of one verification, in order; a failure raises :class:`VerificationError`."""

    def __init__(self) -> None:
        self.checks: List[Tuple[str, str]] = []

    def ok(self, name: str, detail: str = "") -> None:
        """Records a passed check."""
        self.checks.append((name, detail))

    def fail(self, name: str, detail: str) -> VerificationError:
        """The error for a failed check (``raise log.fail(...)``)."""
        return VerificationError(name, detail)


def check_report_data(rd: bytes, nonce: bytes, report_data: bytes, log: CheckLog) -> None:
    """Checks a 64-byte report data field is ``report_data || nonce``."""
    if rd[:32] != report_data:
        raise log.fail(
            "report data binds the channel key",
            "the report does not bind the channel key offered with it (another TLS key: a proxy?)",
        )
    log.ok("report data binds the channel key", rd[:32].hex())
    if rd[32:64] != nonce:
        raise log.fail("nonce", "the report's nonce is not the one issued (stale or replayed report)")
    log.ok("nonce", "the report carries the issued nonce")


def verify_sim(policy: Policy, evidence: bytes, nonce: bytes, report_data: bytes, log: CheckLog) -> VerifiedReport:
    """Verifies a report of the INSECURE sim backend: ``"PSLSIMR1" || measurement || report
    data || nonce || secp256k1 signature`` over ``SHA256("psl/sim-report/v1" || first 104
    bytes)`` by the policy's ``[sim] platform_public``."""
    b = evidence
    if len(b) != SIM_LEN or b[:8] != SIM_MAGIC:
        raise log.fail("format", f"{len(b)} bytes, a sim report is {SIM_LEN} starting PSLSIMR1")
    log.ok("format", "sim report (INSECURE backend)")
    assert policy.sim_platform_public is not None
    key = secp256k1_public(policy.sim_platform_public)
    if not verify_digest(key, sha256(b"psl/sim-report/v1", b[:SIM_BODY]), b[SIM_BODY:]):
        raise log.fail("signature", "the report's signature does not verify under the sim platform key")
    log.ok("signature", "signed by the simulated platform key (which anyone holding it can use)")
    measurement = b[8:40]
    if measurement not in policy.measurements.get("sim", set()):
        raise log.fail("measurement", f"measurement {measurement.hex()} is not in the policy")
    log.ok("measurement", f"{measurement.hex()} is allowed")
    check_report_data(b[40:104], nonce, report_data, log)
    return VerifiedReport("sim", measurement, report_data, log.checks)


def verify_evidence(
    policy: Policy,
    backend: str,
    evidence: bytes,
    nonce: bytes,
    report_data: bytes,
    at: Optional[int] = None,
) -> VerifiedReport:
    """Verifies ``evidence`` of ``backend`` under ``policy``, requiring it to carry ``nonce``
    and bind ``report_data``. ``at``: the verification time (Unix seconds; default now).
    Raises :class:`VerificationError` naming the failing check."""
    log = CheckLog()
    if len(nonce) != 32 or len(report_data) != 32:
        raise ValueError("nonce and report data are 32 bytes")
    if backend == SIM_BACKEND:
        kind = "sim"
    elif backend == SNP_BACKEND:
        kind = "snp"
    elif backend == DCAP_BACKEND:
        from .dcap import quote_kind

        kind = quote_kind(evidence, log)
    else:
        raise log.fail("backend", f"unknown evidence backend {backend!r}")
    if kind == "sim" and not policy.allow_insecure_sim:
        raise log.fail(
            "kind allowed",
            "evidence from the INSECURE sim backend, and the policy does not say allow_insecure_sim = true: refused",
        )
    if not policy.allows(kind):
        raise log.fail("kind allowed", f"TEE kind {kind!r} is not allowed by the policy (allowed_kinds)")
    log.ok("kind allowed", f"{kind} is allowed by {policy.origin}")
    if kind == "sim":
        return verify_sim(policy, evidence, nonce, report_data, log)
    if kind == "snp":
        from .snp import verify_snp

        return verify_snp(policy, evidence, nonce, report_data, log, at=at)
    from .dcap import verify_dcap

    return verify_dcap(policy, kind, evidence, nonce, report_data, log, at=at)
