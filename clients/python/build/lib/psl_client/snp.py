"""AMD SEV-SNP evidence (backend ``snp``), checked as PSL's Rust verifier
(crates/psl-faas/src/attest_snp.rs) checks it:

1. form: ``"PSLSNP01" || report (1184) || u32 LE table length || certificate table`` in
   canonical form (known GUIDs only: VCEK, ASK, ARK, each at most once, data packed in entry
   order); report version 2..5, signature algorithm 1, zero in every unsigned byte of the
   signature area; signed by a VCEK (not a VLEK, chip key not masked);
2. chain: the evidence's ARK (if any) is one of the trust anchors (AMD's Milan, Genoa, Turin
   ARKs, shipped in this package, or the policy's ``trust_anchors``), the ASK (the evidence's,
   else AMD's known ones) is signed by it, the VCEK by the ASK (RSASSA-PSS, SHA-384), each
   valid at the verification time;
3. the VCEK's extensions: product name, hardware id = the report's chip id, TCB = the
   report's reported TCB;
4. the report's ECDSA P-384 / SHA-384 signature under the VCEK;
5. the policy: debug, migration agent, VMPL, SMT, minimum TCB, guest SVN;
6. the measurement digest in the allowed set; 7. report data and nonce.

Not built here: CRLs (the ASK's revocation). A policy with ``require_crl = true`` is refused
with ``VerificationError("not built", ...)``; ``crl_files`` are otherwise not consulted.
"""

from __future__ import annotations

import datetime
import struct
import time
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from cryptography.hazmat.primitives.serialization import Encoding

from .attest import CheckLog, VerifiedReport, check_report_data
from .policy import Policy, snp_measurement, snp_measurement_any_policy

REPORT_LEN = 1184
SIGNED_LEN = 0x2A0
SIG_R = 0x2A0
SIG_S = 0x2E8
ENVELOPE_MAGIC = b"PSLSNP01"
CERT_TABLE_BYTES_MAX = 32 * 1024

GUID_VCEK = bytes.fromhex("63da758de6644564adc5f4b93be8accd")
GUID_VLEK = bytes.fromhex("a8074bc2a25a483eaae639c045a0b8a1")
GUID_ASK = bytes.fromhex("4ab7b379bbac4fe4a02f05aef327c782")
GUID_ARK = bytes.fromhex("c0b406a4a80349529743" "3fb6014cd0ae")
KNOWN_GUIDS = (GUID_VCEK, GUID_ASK, GUID_ARK)

POLICY_MIGRATE_MA = 1 << 18
POLICY_DEBUG = 1 << 19
PLATFORM_SMT_EN = 1

OID_PRODUCT_NAME = x509.ObjectIdentifier("1.3.6.1.4.1.3704.1.2")
OID_SPL = {
    "bl": "1.3.6.1.4.1.3704.1.3.1",
    "tee": "1.3.6.1.4.1.3704.1.3.2",
    "snp": "1.3.6.1.4.1.3704.1.3.3",
    "spl4": "1.3.6.1.4.1.3704.1.3.4",
    "spl5": "1.3.6.1.4.1.3704.1.3.5",
    "spl6": "1.3.6.1.4.1.3704.1.3.6",
    "spl7": "1.3.6.1.4.1.3704.1.3.7",
    "ucode": "1.3.6.1.4.1.3704.1.3.8",
    "fmc": "1.3.6.1.4.1.3704.1.3.9",
}
OID_HW_ID = x509.ObjectIdentifier("1.3.6.1.4.1.3704.1.4")
PRODUCTS = ("Milan", "Genoa", "Turin")


@dataclass(frozen=True)
class Tcb:
    """A decoded TCB_VERSION."""

    fmc: Optional[int]
    bootloader: int
    tee: int
    snp: int
    microcode: int
    reserved: Tuple[int, int, int, int]

    def __str__(self) -> str:
        f = f"fmc {self.fmc}, " if self.fmc is not None else ""
        return f"{f}bootloader {self.bootloader}, tee {self.tee}, snp {self.snp}, microcode {self.microcode}"


