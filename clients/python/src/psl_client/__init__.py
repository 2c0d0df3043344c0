"""PSL's Python SDK: a client of the attested HTTPS KV API (docs/client.md).

Before it sends anything, :class:`Client` checks that the endpoint runs code its policy
accepts and that the TLS key it talks to is the one that code holds; it then pins that key,
signs each request with the credential, and checks each answer's signature.
"""

from .attest import VerifiedReport, verify_evidence
from .client import Client, Item, Receipt, ScanPage, Version
from .credential import Credential
from .errors import (
    AnswerError,
    ApiError,
    AuthError,
    CredentialError,
    JobError,
    PinError,
    PolicyError,
    PslError,
    VerificationError,
)
from .policy import Policy
from .shards import ShardMap, point

__all__ = [
    "AnswerError",
    "ApiError",
    "AuthError",
    "Client",
    "Item",
    "Credential",
    "CredentialError",
    "JobError",
    "PinError",
    "Policy",
    "PolicyError",
    "PslError",
    "Receipt",
    "ScanPage",
    "ShardMap",
    "VerificationError",
    "VerifiedReport",
    "Version",
    "point",
    "verify_evidence",
]
__version__ = "0.1.0"
