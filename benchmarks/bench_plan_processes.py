"""Benchmark: trainopt_core.plan() on more than one process, where the ZeRO stage is a candidate.

For each task of the profile, `--processes` processes (gloo on a CPU, one thread each) plan the
task's model on their shares of one training batch of the baseline's size (the effective batch
of the one-process plans, split over the processes), twice:

1. no memory budget, time only;
2. a budget of 50 % of the data-parallel fp32 baseline's measured peak (per process);
3. with `--adaptive`, also for adaptive accumulation (k by goodput): the noise scale pooled over
   every process's share, the gradient all-reduce counted in the optimizer step's fixed part.
   Goodput's step-time model (a step of k micro-batches costs k·t_micro + t_fixed) is then
   checked on the processes as `bench_goodput.py` checks it on one: the chosen candidate with
   k_min, 2·k_min and k_max micro-batches of the same b, data parallel, timed interleaved in
   `--windows` windows of `--steps` steps (each window's rate the slowest process's); the
   measured samples/s ratio to k_min's (paired by window: median, 95 % interval) beside the
   model's.

Every candidate trains data parallel -- DDP at ZeRO stage 0, DeepSpeed at ZeRO-1/2 -- and each
speedup is paired, window by window, with the DDP fp32 baseline's windows of the same rounds
(each window's rate the slowest process's). The processes must return the same plan; the
benchmark checks that they did, then prints rank 0's table: every candidate's speed against
the baseline (median, 95 % interval), peak memory, and why it lost.

    python benchmarks/bench_plan_processes.py [--profile quick] [--tasks cifar10,wikitext2]
                                              [--processes 2] [--adaptive [--windows 6 --steps 2]]
                                              [--time-budget SECONDS|none] [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
import warnings
from pathlib import Path

import torch

from bench_goodput import (  # this folder is on sys.path when run as a script
    checked_ks, print_step_time_model_checks, rates_by_k, step_time_model_checks)

from trainopt_core import measure
from trainopt_core.distributed import run_processes
from trainopt_core.distributed.process_group import available_cpu_cores
from trainopt_core.reproduction.records import write_record

print = functools.partial(print, flush=True)  # noqa: A001


def plan_on_this_process(task: str, profile: str, progress: bool, adaptive: bool = False, windows: int = 6,
                         steps: int = 2, time_budget_s: float | None | str = "profile") -> dict:
    """The plans of `task` on this process's share of the batch (run by every process), each
    within `time_budget_s` seconds of planning ("profile": the profile's budget; None: none)."""
    from trainopt_core.reproduction.autoplan import plan_task
    from trainopt_core.reproduction.profiles import get_profile
    from trainopt_core.reproduction.tasks import build_task

    warnings.simplefilter("ignore")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    prof = get_profile(task, profile)
    torch.manual_seed(0)  # the same model on every process
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=torch.device("cpu"), seed=0)
    share = _share_of_the_batch(bundle, rank, world)
    if time_budget_s == "profile":
        time_budget_s = prof.plan_time_budget_s
    plan_task = functools.partial(plan_task, time_budget_s=time_budget_s)
    plans, failed = {}, {}
    plans["no budget"] = plan_task(share, prof, torch.device("cpu"), progress=progress and rank == 0)
    budget = 0.5 * plans["no budget"].baseline["peak_memory_bytes"]
    try:  # every process fails alike (they decide on the same measurements): reported, not fatal
        plans["50 % budget"] = plan_task(share, prof, torch.device("cpu"), progress=progress and rank == 0,
                                         memory_budget_bytes=budget)
    except ValueError as error:  # no candidate fits
        failed["50 % budget"] = str(error)
    checks = None
    if adaptive:
        plans["adaptive accumulation"] = plan_task(share, prof, torch.device("cpu"), progress=progress and rank == 0,
                                                   adaptive_accumulation=True)
        checks = _step_time_model_check(share, prof, plans["adaptive accumulation"], world, windows, steps)
    return {"model": bundle.model_name, "data_source": bundle.data_source, "batch": prof.baseline_batch_size,
            "share": prof.baseline_batch_size // world, "plans": {label: p.to_dict() for label, p in plans.items()},
            "failed_plans": failed, "step_time_model": checks}


def _step_time_model_check(share, prof, result, world: int, windows: int, steps: int) -> list[dict]:
    """The adaptive plan's step-time model against the chosen candidate timed data parallel with
    k_min, 2·k_min and k_max micro-batches of its b (every process runs it; rates agreed)."""
    from trainopt_core.planner.ranks import Ranks

    device = torch.device("cpu")
    good = result.goodput
    local = rates_by_k(share, prof, result, device, windows=windows, steps=steps, world_size=world)
    ranks = Ranks(device)
    rates = {name: ranks.min(values) for name, values in local.items()}  # a step ends with its slowest process
    return step_time_model_checks(rates, good, checked_ks(good),
                                  samples_per_micro_batch=world * int(good["micro_batch_size"]))


