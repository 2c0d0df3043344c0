"""Request digests, signing with low S, answer messages; the Rust side's test vectors."""

import json
import os

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from psl_client import wire
from psl_client.client import Receipt

VECTORS = os.path.join(os.path.dirname(__file__), "vectors.json")


def test_request_hash_and_digest_are_the_spec_formulas():
    rh = wire.request_hash("PUT", "/v1/kv/a%2Fb?x=1", b"value")
    assert rh == wire.sha256(b"PUT\n/v1/kv/a%2Fb?x=1\nvalue")
    d = wire.request_digest(b"\1" * 32, b"\2" * 32, rh)
    assert d == wire.sha256(b"psl/http-request/v1" + b"\1" * 32 + b"\2" * 32 + rh)
    m = wire.answer_message(b"\2" * 32, rh, 200, b"{}")
    assert m == b"psl/http-answer/v1" + b"\2" * 32 + rh + b"\x00\xc8" + wire.sha256(b"{}")
    assert wire.bind_https_tls(b"\3" * 32) == wire.sha256(b"psl/report-data/v1", b"psl/https-tls/v1", b"\3" * 32)


@pytest.mark.skipif(not os.path.exists(VECTORS), reason="vectors.json (made by the Rust side) is absent")
def test_rust_vectors():
    v = json.load(open(VECTORS))
    r = v["request"]
    rh = wire.request_hash(r["method"], r["path_and_query"], bytes.fromhex(r["body_hex"]))
    assert rh.hex() == v["request_hash"]
    d = wire.request_digest(bytes.fromhex(v["server_spki_hash"]), bytes.fromhex(v["nonce"]), rh)
    assert d.hex() == v["request_digest"]
    a = v["answer"]
    m = wire.answer_message(bytes.fromhex(v["nonce"]), rh, a["status"], bytes.fromhex(a["body_hex"]))
    assert wire.sha256(m).hex() == a["message_sha256"]


def test_sign_then_verify_with_low_s():
    key = ec.generate_private_key(ec.SECP256K1())
    pub = key.public_key()
    for i in range(64):
        digest = wire.sha256(bytes([i]))
        sig = wire.sign_digest(key, digest)
        assert len(sig) == 64
        s = int.from_bytes(sig[32:], "big")
        assert 0 < s <= wire.SECP256K1_N // 2
        assert wire.verify_digest(pub, digest, sig)
        assert not wire.verify_digest(pub, wire.sha256(b"other"), sig)
        # The high-S twin is valid ECDSA but refused, as libsecp256k1 refuses it.
        high = sig[:32] + (wire.SECP256K1_N - s).to_bytes(32, "big")
        assert not wire.verify_digest(pub, digest, high)


def _receipt(status=200, body=b'{"ok":true}'):
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.hazmat.primitives import serialization

    k = ed25519.Ed25519PrivateKey.generate()
    pub = k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    nonce = os.urandom(32)
    rh = wire.request_hash("GET", "/v1/kv/x", b"")
    sig = k.sign(wire.answer_message(nonce, rh, status, body))
    return Receipt("GET", "/v1/kv/x", b"", nonce, status, body, sig, pub), pub


def test_answer_verification():
    r, pub = _receipt()
    assert r.verify() and r.verify(pub)
    assert Receipt.from_dict(json.loads(json.dumps(r.to_dict()))).verify(pub)
    other, _ = _receipt()
    assert not r.verify(other.server_key)
    flipped = bytearray(r.body)
    flipped[3] ^= 1
    assert not Receipt(**{**r.__dict__, "body": bytes(flipped)}).verify()
    assert not Receipt(**{**r.__dict__, "nonce": os.urandom(32)}).verify()
    assert not Receipt(**{**r.__dict__, "status": 201}).verify()
    assert not Receipt(**{**r.__dict__, "path_and_query": "/v1/kv/y"}).verify()
    sig = bytearray(r.signature)
    sig[0] ^= 0x80
    assert not Receipt(**{**r.__dict__, "signature": bytes(sig)}).verify()
    assert not Receipt(**{**r.__dict__, "signature": b""}).verify()
