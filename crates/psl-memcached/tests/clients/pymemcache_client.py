"""pymemcache against `psl memcached`: set/get/multi-get/cas/incr/delete/expiry.

Usage: python3 pymemcache_client.py HOST PORT   (exit 0 and prints OK when every check passes)
"""
import sys
import time

from pymemcache.client.base import Client


def main(host, port):
    c = Client((host, port), connect_timeout=5, timeout=10, key_prefix=b"pm-")
    assert c.version().startswith(b"1.6"), c.version()
    # set / get / flags round trip
    assert c.set("a", b"hello", noreply=False)
    assert c.get("a") == b"hello"
    assert c.get("missing") is None
    # multi-get
    assert c.set_many({"m1": b"1", "m2": b"22", "m3": b"333"}, noreply=False) == []
    got = c.get_many(["m1", "m2", "m3", "nope"])
    assert got == {"m1": b"1", "m2": b"22", "m3": b"333"}, got
    # add / replace / append / prepend
    assert c.add("a", b"x", noreply=False) is False
    assert c.add("b", b"x", noreply=False) is True
    assert c.replace("b", b"y", noreply=False) is True
    assert c.replace("zz", b"y", noreply=False) is False
    assert c.append("b", b">", noreply=False) and c.prepend("b", b"<", noreply=False)
    assert c.get("b") == b"<y>"
    # cas
    value, unique = c.gets("a")
    assert value == b"hello" and unique
    assert c.cas("a", b"world", unique, noreply=False) is True
    assert c.cas("a", b"again", unique, noreply=False) is False  # EXISTS
    assert c.cas("nope", b"x", b"1", noreply=False) is None  # NOT_FOUND
    assert c.get("a") == b"world"
    many = c.gets_many(["a", "b"])
    assert many["a"][0] == b"world" and many["b"][0] == b"<y>"
    # incr / decr
    c.set("n", b"10", noreply=False)
    assert c.incr("n", 5, noreply=False) == 15
    assert c.decr("n", 100, noreply=False) == 0
    assert c.incr("n", 2**64 - 1, noreply=False) == 2**64 - 1
    assert c.incr("n", 2, noreply=False) == 1
    assert c.incr("nope", 1, noreply=False) is None
    # delete
    assert c.delete("a", noreply=False) is True
    assert c.delete("a", noreply=False) is False
    assert c.get("a") is None
    # expiry: relative, touch, negative via touch
    c.set("e", b"soon", expire=1, noreply=False)
    c.set("keep", b"k", expire=100, noreply=False)
    assert c.get("e") == b"soon"
    time.sleep(2.1)
    assert c.get("e") is None
    assert c.get("keep") == b"k"
    assert c.touch("keep", 1, noreply=False) is True
    time.sleep(2.1)
    assert c.get("keep") is None
    # stats
    stats = c.stats()
    for k in (b"curr_items", b"get_hits", b"get_misses", b"cmd_get", b"cmd_set", b"evictions", b"uptime"):
        assert k in stats, k
    assert stats[b"get_hits"] > 0 and stats[b"get_misses"] > 0
    # noreply (the default of pymemcache's set)
    c.set("nr", b"quiet")
    assert c.get("nr") == b"quiet"
    # binary-safe values
    blob = bytes(range(256)) * 100
    c.set("blob", blob, noreply=False)
    assert c.get("blob") == blob
    assert c.flush_all(noreply=False)
    assert c.get("nr") is None
    c.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
