#!/usr/bin/env bash
# Reproduce every table and figure: run the section notebooks headless with papermill into
# reports/<profile>/ (executed notebooks, tables, figures, run records), then index them in
# reports/README.md. Finished runs are reused, so an interrupted reproduction resumes.
set -uo pipefail

SECTIONS_ALL="01,02,03,04,explorer"
notebook_for() {  # section -> notebook (a function, not an associative array: bash 3 has none)
    case "$1" in
        01) echo 01_main_results.ipynb ;;
        02) echo 02_ablation.ipynb ;;
        03) echo 03_scaling.ipynb ;;
        04) echo 04_error_analysis.ipynb ;;
        explorer) echo explorer.ipynb ;;
    esac
}

usage() {
    cat <<USAGE
Usage: ./run_all.sh [--profile smoke|quick|paper|gpu] [--seeds N] [--sections LIST]
                    [--tasks LIST] [--data-policy auto|real|standin] [--reports-dir DIR]
                    [--executor local|ray] [--ray-address ADDR]

Runs the section notebooks with papermill into reports/<profile>/ and writes reports/README.md.
Run records and timings made on another kind of machine (or under other conditions) are
measured again; those made here are reused, so an interrupted reproduction resumes.

  --profile      smoke (a plumbing check, not evidence), quick (default; a 2-core CPU in well under an hour),
                 paper (the paper's setup; needs GPUs and the real data sets)
                 gpu (the paper's models and batches in short runs: about 6 minutes of one H100)
  --seeds N      seeds per configuration, 1 <= N <= 1000 (default 3: the fewest with a usable 95 % CI)
  --sections     comma-separated subset of $SECTIONS_ALL, each once (default: all, in this order)
  --tasks        comma-separated subset of cifar10,wikitext2, each once (default: both)
  --data-policy  auto (default: real data when present, else a labeled stand-in), real, standin
  --reports-dir  where to write (default: reports/ of this checkout); e.g. a second folder to
                 compare two reproductions with python -m trainopt_core.reporting.agreement
  --executor     local (default: the runs one after another in each notebook's process) or ray
                 (each run a Ray task: pip install 'trainopt[cluster]'; docs/cluster.md)
  --ray-address  with --executor ray: a running cluster's address (auto, HOST:PORT); default:
                 a local cluster of this machine, started by each notebook
  -h, --help     this text
Each option at most once.
USAGE
}

fail_usage() {
    echo "run_all.sh: $1" >&2
    echo "Try './run_all.sh --help'." >&2
    exit 2
}

profile=quick
seeds=3
sections=$SECTIONS_ALL
tasks=cifar10,wikitext2
data_policy=auto
reports_root=
executor=local
ray_address=
given=" "  # the flags given so far: each at most once
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --profile|--seeds|--sections|--tasks|--data-policy|--reports-dir|--executor|--ray-address)
            [ $# -ge 2 ] || fail_usage "$1 needs a value"
            option=$1; value=$2; shift 2 ;;
        --profile=*|--seeds=*|--sections=*|--tasks=*|--data-policy=*|--reports-dir=*|--executor=*|--ray-address=*)
            option=${1%%=*}; value=${1#*=}; shift ;;
        *) fail_usage "unknown argument '$1'" ;;
    esac
    case "$given" in *" $option "*) fail_usage "$option is given twice: allowed once" ;; esac
    given="$given$option "
    case "$option" in
        --profile) profile=$value ;;
        --seeds) seeds=$value ;;
        --sections) sections=$value ;;
        --tasks) tasks=$value ;;
        --data-policy) data_policy=$value ;;
        --reports-dir) reports_root=$value ;;
        --executor) executor=$value ;;
        --ray-address) ray_address=$value ;;
    esac
done

case "$profile" in smoke|quick|paper|gpu) ;; *) fail_usage "--profile '$profile' is invalid: allowed smoke, quick, paper, gpu" ;; esac
# 1..MAX_SEEDS: more would be weeks of runs, and a 20-digit count overflows bash's integers
MAX_SEEDS=1000
{ [[ "$seeds" =~ ^[1-9][0-9]{0,3}$ ]] && [ "$seeds" -le "$MAX_SEEDS" ]; } \
    || fail_usage "--seeds '$seeds' is invalid: allowed an integer from 1 to $MAX_SEEDS"
