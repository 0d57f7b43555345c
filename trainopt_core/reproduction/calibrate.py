"""Targets at convergence: each task's time-to-target threshold, set from measured baseline curves.

    python -m trainopt_core.reproduction.calibrate --profile quick [--seeds 3] [--tasks cifar10,wikitext2]

Runs the baseline of each task for `--seeds` seeds under the profile, then chooses the target by
one rule and writes it, with the curves and checks it came from, to `targets.json` (package
data, read by `profiles.get_profile`). The paper profile keeps the paper's own targets.

The rule: the target is the quality of the seed-mean baseline curve at CROSSING_FRACTION (80 %)
of the run's samples, rounded towards easier (accuracy down to 0.5 %, perplexity up to a
readable step). So time-to-target measures how long the baseline takes to get close to its
plateau, not the first seconds of training. The choice is checked, and a failed check is
reported (exit status 1) rather than written silently:
- the seed-mean curve crosses within CROSSING_WINDOW (70-90 %) of the run, and every seed
  crosses before its run ends (single seeds scatter around the mean: their crossing fractions
  are in the output);
- every seed has at least MIN_EVALUATIONS_BEFORE evaluations before its crossing;
- the plateau clearly exceeds it: every seed's final evaluation beats the target, and the
  plateau (mean of the last PLATEAU_EVALUATIONS evaluations, seed mean) beats it by more than
  the seeds' standard deviation there;
- the curve flattens: the last FLAT_TAIL_FRACTION (20 %) of the run adds less than
  FLAT_TAIL_MAX_GAIN (10 %) of the whole run's improvement (perplexity on the log scale, i.e.
  in loss).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from .. import measure
from .profiles import TARGETS_FILE, load_targets  # noqa: F401  (load_targets: part of this module's API)
from .._errors import fail as _fail

CROSSING_FRACTION = 0.8
CROSSING_WINDOW = (0.7, 0.9)
MIN_EVALUATIONS_BEFORE = 8
PLATEAU_EVALUATIONS = 3
FLAT_TAIL_FRACTION = 0.2
FLAT_TAIL_MAX_GAIN = 0.10


def _round_easier(quality: float, higher_is_better: bool) -> float:
    """Accuracy down to a multiple of 0.005; perplexity up to 3 significant digits."""
    if higher_is_better:
        return math.floor(quality * 200 + 1e-9) / 200
    step = 10 ** (math.floor(math.log10(quality)) - 2)
    return round(math.ceil(quality / step - 1e-9) * step, 6)


def mean_curve(curves: list[tuple[list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray]:
    """The seed-mean of quality curves [(samples, qualities), ...]: each put on the first
    curve's evaluation points by linear interpolation, then averaged. Returns (samples, mean)."""
    grid = np.asarray(curves[0][0], dtype=float)
    return grid, np.mean([np.interp(grid, s, q) for s, q in curves], axis=0)


