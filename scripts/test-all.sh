#!/usr/bin/env bash
# Installs what the tests need and runs all of them: formatting, lints, doc links, the
# workspace's unit, property and integration tests, and a short smoke run of every fuzz target.
# Usage: scripts/test-all.sh            (FUZZ_SECONDS=N to change the per-target fuzz time)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${FUZZ_SECONDS:-12}"
# On CI (a clean clone, built once) incremental state is disk spent for nothing.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
log() { printf '\n==> %s\n' "$*"; }

log "toolchains"
cargo --version
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "the nightly toolchain is needed for the fuzz smoke run (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

log "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

scripts/install-memcached-test-deps.sh  # psl-memcached: memcached, memcaslap, pymemcache, pylibmc
scripts/install-nats-test-deps.sh       # NATS fabric and namespace tests: nats-server, iproute2, openssl
scripts/install-report-test-deps.sh     # psl report: chromium (browser test), redis-server
log "workspace tests"
results=$(mktemp)
cargo test --workspace --locked 2>&1 | tee "$results"
passed=$(grep -E '^test result:' "$results" | sed -E 's/.* ([0-9]+) passed.*/\1/' | paste -sd+ - | bc)
failed=$(grep -E '^test result:' "$results" | sed -E 's/.* ([0-9]+) failed.*/\1/' | paste -sd+ - | bc)

log "python client tests (clients/python, against target/debug/psl)"
py_xml=$(mktemp)
if pyenv=$(scripts/install-python-client-deps.sh); then
  PSL_BIN="$PWD/target/debug/psl" PYTHONDONTWRITEBYTECODE=1 "$pyenv/bin/python" -m pytest -q -p no:cacheprovider \
    --junitxml="$py_xml" clients/python/tests || true
  read -r py_passed py_failed < <("$pyenv/bin/python" -c '
import sys, xml.etree.ElementTree as E
r = E.parse(sys.argv[1]).getroot(); s = r if r.tag == "testsuite" else r.find("testsuite")
t, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(t - f - e - k, f + e)' "$py_xml" 2>/dev/null || echo "0 1")
else
  py_passed=0 py_failed=1
fi
passed=$((passed + py_passed))
failed=$((failed + py_failed))
rm -f "$py_xml"

log "fuzz smoke: ${FUZZ_SECONDS}s per target"
fuzz_failed=()
for target in $(cargo +nightly fuzz list --fuzz-dir fuzz); do
  corpus=$(mktemp -d)
  seeds=fuzz/seeds/$target
  [ -d "$seeds" ] || seeds=
  fuzz_log=$(mktemp)
  if cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" $seeds -- \
    -max_total_time="$FUZZ_SECONDS" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=0 >"$fuzz_log" 2>&1; then
    grep -E "^Done" "$fuzz_log" | tail -n 1 || echo "$target: done"
  else
    # A crash, a leak or a build failure: show it and fail the run (the input is kept under
    # fuzz/artifacts/$target/ for `cargo +nightly fuzz run $target ARTIFACT`).
    grep -E "ERROR|panicked|SUMMARY|error(\[|:)" "$fuzz_log" | head -n 40 || tail -n 40 "$fuzz_log"
    fuzz_failed+=("$target")
  fi
  rm -rf "$corpus" "$fuzz_log"
done

if [ ${#fuzz_failed[@]} -gt 0 ]; then
  echo "fuzz smoke failed for: ${fuzz_failed[*]}" >&2
  failed=$((failed + ${#fuzz_failed[@]}))
fi

echo
echo "tests: ${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