case "$data_policy" in auto|real|standin) ;; *) fail_usage "--data-policy '$data_policy' is invalid: allowed auto, real, standin" ;; esac
case "$executor" in local|ray) ;; *) fail_usage "--executor '$executor' is invalid: allowed local, ray" ;; esac
case "$given" in *" --ray-address "*)
    [ "$executor" = ray ] || fail_usage "--ray-address is for --executor ray (the executor is '$executor')"
    [ -n "$ray_address" ] || fail_usage "--ray-address '' is invalid: allowed auto, HOST:PORT or ray://HOST:PORT of a running cluster (leave it out for a cluster of this machine)"
    # HOST:PORT that takes no TCP connection within 5 s: said now, before the environment is set up
    # (the Python check after it also asks for Ray's GCS there)
    host=${ray_address#ray://}; port=${host##*:}; host=${host%:*}; host=${host#[}; host=${host%]}
    if [[ "$port" =~ ^[0-9]+$ ]] && [ -n "$host" ] && command -v timeout >/dev/null; then
        timeout 5 bash -c ': > "/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null \
            || fail_usage "--ray-address '$ray_address' is invalid: nothing accepted a connection at $host:$port within 5 s; allowed auto, HOST:PORT or ray://HOST:PORT of a running cluster this machine reaches"
    fi ;;
esac
# a comma-separated list: each item allowed, none empty, none twice
check_list() {  # flag, value, allowed items (comma-separated)
    local item items seen=","
    [ -n "$2" ] || fail_usage "$1 '' is invalid: allowed a comma-separated subset of $3"
    case "$2" in ,*|*,|*,,*) fail_usage "$1 '$2' is invalid: an empty item; allowed a comma-separated subset of $3" ;; esac
    IFS=, read -r -a items <<< "$2"
    for item in "${items[@]}"; do
        case ",$3," in *",$item,"*) ;; *) fail_usage "$1: '$item' is invalid: allowed a comma-separated subset of $3" ;; esac
        case "$seen" in *",$item,"*) fail_usage "$1 '$2' is invalid: '$item' twice; allowed each of $3 at most once" ;; esac
        seen="$seen$item,"
    done
}
check_list --tasks "$tasks" cifar10,wikitext2
check_list --sections "$sections" "$SECTIONS_ALL"
read -r -a selected <<< "${sections//,/ }"
case "$given" in *" --reports-dir "*)
    [ -n "$reports_root" ] || fail_usage "--reports-dir '' is invalid: allowed a folder path (leave it out for reports/ of this checkout)" ;;
esac

if [ -n "$reports_root" ]; then
    mkdir -p "$reports_root" || fail_usage "--reports-dir '$reports_root' cannot be created"
    # a folder that cannot be entered or written: stop here, naming it (before, the checkout's
    # own reports/ took the runs, and a second reproduction meant for comparison mixed into it)
    entered=$(cd "$reports_root" 2>/dev/null && pwd) || fail_usage "--reports-dir '$reports_root' cannot be entered (permission denied?): allowed a folder this user can enter and write"
    [ -w "$entered" ] || fail_usage "--reports-dir '$reports_root' is not writable: allowed a folder this user can enter and write"
    reports_root=$entered
fi
cd "$(dirname "$0")"
root=$PWD
reports_root=${reports_root:-$root/reports}
# shellcheck disable=SC1091
. scripts/bootstrap.sh || { echo "run_all.sh: setting up the Python environment failed (see above)" >&2; exit 1; }
if [ "$executor" = ray ] && ! python -c "import ray" 2>/dev/null; then
    fail_usage "--executor ray needs Ray, which is not installed: pip install 'trainopt[cluster]' (or --executor local)"
