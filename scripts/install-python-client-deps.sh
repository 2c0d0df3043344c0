#!/usr/bin/env bash
# Makes the Python SDK's test environment: a venv (default target/pyenv, git-ignored with
# target/; PSL_PYENV=DIR to choose another) with the SDK (clients/python) and its test extras
# (pytest) installed from PyPI. Idempotent: a second run with the same SDK sources does nothing.
# Prints the venv's directory last.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PSL_PYENV:-target/pyenv}"
python="${PYTHON:-python3}"
stamp_of() {
  find clients/python/pyproject.toml clients/python/README.md clients/python/src -type f ! -name '*.pyc' \
    ! -path '*.egg-info/*' -print0 | sort -z |
    xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.psl-client-stamp" 2>/dev/null)" = "$want" ] &&
  "$venv/bin/python" -c 'import psl_client, pytest, cryptography' 2>/dev/null; then
  echo "$venv"
  exit 0
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade './clients/python[test]' >&2
# setuptools builds in the source tree: leave no build output there.
rm -rf clients/python/build clients/python/src/*.egg-info
echo "$want" >"$venv/.psl-client-stamp"
echo "$venv"