def decode_tcb(product: str, raw: int) -> Tcb:
    """Decodes a raw TCB_VERSION in ``product``'s layout."""
    b = raw.to_bytes(8, "little")
    if product == "Turin":
        return Tcb(b[0], b[1], b[2], b[3], b[7], (b[4], b[5], b[6], 0))
    return Tcb(None, b[0], b[1], b[6], b[7], (b[2], b[3], b[4], b[5]))


@dataclass
class Report:
    """An SEV-SNP attestation report, parsed (form checked, signature not)."""

    raw: bytes
    version: int
    guest_svn: int
    policy: int
    vmpl: int
    platform_info: int
    key_info: int
    report_data: bytes
    measurement: bytes
    report_id_ma: bytes
    reported_tcb: int
    chip_id: bytes

    @classmethod
    def parse(cls, b: bytes) -> "Report":
        """Parses a 1184-byte report; ``ValueError`` on a malformed one."""
        if len(b) != REPORT_LEN:
            raise ValueError(f"{len(b)} bytes, an SEV-SNP report is {REPORT_LEN}")
        def u32(o: int) -> int:
            return int(struct.unpack_from("<I", b, o)[0])

        def u64(o: int) -> int:
            return int(struct.unpack_from("<Q", b, o)[0])

        version = u32(0)
        if not 2 <= version <= 5:
            raise ValueError(f"report version {version}, expected 2 to 5")
        if u32(0x34) != 1:
            raise ValueError(f"signature algorithm {u32(0x34)}, expected 1 (ECDSA P-384 with SHA-384)")
        if any(b[SIG_R + 48 : SIG_R + 72]) or any(b[SIG_S + 48 :]):
            raise ValueError("non-zero bytes in the unsigned part of the signature area (high bytes of R or S, or reserved)")
        return cls(
            raw=bytes(b),
            version=version,
            guest_svn=u32(0x04),
            policy=u64(0x08),
            vmpl=u32(0x30),
            platform_info=u64(0x40),
            key_info=u32(0x48),
            report_data=b[0x50:0x90],
            measurement=b[0x90:0xC0],
            report_id_ma=b[0x160:0x180],
            reported_tcb=u64(0x180),
            chip_id=b[0x1A0:0x1E0],
        )

    def signing_key(self) -> int:
        """0: VCEK, 1: VLEK, 7: none."""
        return (self.key_info >> 2) & 7

    def chip_key_masked(self) -> bool:
        """Whether MASK_CHIP_KEY is set (the report is then not signed)."""
        return bool(self.key_info & 2)

    def has_migration_agent(self) -> bool:
        """Whether a migration agent is bound (REPORT_ID_MA is all ones otherwise)."""
        return self.report_id_ma != b"\xff" * 32


def encode_cert_table(entries: List[Tuple[bytes, bytes]]) -> bytes:
    """The canonical GHCB certificate table: entries, a zero entry, the data in entry order."""
    head, body = b"", b""
    start = 24 * (len(entries) + 1)
    for guid, data in entries:
        head += guid + struct.pack("<II", start + len(body), len(data))
        body += data
    return head + b"\0" * 24 + body


def parse_cert_table(b: bytes) -> List[Tuple[bytes, bytes]]:
    """Parses a certificate table (bounded: 64 entries, every range inside the buffer)."""
    if len(b) > CERT_TABLE_BYTES_MAX:
        raise ValueError(f"certificate table: {len(b)} bytes, over {CERT_TABLE_BYTES_MAX}")
    out: List[Tuple[bytes, bytes]] = []
    at = 0
    while True:
        e = b[at : at + 24]
        if len(e) < 24:
            raise ValueError("certificate table: no terminating entry")
        guid = e[:16]
        off, ln = struct.unpack_from("<II", e, 16)
        if guid == b"\0" * 16:
            return out
        if len(out) == 64:
            raise ValueError("certificate table: more than 64 entries")
        if off + ln > len(b):
            raise ValueError(f"certificate table: entry {len(out)} points outside the table")
        out.append((guid, b[off : off + ln]))
        at += 24


