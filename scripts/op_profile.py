"""Where a training step's time goes, by operation category, for the baseline, the paper's
`optimized` and the `auto` a reproduction planned (the error analysis notebook's profile, with
`auto` beside it):

    python scripts/op_profile.py --out DIR [--plans reports/quick/plans] [--profile quick] [--steps 4]

`--plans` is a folder of plan records (``plan__<task>.json``, written by `./run_all.sh`); `auto`
is profiled as the configuration stored there (left out without it). The profiles are kept in
`DIR` as records with their manifest (`analysis.profile_operations`), and `DIR/op_categories.csv`
holds every row; the table printed is self time per trained item (ms) by category.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

print("[op_profile] importing torch and trainopt_core (seconds; longer on a first run) ...", file=sys.stderr,
      flush=True)  # a sign of life before the imports

import pandas as pd  # noqa: E402

from trainopt_core.config import OptimizationConfig  # noqa: E402
from trainopt_core.reporting import analysis  # noqa: E402
from trainopt_core.reproduction.autoplan import load_plan_record, plan_path  # noqa: E402
from trainopt_core.reproduction.profiles import PROFILES, TASKS  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the profiles (created)")
    parser.add_argument("--plans", type=Path, help="folder of plan records: profile their `auto` too")
    parser.add_argument("--profile", default="quick", choices=PROFILES)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps profiled, after one warm-up step")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps={args.steps} is invalid: an integer >= 1")
    missing = [str(plan_path(args.plans, task)) for task in TASKS
               if args.plans is not None and load_plan_record(args.plans, task) is None]
    if missing:
        parser.error(f"--plans: no plan record {', '.join(missing)} "
                     "(./run_all.sh writes them to reports/<profile>/plans)")
    return args


def main(argv=None) -> pd.DataFrame:
    args = parse_args(argv)
    frames = []
    for task in TASKS:
        configs: list = ["baseline", "optimized"]
        if args.plans is not None:
            configs.append(OptimizationConfig.from_dict(load_plan_record(args.plans, task)["config"]))
        for config in configs:
            name = config if isinstance(config, str) else "auto"
            print(f"[op_profile] {task} {name}: {args.steps} optimizer steps under torch.profiler ...", flush=True)
            frames.append(analysis.profile_operations(task, config, profile=args.profile, steps=args.steps,
                                                      out_dir=args.out))
    ops = pd.concat(frames, ignore_index=True)
    ops.to_csv(args.out / "op_categories.csv", index=False)
    per_item = ops.pivot_table(index=["task", "category"], columns="config", values="time_per_item_ms", sort=False)
    print(f"self time per trained item (ms), {args.profile} profile, {args.steps} steps each")
    print(per_item.round(4).to_string())
    return ops


if __name__ == "__main__":
    main()
