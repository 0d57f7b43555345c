"""Does contention for the memory system move the reproduction's throughput ratios?

A test of why two reproductions on one machine disagree (docs/reruns.md, "Do two reproductions
agree?"): a neighbour that shares the memory system but not the cores should slow a
configuration with a large working set more than one whose micro-batches fit in the cache, and
so change their ratio even though both are timed interleaved.

The timed configurations run on one core (one thread, pinned; with `--threads 2` on every core,
as the reproduction runs). Phases alternate: quiet, then a neighbour process pinned to the last
core -- streaming copies of a buffer far beyond the last-level cache (`stream`), sweeps over a
buffer the size of the last-level cache (`cache`), or small matmuls inside its own cache
(`compute`) -- then quiet again. With one thread the neighbour shares only the memory system
with the configurations; with two it also takes time from one of their cores. In every phase the configurations and the two machine-state probes
(`measure.probes`) are timed in interleaved windows. It prints, per phase, each one's median
rate and each configuration's ratio to the first, and writes everything with `--json`.

    python benchmarks/probes/contention/contention.py [--task cifar10] [--configs baseline,+accumulation,optimized]
           [--phases quiet,stream,quiet,cache,quiet] [--windows 5] [--steps 4] [--json FILE]

Needs a Linux machine with at least two cores (CPU affinity); on a GPU it is not meaningful.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import warnings

import torch

from trainopt_core import measure
from trainopt_core.measure.probes import machine_probes
from trainopt_core.measure.stats import paired_ratio
from trainopt_core.measure.timing import interleaved_windows
from trainopt_core.reproduction.profiles import get_profile
from trainopt_core.reproduction.throughput import _Workload

NEIGHBOUR_MIB = {"stream": 512, "cache": 24, "compute": 0}  # beyond a 32 MiB last-level cache / about its size


def _neighbour(kind: str, core: int) -> None:
    """Runs until killed on `core`: copy loops over a buffer of NEIGHBOUR_MIB[kind] MiB, or
    (`compute`) products of two 128 x 128 matrices, inside a core's cache."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    if kind == "compute":
        a = torch.randn(128, 128)
        while True:
            a = torch.tanh(a @ a)
    source = torch.ones(NEIGHBOUR_MIB[kind] * 2**20 // 8)
    target = torch.empty_like(source)
    half = source.numel() // 2
    while True:
        if kind == "stream":
            target.copy_(source)
        else:  # swap the halves' roles: every line of the buffer is read and written each sweep
            target[:half].copy_(source[half:])
            source[half:].copy_(target[:half])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="cifar10", choices=("cifar10", "wikitext2"))
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--configs", default="baseline,+accumulation,optimized")
    parser.add_argument("--phases", default="quiet,stream,quiet,cache,quiet")
    parser.add_argument("--windows", type=int, default=5, help="interleaved rounds per phase")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (probe steps) per window")
    parser.add_argument("--threads", type=int, default=1, choices=(1, 2),
                        help="1: configurations pinned to the first core; 2: on every core, as the reproduction")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    phases = args.phases.split(",")
    unknown = sorted(set(phases) - {"quiet", *NEIGHBOUR_MIB})
    if unknown:
        parser.error(f"--phases: {unknown} unknown; allowed quiet, {', '.join(NEIGHBOUR_MIB)}")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        parser.error(f"needs two cores, this process may use {cores}")
    warnings.simplefilter("ignore")
    if args.threads == 1:
        os.sched_setaffinity(0, {cores[0]})
    torch.set_num_threads(1 if args.threads == 1 else len(cores))
    device = torch.device("cpu")
    prof = get_profile(args.task, args.profile)
    configs = args.configs.split(",")
    loads = {name: _Workload(args.task, prof, name, device=device, backend="torch", data_policy="auto",
                             data_dir=None, seed=0, plans_dir=None) for name in configs}
    workloads = {name: load.step for name, load in loads.items()}
    probes = machine_probes(device)
    workloads.update({f"probe:{name}": probe for name, probe in probes.items()})
    print(f"{args.task} ({args.profile}), {torch.get_num_threads()} thread(s) on "
          f"{measure.run_manifest()['hardware']['cpu_model']}; {args.windows} rounds x {args.steps} steps per phase; "
          f"neighbour on core {cores[-1]}", flush=True)
    results = {"task": args.task, "profile": args.profile, "threads": torch.get_num_threads(), "configs": configs,
               "windows": args.windows,
               "steps_per_window": args.steps, "probes": {n: p.describe() for n, p in probes.items()},
               "neighbour_mib": NEIGHBOUR_MIB, "phases": []}
    context = multiprocessing.get_context("spawn")
    for index, phase in enumerate(phases):
        neighbour = None
        if phase != "quiet":
            neighbour = context.Process(target=_neighbour, args=(phase, cores[-1]), daemon=True)
            neighbour.start()
            time.sleep(2.0)  # its buffers allocated and touched
        try:
            rates = interleaved_windows(workloads, windows=args.windows, steps_per_window=args.steps,
                                        warmup_steps=1 if index == 0 else 0, device=device)
        finally:
            if neighbour is not None:
                neighbour.terminate()
                neighbour.join()
        row = {"phase": phase, "rates": rates,
               "median": {name: statistics.median(values) for name, values in rates.items()},
               "ratio_to_first": {name: paired_ratio(rates[name], rates[configs[0]]) for name in configs[1:]}}
        results["phases"].append(row)
        parts = [f"{name} {row['median'][name]:.0f}" for name in configs]
        parts += [f"copy {row['median']['probe:memory_copy'] / 1e9:.1f} GB/s",
                  f"matmul {row['median']['probe:matmul'] / 1e9:.1f} GFLOP/s"]
        ratios = [f"{name}/{configs[0]} {r['median']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                  for name, r in row["ratio_to_first"].items()]
        print(f"  {phase:6s} " + "; ".join(parts) + f" ({prof.item_unit})\n         " + "; ".join(ratios), flush=True)
    quiet = [row for row in results["phases"] if row["phase"] == "quiet"]
    print("change against the quiet phases' mean (median of each phase):")
    for row in results["phases"]:
        if row["phase"] == "quiet":
            continue
        changes = []
        for name in list(workloads):
            base = statistics.mean(q["median"][name] for q in quiet) if quiet else math.nan
            changes.append(f"{name} {100 * (row['median'][name] / base - 1):+.1f} %")
        print(f"  {row['phase']:6s} " + "; ".join(changes))
    for load in loads.values():
        load.close()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
