"""pymemcache `gets`/`cas` increment loops against a group of `psl memcached` front ends,
for the home failover test (crates/psl/tests/memcached_home_failover.rs).

Usage: python3 pymemcache_cas_loop.py SECONDS KEYS HOST:PORT[,HOST:PORT...]

Increments the counters KEYS (comma-separated) with gets + cas for SECONDS, moving to the next
front end when one cannot be reached (it may have been killed). Prints one line per `STORED`:
`STORED key unique new_value`, and at the end `DONE stored exists server_errors reconnects`.
"""
import random
import sys
import time

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError, MemcacheUnexpectedCloseError


def main(seconds, keys, servers):
    end = time.monotonic() + seconds
    at = 0  # the first front end listed: the test kills it mid-run
    stored = exists = server_errors = reconnects = 0
    c = None
    while time.monotonic() < end:
        if c is None:
            host, port = servers[at].rsplit(":", 1)
            c = Client((host, int(port)), connect_timeout=2, timeout=10)
        key = random.choice(keys)
        try:
            got = c.gets(key)
            if got[0] is None:
                continue
            value, unique = got
            new = int(value) + 1
            r = c.cas(key, str(new).encode(), unique, noreply=False)
            if r is True:
                stored += 1
                print(f"STORED {key} {int(unique)} {new}", flush=True)
            else:
                exists += 1
        except MemcacheServerError:
            # No home for the key's slot right now (a hand-over): retry shortly.
            server_errors += 1
            time.sleep(0.01)
            continue
        except (OSError, MemcacheUnexpectedCloseError):
            # The front end is gone (kill -9): the next one.
            reconnects += 1
            try:
                c.close()
            except Exception:
                pass
            c = None
            at = (at + 1) % len(servers)
            time.sleep(0.02)
    print(f"DONE {stored} {exists} {server_errors} {reconnects}", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(","))
