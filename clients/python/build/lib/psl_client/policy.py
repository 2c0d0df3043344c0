"""The attestation policy file: the TOML ``psl attest verify`` reads
(crates/psl-faas/src/attest_policy.rs, docs/security/attestation.md).

Loading checks what the Rust loader checks: no unknown keys, known kinds only, ``sim`` only
with ``allow_insecure_sim = true``, a section for every allowed kind, well-formed hex. The
allowed measurements are reduced to PSL's measurement digests (:func:`sim` measurements as
they are, :func:`snp_measurement`, :func:`sgx_mrenclave`, ...), as the Rust verifier does.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import PolicyError
from .wire import sha256

POLICY_BYTES_MAX = 1 << 20
ALLOW_ENTRIES_MAX = 4096
KINDS = ("sim", "sgx", "tdx", "snp")

#: Intel's TCB status names (the accepted_tcb_statuses values).
TCB_STATUSES = (
    "UpToDate",
    "OutOfDateConfigurationNeeded",
    "OutOfDate",
    "ConfigurationAndSWHardeningNeeded",
    "ConfigurationNeeded",
    "SWHardeningNeeded",
    "Revoked",
)
DEFAULT_ACCEPTED_TCB = ["UpToDate", "SWHardeningNeeded", "ConfigurationNeeded", "ConfigurationAndSWHardeningNeeded"]

_KEYS: Dict[str, Set[str]] = {
    "": {"allowed_kinds", "allow_insecure_sim", "collateral", "sgx", "tdx", "snp", "sim", "hosts"},
    "collateral": {"pccs_url", "pccs_ca", "cache_dir", "cache_max_secs", "file", "max_age_days"},
    "sgx": {"accepted_tcb_statuses", "allow_debug", "allow"},
    "sgx.allow": {"mrenclave", "mrsigner", "isv_prod_id", "min_isv_svn"},
    "tdx": {"accepted_tcb_statuses", "allow_debug", "allow"},
    "tdx.allow": {"mrtd", "rtmr0", "rtmr1", "rtmr2", "rtmr3"},
    "snp": {
        "allow_debug", "allow_migration_agent", "allow_smt", "vmpls", "min_tcb", "min_guest_svn",
        "vcek_cache_dir", "vcek_files", "crl_files", "require_crl", "trust_anchors", "allow",
    },
    "snp.min_tcb": {"bootloader", "tee", "snp", "microcode", "fmc"},
    "snp.allow": {"measurement", "guest_policy"},
    "sim": {"platform_public", "allow"},
    "sim.allow": {"measurement"},
    "hosts": {"require_attestation", "allow_insecure_unauthenticated"},
}


def sgx_mrenclave(mr_enclave: bytes) -> bytes:
    """PSL's measurement digest of an SGX MRENCLAVE."""
    return sha256(b"psl/dcap/sgx-mrenclave/v1", mr_enclave)


def sgx_mrsigner(mr_signer: bytes, isv_prod_id: int) -> bytes:
    """PSL's measurement digest of an SGX signer and product id."""
    return sha256(b"psl/dcap/sgx-mrsigner/v1", mr_signer, isv_prod_id.to_bytes(2, "little"))


def tdx_measurement(mr_td: bytes, rtmrs: List[bytes]) -> bytes:
    """PSL's measurement digest of a TD: MRTD and RTMR0..3."""
    return sha256(b"psl/dcap/tdx/v1", mr_td, *rtmrs)


def snp_measurement(launch: bytes, guest_policy: int) -> bytes:
    """PSL's measurement digest of an SEV-SNP launch digest under a guest policy."""
    return sha256(b"psl/snp/v1", launch, guest_policy.to_bytes(8, "little"))


def snp_measurement_any_policy(launch: bytes) -> bytes:
    """PSL's measurement digest of an SEV-SNP launch digest, whatever the guest policy."""
    return sha256(b"psl/snp/any-policy/v1", launch)


def _hex_n(what: str, v: Any, n: int) -> bytes:
    if not isinstance(v, str):
        raise PolicyError(f"{what} must be {2 * n} hex digits, got {v!r}")
    try:
        b = bytes.fromhex(v.strip())
    except ValueError:
        b = b""
    if len(b) != n:
        raise PolicyError(f"{what} must be {2 * n} hex digits, got {v!r}")
    return b


def _number(what: str, v: Any) -> int:
    if isinstance(v, bool):
        raise PolicyError(f"{what}: expected a number")
    if isinstance(v, int) and v >= 0:
        return v
    if isinstance(v, str):
        t = v.strip()
        try:
            return int(t[2:], 16) if t.lower().startswith("0x") else int(t, 10)
        except ValueError:
            pass
        raise PolicyError(f"{what}: {v!r} is not a number")
    raise PolicyError(f'{what}: expected a number or a string like "0x30000"')


