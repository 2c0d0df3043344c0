"""Test helpers: sim reports made in Python, a TLS relay with its own key."""

from __future__ import annotations

import datetime
import os
import select
import socket
import ssl
import tempfile
import threading
from typing import List, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from psl_client.wire import sha256, sign_digest


def sim_platform() -> Tuple[ec.EllipticCurvePrivateKey, str]:
    """A sim platform key and its compressed public key in hex."""
    k = ec.generate_private_key(ec.SECP256K1())
    pub = k.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    return k, pub.hex()


def sim_report(key: ec.EllipticCurvePrivateKey, measurement: bytes, report_data: bytes, nonce: bytes) -> bytes:
    """A sim report as PSL's SimAttester makes it."""
    body = b"PSLSIMR1" + measurement + report_data + nonce
    return body + sign_digest(key, sha256(b"psl/sim-report/v1", body))


def sim_policy_text(pub_hex: str, measurements: List[bytes], allow: bool = True) -> str:
    """A policy accepting the sim backend (or, with ``allow=False``, one that does not)."""
    if not allow:
        return f'allowed_kinds = ["snp"]\n[snp]\n[[snp.allow]]\nmeasurement = "{"00" * 48}"\n'
    s = f'allowed_kinds = ["sim"]\nallow_insecure_sim = true\n[sim]\nplatform_public = "{pub_hex}"\n'
    for m in measurements:
        s += f'[[sim.allow]]\nmeasurement = "{m.hex()}"\n'
    return s


def self_signed_ed25519() -> Tuple[str, str]:
    """A fresh self-signed Ed25519 certificate and key, as PEM files; returns their paths."""
    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "relay")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, None)
    )
    d = tempfile.mkdtemp(prefix="psl-relay-")
    cp, kp = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    with open(cp, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(kp, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cp, kp


class TlsRelay:
    """Terminates TLS with its own self-signed Ed25519 certificate and relays the plaintext
    to a real HTTPS endpoint (a man in the middle). ``url`` is where it listens."""

    def __init__(self, target_host: str, target_port: int) -> None:
        cp, kp = self_signed_ed25519()
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(cp, kp)
        self.client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.client_ctx.check_hostname = False
        self.client_ctx.verify_mode = ssl.CERT_NONE
        self.target = (target_host, target_port)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.socks: List[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            c.settimeout(10)
            s = self.server_ctx.wrap_socket(c, server_side=True)
            u = self.client_ctx.wrap_socket(socket.create_connection(self.target, timeout=10))
            self.socks += [s, u]
        except OSError:
            c.close()
            return

        # One thread per connection pair, never two threads on one SSL object: a short
        # timeout lets a recv that found only a TLS control record (a session ticket) return.
        peer = {s: u, u: s}
        try:
            for x in (s, u):
                x.settimeout(0.05)
            while not self.stop.is_set():
                ready = [x for x in (s, u) if x.pending()] or select.select([s, u], [], [], 0.2)[0]
                for x in ready:
                    try:
                        d = x.recv(65536)
                    except (TimeoutError, socket.timeout, ssl.SSLWantReadError):
                        continue
                    if not d:
                        return
                    peer[x].settimeout(10)
                    peer[x].sendall(d)
                    peer[x].settimeout(0.05)
        except OSError:
            pass
        finally:
            for x in (s, u):
                try:
                    x.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        self.thread.join(timeout=2)
