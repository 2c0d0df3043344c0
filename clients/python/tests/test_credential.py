"""The credential file psl keys client writes: loaded, checked, used to sign."""

import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from psl_client import Credential, CredentialError
from psl_client.wire import secp256k1_public, sha256, verify_digest


def cred_json(**over):
    k = ec.generate_private_key(ec.SECP256K1())
    pub = k.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    d = {
        "version": 1,
        "capsule": "ab" * 32,
        "can": ["read", "write"],
        "key": k.private_numbers().private_value.to_bytes(32, "big").hex(),
        "public": pub.hex(),
        "cert": "0102",
    }
    d.update(over)
    return d


def test_load_and_sign(tmp_path):
    p = tmp_path / "c.cred"
    d = cred_json()
    p.write_text(json.dumps(d))
    os.chmod(p, 0o600)
    c = Credential.load(p)
    assert c.can == ["read", "write"] and c.cert == b"\1\2" and c.capsule == b"\xab" * 32
    digest = sha256(b"x")
    assert verify_digest(secp256k1_public(c.public), digest, c.sign(digest))
    assert "key" not in repr(c).replace("_key", "")  # the secret is not printed


def test_refused(tmp_path):
    other = cred_json()
    for bad in (
        cred_json(version=2),
        cred_json(public=other["public"]),
        cred_json(key="00" * 32),
        cred_json(capsule="ab"),
        cred_json(cert="zz"),
        cred_json(can="read"),
    ):
        with pytest.raises(CredentialError):
            Credential.from_json(bad)
    p = tmp_path / "x.cred"
    p.write_text("not json")
    with pytest.raises(CredentialError):
        Credential.load(p)
    with pytest.raises(CredentialError):
        Credential.load(tmp_path / "missing.cred")