fi
if [ -n "$ray_address" ]; then  # a cluster that does not answer: said here, not after minutes in ray.init()
    refusal=$(RAY_BACKEND_LOG_LEVEL=error python - "$ray_address" <<'PY'
import sys
from trainopt_core.reproduction.executor import check_ray_address
try:
    check_ray_address(sys.argv[1], "--ray-address")
except ValueError as error:
    print(error)
PY
) || refusal="--ray-address '$ray_address' could not be checked (see above)"
    [ -z "$refusal" ] || fail_usage "$refusal"
fi

# papermill keeps the output path and the parameters in each executed notebook: inside the
# checkout they name the reports folder relatively (reports_dir from notebooks/), so an executed
# notebook carries no absolute path of this machine
case "$reports_root" in
    "$root") reports_shown=.; reports_param=.. ;;
    "$root"/*) reports_shown=${reports_root#"$root"/}; reports_param=../$reports_shown ;;
    *) reports_shown=$reports_root; reports_param=$reports_root ;;
esac
out_dir="$reports_shown/$profile/notebooks"
mkdir -p "$out_dir"
case "$data_policy" in
    auto) data_said="data policy auto: the real data sets where they are in ./data, else labeled stand-ins (NOT CIFAR-10, NOT WikiText-2); the summary at the end says which" ;;
    standin) data_said="data policy standin: labeled stand-ins (NOT CIFAR-10, NOT WikiText-2)" ;;
    *) data_said="data policy $data_policy" ;;
esac
echo "[run_all] profile $profile, $seeds seed(s), tasks $tasks, $data_said, sections ${selected[*]}, executor $executor${ray_address:+ at $ray_address}"
failures=()
run_start=$(date +%s)
# the notebooks' progress lines (which run of how many, trained or reused, time left), shown here
# while a notebook runs: its own output reaches this terminal only when it ends
export TRAINOPT_PROGRESS_LOG
TRAINOPT_PROGRESS_LOG=$(mktemp "${TMPDIR:-/tmp}/trainopt_progress.XXXXXX")
follower=""
stop_following() {
    if [ -n "$follower" ]; then sleep 0.5; kill "$follower" 2>/dev/null; wait "$follower" 2>/dev/null; follower=""; fi
}
trap 'stop_following; rm -f "$TRAINOPT_PROGRESS_LOG"' EXIT
for section in "${selected[@]}"; do
    notebook=$(notebook_for "$section")
    start=$(date +%s)
    echo "[run_all] ${notebook} ..."
    : > "$TRAINOPT_PROGRESS_LOG"
    tail -n +1 -s 0.5 -f "$TRAINOPT_PROGRESS_LOG" 2>/dev/null &
    follower=$!
    if python -m papermill "notebooks/$notebook" "$out_dir/$notebook" \
            -p profile "$profile" -p seeds "$seeds" -p tasks "$tasks" \
            -p reports_dir "$reports_param" -p data_policy "$data_policy" \
            -p executor "$executor" -p ray_address "$ray_address" \
            --cwd notebooks -k python3; then
        stop_following
        echo "[run_all] ${notebook} done in $(( $(date +%s) - start )) s -> $out_dir/$notebook"
    else
        stop_following
        cell=$(python -c 'import sys; from trainopt_core.reporting.notebook import describe_failed_cell as d; print(d(sys.argv[1]))' \
               "$out_dir/$notebook" 2>&1)
        echo "[run_all] FAILED: notebooks/$notebook -- $cell" >&2
        echo "[run_all]         the executed notebook with the error: $out_dir/$notebook" >&2
        failures+=("notebooks/$notebook: $cell")
    fi
done

python -c 'import sys; from trainopt_core.reporting import write_reports_index; print("[run_all] wrote", write_reports_index(sys.argv[1]))' \
    "$reports_root" || failures+=("$reports_root/README.md could not be written")

if [ ${#failures[@]} -gt 0 ]; then
    echo "[run_all] ${#failures[@]} failure(s):" >&2
    printf '[run_all]   %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "[run_all] all sections done in $(( $(date +%s) - run_start )) s; see $reports_root/README.md"
echo
python -m trainopt_core.reporting.summary "$reports_root" --profile "$profile" \
    || echo "[run_all] the summary of $reports_root/$profile could not be printed" >&2
