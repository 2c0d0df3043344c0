"""The client: verify the endpoint, pin its key, sign requests, check answers."""

from __future__ import annotations

import base64
import collections
import http.client
import json
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlsplit

from .attest import VerifiedReport, verify_evidence
from .credential import Credential
from .errors import AnswerError, ApiError, AuthError, JobError, PinError, VerificationError
from .policy import Policy
from .shards import ShardMap
from .wire import (
    answer_message,
    event_message,
    bind_https_tls,
    cert_ed25519_key,
    cert_spki_der,
    ed25519_verify,
    request_digest,
    request_hash,
    spki_hash,
)

#: Largest answer body read (bigger ones are refused unread).
BODY_BYTES_MAX = 16 * 1024 * 1024
#: Largest attestation answer read.
ATTESTATION_BYTES_MAX = 1 << 20
#: Longest key (bytes), memcached's.
KEY_BYTES_MAX = 250
#: Largest value (bytes) the endpoint takes.
VALUE_BYTES_MAX = 1 << 20
#: Most ops in one atomic batch.
BATCH_OPS_MAX = 256
#: Longest line of an event stream read.
EVENT_LINE_BYTES_MAX = 1 << 20
#: Receipts kept by a client (oldest dropped first).
RECEIPTS_KEPT = 1024

BytesLike = Union[bytes, bytearray, memoryview, str]


def _b(v: BytesLike) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


@dataclass(frozen=True)
class Version:
    """The record version of the write that made a value."""

    lamport: int
    writer: int
    cas: int


@dataclass(frozen=True)
class Item:
    """One item of a scan."""

    key: bytes
    value: bytes
    version: Version


