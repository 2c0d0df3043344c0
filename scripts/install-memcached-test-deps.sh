#!/usr/bin/env bash
# Installs what the psl-memcached tests and `psl bench memcached` need:
# - Debian's memcached (the benchmark's baseline) and libmemcached-tools (memcaslap, the load
#   generator; Debian names it memcaslap), libmemcached-dev (to build pylibmc if no wheel fits);
# - the Python clients pymemcache and pylibmc (crates/psl-memcached/tests/clients/).
# Idempotent: skips what is already there.
set -euo pipefail
need_apt=()
command -v memcached >/dev/null 2>&1 || need_apt+=(memcached)
command -v memcaslap >/dev/null 2>&1 || command -v memaslap >/dev/null 2>&1 || need_apt+=(libmemcached-tools)
[ -e /usr/include/libmemcached/memcached.h ] || need_apt+=(libmemcached-dev zlib1g-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (apt)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
if ! "$PY" -c 'import pymemcache, pylibmc' >/dev/null 2>&1; then
  echo "installing pymemcache pylibmc (pip)"
  "$PY" -m pip install -q pymemcache pylibmc \
    || "$PY" -m pip install -q --break-system-packages pymemcache pylibmc
fi
