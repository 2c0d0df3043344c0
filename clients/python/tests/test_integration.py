"""Against a real deployment: ``$PSL_BIN up --kv`` in a temporary directory (skipped when
PSL_BIN is not set). The round trip of every call, then one test per refusal."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import psl_client
import psl_client.client as client_mod
from helpers import TlsRelay
from psl_client import AnswerError, ApiError, AuthError, Client, PinError, ShardMap, VerificationError

PSL_BIN = os.environ.get("PSL_BIN")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not PSL_BIN or not os.path.exists(PSL_BIN or ""), reason="PSL_BIN does not point at a built psl"),
]
START_TIMEOUT_S = 90


def psl(*args: str, cwd: Path) -> str:
    o = subprocess.run([PSL_BIN, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert o.returncode == 0, f"psl {args}: {o.stderr}"
    return o.stdout


class Up:
    def __init__(self, dir: Path, cluster: dict) -> None:
        self.dir = dir
        self.cluster = cluster
        self.url = cluster["kv"]["http"][0]
        self.policy = dir / "up" / "attest-policy.toml"
        self.owner = Path(cluster["kv"]["owner"])
        self.capsule = Path(cluster["kv"]["capsule"])

    def credential(self, name: str, can: str, capsule: Path | None = None, owner: Path | None = None) -> Path:
        out = self.dir / name
        psl("keys", "client", "--owner", str(owner or self.owner), "--capsule", str(capsule or self.capsule),
            "--can", can, "--out", str(out), "--force", cwd=self.dir)
        return out


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    d = tmp_path_factory.mktemp("pslup")
    log = open(d / "up.log", "wb")
    p = subprocess.Popen(
        # A 1 MiB front end: test_reads_back_what_the_front_end_evicted fills it.
        [PSL_BIN, "up", "--kv", "--memcached", "1", "--workers", "1", "--servers", "1", "--kv-memory-mb", "1", "--dir", "up"],
        cwd=d, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        cluster = None
        while time.monotonic() < deadline:
            assert p.poll() is None, f"psl up exited {p.returncode}: {(d / 'up.log').read_text()[-2000:]}"
            f = d / "up" / "cluster.json"
            try:
                c = json.loads(f.read_text())
                if c.get("kv", {}).get("http") and (d / "up" / "attest-policy.toml").exists():
                    cluster = c
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        assert cluster is not None, f"psl up did not list kv.http within {START_TIMEOUT_S} s"
        u = Up(d, cluster)
        # Ready: the endpoint answers an attestation request.
        while True:
            try:
                Client(u.url, u.policy, None, timeout=5).close()
                break
            except (OSError, VerificationError):
                assert time.monotonic() < deadline, "the KV endpoint did not answer in time"
                time.sleep(0.2)
        yield u
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        except ProcessLookupError:
            pass
        log.close()


@pytest.fixture(scope="module")
def rw(up):
    return up.credential("rw.cred", "read,write")


def test_round_trip(up, rw):
    with Client(up.url, up.policy, rw) as c:
        assert c.report.kind == "sim"
        key = b"py/k%/?&=#\xc3\xa9\xff"
        assert c.get(key) is None
        cas1 = c.put(key, b"\x00value\xff")
        got = c.get(key)
        assert got is not None and got[0] == b"\x00value\xff" and got[1].cas == cas1
        c.put("py/two", "zwei")
        page = c.scan("py/", limit=10)
        assert [i.key for i in page] == sorted([key, b"py/two"]) and not page.more
        assert [i.key for i in c.scan("py/", limit=1)] == [min(key, b"py/two")]
        assert c.scan("py/", limit=1).more
        assert c.cas(key, cas1, b"new")
        assert not c.cas(key, cas1, b"newer")  # the unique moved
        assert c.get(key)[0] == b"new"
        assert c.delete(key) and not c.delete(key)
        assert c.get(key) is None
        assert not c.cas(key, 1, b"x")  # not found
        assert c.sync(durable=True) >= 0 and c.sync(durable=False) >= 0
        # Every answer was kept, signed over its own nonce and request.
        assert len(c.receipts) >= 14 and all(r.verify(c.pinned_key) for r in c.receipts)
        assert len({r.nonce for r in c.receipts}) == len(c.receipts)
        # A new connection: the pin holds and the first request is signed again.
        c.close()
        assert c.get("py/two")[0] == b"zwei"
    with Client(up.url, up.policy, rw, sign_every_request=True) as c:
        assert c.get("py/two")[0] == b"zwei" and c.delete("py/two")


def test_answers_name_the_capsule_the_shard_map_gives_each_key(up, rw):
    shown = json.loads(psl("shard", "show", "--json", "--owner", str(up.owner), "--map", up.cluster["kv"]["map"], cwd=up.dir))
    m = ShardMap.from_json(shown)
    with Client(up.url, up.policy, rw, shard_map=m) as c:
        c.put("py/shard", "s")
        assert c.get("py/shard")[0] == b"s"
        assert c.delete("py/shard")
    # A map that puts every key in another capsule: the real front end's answers name its own
    # capsule, so the client refuses them, as it would a front end of the wrong shard.
    other = dict(shown, shards=[dict(shown["shards"][0], capsule="bb" * 32)])
    with Client(up.url, up.policy, rw, shard_map=ShardMap.from_json(other)) as c:
        with pytest.raises(AnswerError, match="puts the key in"):
            c.get("py/shard")


def test_reads_back_what_the_front_end_evicted(up, rw):
    # Over its 1 MiB limit the front end evicts local copies CapsuleDB holds; a get of one is
    # answered from CapsuleDB (the endpoint's path that may wait), with the same value.
    value = lambda i: (b"%06d" % i) * 512  # 3 KiB
    n = 900
    with Client(up.url, up.policy, rw, timeout=30) as c:
        for i in range(0, n, 50):
            c.batch([(f"evict/{j}", value(j)) for j in range(i, i + 50)])
            c.sync(durable=True)
        missing = [i for i in range(n) if (c.get(f"evict/{i}") or (None,))[0] != value(i)]
        assert missing == [], f"{len(missing)} of {n} did not read back, first {missing[:5]}"


def test_atomic_batch(up, rw):
    with Client(up.url, up.policy, rw) as c:
        c.put("bank/gone", "x")
        versions = c.batch([("bank/a", b"90"), ("bank/b", b"110"), ("bank/gone", None)])
        assert len(versions) == 3
        assert [v.lamport for v in versions] == sorted({v.lamport for v in versions})
        assert c.get("bank/a") == (b"90", versions[0]) and c.get("bank/b")[0] == b"110"
        assert c.get("bank/gone") is None
        # One bad op: the endpoint refuses the whole batch and writes nothing.
        with pytest.raises(ApiError) as refused:
            c.batch([("bank/c", b"1"), ("bad key", b"2")])
        assert refused.value.status == 400 and "op 1" in str(refused.value)
        assert c.get("bank/c") is None
        with pytest.raises(ValueError):
            c.batch([])


def test_proxy_with_its_own_tls_key_is_refused(up, rw):
    u = urlsplit(up.url)
    relay = TlsRelay(u.hostname, u.port)
    try:
        with pytest.raises(VerificationError) as e:
            Client(relay.url, up.policy, rw, timeout=5)
        assert e.value.check == "report data binds the channel key"
    finally:
        relay.close()


def test_pinned_key_refuses_another_endpoint_later(up, rw):
    u = urlsplit(up.url)
    relay = TlsRelay(u.hostname, u.port)
    try:
        c = Client(up.url, up.policy, rw, timeout=5)
        c.close()
        c._conn.host, c._conn.port = "127.0.0.1", urlsplit(relay.url).port
        with pytest.raises(PinError):
            c.get("x")
    finally:
        relay.close()


def test_sim_evidence_refused_without_allow_insecure_sim(up, rw, tmp_path):
    p = tmp_path / "strict.toml"
    p.write_text(f'allowed_kinds = ["snp"]\n[snp]\n[[snp.allow]]\nmeasurement = "{"00" * 48}"\n')
    with pytest.raises(VerificationError) as e:
        Client(up.url, p, rw, timeout=5)
    assert e.value.check == "kind allowed"


def test_flipped_evidence_byte_is_refused(up, rw, monkeypatch):
    real = client_mod.verify_evidence

    def flipped(policy, backend, evidence, nonce, report_data, at=None):
        t = bytearray(evidence)
        t[50] ^= 1  # inside the report data field of a sim report
        return real(policy, backend, bytes(t), nonce, report_data, at=at)

    monkeypatch.setattr(client_mod, "verify_evidence", flipped)
    with pytest.raises(VerificationError) as e:
        Client(up.url, up.policy, rw, timeout=5)
    assert e.value.check == "signature"


def test_replayed_attestation_answer_is_refused(up, rw, monkeypatch):
    # An old answer of the very endpoint (same TLS key), made for another nonce.
    u = urlsplit(up.url)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    import http.client

    h = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=10)
    h.request("GET", f"/v1/attestation?nonce={os.urandom(32).hex()}")
    old = h.getresponse().read()
    h.close()
    real = client_mod._read_bounded
    calls = []

    def replay(resp, limit):
        body = real(resp, limit)
        calls.append(1)
        return old if len(calls) == 1 else body

    monkeypatch.setattr(client_mod, "_read_bounded", replay)
    with pytest.raises(VerificationError) as e:
        Client(up.url, up.policy, rw, timeout=5)
    assert e.value.check == "nonce"


def test_tampered_answer_is_refused(up, rw, monkeypatch):
    c = Client(up.url, up.policy, rw, timeout=5)
    try:
        c.put("py/t", "v")
        real = client_mod._read_bounded

        def tamper(resp, limit):
            body = bytearray(real(resp, limit))
            body[-2] ^= 1
            return bytes(body)

        monkeypatch.setattr(client_mod, "_read_bounded", tamper)
        with pytest.raises(AnswerError):
            c.get("py/t")
    finally:
        c.close()


def test_credential_for_another_capsule_is_forbidden(up, tmp_path):
    other = tmp_path / "other.capsule"
    psl("capsule", "new", "--owner", str(up.owner), "--out", str(other), cwd=tmp_path)
    cred = up.credential("other-capsule.cred", "read,write", capsule=other)
    with Client(up.url, up.policy, cred, timeout=5) as c:
        with pytest.raises(AuthError) as e:
            c.get("py/x")
        assert e.value.status == 403 and e.value.message
        assert e.value.receipt.verify(c.pinned_key)


def test_credential_of_another_owner_is_unauthenticated(up, tmp_path):
    owner = tmp_path / "stranger.key"
    psl("keys", "new", "--out", str(owner), cwd=tmp_path)
    capsule = tmp_path / "stranger.capsule"
    psl("capsule", "new", "--owner", str(owner), "--out", str(capsule), cwd=tmp_path)
    cred = up.credential("stranger.cred", "read,write", capsule=capsule, owner=owner)
    with Client(up.url, up.policy, cred, timeout=5) as c:
        with pytest.raises(AuthError) as e:
            c.get("py/x")
        assert e.value.status == 401


def test_read_only_credential_may_not_write(up, rw):
    ro = up.credential("ro.cred", "read")
    with Client(up.url, up.policy, rw) as w:
        w.put("py/ro", "seen")
    with Client(up.url, up.policy, ro, timeout=5) as c:
        assert c.get("py/ro")[0] == b"seen"
        with pytest.raises(AuthError) as e:
            c.put("py/ro", "nope")
        assert e.value.status == 403 and "write" in e.value.message
        assert c.get("py/ro")[0] == b"seen"  # the connection still serves reads


def test_jobs_on_the_leader(up, rw):
    faas = up.cluster.get("faas", {}).get("http")
    if not faas:
        pytest.skip("this psl up lists no faas.http (jobs API)")
    runner = up.credential("run.cred", "read,write,run")
    with Client(faas, up.policy, runner, timeout=10) as c:
        steps = []
        report = c.run(
            'emit("hi " + lambda.input + " " + lambda.id)', lambdas=2, input="py", timeout=120, on_progress=steps.append
        )
        assert sorted(e for l in report["lambdas"] for e in l["emitted"]) == ["hi py 0", "hi py 1"]
        # The progress came as signed events over HTTPS, in order, each step once.
        names = [s["step"] for s in steps]
        assert names[:2] == ["begun", "dispatched"] and names[-1] == "ending", names
        assert "admitted" in names and names.count("worker_done") >= 1
        # A finished job's stream replays its steps, then its status, marked last.
        job_id = c.submit('emit("again")')
        events = list(c.events(job_id))
        assert events[-1]["last"] is True and events[-1]["status"] == "done", events[-1]
        assert all(e["status"] == "running" for e in events[:-1]) and len(events) >= 4
        with pytest.raises(psl_client.JobError) as e:
            c.run('throw new Error("boom")', timeout=120)
        assert "boom" in e.value.error
    with Client(faas, up.policy, rw, timeout=10) as c:
        with pytest.raises(AuthError) as e:
            c.submit('emit("x")')
        assert e.value.status == 403
