"""The client credential file written by ``psl keys client``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .errors import CredentialError
from .wire import sign_digest

#: Largest credential file read.
CREDENTIAL_BYTES_MAX = 64 * 1024


@dataclass(frozen=True)
class Credential:
    """A client key and the owner-signed certificate that names its capsule and rights."""

    capsule: bytes
    can: List[str]
    public: bytes
    cert: bytes
    _key: ec.EllipticCurvePrivateKey = field(repr=False, compare=False)

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> "Credential":
        """Reads a credential file (JSON: version, capsule, can, key, public, cert)."""
        try:
            with open(path, "rb") as f:
                raw = f.read(CREDENTIAL_BYTES_MAX + 1)
        except OSError as e:
            raise CredentialError(f"reading the credential {path}: {e}") from e
        if len(raw) > CREDENTIAL_BYTES_MAX:
            raise CredentialError(f"credential {path}: over {CREDENTIAL_BYTES_MAX} bytes")
        try:
            return cls.from_json(json.loads(raw))
        except CredentialError as e:
            raise CredentialError(f"credential {path}: {e}") from e
        except ValueError as e:
            raise CredentialError(f"credential {path}: not JSON: {e}") from e

    @classmethod
    def from_json(cls, d: object) -> "Credential":
        """A credential from the file's parsed JSON."""
        if not isinstance(d, dict):
            raise CredentialError("not a JSON object")
        if d.get("version") != 1:
            raise CredentialError(f"version {d.get('version')!r}, this SDK reads version 1")

        def hexfield(name: str, n: int = 0) -> bytes:
            v = d.get(name)
            if not isinstance(v, str):
                raise CredentialError(f"{name!r} missing")
            try:
                b = bytes.fromhex(v)
            except ValueError:
                raise CredentialError(f"{name!r} is not hex") from None
            if n and len(b) != n:
                raise CredentialError(f"{name!r} is {len(b)} bytes, expected {n}")
            return b

        secret = hexfield("key", 32)
        public = hexfield("public", 33)
        try:
            key = ec.derive_private_key(int.from_bytes(secret, "big"), ec.SECP256K1())
        except ValueError as e:
            raise CredentialError(f"'key' is not a secp256k1 secret: {e}") from None
        mine = key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
        )
        if mine != public:
            raise CredentialError("'public' is not the public key of 'key'")
        can = d.get("can", [])
        if not isinstance(can, list) or not all(isinstance(c, str) for c in can):
            raise CredentialError("'can' must be a list of strings")
        return cls(capsule=hexfield("capsule", 32), can=list(can), public=public, cert=hexfield("cert"), _key=key)

    def sign(self, digest: bytes) -> bytes:
        """The 64-byte compact low-S signature of a 32-byte request digest."""
        return sign_digest(self._key, digest)
