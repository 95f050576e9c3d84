#!/usr/bin/env bash
# Sets up a venv with nox and runs every default nox session (two at a time): the wheels, lint, the core tests, each plugin in its
# own venv, all plugins against the core, and the distributions. Works on a fresh Debian + Python 3.11. Ends with where the
# time went (scripts/ci_times.py: wall time per session and lane, the slowest tests) and `ci wall: N s`.
set -euo pipefail
cd "$(dirname "$0")/.."
START="$(date +%s)"
PY="$(bash scripts/python.sh)"  # $PYTHON, else the distribution's Python, else PATH's
"$PY" -m venv .nox-venv
.nox-venv/bin/pip install -q --disable-pip-version-check "nox>=2026.10.20"  # --parallel, session requires=
rm -rf .nox/times
rc=0
.nox-venv/bin/nox "$@" || rc=$?
"$PY" scripts/ci_times.py --since "$START" || true
exit "$rc"
