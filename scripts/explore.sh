#!/usr/bin/env bash
# JupyterLab on working copies of the notebooks in lab/ (git-ignored): running and saving them
# never changes the tracked notebooks/, whose source is notebooks/build_notebooks.py. A copy
# already in lab/ is kept (your outputs and edits); delete it for a fresh one. Run it in the
# environment ./run_all.sh made (source .venv/bin/activate) or conda's (conda activate trainopt).
#
#   scripts/explore.sh [JUPYTERLAB OPTIONS]      # then open explorer.ipynb and "Run All"
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lab="$root/lab"
command -v jupyter >/dev/null || {
    echo "explore.sh: no 'jupyter' command here: activate the environment first (source .venv/bin/activate, made by ./run_all.sh or ./run_tests.sh)" >&2
    exit 1
}
mkdir -p "$lab"
for source in "$root"/notebooks/*.ipynb; do
    copy="$lab/$(basename "$source")"
    if [ -e "$copy" ]; then
        echo "[explore] kept lab/$(basename "$copy") (yours; delete it for a fresh copy)"
    else
        cp "$source" "$copy"
        echo "[explore] copied notebooks/$(basename "$source") -> lab/"
    fi
done
# as root (a container, a cloud VM) JupyterLab refuses to start without --allow-root: say it and pass it
as_root=()
if [ "$(id -u)" = 0 ] && [[ " $* " != *" --allow-root "* ]]; then
    echo "[explore] running as root: passing --allow-root to jupyter lab" >&2
    as_root=(--allow-root)
fi
# the notebooks' reports_dir "../reports" is the checkout's reports/ from lab/ as from notebooks/
exec jupyter lab "$lab" ${as_root[@]+"${as_root[@]}"} "$@"