def encode_evidence(report: bytes, entries: List[Tuple[bytes, bytes]]) -> bytes:
    """PSL's ``snp`` evidence for a report and its certificates."""
    table = encode_cert_table(entries) if entries else b""
    return ENVELOPE_MAGIC + report + struct.pack("<I", len(table)) + table


def decode_evidence(b: bytes) -> Tuple[Report, Dict[bytes, bytes]]:
    """Splits ``snp`` evidence into the report and its certificates by GUID; ``ValueError``
    unless the table is canonical and holds only known GUIDs, each once."""
    head = 8 + REPORT_LEN + 4
    if len(b) < head or b[:8] != ENVELOPE_MAGIC:
        raise ValueError(f"{len(b)} bytes: snp evidence is PSLSNP01, a {REPORT_LEN}-byte report, a table length and a table")
    report = Report.parse(b[8 : 8 + REPORT_LEN])
    (ln,) = struct.unpack_from("<I", b, 8 + REPORT_LEN)
    if len(b) - head != ln:
        raise ValueError(f"certificate table length {ln}, but {len(b) - head} bytes follow the report")
    if ln == 0:
        return report, {}
    table = b[head:]
    entries = parse_cert_table(table)
    certs: Dict[bytes, bytes] = {}
    for i, (g, d) in enumerate(entries):
        if g not in KNOWN_GUIDS:
            raise ValueError(f"certificate table entry {i}: GUID {g.hex()} is not a VCEK, ASK or ARK")
        if g in certs:
            raise ValueError(f"certificate table: GUID {g.hex()} twice")
        certs[g] = d
    if encode_cert_table(entries) != table:
        raise ValueError("certificate table is not in canonical form")
    return report, certs


def _amd(name: str) -> bytes:
    return resources.files("psl_client").joinpath("amd").joinpath(name).read_bytes()


def _load_cert(data: bytes) -> x509.Certificate:
    if data.lstrip().startswith(b"-----BEGIN"):
        return x509.load_pem_x509_certificate(data)
    return x509.load_der_x509_certificate(data)


def _cn(c: x509.Certificate) -> str:
    a = c.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(a[0].value) if a else c.subject.rfc4514_string()


def _anchors(policy: Policy) -> List[Tuple[str, x509.Certificate]]:
    """(product, ARK): the policy's trust anchors, else AMD's."""
    assert policy.snp is not None
    out: List[Tuple[str, x509.Certificate]] = []
    if policy.snp.trust_anchors:
        for p in policy.snp.trust_anchors:
            c = _load_cert(Path(p).read_bytes())
            cn = _cn(c)
            product = next((pr for pr in PRODUCTS if cn == f"ARK-{pr}"), None)
            if product is None:
                raise ValueError(f"trust anchor {p}: '{cn}' names no product line (ARK-Milan, ARK-Genoa, ARK-Turin)")
            out.append((product, c))
        return out
    return [(p, x509.load_der_x509_certificate(_amd(f"ark_{p.lower()}.der"))) for p in PRODUCTS]


def _known_asks(policy: Policy) -> List[x509.Certificate]:
    assert policy.snp is not None
    if policy.snp.trust_anchors:
        return []
    return [x509.load_der_x509_certificate(_amd(f"ask_{p.lower()}.der")) for p in PRODUCTS]


def _fmt(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_validity(c: x509.Certificate, t: int, what: str) -> Optional[str]:
    """None if ``c`` is valid at ``t``, else why not."""
    nb, na = c.not_valid_before_utc.timestamp(), c.not_valid_after_utc.timestamp()
    if t < nb or t > na:
        return f"{what} is valid from {_fmt(nb)} to {_fmt(na)}, not at {_fmt(t)}"
    return None


def check_signed_by(c: x509.Certificate, issuer: x509.Certificate, what: str) -> Optional[str]:
    """None if ``issuer`` (RSA) signed ``c`` with RSASSA-PSS / SHA-384, else why not."""
    if c.issuer != issuer.subject:
        return f"{what}: issued by '{c.issuer.rfc4514_string()}', not by '{issuer.subject.rfc4514_string()}'"
    if c.signature_algorithm_oid != x509.SignatureAlgorithmOID.RSASSA_PSS:
        return f"{what}: signature algorithm {c.signature_algorithm_oid.dotted_string}, expected RSASSA-PSS"
    key = issuer.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        return f"{what}: the issuer's key is not RSA"
    try:
        key.verify(
            c.signature,
            c.tbs_certificate_bytes,
            padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48),
            hashes.SHA384(),
        )
    except InvalidSignature:
        return f"{what}: the signature of '{_cn(issuer)}' does not verify"
    return None


