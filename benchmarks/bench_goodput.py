"""Benchmark: `plan(adaptive_accumulation=True)` -- k by goodput -- and the step-time model it rests on.

For each task of the profile (the quick ResNet and GPT-2 on this machine) it plans with adaptive
accumulation on one training batch of the baseline's size, as the reproduction's `auto` plans,
and prints the gradient noise scale B_simple of that batch at the initial weights (with its
95 % interval), the chosen micro-batch's and optimizer step's seconds, and the goodput table.

Goodput's samples/s term is a model: a step of k micro-batches of b samples costs
k·t_micro + t_optimizer. The benchmark checks it: the chosen candidate with k = k_min, 2·k_min
and k_max micro-batches of the same b (real training batches of k·b samples) is timed
interleaved, A, B, C, A, B, C ..., in `--windows` windows of `--steps` optimizer steps, and the
measured samples/s ratio to k_min's (paired by window: median and 95 % interval) is printed
beside the model's.

    python benchmarks/bench_goodput.py [--profile quick] [--tasks cifar10,wikitext2] [--json FILE]
"""
from __future__ import annotations

import copy
import functools
import sys

import bench_plan  # the shared command line (this folder is on sys.path when run as a script)
import torch

from trainopt_core.measure.stats import paired_ratio
from trainopt_core.measure.timing import interleaved_windows
from trainopt_core.planner.trial import Trial
from trainopt_core.planner.space import candidate_of
from trainopt_core.reproduction.autoplan import plan_task
from trainopt_core.reproduction.profiles import get_profile
from trainopt_core.reproduction.tasks import build_task

print = functools.partial(print, flush=True)  # noqa: A001 -- interleaved with progress on stderr


def optimizer_of(prof):
    def build(parameters):
        return torch.optim.AdamW(parameters, lr=prof.lr, betas=prof.betas, weight_decay=prof.weight_decay)
    return build


def checked_ks(good: dict) -> list[int]:
    """The k whose step time is checked: k_min, 2·k_min and k_max."""
    return sorted({good["k_min"], min(2 * good["k_min"], good["k_max"]), good["k_max"]})


def rates_by_k(bundle, prof, result, device, *, windows: int, steps: int, world_size: int = 1) -> dict[str, list[float]]:
    """This process's samples/s of the plan's chosen candidate with each `checked_ks` k micro-batches of its
    b, timed interleaved; on `world_size` processes each takes its k·b of a batch of world_size·k·b
    (`bundle` cut to its share) and trains data parallel."""
    good = result.goodput
    b, ks = int(good["micro_batch_size"]), checked_ks(good)
    candidate = candidate_of(result.chosen)

    def loss(model, x, y=None):
        return bundle.loss(model, x, y)

    trials = {}
    for k in ks:
        batch = tuple(t for t in next(bundle.train_batches(world_size * k * b, seed=0)) if t is not None)
        trials[k] = Trial(candidate.replace(k=k), copy.deepcopy(bundle.model).to(device), optimizer_of(prof), batch,
                          loss, device, loss_takes_model=True, world_size=world_size)
    return interleaved_windows({str(k): trials[k].step for k in ks}, windows=windows, steps_per_window=steps,
                               warmup_steps=1, device=device)


def step_time_model_checks(rates: dict[str, list[float]], good: dict, ks: list[int], *,
                           samples_per_micro_batch: int) -> list[dict]:
    """Each k's measured samples/s relative to ks[0]'s (paired by window: median and 95 % interval)
    beside the ratio goodput's step-time model predicts, and whether the interval holds it."""
    predicted = {row["k"]: row["samples_per_s"] for row in good["rows"]}
    checks = []
    for k in ks:
        ratio = paired_ratio(rates[str(k)], rates[str(ks[0])])
        model_ratio = predicted[k] / predicted[ks[0]]
        inside = ratio["ci_low"] <= model_ratio <= ratio["ci_high"] if ratio["ci_low"] is not None else None
        checks.append({"k": k, "batch": k * samples_per_micro_batch, "measured_ratio": ratio["median"],
                       "ci_low": ratio["ci_low"], "ci_high": ratio["ci_high"], "model_ratio": model_ratio,
                       "model_inside_interval": inside})
    return checks


def print_step_time_model_checks(checks: list[dict], timing: str) -> None:
    print(f"  step-time model vs measured ({timing}; ratio to k={checks[0]['k']}):")
    for check in checks:
        inside = check["model_inside_interval"]
        print(f"    k={check['k']:2d} (batch {check['batch']:4d}): measured x{check['measured_ratio']:.3f} "
              f"[{check['ci_low']:.3f}, {check['ci_high']:.3f}], model x{check['model_ratio']:.3f}"
              + ("" if inside is None else "  (inside)" if inside else "  (OUTSIDE)"))


def bench_task(task: str, profile: str, device: torch.device, windows: int, steps: int, progress: bool,
               planning_memory_bytes: float | None = None, record=None) -> dict:
    """`record` (bench_plan.BenchRecord) keeps finished tasks only: one plan per task, nothing to keep within one."""
    prof = get_profile(task, profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
    print(f"\n{task}: {bundle.model_name}; {bundle.data_source}; batch {prof.baseline_batch_size}")
    result = plan_task(bundle, prof, device, progress=progress, adaptive_accumulation=True,
                       planning_memory_bytes=planning_memory_bytes)
    good = result.goodput
    print(f"  plan: {result.chosen['candidate']} -> starting k={result.config.k}, k in [{good['k_min']}, {good['k_max']}] "
          f"(planning {result.planning_s:.1f} s)")
    print("\n".join("  " + line for line in result.explain().splitlines() if "Adaptive" in line or line.startswith("    ")))
    print(f"  {'k':>3} {'batch':>6} {'samples/s':>10} {'efficiency':>10} {'goodput vs k_min':>17}")
    for row in good["rows"]:
        print(f"  {row['k']:3d} {row['effective_batch']:6.0f} {row['samples_per_s']:10.1f} "
              f"{row['statistical_efficiency']:10.3f} {row['relative_goodput']:17.3f}")

    # the step-time model, checked: the same micro-batch b, k micro-batches per step
    b, ks = int(good["micro_batch_size"]), checked_ks(good)
    rates = rates_by_k(bundle, prof, result, device, windows=windows, steps=steps)
    checks = step_time_model_checks(rates, good, ks, samples_per_micro_batch=b)
    print_step_time_model_checks(checks, f"{windows} windows x {steps} steps, interleaved")
    return {"task": task, "profile": profile, "model": bundle.model_name, "data_source": bundle.data_source,
            "plan": result.to_dict(), "step_time_model": checks, "windows": windows, "steps_per_window": steps}


def main(argv=None) -> int:
    return bench_plan.main(argv, description=__doc__.split("\n")[0], bench=bench_task, default_steps=2)


if __name__ == "__main__":
    sys.exit(main())
