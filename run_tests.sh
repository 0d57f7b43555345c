#!/usr/bin/env bash
# Runs the test suite (unit, integration, distributed and notebook tests) in the project's
# environment, creating .venv/ first when no environment with trainopt is active.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/bootstrap.sh
exec python -m pytest "$@"