@dataclass
class ScanPage:
    """A page of a scan, in key order; ``more``: the endpoint has more after the last key
    (ask again with ``after=page.items[-1].key``). Iterable over its items."""

    items: List[Item]
    more: bool
    epoch: int

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Receipt:
    """One answer as the endpoint signed it, with the request it answers: enough to show
    anyone later what the attested endpoint said (with the evidence that bound its key)."""

    method: str
    path_and_query: str
    request_body: bytes
    nonce: bytes
    status: int
    body: bytes
    signature: bytes
    #: The endpoint's pinned Ed25519 key when the answer was checked.
    server_key: bytes

    @property
    def request_hash(self) -> bytes:
        """``SHA256(METHOD || "\\n" || PATH_AND_QUERY || "\\n" || BODY)``."""
        return request_hash(self.method, self.path_and_query, self.request_body)

    def message(self) -> bytes:
        """The bytes the endpoint signed."""
        return answer_message(self.nonce, self.request_hash, self.status, self.body)

    def verify(self, pinned_key: Optional[bytes] = None) -> bool:
        """Whether the signature checks under ``pinned_key`` (default: the key it was
        checked with)."""
        return ed25519_verify(self.server_key if pinned_key is None else pinned_key, self.message(), self.signature)

    def json(self) -> Any:
        """The answer body, parsed."""
        return json.loads(self.body)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready form (hex for bytes)."""
        return {
            "method": self.method,
            "path_and_query": self.path_and_query,
            "request_body": self.request_body.hex(),
            "nonce": self.nonce.hex(),
            "status": self.status,
            "body": self.body.hex(),
            "signature": self.signature.hex(),
            "server_key": self.server_key.hex(),
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Receipt":
        """The inverse of :meth:`to_dict`."""
        h = bytes.fromhex
        return cls(d["method"], d["path_and_query"], h(d["request_body"]), h(d["nonce"]), int(d["status"]),
                   h(d["body"]), h(d["signature"]), h(d["server_key"]))


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection that keeps the peer's certificate and, once a key is pinned,
    refuses any connection presenting another one."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self.pin: Optional[bytes] = None
        self.peer_cert: Optional[bytes] = None
        #: Whether a signed request on this TLS connection was accepted (later ones may go
        #: unsigned, spec "connection-proved credentials").
        self.proved = False

    def connect(self) -> None:
        super().connect()
        self.proved = False
        assert isinstance(self.sock, ssl.SSLSocket)
        der = self.sock.getpeercert(binary_form=True)
        if not der:
            self.close()
            raise PinError("the endpoint presented no certificate")
        self.peer_cert = der
        if self.pin is not None:
            try:
                key: Optional[bytes] = cert_ed25519_key(der)
            except ValueError:
                key = None
            if key != self.pin:
                self.close()
                raise PinError(
                    f"the endpoint presented TLS key {key.hex() if key else '(not Ed25519)'}, "
                    f"not the verified and pinned {self.pin.hex()}: refused"
                )


def _read_bounded(resp: http.client.HTTPResponse, limit: int) -> bytes:
    n = resp.getheader("content-length")
    if n is not None and n.strip().isdigit() and int(n) > limit:
        raise AnswerError(f"the answer announces {n} bytes, over the bound {limit}")
    body = resp.read(limit + 1)
    if len(body) > limit:
        raise AnswerError(f"the answer is over the bound of {limit} bytes")
    return body


class Client:
    """A client of one PSL HTTPS endpoint (a front end's KV API).

    Constructing it verifies the endpoint before anything else is sent: a TLS handshake
    (any certificate accepted, kept), ``GET /v1/attestation`` with a fresh nonce, the evidence
    checked under ``policy`` with the report data required to bind *this* certificate's key
    and the nonce required to be ours. Raises :class:`VerificationError` otherwise. The
    verified Ed25519 key is then pinned: a later connection with another key raises
    :class:`PinError`.

    Each call sends a fresh nonce and the credential, signed (the first request of each
    connection; ``sign_every_request=True`` signs all), and checks the answer's signature
    under the pinned key over that nonce and request (:class:`AnswerError` if it does not).
    401/403 raise :class:`AuthError`. Every checked answer is kept as a :class:`Receipt`
    (``last_receipt``, ``receipts``). Thread-safe (one connection, calls serialized).

    ``url``: ``https://HOST:PORT``. ``policy``, ``credential``: paths or loaded objects.
    ``timeout``: seconds per socket operation. ``verify_at``: verification time (Unix
    seconds) for the evidence's certificates; default now. ``shard_map``: the deployment's
    shard map (``psl shard show --json``, a path or a loaded :class:`ShardMap`); with it,
    every answer about a key must name the capsule the map gives that key
    (:class:`AnswerError` otherwise), so a front end of the wrong shard cannot answer for it.
    """

    def __init__(
        self,
        url: str,
        policy: Union[str, "os.PathLike[str]", Policy] = "policy.toml",
        credential: Union[str, "os.PathLike[str]", Credential, None] = "client.cred",
        timeout: float = 10.0,
        *,
        max_body: int = BODY_BYTES_MAX,
        sign_every_request: bool = False,
        verify_at: Optional[int] = None,
        shard_map: Union[str, "os.PathLike[str]", ShardMap, None] = None,
    ) -> None:
        u = urlsplit(url)
        if u.scheme != "https" or not u.hostname or u.port is None:
            raise ValueError(f"{url}: give the endpoint as https://HOST:PORT")
        self.url = url
        self.policy = policy if isinstance(policy, Policy) else Policy.load(policy)
        self.credential: Optional[Credential] = (
            credential if isinstance(credential, Credential) or credential is None else Credential.load(credential)
        )
        self.timeout = timeout
        self.max_body = max_body
        self.sign_every_request = sign_every_request
        self.shard_map: Optional[ShardMap] = (
            shard_map if isinstance(shard_map, ShardMap) or shard_map is None else ShardMap.load(shard_map)
        )
        self.receipts: Deque[Receipt] = collections.deque(maxlen=RECEIPTS_KEPT)
        self._lock = threading.Lock()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the evidence vouches for the key, not a CA
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._conn = _Connection(u.hostname, u.port, ctx, timeout)
        try:
            self._conn.connect()
            cert = self._conn.peer_cert
            assert cert is not None
            try:
                key = cert_ed25519_key(cert)
            except ValueError as e:
                raise VerificationError("tls key", str(e)) from None
            self.spki_hash: bytes = spki_hash(cert_spki_der(cert))
            self.report: VerifiedReport = self._attest(verify_at)
            self.pinned_key: bytes = key
            self._conn.pin = key
        except BaseException:
            self._conn.close()
            raise

    # -- verification ---------------------------------------------------------------------

    def _attest(self, verify_at: Optional[int]) -> VerifiedReport:
        nonce = os.urandom(32)
        try:
            self._conn.request("GET", f"/v1/attestation?nonce={nonce.hex()}")
            resp = self._conn.getresponse()
            body = _read_bounded(resp, ATTESTATION_BYTES_MAX)
        except AnswerError as e:
            raise VerificationError("attestation", str(e)) from None
        except (OSError, http.client.HTTPException) as e:
            raise VerificationError("attestation", f"GET /v1/attestation failed: {e!r}") from None
        if resp.status != 200:
            raise VerificationError("attestation", f"HTTP {resp.status}: {body[:500]!r}")
        try:
            a = json.loads(body)
            backend = a["backend"]
            evidence = bytes.fromhex(a["evidence"])
            if not isinstance(backend, str):
                raise TypeError("backend is not a string")
        except (ValueError, KeyError, TypeError) as e:
            raise VerificationError("attestation", f"the attestation answer is malformed: {e}") from None
        self.attestation: Dict[str, Any] = a
        return verify_evidence(self.policy, backend, evidence, nonce, bind_https_tls(self.spki_hash), at=verify_at)

    # -- requests -------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connection (a later call reconnects, to the pinned key only)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def last_receipt(self) -> Optional[Receipt]:
        """The newest checked answer."""
        return self.receipts[-1] if self.receipts else None

    def request(self, method: str, path_and_query: str, body: bytes = b"") -> Tuple[Receipt, Any]:
        """Sends one signed request and returns its checked receipt and parsed JSON body.
        Raises :class:`AuthError` for 401/403; other statuses are the caller's."""
        if self.credential is None:
            raise AuthError(401, "this client has no credential")
        method = method.upper()
        with self._lock:
            for attempt in range(3):
                conn = self._conn
                if conn.sock is None:
                    conn.connect()  # the pin is checked here
                reused = conn.proved
                signed = self.sign_every_request or not conn.proved
                nonce = os.urandom(32)
                rh = request_hash(method, path_and_query, body)
                headers = {
                    "psl-nonce": nonce.hex(),
                    "psl-credential": self.credential.cert.hex(),
                    "Content-Length": str(len(body)),
                }
                if signed:
                    headers["psl-signature"] = self.credential.sign(request_digest(self.spki_hash, nonce, rh)).hex()
                try:
                    conn.request(method, path_and_query, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = _read_bounded(resp, self.max_body)
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    conn.close()
                    # A keep-alive connection the endpoint closed meanwhile: once more, anew
                    # (not for compare-and-set, whose retry could report a false conflict).
                    if attempt == 0 and reused and not path_and_query.startswith("/v1/cas"):
                        continue
                    raise
                except BaseException:
                    conn.close()
                    raise
                if resp.will_close:
                    conn.close()
                sig_hex = resp.getheader("psl-signature")
                try:
                    sig = bytes.fromhex(sig_hex or "")
                except ValueError:
                    sig = b""
                receipt = Receipt(method, path_and_query, body, nonce, resp.status, data, sig, self.pinned_key)
                if not receipt.verify():
                    conn.close()
                    raise AnswerError(
                        f"{method} {path_and_query}: HTTP {resp.status} answer whose signature does not check under "
                        f"the pinned key for this request and nonce ({'missing' if not sig_hex else 'bad'} psl-signature): refused"
                    )
                self.receipts.append(receipt)
                if resp.status == 401 and not signed and attempt < 2:
                    conn.proved = False  # the endpoint forgot the connection's proof: sign again
                    continue
                if resp.status not in (401, 403):
                    conn.proved = True
                try:
                    parsed = json.loads(data) if data else None
                except ValueError:
                    raise AnswerError(f"{method} {path_and_query}: the signed answer is not JSON") from None
                if resp.status in (401, 403):
                    msg = parsed.get("error", "") if isinstance(parsed, dict) else str(parsed)
                    raise AuthError(resp.status, msg, receipt)
                return receipt, parsed
        raise AnswerError("unreachable")  # pragma: no cover

    def _expect(self, receipt: Receipt, parsed: Any, ok: Sequence[int]) -> Dict[str, Any]:
        if receipt.status not in ok:
            msg = parsed.get("error", "") if isinstance(parsed, dict) else str(parsed)
            raise ApiError(receipt.status, msg or receipt.body[:200].decode("utf-8", "replace"), receipt)
        if not isinstance(parsed, dict):
            raise AnswerError(f"{receipt.method} {receipt.path_and_query}: the answer is not a JSON object")
        return parsed

    def _check_shard(self, receipt: Receipt, key: bytes, d: Dict[str, Any]) -> None:
        if self.shard_map is not None:
            why = self.shard_map.check_answer(key, d)
            if why is not None:
                raise AnswerError(f"{receipt.method} {receipt.path_and_query}: {why}")

    @staticmethod
    def _key_path(key: BytesLike) -> str:
        k = _b(key)
        if not 1 <= len(k) <= KEY_BYTES_MAX:
            raise ValueError(f"a key is 1 to {KEY_BYTES_MAX} bytes, got {len(k)}")
        if any(c <= 0x20 or c == 0x7F for c in k):
            raise ValueError("a key has no space or control character (memcached's rule)")
        return quote(k, safe="")

    @staticmethod
    def _version(v: Any) -> Version:
        return Version(int(v["lamport"]), int(v["writer"]), int(v["cas"]))

    # -- the KV API -----------------------------------------------------------------------

    def get(self, key: BytesLike) -> Optional[Tuple[bytes, Version]]:
        """The value of ``key`` and its version, or None if there is none."""
        r, p = self.request("GET", "/v1/kv/" + self._key_path(key))
        d = self._expect(r, p, (200, 404))
        self._check_shard(r, _b(key), d)
        if r.status == 404 or not d.get("found"):
            return None
        try:
            return base64.b64decode(d["value"], validate=True), self._version(d["version"])
        except (KeyError, ValueError, TypeError) as e:
            raise AnswerError(f"GET: malformed answer: {e}") from None

    def put(self, key: BytesLike, value: BytesLike) -> int:
        """Stores ``value`` at ``key``; returns its CAS unique."""
        v = _b(value)
        if len(v) > VALUE_BYTES_MAX:
            raise ValueError(f"a value is at most {VALUE_BYTES_MAX} bytes")
        r, p = self.request("PUT", "/v1/kv/" + self._key_path(key), v)
        d = self._expect(r, p, (200,))
        self._check_shard(r, _b(key), d)
        return int(d.get("cas", 0))

    def delete(self, key: BytesLike) -> bool:
        """Deletes ``key``; whether there was a value to delete."""
        r, p = self.request("DELETE", "/v1/kv/" + self._key_path(key))
        d = self._expect(r, p, (200,))
        self._check_shard(r, _b(key), d)
        return bool(d.get("deleted"))

    def scan(self, prefix: BytesLike = b"", limit: int = 100, after: Optional[BytesLike] = None) -> ScanPage:
        """Items whose keys start with ``prefix``, in key order, at most ``limit`` (1..1000);
        ``after``: the last key of the previous page."""
        if not 1 <= limit <= 1000:
            raise ValueError("limit is 1 to 1000")
        q = f"/v1/kv?prefix={quote(_b(prefix), safe='')}"
        if after is not None:
            q += f"&after={quote(_b(after), safe='')}"
        q += f"&limit={limit}"
        r, p = self.request("GET", q)
        d = self._expect(r, p, (200,))
        try:
            items = [
                Item(base64.b64decode(i["key"], validate=True), base64.b64decode(i["value"], validate=True),
                     self._version(i["version"]))
                for i in d["items"]
            ]
            return ScanPage(items, bool(d.get("more", False)), int(d.get("epoch", 0)))
        except (KeyError, ValueError, TypeError) as e:
            raise AnswerError(f"scan: malformed answer: {e}") from None

    def cas(self, key: BytesLike, cas_unique: int, value: BytesLike) -> bool:
        """Stores ``value`` only if the item's CAS unique is still ``cas_unique``; whether it
        was stored (False: someone wrote since, or there is no item)."""
        v = _b(value)
        if len(v) > VALUE_BYTES_MAX:
            raise ValueError(f"a value is at most {VALUE_BYTES_MAX} bytes")
        r, p = self.request("POST", f"/v1/cas/{self._key_path(key)}?cas={int(cas_unique)}", v)
        d = self._expect(r, p, (200, 409))
        self._check_shard(r, _b(key), d)
        return r.status == 200 and bool(d.get("stored"))

    def batch(self, ops: Sequence[Tuple[BytesLike, Optional[BytesLike]]]) -> List[Version]:
        """Writes ``ops`` atomically (``POST /v1/batch``): each ``(key, value)`` a put and each
        ``(key, None)`` a delete, in one record that every node applies whole, so no reader
        sees some of them without the others. Returns each op's version, in order (a delete's
        ``cas`` is 0). At most :data:`BATCH_OPS_MAX` ops; the endpoint refuses the whole batch
        (nothing written) if any op is bad."""
        if not 1 <= len(ops) <= BATCH_OPS_MAX:
            raise ValueError(f"a batch holds 1 to {BATCH_OPS_MAX} ops")
        wire = []
        for key, value in ops:
            k = _b(key)
            if not 1 <= len(k) <= KEY_BYTES_MAX:
                raise ValueError(f"a key is 1 to {KEY_BYTES_MAX} bytes")
            op: Dict[str, Any] = {"key": base64.b64encode(k).decode()}
            if value is None:
                op["op"] = "delete"
            else:
                v = _b(value)
                if len(v) > VALUE_BYTES_MAX:
                    raise ValueError(f"a value is at most {VALUE_BYTES_MAX} bytes")
                op.update(op="put", value=base64.b64encode(v).decode())
            wire.append(op)
        r, p = self.request("POST", "/v1/batch", json.dumps({"ops": wire}).encode())
        d = self._expect(r, p, (200,))
        for key, _ in ops:
            self._check_shard(r, _b(key), d)
        done = d.get("ops")
        if not d.get("applied") or not isinstance(done, list) or len(done) != len(ops):
            raise AnswerError("POST /v1/batch: the answer does not name every op")
        try:
            return [self._version(o["version"]) for o in done]
        except (KeyError, ValueError, TypeError) as e:
            raise AnswerError(f"POST /v1/batch: malformed answer: {e}") from None

    def sync(self, durable: bool = True) -> int:
        """Waits until this front end's writes so far are in a closed epoch (and, with
        ``durable``, held by a majority of capsule servers); returns the epoch."""
        r, p = self.request("POST", f"/v1/sync?durable={'true' if durable else 'false'}")
        return int(self._expect(r, p, (200,)).get("epoch", 0))

    # -- the jobs API (the leader's endpoint: faas.http in cluster.json) ------------------

    def submit(self, program: str, lambdas: int = 1, input: Optional[str] = None) -> str:
        """Starts a job (``POST /v1/jobs``; needs ``run``); returns its id. 503 (4 jobs run
        already) raises :class:`ApiError`."""
        if not 1 <= lambdas:
            raise ValueError("lambdas is at least 1")
        body = json.dumps({"program": program, "lambdas": lambdas, "input": input}).encode()
        r, p = self.request("POST", "/v1/jobs", body)
        d = self._expect(r, p, (202,))
        job_id = d.get("id")
        if not isinstance(job_id, str) or not job_id.isalnum():
            raise AnswerError("POST /v1/jobs: the answer names no job id")
        return job_id

    def job(self, job_id: str) -> Dict[str, Any]:
        """A job's status (``GET /v1/jobs/{id}``): ``{"id", "status", ...}``."""
        if not job_id.isalnum():
            raise ValueError("a job id is hex")
        r, p = self.request("GET", f"/v1/jobs/{job_id}")
        return self._expect(r, p, (200,))

    def events(self, job_id: str) -> Iterator[Dict[str, Any]]:
        """A job's progress as the leader streams it (``GET /v1/jobs/{id}/events``, server-sent
        events): yields each event, in order, once its signature checks under the pinned key
        over this request's nonce and hash and the event's place in the stream. Steps carry
        ``"progress": {"step": ...}``; the last event is the job's final status (what
        :meth:`job` answers) with ``"last": True``. A stream that ends before its last event
        (the endpoint caps a connection at 30 s) raises :class:`AnswerError`; subscribe again
        (the new stream starts from the job's first step)."""
        if self.credential is None:
            raise AuthError(401, "this client has no credential")
        if not (len(job_id) == 16 and all(c in "0123456789abcdef" for c in job_id)):
            raise ValueError("a job id is 16 lower-case hex digits")
        path = f"/v1/jobs/{job_id}/events"
        with self._lock:
            conn = self._conn
            if conn.sock is None:
                conn.connect()
            nonce = os.urandom(32)
            rh = request_hash("GET", path, b"")
            headers = {
                "psl-nonce": nonce.hex(),
                "psl-credential": self.credential.cert.hex(),
                "psl-signature": self.credential.sign(request_digest(self.spki_hash, nonce, rh)).hex(),
                "Content-Length": "0",
            }
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                if resp.status != 200:
                    data = _read_bounded(resp, self.max_body)
                    sig = bytes.fromhex(resp.getheader("psl-signature") or "")
                    receipt = Receipt("GET", path, b"", nonce, resp.status, data, sig, self.pinned_key)
                    if not receipt.verify():
                        raise AnswerError(f"GET {path}: HTTP {resp.status} answer whose signature does not check")
                    parsed = json.loads(data) if data else None
                    msg = parsed.get("error", "") if isinstance(parsed, dict) else ""
                    if resp.status in (401, 403):
                        raise AuthError(resp.status, msg, receipt)
                    raise ApiError(resp.status, msg, receipt)
                head = bytes.fromhex(resp.getheader("psl-signature") or "")
                if not ed25519_verify(self.pinned_key, answer_message(nonce, rh, 200, b""), head):
                    raise AnswerError(f"GET {path}: the stream's head is not signed for this request: refused")
                seq, said = 0, None
                while True:
                    line = resp.readline(EVENT_LINE_BYTES_MAX + 1)
                    if not line or len(line) > EVENT_LINE_BYTES_MAX:
                        raise AnswerError(f"GET {path}: the stream ended before its last event")
                    line = line.rstrip(b"\r\n")
                    if line.startswith(b"id: "):
                        try:
                            said = int(line[4:])
                        except ValueError:
                            raise AnswerError(f"GET {path}: an event id is not a number: refused") from None
                    elif line.startswith(b"data: "):
                        sig_hex, _, body = line[6:].partition(b" ")
                        seq += 1
                        try:
                            sig = bytes.fromhex(sig_hex.decode())
                        except ValueError:
                            sig = b""
                        if said != seq or not ed25519_verify(self.pinned_key, event_message(nonce, rh, seq, body), sig):
                            raise AnswerError(f"GET {path}: event {seq} is not signed for its place in this stream: refused")
                        try:
                            event = json.loads(body)
                        except ValueError:
                            raise AnswerError(f"GET {path}: event {seq} is not JSON") from None
                        if not isinstance(event, dict):
                            raise AnswerError(f"GET {path}: event {seq} is not a JSON object")
                        yield event
                        if event.get("last"):
                            return
            finally:
                conn.close()  # a stream's connection is not kept for other calls

    def run(
        self,
        program: str,
        lambdas: int = 1,
        input: Optional[str] = None,
        timeout: float = 120.0,
        poll: float = 0.2,
        on_progress: Optional[Any] = None,
    ) -> Dict[str, Any]:
        """Runs a job on the leader and waits (at most ``timeout`` s) for its end, following
        its event stream (:meth:`events`; ``on_progress`` is called with each step), or
        polling every ``poll`` s if no stream is to be had; returns its report
        (``report["lambdas"][i]["emitted"]``). Raises :class:`JobError` if it failed or did
        not end in time."""
        job_id = self.submit(program, lambdas, input)
        deadline = time.monotonic() + timeout
        steps_seen = 0
        while True:
            st: Optional[Dict[str, Any]] = None
            try:
                n = 0
                for ev in self.events(job_id):
                    if ev.get("last"):
                        st = ev
                    elif "progress" in ev:
                        n += 1
                        if n > steps_seen:
                            steps_seen = n
                            if on_progress is not None:
                                on_progress(ev["progress"])
                    if time.monotonic() >= deadline:
                        break
            except AnswerError as e:
                if "ended before its last event" not in str(e):
                    raise
            except ApiError as e:
                if e.status != 503:
                    raise
            if st is None:
                st = self.job(job_id)
            status = st.get("status")
            if status == "done":
                report = st.get("report")
                if not isinstance(report, dict):
                    raise AnswerError(f"job {job_id}: done without a report")
                return report
            if status == "failed":
                report = st.get("report") if isinstance(st.get("report"), dict) else None
                why = st.get("error")
                if not why and report is not None:
                    why = "; ".join(str(l.get("error")) for l in report.get("lambdas", []) if l.get("error"))
                raise JobError(job_id, str(why or "failed"), report)
            if status != "running":
                raise AnswerError(f"job {job_id}: unknown status {status!r}")
            if time.monotonic() >= deadline:
                raise JobError(job_id, f"still running after {timeout} s")
            time.sleep(poll)
