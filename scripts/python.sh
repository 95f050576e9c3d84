#!/usr/bin/env bash
# The Python that scripts/test.sh and scripts/setup_demo.sh make their venvs from, printed as its real path
# (a pyenv shim costs 250 ms a start): $PYTHON; else the distribution's own (TOOLRL_SYSTEM_PYTHONS, default
# /usr/bin/python3.11 /usr/bin/python3: Debian's is an optimised, statically linked build; pyenv's default,
# a shared library without --enable-optimizations, runs Python code ~20% slower, and a cold
# `bash scripts/test.sh` took 1,100 s against 1,250-1,285 s: docs/testing.md); else python3.11 or python3
# on PATH. One older than 3.10 or that cannot make a venv (Debian without python3-venv) is passed over;
# $PYTHON is not.
set -euo pipefail
usable() { "$1" -c 'import ensurepip, sys, venv; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; }
if [ -n "${PYTHON:-}" ]; then
  candidates=("$PYTHON")
else
  read -r -a candidates <<< "${TOOLRL_SYSTEM_PYTHONS-/usr/bin/python3.11 /usr/bin/python3}"
  candidates+=("$(command -v python3.11 || true)" "$(command -v python3 || true)")
fi
for py in "${candidates[@]}"; do
  if [ -n "$py" ] && usable "$py"; then
    exec "$py" -c 'import os, sys; print(os.path.realpath(sys.executable))'
  fi
done
echo "error: no Python 3.10+ that can make a venv among: ${candidates[*]} (set PYTHON)" >&2
exit 1