def _ext(c: x509.Certificate, oid: str) -> Optional[bytes]:
    try:
        e = c.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid))
    except x509.ExtensionNotFound:
        return None
    v = e.value
    return v.value if isinstance(v, x509.UnrecognizedExtension) else None


def _small_int(b: Optional[bytes]) -> Optional[int]:
    if b is None:
        return None
    if len(b) == 3 and b[0] == 2 and b[1] == 1 and b[2] < 0x80:
        return b[2]
    if len(b) == 4 and b[0] == 2 and b[1] == 2 and b[2] == 0 and b[3] >= 0x80:
        return b[3]
    return None


@dataclass
class VcekInfo:
    """A VCEK's product name, hardware id and TCB extensions."""

    product_name: str
    hw_id: bytes
    tcb: Tcb

    @classmethod
    def from_cert(cls, c: x509.Certificate) -> "VcekInfo":
        """Reads the extensions; ``ValueError`` naming one missing or malformed."""
        name = _ext(c, OID_PRODUCT_NAME.dotted_string)
        if name is None or len(name) < 2 or name[0] != 0x16 or name[1] != len(name) - 2 or not name[2:].isascii():
            raise ValueError("VCEK: extension productName missing or malformed")
        hw = _ext(c, OID_HW_ID.dotted_string)
        if hw is None:
            raise ValueError("VCEK: extension hwID missing or malformed")

        def spl(k: str, required: bool) -> Optional[int]:
            raw = _ext(c, OID_SPL[k])
            if raw is None:
                if required:
                    raise ValueError(f"VCEK: extension {k}SPL missing or malformed")
                return None
            v = _small_int(raw)
            if v is None:
                raise ValueError(f"VCEK: extension {k}SPL missing or malformed")
            return v

        reserved = tuple(spl(k, False) or 0 for k in ("spl4", "spl5", "spl6", "spl7"))
        tcb = Tcb(spl("fmc", False), spl("bl", True), spl("tee", True), spl("snp", True), spl("ucode", True), reserved)  # type: ignore[arg-type]
        return cls(name[2:].decode("ascii"), hw, tcb)

    def matches(self, product: str, chip_id: bytes, tcb: Tcb) -> Optional[str]:
        """None if this VCEK is the one for ``chip_id`` at ``tcb``, else why not."""
        if len(self.hw_id) == 64:
            chip_ok = self.hw_id == chip_id
        else:
            chip_ok = product == "Turin" and len(self.hw_id) == 8 and self.hw_id == chip_id[:8]
        if not chip_ok:
            return f"the VCEK's hardware id {self.hw_id.hex()} is not the report's chip id {chip_id.hex()}"
        m, t = self.tcb, tcb
        fmc_ok = product != "Turin" or m.fmc == t.fmc
        if not fmc_ok or (m.bootloader, m.tee, m.snp, m.microcode, m.reserved) != (
            t.bootloader, t.tee, t.snp, t.microcode, t.reserved
        ):
            return f"the VCEK is for TCB ({m}), the report's reported TCB is ({t})"
        return None


def _cached_vceks(policy: Policy) -> List[bytes]:
    assert policy.snp is not None
    files = list(policy.snp.vcek_files)
    d = policy.snp.vcek_cache_dir
    if d is not None and Path(d).is_dir():
        files += sorted(p for p in Path(d).iterdir() if p.is_file() and not p.name.endswith(".crl"))
    out = []
    for p in files[:4096]:
        try:
            out.append(_load_cert(Path(p).read_bytes()).public_bytes(Encoding.DER))
        except (OSError, ValueError):
            continue
    return out