def _check_keys(d: Any, section: str) -> Dict[str, Any]:
    if not isinstance(d, dict):
        raise PolicyError(f"[{section}] must be a table")
    unknown = set(d) - _KEYS[section]
    if unknown:
        where = f"[{section}]" if section else "top level"
        raise PolicyError(f"unknown key(s) {sorted(unknown)} at {where}")
    return d


@dataclass
class SnpSettings:
    """The ``[snp]`` section, parsed."""

    allow_debug: bool = False
    allow_migration_agent: bool = False
    allow_smt: bool = True
    vmpls: List[int] = field(default_factory=lambda: [0])
    min_tcb: Dict[str, int] = field(default_factory=dict)
    min_guest_svn: int = 0
    vcek_cache_dir: Optional[Path] = None
    vcek_files: List[Path] = field(default_factory=list)
    crl_files: List[Path] = field(default_factory=list)
    require_crl: bool = False
    trust_anchors: List[Path] = field(default_factory=list)


@dataclass
class DcapSettings:
    """An ``[sgx]`` or ``[tdx]`` section, parsed."""

    accepted_tcb_statuses: List[str] = field(default_factory=lambda: list(DEFAULT_ACCEPTED_TCB))
    allow_debug: bool = False
    #: SGX: minimum ISV SVN per MRSIGNER digest.
    min_svn: Dict[bytes, int] = field(default_factory=dict)