def choose_target(curves: list[tuple[list[float], list[float]]], *, higher_is_better: bool,
                  fraction: float = CROSSING_FRACTION) -> dict:
    """The target and its checks from baseline curves [(samples, qualities), ...], one per seed.

    The curves are put on the first curve's evaluation points (linear interpolation) and
    averaged; the target is the mean curve's quality at `fraction` of the last evaluation's
    samples, rounded towards easier."""
    if not curves:
        _fail("curves", curves, "one (samples, qualities) curve per seed, at least one")
    if not 0 < fraction < 1:
        _fail("fraction", fraction, "a number in (0, 1)")
    for samples, qualities in curves:
        if len(samples) != len(qualities) or len(samples) < PLATEAU_EVALUATIONS + 2:
            _fail("curves", f"{len(samples)} samples / {len(qualities)} qualities",
                  f"as many qualities as samples, at least {PLATEAU_EVALUATIONS + 2} evaluations")
        if not all(math.isfinite(q) for q in qualities):
            _fail("curves", qualities, "finite qualities (a diverged baseline cannot set a target)")
    grid, seed_mean = mean_curve(curves)
    total = float(grid[-1])
    target = _round_easier(float(np.interp(fraction * total, grid, seed_mean)), higher_is_better)

    seeds = []
    for samples, qualities in curves:
        crossing = measure.time_to_target(samples, qualities, target, higher_is_better)
        before = None if crossing is None else sum(1 for s in samples if s < crossing)
        seeds.append(dict(crossing_samples=crossing, crossing_fraction=None if crossing is None else crossing / samples[-1],
                          evaluations_before_crossing=before,
                          plateau=statistics.fmean(qualities[-PLATEAU_EVALUATIONS:]),
                          final=qualities[-1]))
    plateaus = [s["plateau"] for s in seeds]
    plateau = statistics.fmean(plateaus)
    spread = statistics.stdev(plateaus) if len(plateaus) > 1 else 0.0
    margin = (plateau - target) if higher_is_better else (target - plateau)
    scale = seed_mean if higher_is_better else np.log(seed_mean)
    at_tail_start = float(np.interp((1 - FLAT_TAIL_FRACTION) * total, grid, scale))
    total_gain = abs(float(scale[-1] - scale[0]))
    tail_gain = abs(float(scale[-1]) - at_tail_start) / total_gain if total_gain > 0 else math.inf
    low, high = CROSSING_WINDOW
    mean_crossing = measure.time_to_target(grid.tolist(), seed_mean.tolist(), target, higher_is_better)
    mean_fraction = None if mean_crossing is None else mean_crossing / total
    checks = {
        f"the seed-mean curve crosses within {low:.0%}-{high:.0%} of the run, every seed before its end": (
            mean_fraction is not None and low <= mean_fraction <= high
            and all(s["crossing_fraction"] is not None for s in seeds)),
        f">= {MIN_EVALUATIONS_BEFORE} evaluations before every crossing": all(
            s["evaluations_before_crossing"] is not None and s["evaluations_before_crossing"] >= MIN_EVALUATIONS_BEFORE
            for s in seeds),
        "every seed ends beyond the target, the plateau by > its seed spread": margin > max(spread, 0.0) and all(
            (s["final"] > target) if higher_is_better else (s["final"] < target) for s in seeds),
        f"the last {FLAT_TAIL_FRACTION:.0%} of the run adds < {FLAT_TAIL_MAX_GAIN:.0%} of its improvement":
            tail_gain < FLAT_TAIL_MAX_GAIN,
    }
    return dict(target=target, higher_is_better=higher_is_better, rule=f"seed-mean baseline quality at "
                f"{fraction:.0%} of the run, rounded towards easier", plateau=plateau, plateau_seed_std=spread,
                plateau_margin=margin, tail_gain_fraction=tail_gain, mean_crossing_fraction=mean_fraction, seeds=seeds, checks=checks, ok=all(checks.values()),
                mean_curve=dict(samples=grid.tolist(), quality=seed_mean.tolist()))


def calibrate(profile: str, tasks: list[str], seeds: int, *, out_dir: Path, data_policy: str = "auto",
              progress: bool = True) -> dict:
    """Runs the baselines and returns {task: choose_target(...) + the runs' provenance}."""
    from .profiles import get_profile
    from .runner import run

    results = {}
    for task in tasks:
        prof = get_profile(task, profile)
        records = [run(task, "baseline", profile=profile, seed=seed, out_dir=out_dir, data_policy=data_policy,
                       progress=progress) for seed in range(seeds)]
        curves = [([h["samples"] for h in r["history"]], [h["quality"] for h in r["history"]]) for r in records]
        result = choose_target(curves, higher_is_better=prof.higher_is_better)
        result.update(quality=prof.quality_name, seeds_run=list(range(seeds)), data_source=records[0]["data_source"],
                      hardware=records[0]["conditions"]["hardware"], profile_target_when_run=prof.target)
        results[task] = result
    return results


def main(argv=None) -> int:
    from .profiles import PROFILES, TASKS

    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reproduction.calibrate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="quick", choices=[p for p in PROFILES if p != "paper"])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated subset of " + ",".join(TASKS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--data-policy", default="auto", choices=("auto", "real", "standin"))
    parser.add_argument("--runs-dir", default=None, help="where the baseline records go "
                        "(default reports/<profile>/calibration/runs)")
    parser.add_argument("--out", default=str(TARGETS_FILE), help="the targets file to update")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    for task in tasks:
        if task not in TASKS:
            parser.error(f"--tasks: {task!r} is not one of {TASKS}")
    if args.seeds < 2:
        parser.error(f"--seeds {args.seeds}: at least 2 (the plateau check needs a seed spread)")
    runs_dir = Path(args.runs_dir or f"reports/{args.profile}/calibration/runs")
    results = calibrate(args.profile, tasks, args.seeds, out_dir=runs_dir, data_policy=args.data_policy,
                        progress=not args.no_progress)
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    data.setdefault(args.profile, {}).update(results)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    failed = 0
    for task, result in results.items():
        print(f"{args.profile}/{task}: target {result['quality']} {result['target']} "
              f"(plateau {result['plateau']:.4g} ± {result['plateau_seed_std']:.2g})")
        for check, passed in result["checks"].items():
            print(f"  [{'ok' if passed else 'FAILED'}] {check}")
            failed += not passed
    print(f"written to {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
