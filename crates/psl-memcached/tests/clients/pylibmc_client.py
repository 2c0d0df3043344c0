"""pylibmc (libmemcached) against `psl memcached`: set/get/multi-get/cas/incr/delete/expiry.

Usage: python3 pylibmc_client.py HOST PORT   (exit 0 and prints OK when every check passes)
"""
import sys
import time

import pylibmc


def main(host, port):
    mc = pylibmc.Client(["%s:%d" % (host, port)], binary=False, behaviors={"cas": True, "tcp_nodelay": True})
    # A fresh namespace, so that several scripts can share one server.
    mc.flush_all()
    # set / get with pylibmc's own flags (it stores type info in the flags)
    assert mc.set("a", b"hello")
    assert mc.get("a") == b"hello"
    assert mc.set("i", 42) and mc.get("i") == 42
    assert mc.set("s", "text") and mc.get("s") == "text"
    assert mc.set("d", {"x": [1, 2]}) and mc.get("d") == {"x": [1, 2]}
    assert mc.get("missing") is None
    # multi
    assert mc.set_multi({"m1": b"1", "m2": b"22", "m3": b"333"}) == []
    got = mc.get_multi(["m1", "m2", "m3", "nope"])
    assert got == {"m1": b"1", "m2": b"22", "m3": b"333"}, got
    # add / replace / append / prepend
    assert not mc.add("a", b"x")
    assert mc.add("b", b"x")
    assert mc.replace("b", b"y")
    assert not mc.replace("zz", b"y")
    assert mc.append("b", b">") and mc.prepend("b", b"<")
    assert mc.get("b") == b"<y>"
    # cas
    value, unique = mc.gets("a")
    assert value == b"hello" and unique
    assert mc.cas("a", b"world", unique)
    assert not mc.cas("a", b"again", unique)
    assert mc.get("a") == b"world"
    # incr / decr
    mc.set("n", 10)
    assert mc.incr("n", 5) == 15
    assert mc.decr("n", 100) == 0
    assert mc.incr("n") == 1
    try:
        mc.incr("nope")
        raise AssertionError("incr of a missing key must fail")
    except pylibmc.NotFound:
        pass
    # delete
    assert mc.delete("a")
    assert not mc.delete("a")
    assert mc.get("a") is None
    mc.delete_multi(["m1", "m2"])
    assert mc.get_multi(["m1", "m2", "m3"]) == {"m3": b"333"}
    # expiry
    mc.set("e", b"soon", time=1)
    mc.set("keep", b"k", time=100)
    assert mc.get("e") == b"soon"
    time.sleep(2.1)
    assert mc.get("e") is None
    assert mc.get("keep") == b"k"
    assert mc.touch("keep", 1)
    time.sleep(2.1)
    assert mc.get("keep") is None
    # stats
    (server, stats), = mc.get_stats()
    for k in ("curr_items", "get_hits", "get_misses", "cmd_get", "cmd_set", "evictions"):
        assert k in stats, k
    # large value near the limit
    big = b"z" * (1000 * 1000)
    assert mc.set("big", big)
    assert mc.get("big") == big
    mc.flush_all()
    assert mc.get("b") is None
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