@dataclass
class Policy:
    """A policy file, parsed and checked; relative paths resolved against its directory."""

    allowed_kinds: List[str]
    allow_insecure_sim: bool
    #: Allowed measurement digests per kind.
    measurements: Dict[str, Set[bytes]]
    sim_platform_public: Optional[bytes] = None
    snp: Optional[SnpSettings] = None
    sgx: Optional[DcapSettings] = None
    tdx: Optional[DcapSettings] = None
    collateral: Dict[str, Any] = field(default_factory=dict)
    base: Path = Path(".")
    origin: str = "<text>"

    def allows(self, kind: str) -> bool:
        """Whether reports of this TEE kind are accepted at all."""
        return kind in self.allowed_kinds

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> "Policy":
        """Reads and parses a policy file; :class:`PolicyError` if it is refused."""
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > POLICY_BYTES_MAX:
                raise PolicyError(f"reading the policy {p}: {size} bytes, over {POLICY_BYTES_MAX}")
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyError(f"reading the policy {p}: {e}") from e
        return cls.parse(text, base=p.parent, origin=str(p))

    @classmethod
    def parse(cls, text: str, base: Union[str, Path] = ".", origin: str = "<text>") -> "Policy":
        """Parses policy text; ``base`` resolves relative paths."""
        try:
            return cls._parse(text, Path(base), origin)
        except PolicyError as e:
            raise PolicyError(f"policy {origin}: {e}") from None
        except (ValueError, TypeError) as e:  # a value of the wrong type (int("x"), ...)
            raise PolicyError(f"policy {origin}: a value has the wrong type: {e}") from None

    @classmethod
    def _parse(cls, text: str, base: Path, origin: str) -> "Policy":
        if len(text) > POLICY_BYTES_MAX:
            raise PolicyError(f"{len(text)} bytes, over {POLICY_BYTES_MAX}")
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PolicyError(f"not TOML: {e}") from None
        _check_keys(doc, "")
        allow_sim = doc.get("allow_insecure_sim", False)
        if not isinstance(allow_sim, bool):
            raise PolicyError("allow_insecure_sim must be true or false")
        kinds: List[str] = []
        raw_kinds = doc.get("allowed_kinds", [])
        if not isinstance(raw_kinds, list):
            raise PolicyError("allowed_kinds must be a list")
        for k in raw_kinds:
            if k not in KINDS:
                raise PolicyError(f"allowed_kinds: unknown kind {k!r} (sgx, tdx, snp, sim)")
            if k not in kinds:
                kinds.append(k)
        if "sim" in kinds and not allow_sim:
            raise PolicyError(
                'allowed_kinds lists "sim", but the sim backend is INSECURE and is accepted only with '
                "allow_insecure_sim = true"
            )
        if allow_sim and "sim" not in kinds:
            kinds.append("sim")
        if not kinds:
            raise PolicyError("allowed_kinds is empty: the policy would accept nothing")

        def path(v: Any, what: str) -> Path:
            if not isinstance(v, str):
                raise PolicyError(f"{what} must be a path")
            q = Path(v)
            return q if q.is_absolute() else base / q

        def section(name: str) -> Dict[str, Any]:
            if name not in doc:
                raise PolicyError(f"allowed_kinds lists {name!r} but there is no [{name}] section")
            return _check_keys(doc[name], name)

        def allow_list(s: Dict[str, Any], name: str) -> List[Dict[str, Any]]:
            a = s.get("allow", [])
            if not isinstance(a, list):
                raise PolicyError(f"[[{name}.allow]] must be an array of tables")
            if len(a) > ALLOW_ENTRIES_MAX:
                raise PolicyError(f"[[{name}.allow]]: {len(a)} entries, over {ALLOW_ENTRIES_MAX}")
            return [_check_keys(e, f"{name}.allow") for e in a]

        def statuses(s: Dict[str, Any], name: str) -> List[str]:
            st = s.get("accepted_tcb_statuses")
            if st is None:
                return list(DEFAULT_ACCEPTED_TCB)
            for n in st:
                if n not in TCB_STATUSES:
                    raise PolicyError(f"[{name}] accepted_tcb_statuses: unknown status {n!r}")
            return list(st)

        pol = cls(allowed_kinds=kinds, allow_insecure_sim=allow_sim, measurements={}, base=base, origin=origin)
        pol.collateral = dict(_check_keys(doc.get("collateral", {}), "collateral"))
        _check_keys(doc.get("hosts", {}), "hosts")
        for k in kinds:
            allowed: Set[bytes] = set()
            if k == "sim":
                s = section("sim")
                pub = s.get("platform_public")
                try:
                    pol.sim_platform_public = bytes.fromhex(str(pub).strip())
                    from .wire import secp256k1_public

                    secp256k1_public(pol.sim_platform_public)
                except ValueError:
                    raise PolicyError("[sim] platform_public is not a public key in hex") from None
                for a in allow_list(s, "sim"):
                    allowed.add(_hex_n("[[sim.allow]] measurement", a.get("measurement"), 32))
            elif k == "snp":
                s = section("snp")
                mt = _check_keys(s.get("min_tcb", {}), "snp.min_tcb")
                st = SnpSettings(
                    allow_debug=bool(s.get("allow_debug", False)),
                    allow_migration_agent=bool(s.get("allow_migration_agent", False)),
                    allow_smt=bool(s.get("allow_smt", True)),
                    vmpls=[int(v) for v in s.get("vmpls", [0])],
                    min_tcb={n: int(mt.get(n, 0)) for n in ("bootloader", "tee", "snp", "microcode", "fmc")},
                    min_guest_svn=int(s.get("min_guest_svn", 0)),
                    vcek_cache_dir=path(s["vcek_cache_dir"], "vcek_cache_dir") if "vcek_cache_dir" in s else None,
                    vcek_files=[path(v, "vcek_files") for v in s.get("vcek_files", [])],
                    crl_files=[path(v, "crl_files") for v in s.get("crl_files", [])],
                    require_crl=bool(s.get("require_crl", False)),
                    trust_anchors=[path(v, "trust_anchors") for v in s.get("trust_anchors", [])],
                )
                pol.snp = st
                for a in allow_list(s, "snp"):
                    m = _hex_n("[[snp.allow]] measurement", a.get("measurement"), 48)
                    if a.get("guest_policy") is not None:
                        allowed.add(snp_measurement(m, _number("guest_policy", a["guest_policy"])))
                    else:
                        allowed.add(snp_measurement_any_policy(m))
            elif k == "sgx":
                s = section("sgx")
                ds = DcapSettings(accepted_tcb_statuses=statuses(s, "sgx"), allow_debug=bool(s.get("allow_debug", False)))
                for i, a in enumerate(allow_list(s, "sgx")):
                    enc, g = a.get("mrenclave"), a.get("mrsigner")
                    if enc is not None and g is None:
                        if "isv_prod_id" in a or "min_isv_svn" in a:
                            raise PolicyError(f"[[sgx.allow]] entry {i}: isv_prod_id and min_isv_svn go with mrsigner")
                        allowed.add(sgx_mrenclave(_hex_n("mrenclave", enc, 32)))
                    elif g is not None and enc is None:
                        if "isv_prod_id" not in a:
                            raise PolicyError(f"[[sgx.allow]] entry {i}: mrsigner needs isv_prod_id")
                        d = sgx_mrsigner(_hex_n("mrsigner", g, 32), int(a["isv_prod_id"]))
                        allowed.add(d)
                        ds.min_svn[d] = int(a.get("min_isv_svn", 0))
                    else:
                        raise PolicyError(f"[[sgx.allow]] entry {i}: give exactly one of mrenclave, mrsigner")
                pol.sgx = ds
            elif k == "tdx":
                s = section("tdx")
                pol.tdx = DcapSettings(accepted_tcb_statuses=statuses(s, "tdx"), allow_debug=bool(s.get("allow_debug", False)))
                for a in allow_list(s, "tdx"):
                    regs = [_hex_n(n, a.get(n), 48) for n in ("mrtd", "rtmr0", "rtmr1", "rtmr2", "rtmr3")]
                    allowed.add(tdx_measurement(regs[0], regs[1:]))
            pol.measurements[k] = allowed
        return pol
