#!/usr/bin/env bash
# Source this file: it leaves a Python environment with trainopt installed active.
# An already-active environment that imports trainopt_core with its extras is used as it is;
# otherwise a local .venv/ in the checkout is created (once) and reused.
_trainopt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_trainopt_pins="$_trainopt_root/constraints.txt"
# a changed pyproject.toml or constraints.txt installs again
_trainopt_stamp_src="$(cat "$_trainopt_root/pyproject.toml" "$_trainopt_pins" 2>/dev/null | sha256sum | cut -c1-16)"

_trainopt_ready() {
    python - <<'PY' >/dev/null 2>&1
import importlib, sys
for name in ("trainopt_core", "torch", "torchvision", "transformers", "papermill", "nbval", "pytest", "deepspeed", "seaborn"):
    importlib.import_module(name)
PY
}

# pip install "$@" at the releases the tests passed with (constraints.txt); where those cannot be
# installed (another Python, another platform), the newest releases pyproject.toml allows.
# pip byte-compiles what it installs (not --no-compile): where PYTHONDONTWRITEBYTECODE is set, Python
# caches nothing itself, and every process would compile torch's modules again (6 s more per process)
_trainopt_pip_install() {
    python -m pip install -q -c "$_trainopt_pins" "$@" >&2 && return 0
    echo "[trainopt] the pinned releases in constraints.txt do not install here; installing the newest releases pyproject.toml allows (the tests passed with the pinned ones)" >&2
    python -m pip install -q "$@" >&2
}

# _trainopt_ready imports torch, transformers, deepspeed and seaborn: 7 s with their files in the OS's cache, 75 s
# on a fresh clone's first run; said first, so that a command is never silent for that minute
echo "[trainopt] checking the environment (importing torch, transformers, deepspeed, seaborn; ~1 min the first time) ..." >&2
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] || ! _trainopt_ready; then
    if [ ! -x "$_trainopt_root/.venv/bin/python" ]; then
        echo "[trainopt] creating $_trainopt_root/.venv" >&2
        python3 -m venv "$_trainopt_root/.venv" || return 1 2>/dev/null || exit 1
    fi
    # shellcheck disable=SC1091
    . "$_trainopt_root/.venv/bin/activate"
    if [ "$(cat "$_trainopt_root/.venv/.trainopt-stamp" 2>/dev/null)" != "$_trainopt_stamp_src" ] || ! _trainopt_ready; then
        echo "[trainopt] installing into .venv (torch first; a few minutes the first time)" >&2
        # torch's CUDA build and the extras take about 6.5 GB. With less than 7 GiB free, stop here
        # and say so: pip would fail half-way with "No space left on device", and the fallbacks
        # below (other releases, then a download) would bury that under their own errors. An
        # environment that already has torch needs little more, so it is not held to this.
        if ! python -c "import torch" >/dev/null 2>&1; then
            _trainopt_free_kb=$(df -Pk "$_trainopt_root" 2>/dev/null | awk 'NR == 2 {print $4}')
            if [ -n "$_trainopt_free_kb" ] && [ "$_trainopt_free_kb" -lt 7340032 ]; then
                echo "[trainopt] only $((_trainopt_free_kb / 1048576)) GiB free under $_trainopt_root; a new environment needs about 7 GiB. Free some space, or activate an existing environment with trainopt installed" >&2
                return 1 2>/dev/null || exit 1
            fi
        fi
        python -m pip install -q --upgrade pip >&2
        # torch/torchvision as one pair: mismatched builds fail to import torchvision
        _trainopt_pip_install "torch==2.14.1" "torchvision==0.29.1" \
            || python -m pip install -q torch torchvision >&2 || { echo "[trainopt] torch install failed" >&2; return 1 2>/dev/null || exit 1; }
        _trainopt_pip_install -e "$_trainopt_root[dev]" || { echo "[trainopt] install failed" >&2; return 1 2>/dev/null || exit 1; }
        python -m ipykernel install --sys-prefix --name python3 >/dev/null 2>&1 || true
        echo "$_trainopt_stamp_src" > "$_trainopt_root/.venv/.trainopt-stamp"
    fi
fi
unset -f _trainopt_ready _trainopt_pip_install
