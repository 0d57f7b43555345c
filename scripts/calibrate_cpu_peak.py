"""Measure this CPU's peak matmul FLOP/s for the MFU denominator and commit it per kind of CPU.

Runs the matmul probe (`measure.flops.matmul_probe_flops`) in `--processes` fresh processes, one
after another, in fp32 and, where the CPU computes bf16 natively, in bf16, at torch's default
thread count; writes the median of each, with every run, the commit and the date, into
trainopt_core/measure/cpu_peaks.json under this CPU's kind ("AVX512+bf16, AMD family 26 model 2")
and thread count. Runs on this kind of CPU then divide by that median instead of probing in the
process (docs/verdicts.md). Run it on a quiet machine, from a clean commit (about 1 minute).

    python scripts/calibrate_cpu_peak.py [--processes 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
print("[calibrate_cpu_peak] importing torch (seconds) ...", file=sys.stderr, flush=True)

from trainopt_core.measure.flops import CPU_PEAKS_FILE, cpu_kind  # noqa: E402
from trainopt_core.measure.manifest import cpu_computes_bf16_natively, run_manifest  # noqa: E402

PROBE = ("import json, torch; from trainopt_core.measure.flops import matmul_probe_flops; "
         "print(json.dumps([torch.get_num_threads(), matmul_probe_flops('cpu', '{precision}')[0]]))")


def probe(precision: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE.format(precision=precision)], capture_output=True, text=True,
                         env=env, cwd=REPO, check=True, timeout=300)
    threads, flops = json.loads(out.stdout.strip().splitlines()[-1])
    return threads, flops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8, help="fresh processes per precision (default 8)")
    args = parser.parse_args(argv)
    if not 3 <= args.processes <= 100:
        parser.error(f"--processes {args.processes} is invalid: allowed an integer from 3 to 100")
    git = run_manifest(device="cpu")["git"]
    kind, load = cpu_kind(), os.getloadavg()[0]
    print(f"[calibrate_cpu_peak] {kind}; commit {git['commit'][:7]}{' (uncommitted changes)' if git['dirty'] else ''}; "
          f"load {load:.1f}", flush=True)
    peaks = json.loads(CPU_PEAKS_FILE.read_text()) if CPU_PEAKS_FILE.is_file() else {"peaks": {}}
    for precision in ["fp32"] + ["bf16"] * cpu_computes_bf16_natively():
        runs = []
        for i in range(args.processes):
            threads, flops = probe(precision)
            runs.append(flops)
            print(f"  {precision} #{i + 1}: {flops / 1e9:.1f} GFLOP/s ({threads} threads)", flush=True)
        median = statistics.median(runs)
        print(f"{precision}: median {median / 1e9:.1f} GFLOP/s, {min(runs) / 1e9:.1f}-{max(runs) / 1e9:.1f} "
              f"({100 * (max(runs) / min(runs) - 1):.1f} %)", flush=True)
        peaks["peaks"].setdefault(kind, {}).setdefault(str(threads), {})[precision] = dict(
            flops_per_s=median, runs=runs, commit=git["commit"][:7] + ("+dirty" if git["dirty"] else ""),
            date=time.strftime("%Y-%m-%d", time.gmtime()), load_before=round(load, 2))
    CPU_PEAKS_FILE.write_text(json.dumps(peaks, indent=1, sort_keys=True) + "\n")
    print(f"wrote {CPU_PEAKS_FILE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
