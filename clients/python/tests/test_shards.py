"""Keys' points and the shard map as the Rust side computes them (psl_scl::shard), and the
check a client makes of which capsule answered."""

import pytest

from psl_client import ShardMap, point
from psl_client.shards import hash_tag

A, B = "aa" * 32, "bb" * 32
TWO = {
    "map_version": 3,
    "shards": [{"shard": 0, "capsule": A, "front_ends": []}, {"shard": 1, "capsule": B, "front_ends": []}],
    "routes": [{"first": 0, "last": (1 << 63) - 1, "shard": 0}, {"first": 1 << 63, "last": (1 << 64) - 1, "shard": 1}],
    "moves": [],
}


def test_points_match_the_rust_vectors():
    # The same vectors as psl_scl::shard's hash_tags_follow_the_redis_rule.
    assert point(b"user:1") == 0xE874D9ADABB81120
    assert point(b"{user42}.cart") == 0x4D73B0033F54392D
    assert hash_tag(b"x{a}{b}") == b"a"
    assert hash_tag(b"{}.cart") == b"{}.cart"
    assert hash_tag(b"{open") == b"{open"


def test_a_map_routes_by_point_and_checks_which_capsule_answered():
    m = ShardMap.from_json(TWO)
    k0 = next(k for k in (f"k{i}".encode() for i in range(100)) if point(k) < 1 << 63)
    k1 = next(k for k in (f"k{i}".encode() for i in range(100)) if point(k) >= 1 << 63)
    assert (m.shard_of(k0), m.shard_of(k1)) == (0, 1)
    assert m.check_answer(k1, {"capsule": B, "shard": 1, "map_version": 3}) is None
    # A front end of the other shard answering for the key: refused.
    why = m.check_answer(k1, {"capsule": A, "shard": 0, "map_version": 3})
    assert why is not None and "puts the key in" in why
    # An answer without a capsule cannot be checked.
    assert m.check_answer(k0, {"found": False}) is not None
    # A front end on a newer map: this client's map is behind.
    assert "newer" in m.check_answer(k0, {"capsule": A, "map_version": 4})


@pytest.mark.parametrize(
    "bad",
    [
        {**TWO, "routes": [{"first": 1, "shard": 0}]},
        {**TWO, "routes": [{"first": 0, "shard": 0}, {"first": 0, "shard": 1}]},
        {**TWO, "routes": [{"first": 0, "shard": 2}]},
        {**TWO, "shards": [{"capsule": A}, {"capsule": A}]},
        {**TWO, "shards": [{"capsule": "zz"}]},
        {"shards": []},
    ],
)
def test_broken_maps_are_refused(bad):
    with pytest.raises(ValueError):
        ShardMap.from_json(bad)
