#!/usr/bin/env bash
# Installs what the NATS fabric tests, the multi-host test in network namespaces and
# `psl bench fabric` need:
# - Debian's nats-server (2.9.x): the NATS backend's tests start their own servers on
#   loopback, and the namespace test runs a three-server cluster;
# - iproute2 (`ip netns`, veth pairs, a bridge) for the namespace test (root only);
# - openssl, to make the throwaway CA and server certificate of the NATS TLS test.
# Idempotent: skips what is already there.
set -euo pipefail
need_apt=()
command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (apt)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# The Debian package enables a system service on port 4222; the tests start their own servers
# on free ports and never use it, but a benchmark run beside it would share the CPU.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nats-server 2>/dev/null; then
  systemctl stop nats-server || true
fi
nats-server --version
