"""What only a CUDA GPU measures, in one command, for a GPU session of limited time.

1. The GPU tests (`pytest -m gpu tests/test_gpu.py`): training-step peak memory, fp16 skipped
   steps, TF32 peaks, NVML energy, synchronized timing.
2. The profile's baseline and optimized runs of each task, cut to `--steps` optimizer steps
   (truncated runs, status "truncated"): throughput after the profile's warm-up steps,
   training-step and evaluation peak memory, energy, FLOPs utilization, skipped fp16 steps.
3. √L checkpointing's recompute overhead at the profile's sizes, timed directly.

Everything lands in `--out`: environment.json (the hardware manifest), gpu_tests.txt,
gpu_runs.json (the truncated run records and the overheads) and gpu_runs.md (their table).
Quality and time-to-target need full runs (`./run_all.sh --profile paper`), not these.

    python scripts/gpu_check.py --out DIR [--profile paper] [--steps 60] [--tasks cifar10,wikitext2]

Without CUDA it stops, unless run as `--device cpu --profile smoke` (a run of the plumbing).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

print("[gpu_check] importing torch and trainopt_core (seconds; longer on a first run) ...", file=sys.stderr,
      flush=True)  # a sign of life before the imports

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from trainopt_core import measure  # noqa: E402
from trainopt_core.reporting.index import markdown_table  # noqa: E402
from trainopt_core.reporting.analysis.profiling import measure_recompute_overhead  # noqa: E402
from trainopt_core.reproduction import runner  # noqa: E402
from trainopt_core.reproduction.profiles import PROFILES, TASKS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("baseline", "optimized")
# what the table shows of a truncated run's metrics: (title, key, format of a value that is not None)
COLUMNS = (
    ("throughput", "throughput", lambda v, m: f"{v:,.0f} {m['throughput_unit']}"),
    ("training-step peak", "peak_memory_bytes", lambda v, m: f"{v / 2**20:,.0f} MiB"),
    ("evaluation peak", "evaluation_peak_memory_bytes", lambda v, m: f"{v / 2**20:,.0f} MiB"),
    ("energy", "energy_j", lambda v, m: f"{v:,.0f} J"),
    ("model FLOPs utilization", "flops_utilization", lambda v, m: f"{100 * v:.1f} %"),
    ("skipped fp16 steps", "skipped_steps", lambda v, m: str(v)),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the results (created)")
    parser.add_argument("--profile", default="paper", choices=PROFILES)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run, the profile's warm-up included")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, from " + ",".join(TASKS))
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu with --profile smoke")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
    args = parser.parse_args(argv)
    args.tasks = args.tasks.split(",")
    for task in args.tasks:
        if task not in TASKS:
            parser.error(f"--tasks: {task!r} is invalid; allowed {', '.join(TASKS)}")
    if args.steps < 1:
        parser.error(f"--steps={args.steps} is invalid: allowed an integer >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False); "
                     "a run of the plumbing is --device cpu --profile smoke")
    if device.type != "cuda" and args.profile != "smoke":
        parser.error(f"--device {args.device} is allowed with --profile smoke only (the GPU sizes take hours on a CPU)")
    return args


def run_tests(out: Path) -> int:
    """The GPU tests; their output in gpu_tests.txt. Returns pytest's exit code."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-rA", "-q",
                             "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    (out / "gpu_tests.txt").write_text(result.stdout + result.stderr)
    print(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:], flush=True)
    return result.returncode


def truncated_run(task: str, config: str, args: argparse.Namespace) -> dict:
    """A run of `config` cut to args.steps optimizer steps (not written by the runner)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        try:
            record = runner.run(task, config, profile=args.profile, out_dir=scratch, device=args.device,
                                max_steps=args.steps, rerun=True, progress=False)
        except Exception as err:  # an out-of-memory or a CUDA path that fails: reported, the rest goes on
            return {"task": task, "config_name": config, "status": "failed", "error": f"{type(err).__name__}: {err}"}
    record["seconds"] = time.perf_counter() - started
    return record


def table(records: list[dict], overheads: dict) -> str:
    rows = []
    for record in records:
        row = {"task": record["task"], "configuration": record["config_name"]}
        if record["status"] == "failed":
            row["steps"] = f"failed: {record['error'][:200]}"
        else:
            metrics = record["metrics"]
            row["steps"] = metrics["optimizer_steps"]
            row.update({title: "n/a" if metrics.get(key) is None else show(metrics[key], metrics)
                        for title, key, show in COLUMNS})
        rows.append(row)
    lines = [markdown_table(pd.DataFrame(rows).fillna("")).rstrip("\n"), "",
             "√L checkpointing's recompute overhead (forward + backward with over without, minus one):", ""]
    for task, result in overheads.items():
        lines.append(f"- {task}: " + (result["error"] if "error" in result else
                                      f"{100 * result['recompute_overhead']:.1f} % in {result['precision']}, {result['segments']} "
                                      f"segments of {result['blocks']} blocks (forward share of a step "
                                      f"{100 * result['forward_share']:.1f} %)"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    (out / "environment.json").write_text(json.dumps(measure.run_manifest(profile=args.profile, device=device), indent=1))
    if not args.no_tests:
        print("[gpu_check] the GPU tests (pytest -m gpu tests/test_gpu.py) ...", flush=True)
    tests = None if args.no_tests else run_tests(out)
    records, overheads = [], {}
    for task in args.tasks:
        print(f"[gpu_check] {task}: {', '.join(CONFIGS)}, {args.steps} optimizer steps each, then checkpointing's "
              "recompute overhead ...", flush=True)
        for config in CONFIGS:
            record = truncated_run(task, config, args)
            records.append(record)
            print(f"{task} {config}: {record['status']}"
                  + (f" {record.get('error', '')}" if record["status"] == "failed" else
                     f", {record['metrics']['throughput']:,.0f} {record['metrics']['throughput_unit']}, "
                     f"{record['seconds']:.0f} s"), flush=True)
        try:
            overheads[task] = measure_recompute_overhead(task, profile=args.profile, device=device)
        except Exception as err:
            overheads[task] = {"error": f"{type(err).__name__}: {err}"}
    (out / "gpu_runs.json").write_text(json.dumps({"profile": args.profile, "steps": args.steps, "tests_exit": tests,
                                                   "runs": records, "recompute_overhead": overheads}, indent=1))
    text = table(records, overheads)
    (out / "gpu_runs.md").write_text(text)
    print(text, flush=True)
    return 0 if tests in (None, 0) and all(r["status"] != "failed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
