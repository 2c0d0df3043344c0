#!/usr/bin/env bash
# Installs what `psl report` and its tests need:
# - Debian's chromium: crates/psl-tools/tests/report_browser.rs loads the HTML report in headless mode;
# - redis-server: the durable anchor of `psl bench ycsb` (appendfsync always) in the report;
# - memcached and memcaslap come from scripts/install-memcached-test-deps.sh.
# Idempotent: skips what is already there.
set -euo pipefail
need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (apt)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
