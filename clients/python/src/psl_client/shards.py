"""Which shard holds a key (docs/protocol/sharding.md): a key's point, and the shard map as
``psl shard show --json`` prints it, so that a client can check which capsule answered.

A key's *point* is the first 8 bytes, big-endian, of SHA-256(``psl/shard/v1`` || its hash
tag), where the hash tag is the part between the first ``{`` and the first ``}`` after it
when it is not empty (Redis Cluster's rule: ``{user42}.cart`` and ``{user42}.orders`` share a
shard), else the whole key. The map divides the points into ranges, each held by one shard,
whose capsule every signed KV answer names (``capsule``, with ``shard`` and ``map_version``).

The map itself is a record of an owner-signed capsule sealed under the KV data key; ``psl
shard show`` verifies it with the owner key. This module trusts the JSON it is given: load
it from the operator, as the policy file is.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

POINT_DOMAIN = b"psl/shard/v1"
SHARDS_MAX = 1024
ROUTES_MAX = 4096


def hash_tag(key: bytes) -> bytes:
    """The part of ``key`` that decides its shard."""
    open_at = key.find(b"{")
    if open_at >= 0:
        close_at = key.find(b"}", open_at + 1)
        if close_at > open_at + 1:
            return key[open_at + 1 : close_at]
    return key


def point(key: bytes) -> int:
    """A key's point in the 64-bit hash space."""
    return int.from_bytes(hashlib.sha256(POINT_DOMAIN + hash_tag(key)).digest()[:8], "big")


@dataclass(frozen=True)
class ShardMap:
    """A shard map: each shard's capsule (hex) and the routes (first point, shard), sorted."""

    map_version: int
    capsules: Tuple[str, ...]
    routes: Tuple[Tuple[int, int], ...]

    @staticmethod
    def from_json(d: Dict[str, Any]) -> "ShardMap":
        """The map of ``psl shard show --json``; refuses one whose routes do not cover the
        point space exactly once or name a shard it does not have."""
        try:
            capsules = tuple(str(s["capsule"]).lower() for s in d["shards"])
            routes = tuple((int(r["first"]), int(r["shard"])) for r in d["routes"])
            version = int(d["map_version"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a shard map: {e}") from None
        if not 1 <= len(capsules) <= SHARDS_MAX or not 1 <= len(routes) <= ROUTES_MAX:
            raise ValueError("a shard map has 1 to 1024 shards and 1 to 4096 routes")
        if any(len(c) != 64 or any(ch not in "0123456789abcdef" for ch in c) for c in capsules):
            raise ValueError("a shard's capsule is 64 hex digits")
        if len(set(capsules)) != len(capsules):
            raise ValueError("two shards name the same capsule")
        if routes[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(routes, routes[1:])):
            raise ValueError("routes must start at 0 and strictly increase")
        if any(not 0 <= s < len(capsules) for _, s in routes):
            raise ValueError("a route names a shard the map does not have")
        if any(not 0 <= f < 1 << 64 for f, _ in routes):
            raise ValueError("a route's first point is a 64-bit number")
        return ShardMap(version, capsules, routes)

    @staticmethod
    def load(path: Union[str, "os.PathLike[str]"]) -> "ShardMap":
        """Reads ``psl shard show --json``'s output from a file."""
        with open(path, "rb") as f:
            return ShardMap.from_json(json.load(f))

    def shard_of(self, key: bytes) -> int:
        """The shard that holds ``key``."""
        p = point(key)
        lo, hi = 0, len(self.routes)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.routes[mid][0] <= p:
                lo = mid
            else:
                hi = mid
        return self.routes[lo][1]

    def capsule_of(self, key: bytes) -> str:
        """The capsule (hex) of the shard that holds ``key``."""
        return self.capsules[self.shard_of(key)]

    def check_answer(self, key: bytes, answer: Dict[str, Any]) -> Optional[str]:
        """None if ``answer`` (a KV answer's JSON, signature already checked) came from the
        shard this map gives ``key``; else why not."""
        want = self.capsule_of(key)
        got = answer.get("capsule")
        if not isinstance(got, str) or got.lower() != want:
            return f"answered by capsule {got}, but map version {self.map_version} puts the key in {want}"
        newer = answer.get("map_version")
        if isinstance(newer, int) and newer > self.map_version:
            return f"the front end routes by map version {newer}, newer than this client's {self.map_version}"
        return None


__all__: List[str] = ["ShardMap", "hash_tag", "point"]