def verify_snp(
    policy: Policy, evidence: bytes, nonce: bytes, report_data: bytes, log: CheckLog, at: Optional[int] = None
) -> VerifiedReport:
    """Verifies ``snp`` evidence (see the module docs); raises ``VerificationError``."""
    try:
        return _verify_snp(policy, evidence, nonce, report_data, log, at)
    except (ValueError, TypeError) as e:
        # cryptography parses certificates lazily: a malformed field surfaces on access.
        raise log.fail("certificate chain", f"a certificate is malformed: {e}") from None


def _verify_snp(
    policy: Policy, evidence: bytes, nonce: bytes, report_data: bytes, log: CheckLog, at: Optional[int]
) -> VerifiedReport:
    s = policy.snp
    assert s is not None
    t = int(time.time()) if at is None else at
    try:
        report, certs = decode_evidence(evidence)
    except ValueError as e:
        raise log.fail("format", f"evidence is malformed: {e}") from None
    log.ok("format", f"SEV-SNP report version {report.version}, VMPL {report.vmpl}, guest policy {report.policy:#x}")
    if s.require_crl:
        raise log.fail("not built", "the policy says require_crl = true, and this SDK does not check AMD CRLs")
    if report.chip_key_masked() or report.signing_key() != 0:
        raise log.fail("signing key", f"the report is signed by key {report.signing_key()} (0 = VCEK): only VCEK-signed reports are accepted")
    log.ok("signing key", "VCEK")
    try:
        anchors = _anchors(policy)
    except (OSError, ValueError) as e:
        raise log.fail("ARK (trust anchor)", str(e)) from None
    ev_ark = certs.get(GUID_ARK)
    if ev_ark is not None:
        cand = [(p, c) for p, c in anchors if c.public_bytes(Encoding.DER) == ev_ark]
        if not cand:
            raise log.fail("ARK (trust anchor)", "the evidence's ARK is not one of the trust anchors")
    else:
        cand = anchors
    try:
        ev_ask = _load_cert(certs[GUID_ASK]) if GUID_ASK in certs else None
    except ValueError as e:
        raise log.fail("ASK", f"certificate chain refused: the ASK does not parse: {e}") from None
    vcek_der = certs.get(GUID_VCEK)
    if vcek_der is None:
        for d in _cached_vceks(policy):
            try:
                info = VcekInfo.from_cert(x509.load_der_x509_certificate(d))
            except ValueError:
                continue
            if any(info.matches(p, report.chip_id, decode_tcb(p, report.reported_tcb)) is None for p, _ in cand):
                vcek_der = d
                break
        if vcek_der is None:
            raise log.fail("VCEK", "the evidence carries no VCEK and none in the policy's vcek_files / vcek_cache_dir matches the report's chip and TCB")
    try:
        with warnings.catch_warnings():
            # AMD's VCEKs have serial numbers RFC 5280 disallows; cryptography warns.
            warnings.simplefilter("ignore")
            vcek = x509.load_der_x509_certificate(vcek_der)
    except ValueError as e:
        raise log.fail("VCEK", f"certificate chain refused: the VCEK does not parse: {e}") from None
    asks = [ev_ask] if ev_ask is not None else _known_asks(policy)
    ask = next((a for a in asks if a.subject == vcek.issuer), None)
    if ask is None:
        raise log.fail("ASK", f"no ASK named '{vcek.issuer.rfc4514_string()}' (the VCEK's issuer) in the evidence or known")
    found = next(((p, a) for p, a in cand if ask.issuer == a.subject), None)
    if found is None:
        raise log.fail("ARK (trust anchor)", f"the ASK '{_cn(ask)}' is issued by '{ask.issuer.rfc4514_string()}', which is not a trust anchor")
    product, ark = found
    why = check_validity(ark, t, "the ARK")
    if why:
        raise log.fail("ARK (trust anchor)", why)
    log.ok("ARK (trust anchor)", f"{_cn(ark)} (product line {product}), valid at {_fmt(t)}")
    why = check_signed_by(ask, ark, "ASK") or check_validity(ask, t, "the ASK")
    if why:
        raise log.fail("ASK signed by the ARK", why)
    log.ok("ASK signed by the ARK", f"{_cn(ask)}, RSASSA-PSS/SHA-384, valid")
    why = check_signed_by(vcek, ask, "VCEK") or check_validity(vcek, t, "the VCEK")
    if why:
        raise log.fail("VCEK signed by the ASK", why)
    log.ok("VCEK signed by the ASK", f"{_cn(vcek)}, RSASSA-PSS/SHA-384, valid")
    try:
        info = VcekInfo.from_cert(vcek)
    except ValueError as e:
        raise log.fail("VCEK extensions", str(e)) from None
    if not info.product_name.startswith(product):
        raise log.fail("VCEK product", f"the VCEK is for product '{info.product_name}', the chain is {product}'s")
    log.ok("VCEK product", info.product_name)
    tcb = decode_tcb(product, report.reported_tcb)
    why = info.matches(product, report.chip_id, tcb)
    if why:
        raise log.fail("chip id and reported TCB match the VCEK", why)
    log.ok("chip id and reported TCB match the VCEK", f"chip {report.chip_id[:8].hex()}…, TCB {tcb}")
    # The report's signature.
    key = vcek.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise log.fail("report signature", "the VCEK's key is not an ECDSA P-384 key")
    r = int.from_bytes(report.raw[SIG_R : SIG_R + 48], "little")
    s_ = int.from_bytes(report.raw[SIG_S : SIG_S + 48], "little")
    try:
        key.verify(utils.encode_dss_signature(r, s_), report.raw[:SIGNED_LEN], ec.ECDSA(hashes.SHA384()))
    except (InvalidSignature, ValueError):
        raise log.fail("report signature", "the report's signature does not verify under the chip's VCEK") from None
    log.ok("report signature", "ECDSA P-384/SHA-384 under the VCEK")
    # The policy.
    if report.policy & POLICY_DEBUG and not s.allow_debug:
        raise log.fail("debug", "the guest policy allows debugging")
    log.ok("debug")
    if (report.policy & POLICY_MIGRATE_MA or report.has_migration_agent()) and not s.allow_migration_agent:
        raise log.fail("migration agent", "a migration agent is allowed or bound to the guest")
    log.ok("migration agent")
    if report.vmpl not in s.vmpls:
        raise log.fail("VMPL", f"VMPL {report.vmpl} is not one of the accepted {s.vmpls}")
    log.ok("VMPL", str(report.vmpl))
    if not s.allow_smt and report.platform_info & PLATFORM_SMT_EN:
        raise log.fail("SMT", "SMT is enabled on the platform")
    log.ok("SMT")
    m = s.min_tcb
    low = [
        f"{n} {have} < {m.get(n, 0)}"
        for n, have in (("bootloader", tcb.bootloader), ("tee", tcb.tee), ("snp", tcb.snp), ("microcode", tcb.microcode))
        if have < m.get(n, 0)
    ]
    if product == "Turin" and (tcb.fmc or 0) < m.get("fmc", 0):
        low.append(f"fmc {tcb.fmc or 0} < {m.get('fmc', 0)}")
    if low:
        raise log.fail("minimum TCB", "reported TCB below the policy's minimum: " + ", ".join(low))
    log.ok("minimum TCB", str(tcb))
    if report.guest_svn < s.min_guest_svn:
        raise log.fail("guest SVN", f"guest SVN {report.guest_svn} < {s.min_guest_svn}")
    log.ok("guest SVN", str(report.guest_svn))
    digests = [snp_measurement(report.measurement, report.policy), snp_measurement_any_policy(report.measurement)]
    allowed = policy.measurements.get("snp", set())
    measurement = next((d for d in digests if d in allowed), None)
    if measurement is None:
        raise log.fail(
            "measurement",
            f"launch measurement {report.measurement.hex()} with guest policy {report.policy:#x} is not in the policy",
        )
    log.ok("measurement", report.measurement.hex())
    check_report_data(report.report_data, nonce, report_data, log)
    return VerifiedReport("snp", measurement, report_data, log.checks)
