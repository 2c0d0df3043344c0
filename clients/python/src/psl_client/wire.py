"""The bytes of PSL's HTTPS API v1: hashes, labels, the request digest, the answer message,
and secp256k1 signing with low S. Pure functions, no I/O."""

from __future__ import annotations

import hashlib
import struct

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, utils
from cryptography.exceptions import InvalidSignature

#: Order of the secp256k1 group.
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141

TLS_SPKI_LABEL = b"psl/tls-spki/v1"
REPORT_DATA_LABEL = b"psl/report-data/v1"
HTTPS_TLS_LABEL = b"psl/https-tls/v1"
REQUEST_LABEL = b"psl/http-request/v1"
ANSWER_LABEL = b"psl/http-answer/v1"


def sha256(*parts: bytes) -> bytes:
    """SHA-256 over the concatenation of ``parts``."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


def spki_hash(spki_der: bytes) -> bytes:
    """``SHA256("psl/tls-spki/v1" || SubjectPublicKeyInfo DER)``."""
    return sha256(TLS_SPKI_LABEL, spki_der)


def cert_spki_der(cert_der: bytes) -> bytes:
    """The SubjectPublicKeyInfo (DER) of a certificate."""
    from cryptography import x509

    cert = x509.load_der_x509_certificate(cert_der)
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def cert_ed25519_key(cert_der: bytes) -> bytes:
    """The raw 32-byte Ed25519 public key of a certificate; ``ValueError`` if it is another
    kind of key."""
    from cryptography import x509

    key = x509.load_der_x509_certificate(cert_der).public_key()
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"the certificate's key is {type(key).__name__}, not Ed25519")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def bind_channel_key(channel_public: bytes) -> bytes:
    """``SHA256("psl/report-data/v1" || channel_public)``."""
    return sha256(REPORT_DATA_LABEL, channel_public)


def bind_https_tls(spki_h: bytes) -> bytes:
    """The report data of an HTTPS endpoint whose certificate's SPKI hashes to ``spki_h``."""
    if len(spki_h) != 32:
        raise ValueError("spki hash is 32 bytes")
    return bind_channel_key(HTTPS_TLS_LABEL + spki_h)


def request_hash(method: str, path_and_query: str, body: bytes) -> bytes:
    """``SHA256(METHOD || "\\n" || PATH_AND_QUERY || "\\n" || BODY)``."""
    return sha256(method.encode("ascii"), b"\n", path_and_query.encode("ascii"), b"\n", body)


def request_digest(server_spki_hash: bytes, nonce: bytes, req_hash: bytes) -> bytes:
    """``SHA256("psl/http-request/v1" || spki_hash || nonce || request_hash)``: what the
    client's key signs."""
    for name, v in (("spki hash", server_spki_hash), ("nonce", nonce), ("request hash", req_hash)):
        if len(v) != 32:
            raise ValueError(f"{name} must be 32 bytes")
    return sha256(REQUEST_LABEL, server_spki_hash, nonce, req_hash)


def answer_message(nonce: bytes, req_hash: bytes, status: int, body: bytes) -> bytes:
    """``"psl/http-answer/v1" || nonce || request_hash || u16be(status) || SHA256(body)``:
    what the endpoint's Ed25519 key signs."""
    if len(nonce) != 32 or len(req_hash) != 32:
        raise ValueError("nonce and request hash are 32 bytes")
    return ANSWER_LABEL + nonce + req_hash + struct.pack(">H", status) + sha256(body)


def event_message(nonce: bytes, req_hash: bytes, seq: int, event_json: bytes) -> bytes:
    """What a streamed event's signature covers: ``"psl/http-event/v1" ‖ nonce ‖ request hash
    ‖ seq (u64, big-endian) ‖ SHA-256(event JSON)``."""
    return b"psl/http-event/v1" + nonce + req_hash + struct.pack(">Q", seq) + sha256(event_json)


def sign_digest(key: ec.EllipticCurvePrivateKey, digest: bytes) -> bytes:
    """Signs a 32-byte digest as is (no further hashing) with secp256k1 ECDSA; returns the
    64-byte compact ``r || s`` with low S (``s <= n/2``)."""
    if len(digest) != 32:
        raise ValueError("digest is 32 bytes")
    der = key.sign(digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
    r, s = utils.decode_dss_signature(der)
    if s > SECP256K1_N // 2:
        s = SECP256K1_N - s
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def verify_digest(public: ec.EllipticCurvePublicKey, digest: bytes, sig: bytes) -> bool:
    """Checks a compact secp256k1 signature over a 32-byte digest as libsecp256k1 does: a
    high-S signature is refused."""
    if len(sig) != 64 or len(digest) != 32:
        return False
    r, s = int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")
    if not (0 < r < SECP256K1_N and 0 < s <= SECP256K1_N // 2):
        return False
    try:
        public.verify(
            utils.encode_dss_signature(r, s), digest, ec.ECDSA(utils.Prehashed(hashes.SHA256()))
        )
        return True
    except InvalidSignature:
        return False


def secp256k1_public(compressed: bytes) -> ec.EllipticCurvePublicKey:
    """A secp256k1 public key from its 33-byte compressed encoding."""
    return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), compressed)


def ed25519_verify(public: bytes, msg: bytes, sig: bytes) -> bool:
    """Checks an Ed25519 signature."""
    if len(public) != 32 or len(sig) != 64:
        return False
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public).verify(sig, msg)
        return True
    except (InvalidSignature, ValueError):
        return False
