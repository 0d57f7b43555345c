"""Benchmark: trainopt_core.plan() against the fp32 baseline, ratios measured in one run.

For each task of the profile (the quick ResNet and GPT-2 on this machine; the paper's sizes
with --profile paper on a GPU) it plans four times on one training batch of the baseline's size:

1. no budget, time only: the `auto` configuration; its planning time is bar 4 (<= 60 s);
2. a budget of 50 % of the baseline's measured peak (bar 2: within budget, >= 1.0x baseline);
3. time and memory weighted (1, 1, 0), which measures checkpointing, to find a budget that only
   checkpointing meets: halfway between the smallest checkpointed and the smallest
   non-checkpointed peak;
4. that budget (bar 3: the plan checkpoints and fits).

Then the baseline and the planned configurations are built as the reproduction builds them
(`runner.build_engine`: the profile's AdamW, its real training batches) and timed interleaved,
A, B, C, A, B, C ..., in `--windows` windows of `--steps` optimizer steps; each ratio to the
baseline is paired window by window (median and 95 % interval). Peak memory of each is measured
again on that path (one tracked optimizer step after a warm-up). Bar 1: auto >= 1.25x.

    python benchmarks/bench_plan.py [--profile quick] [--tasks cifar10,wikitext2] [--json FILE [--resume]]
                                    [--planning-memory-mib N]

`--json FILE` is written after every plan and every task, so a run stopped part-way (a GPU
machine's time limit per command) keeps what it finished; `--resume` continues it in a new
process: finished tasks and plans are kept, the rest planned and timed. It refuses a FILE made
on other code, another machine or other settings.

`--planning-memory-mib` limits what the planner's candidate copies may hold at once, as a GPU's
memory does (on CUDA the default is 90 % of the free memory): on a CPU it runs the timing in
groups that fit, each with the baseline, that a paper-size plan needs on a GPU.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from trainopt_core import measure
from trainopt_core.config import OptimizationConfig
from trainopt_core.measure.memory import resident_bytes
from trainopt_core.measure.tracker import MemoryTracker
from trainopt_core.measure.stats import paired_ratio
from trainopt_core.measure.timing import interleaved_windows
from trainopt_core.planner.result import Plan
from trainopt_core.reproduction import runner
from trainopt_core.reproduction.autoplan import plan_task
from trainopt_core.reproduction.profiles import get_profile
from trainopt_core.reproduction.records import write_record
from trainopt_core.reproduction.tasks import build_task

print = functools.partial(print, flush=True)  # noqa: A001 -- interleaved with progress on stderr
BARS = {"auto_speedup": 1.25, "half_budget_speedup": 1.0, "planning_s": 60.0}


class BenchRecord:
    """The --json file, written whole after every plan and every task (`records.write_record`: a
    run killed while writing leaves the previous version). With `resume`, an existing
    file's finished tasks and its unfinished task's finished plans are kept, but only when it was
    made on the same commit, machine and settings (`SAME`): a plan measured elsewhere would be
    timed here as if it had been planned here."""

    SAME = ("profile", "device", "hardware", "torch", "planning_memory_bytes", "windows", "steps_per_window",
            "git_commit")

    def __init__(self, path: str | None, settings: dict, header: dict, resume: bool = False):
        self.path = path
        self.data = {**header, "settings": settings, "tasks": [], "unfinished": {}, "processes": 1}
        if not (resume and path and os.path.exists(path)):
            return
        with open(path) as handle:
            earlier = json.load(handle)
        for key in self.SAME:
            if earlier.get("settings", {}).get(key) != settings[key]:
                raise SystemExit(f"--resume {path}: {key} was {earlier.get('settings', {}).get(key)!r} there and is "
                                 f"{settings[key]!r} now; run without --resume (or with another --json) to start over")
        self.data.update(tasks=earlier["tasks"], unfinished=earlier.get("unfinished", {}),
                         processes=earlier.get("processes", 1) + 1)
        print(f"resuming {path}: tasks finished {[t['task'] for t in self.data['tasks']]}, plans finished "
              + str({task: sorted(kept["plans"]) for task, kept in self.data["unfinished"].items()}))

    def finished(self, task: str) -> dict | None:
        return next((result for result in self.data["tasks"] if result["task"] == task), None)

    def unfinished(self, task: str) -> dict:
        """{"plans": {label: Plan.to_dict()}, "failed": {label: error}}: filled by `_plans`."""
        return self.data["unfinished"].setdefault(task, {"plans": {}, "failed": {}})

    def finish(self, task: str, result: dict) -> None:
        self.data["unfinished"].pop(task, None)
        self.data["tasks"].append(result)
        self.save()

    def save(self) -> None:
        if self.path:
            write_record(Path(self.path), self.data)  # atomic: a temporary file, then renamed


def _plans(bundle, prof, device, progress: bool, planning_memory_bytes: float | None = None,
           kept: dict | None = None, save=lambda: None) -> tuple[dict, dict]:
    """The plans that succeeded, and {label: error} for those that failed (a budget nothing fits,
    a GPU out of memory while the candidates are held for interleaved timing): reported, not fatal.
    `kept` ({"plans": {label: Plan.to_dict()}, "failed": {label: error}}) holds what an earlier
    process finished: reused, not planned again; each new plan is added to it, then `save()`."""
    kept = {"plans": {}, "failed": {}} if kept is None else kept
    plans, failed = {}, {}

    def attempt(label, optional=True, **kwargs):
        if label in kept["plans"]:
            plans[label] = Plan.from_dict(kept["plans"][label])
            print(f"  plan {label}: kept from the earlier process")
            return
        if label in kept["failed"]:
            failed[label] = kept["failed"][label]
            print(f"  plan {label}: FAILED in the earlier process: {failed[label]}")
            return
        try:  # as the reproduction's `auto` plans
            plans[label] = plan_task(bundle, prof, device, progress=progress,
                                     planning_memory_bytes=planning_memory_bytes, **kwargs)
            kept["plans"][label] = plans[label].to_dict()
        except (ValueError, torch.OutOfMemoryError) as err:
            if not optional:
                raise
            failed[label] = kept["failed"][label] = f"{type(err).__name__}: {str(err)[:400]}"
            print(f"  plan {label}: FAILED {failed[label]}")
        save()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    attempt("auto", optional=False)
    base_peak = plans["auto"].baseline["peak_memory_bytes"]
    attempt("auto, 50 % budget", memory_budget_bytes=0.5 * base_peak)
    attempt("(time, memory) weighted", weights=(1.0, 1.0, 0.0))
    weighted = plans.get("(time, memory) weighted")
    if weighted is None:
        return plans, failed
    peaks = {kind: [row["peak_memory_bytes"] for row in weighted.rows if row["peak_memory_bytes"] is not None
                    and (row["checkpointing"] is not None) == kind] for kind in (False, True)}
    if peaks[True] and min(peaks[True]) < min(peaks[False]):
        budget = (min(peaks[True]) + min(peaks[False])) / 2
        attempt("auto, checkpoint-only budget", memory_budget_bytes=budget)
    return plans, failed


def _engine_step(bundle, prof, cfg: OptimizationConfig, device):
    copied = dataclasses.replace(bundle, model=copy.deepcopy(bundle.model))
    engine, micro = runner.build_engine(copied, prof, cfg, device=device)
    batches = copied.train_batches(micro, seed=0)
    return engine, lambda: runner.one_optimizer_step(engine, copied, engine.model, batches)[0]


def _peak_bytes(engine, step, device) -> int:
    step()  # warm-up: optimizer state allocated
    with MemoryTracker(engine.model, engine.optimizer, device) as tracker:
        step()
    return tracker.peak_bytes


def bench_task(task: str, profile: str, device: torch.device, windows: int, steps: int, progress: bool,
               planning_memory_bytes: float | None = None, record: BenchRecord | None = None) -> dict:
    prof = get_profile(task, profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
    print(f"\n{task}: {bundle.model_name}; {bundle.data_source}; batch {prof.baseline_batch_size}")
    kept = record.unfinished(task) if record else None
    from_earlier = sorted(kept["plans"]) if kept else []
    plans, failed = _plans(bundle, prof, device, progress, planning_memory_bytes, kept=kept,
                           save=record.save if record else lambda: None)
    for label, result in plans.items():
        budget = result.memory_budget_bytes
        compiling = f", of which compiling {result.compile_s:.1f} s" if result.compile_s else ""
        print(f"  plan {label}: {result.chosen['candidate']} (planning {result.planning_s:.1f} s{compiling}, "
              f"{sum(r['speedup'] is not None for r in result.rows)} candidates timed"
              + (f", budget {budget / 2**20:.1f} MiB" if budget else "") + ")"
              + (" -- planned by the earlier process" if label in from_earlier else ""))
        if result.stage_s:
            print("    planning by stage: " + ", ".join(f"{stage} {s:.1f} s" for stage, s in result.stage_s.items()))
        for note in result.notes:
            if note.startswith("Timed in groups"):
                print(f"    {note}")
    configs = {"baseline": OptimizationConfig.baseline()}
    configs.update({label: p.config for label, p in plans.items() if label != "(time, memory) weighted"})
    steps_by_label, peaks = {}, {}
    for label, cfg in configs.items():
        others_bytes = resident_bytes(device)  # on a GPU: the engines built before this one
        engine, step = _engine_step(bundle, prof, cfg, device)
        peaks[label] = _peak_bytes(engine, step, device) - others_bytes
        steps_by_label[label] = step
    rates = interleaved_windows(steps_by_label, windows=windows, steps_per_window=steps, warmup_steps=1, device=device)
    results = {"task": task, "profile": profile, "model": bundle.model_name, "data_source": bundle.data_source,
               "windows": windows, "steps_per_window": steps, "rows": [], "failed_plans": failed,
               "plans_from_an_earlier_process": from_earlier}
    print(f"  timed interleaved: {windows} windows x {steps} optimizer steps; ratio to the baseline paired by window")
    for label, cfg in configs.items():
        ratio = paired_ratio(rates[label], rates["baseline"])
        planned = plans.get(label)
        budget = planned.memory_budget_bytes if planned else None
        row = {"configuration": label, "config": cfg.computation_fields(), "speedup": ratio["median"],
               "speedup_ci_low": ratio["ci_low"], "speedup_ci_high": ratio["ci_high"],
               "peak_memory_bytes": peaks[label], "memory_budget_bytes": budget,
               "planning_s": planned.planning_s if planned else None,
               "compile_s": planned.compile_s if planned else None,
               "planning_stage_s": dict(planned.stage_s) if planned else None,
               "chosen": planned.chosen["candidate"] if planned else "fp32, k=1"}
        results["rows"].append(row)
        fit = "" if budget is None else (" within budget" if peaks[label] <= budget else " OVER BUDGET")
        print(f"  {label:30s} {row['chosen']:45s} x{ratio['median']:.2f} [{ratio['ci_low']:.2f}, "
              f"{ratio['ci_high']:.2f}]  peak {peaks[label] / 2**20:7.1f} MiB{fit}")
    rows = {row["configuration"]: row for row in results["rows"]}
    half = rows.get("auto, 50 % budget")
    bars = [("auto >= 1.25x baseline", rows["auto"]["speedup"], BARS["auto_speedup"], ">="),
            ("50 % budget: >= 1.0x baseline", half and half["speedup"], BARS["half_budget_speedup"], ">="),
            ("planning time (s) <= 60", plans["auto"].planning_s, BARS["planning_s"], "<=")]
    if plans["auto"].compile_s:  # compile time is reported apart (its timing excludes it)
        bars.append(("  the same without compiling", plans["auto"].planning_s - plans["auto"].compile_s,
                     BARS["planning_s"], "<="))
    print("  bars:")
    for name, value, bar, op in bars:
        if value is None:
            print(f"    {name:34s} not measured: the plan failed")
            continue
        held = value >= bar if op == ">=" else value <= bar
        print(f"    {name:34s} {value:7.2f}  {'met' if held else 'NOT MET'}")
    if half is not None:
        fits = half["peak_memory_bytes"] <= half["memory_budget_bytes"]
        print(f"    {'50 % budget: within budget':34s} {'met' if fits else 'NOT MET'}")
    only = rows.get("auto, checkpoint-only budget")
    if "auto, checkpoint-only budget" in failed:
        print("    checkpoint-only budget: not measured: the plan failed")
    elif only is None:
        print("    checkpoint-only budget: no checkpointed candidate went below every plain one: not tested")
    else:
        ok = only["config"].get("checkpointing") is not None and only["peak_memory_bytes"] <= only["memory_budget_bytes"]
        print(f"    {'checkpoint-only budget: checkpoints, fits':34s} {'met' if ok else 'NOT MET'}")
    results["plans"] = {label: p.to_dict() for label, p in plans.items()}
    return results


def main(argv=None, *, description: str | None = None, bench=None, default_steps: int = 3) -> int:
    """The command line of a plan benchmark: per task `bench(task, profile, device, windows,
    steps, progress, planning_memory_bytes, record=BenchRecord)`, then the timing, with the JSON
    file written as it goes (bench_goodput.py uses it too)."""
    bench = bench or bench_task
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n")[0])
    parser.add_argument("--profile", default="quick", choices=("smoke", "quick", "paper"))
    parser.add_argument("--tasks", default="cifar10,wikitext2")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=default_steps)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--json", default=None, help="also write the measurements and plans here, after every "
                                                      "plan and every task")
    parser.add_argument("--resume", action="store_true",
                        help="continue the --json file of a run stopped part-way: its finished tasks and plans "
                             "are kept (same commit, machine and settings only)")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--planning-memory-mib", type=float, default=None,
                        help="memory the planner's candidate copies may hold at once (default: on CUDA 90 %% of "
                             "the free memory, elsewhere no limit); a small value on a CPU exercises the "
                             "grouped timing a GPU's memory forces")
    args = parser.parse_args(argv)
    if args.planning_memory_mib is not None and not args.planning_memory_mib > 0:
        parser.error(f"--planning-memory-mib {args.planning_memory_mib}: allowed a number of MiB > 0")
    if args.resume and not args.json:
        parser.error("--resume: allowed only with --json FILE (the file to continue)")
    planning_memory = None if args.planning_memory_mib is None else args.planning_memory_mib * 2**20
    warnings.simplefilter("ignore")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    manifest = measure.run_manifest(profile=args.profile, device=device)
    hardware = manifest["hardware"]
    print(f"machine: {hardware}; device {device}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    git = manifest.get("git") or {}
    settings = {"profile": args.profile, "device": str(device), "hardware": hardware, "torch": torch.__version__,
                "planning_memory_bytes": planning_memory, "windows": args.windows, "steps_per_window": args.steps,
                "git_commit": git.get("commit")}
    if args.resume and git.get("dirty"):
        print("note: the checkout has uncommitted changes; what the earlier process finished is kept on the "
              "commit alone")
    record = BenchRecord(args.json, settings, {"hardware": hardware, "device": str(device),
                                               "torch": torch.__version__, "manifest": manifest,
                                               "planning_memory_bytes": planning_memory}, resume=args.resume)
    started = time.perf_counter()
    for task in args.tasks.split(","):
        if record.finished(task):
            print(f"\n{task}: finished by the earlier process; kept from {args.json}")
            continue
        record.finish(task, bench(task, args.profile, device, args.windows, args.steps, args.progress,
                                  planning_memory, record=record))
    record.data["wall_s"] = time.perf_counter() - started  # this process's
    print(f"\nbenchmark took {record.data['wall_s']:.0f} s" + (f" in this process (process {record.data['processes']} "
                                                                 "of this run)" if record.data["processes"] > 1 else ""))
    record.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
