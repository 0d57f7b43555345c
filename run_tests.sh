#!/usr/bin/env bash
# Runs the test suite (unit, integration, distributed and notebook tests) in the project's
# environment, creating .venv/ first when no environment with trainopt is active.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/bootstrap.sh
# One test worker per core, at most 2 (pytest-xdist): each file's tests stay in one worker, so a
# module's fixtures run once. TRAINOPT_TEST_WORKERS=0 runs every test in this one process.
workers="${TRAINOPT_TEST_WORKERS:-$(( $(nproc) >= 2 ? 2 : 0 ))}"
exec python -m pytest -n "$workers" --dist loadfile "$@"
