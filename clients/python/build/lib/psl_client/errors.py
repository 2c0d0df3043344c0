"""The exceptions the SDK raises. Every refusal is a :class:`PslError`."""

from __future__ import annotations

from typing import Any, Dict, Optional


class PslError(Exception):
    """Base class of every error the SDK raises."""


class PolicyError(PslError):
    """The policy file could not be read or is refused (unknown key, missing section, ...)."""


class CredentialError(PslError):
    """The credential file could not be read or is malformed."""


class VerificationError(PslError):
    """The endpoint's evidence was refused; ``check`` names the failing check.

    Checks are named as ``psl verify`` names them: ``policy``, ``kind allowed``, ``format``,
    ``signature``, ``measurement``, ``report data binds the channel key``, ``nonce``,
    ``ARK (trust anchor)``, ``ASK signed by the ARK``, ``VCEK signed by the ASK``,
    ``report signature``, ``not built`` (a check this SDK cannot make), ...
    """

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


class PinError(PslError):
    """A connection presented a TLS key other than the one verified and pinned."""


class AnswerError(PslError):
    """An answer whose signature does not check under the pinned key (for this request and
    nonce), or that is malformed or over the size bound."""


class ApiError(PslError):
    """The endpoint answered (with a valid signature) a status the call does not expect."""

    def __init__(self, status: int, message: str, receipt: Optional["object"] = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.receipt = receipt


class AuthError(ApiError):
    """401 (no or bad credential or signature) or 403 (another capsule, or a missing
    permission); ``message`` is the server's."""


class JobError(PslError):
    """A job ended ``failed`` (``error`` is the leader's reason), or did not end in time."""

    def __init__(self, job_id: str, error: str, report: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(f"job {job_id}: {error}")
        self.job_id = job_id
        self.error = error
        #: The job's report when it has one (each lambda's ``error`` is there).
        self.report = report