def _share_of_the_batch(bundle, rank: int, world: int):
    """The task bundle with its training batches cut to this process's share (rank r of W takes
    the r-th of W equal slices), so that the processes together plan on the baseline's batch."""
    def train_batches(batch_size: int, seed: int = 0):
        if batch_size % world:
            raise ValueError(f"batch_size={batch_size}: allowed a multiple of the {world} processes")
        for batch in bundle.train_batches(batch_size, seed=seed):
            yield tuple(None if t is None else t.chunk(world)[rank] for t in batch)
    return dataclasses.replace(bundle, train_batches=train_batches)


def _print_plan(label: str, planned: dict) -> None:
    budget = planned["memory_budget_bytes"]
    stages = ", ".join(f"{stage} {s:.1f} s" for stage, s in planned["stage_s"].items())
    print(f"  plan {label}: {planned['chosen']} (planning {planned['planning_s']:.1f} s: {stages}"
          + (f"; budget {budget / 2**20:.1f} MiB" if budget else "") + ")")
    for row in planned["rows"]:
        if row["speedup"] is None and row["peak_memory_bytes"] is None:
            continue
        speed = ("" if row["speedup"] is None else
                 f"x{row['speedup']:.2f} [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]")
        peak = "" if row["peak_memory_bytes"] is None else f"{row['peak_memory_bytes'] / 2**20:7.1f} MiB"
        verdict = "CHOSEN" if row.get("chosen") else (row["rejected_because"] or "")[:70]
        print(f"    {row['candidate']:45s} {speed:20s} {peak:12s} {verdict}")
    good = planned.get("goodput")
    if good:
        noise = good["noise_scale"]
        print(f"    B_simple {noise['b_simple']:.4g} [{noise['ci_low']:.4g}, {noise['ci_high']:.4g}] samples from "
              f"{noise['micro_batches']} micro-batches of {noise['micro_batch_size']:.3g} (every process's share); "
              f"micro-batch {good['micro_s'] * 1e3:.1f} ms, optimizer step with the all-reduce "
              f"{good['optimizer_s'] * 1e3:.1f} ms (slowest process); k = {good['k']} in "
              f"[{good['k_min']}, {good['k_max']}] ({good['k_at_interval'][0]} to {good['k_at_interval'][1]} "
              f"across the interval; closed form {good['closed_form_k']:.3g})")


def _time_budget(text: str) -> float | None | str:
    if text in ("none", "profile"):
        return None if text == "none" else text
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"--time-budget {text!r}: allowed seconds > 0, 'none' or 'profile'")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="quick", choices=("smoke", "quick"))
    parser.add_argument("--tasks", default="cifar10,wikitext2")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--adaptive", action="store_true", help="also plan for adaptive accumulation")
    parser.add_argument("--windows", type=int, default=6, help="--adaptive's step-time check: timing windows")
    parser.add_argument("--steps", type=int, default=2, help="--adaptive's step-time check: steps per window")
    parser.add_argument("--time-budget", default="profile", type=_time_budget, metavar="SECONDS|none|profile",
                        help="each plan's planning time budget (default: the profile's)")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    if args.processes < 2:
        parser.error(f"--processes {args.processes}: allowed an integer >= 2 (one process: bench_plan.py)")
    hardware = measure.run_manifest()["hardware"]
    print(f"machine: {hardware}; {args.processes} processes (gloo, CPU); torch {torch.__version__}")
    results = {"manifest": measure.run_manifest(profile=args.profile, device=torch.device("cpu")),
               "processes": args.processes, "tasks": []}
    for task in args.tasks.split(","):
        started = time.perf_counter()
        arguments = (task, args.profile, args.progress, args.adaptive, args.windows, args.steps, args.time_budget)
        ranks = run_processes(plan_on_this_process, args.processes, args=arguments,
                              backend="gloo", threads_per_process=max(1, available_cpu_cores() // args.processes),
                              timeout_s=1800)
        wall_s = time.perf_counter() - started

        def decided(rank_result):  # what the processes must agree on (their planning clocks differ)
            return {label: (p["chosen"], p["rows"], p.get("goodput")) for label, p in rank_result["plans"].items()}
        same = all(decided(r) == decided(ranks[0]) for r in ranks[1:])
        first = ranks[0]
        print(f"\n{task}: {first['model']}; {first['data_source']}; batch {first['batch']} "
              f"= {args.processes} x {first['share']} (wall {wall_s:.0f} s)")
        print(f"  every process returned the same plans: {'yes' if same else 'NO'}")
        for label, planned in first["plans"].items():
            _print_plan(label, planned)
        for label, error in first["failed_plans"].items():
            print(f"  plan {label}: FAILED {error}")
        if first["step_time_model"]:
            print_step_time_model_checks(first["step_time_model"], f"{args.windows} windows x {args.steps} steps, "
                                         f"interleaved, {args.processes} processes")
        results["tasks"].append({"task": task, **first, "same_plan_on_every_process": same, "wall_s": wall_s})
        if args.json:  # after every task: a run stopped part-way keeps the tasks it finished
            write_record(Path(args.json), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
