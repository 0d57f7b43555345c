"""Command line: one training run -> one JSON run record; or the reproduction's grid of runs as
one command per run (for a job array of any scheduler).

    python -m trainopt_core.reproduction --task cifar10 --config optimized --profile quick --seed 0 --out reports/quick/runs
    python -m trainopt_core.reproduction list --profile paper --seeds 3 [--out DIR] [--tasks ...] [--configs ...]

Under `python -m trainopt_core.distributed --nproc N -- ...` every rank runs this; rank 0 writes the record.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record as record_errors

from ..config import OptimizationConfig
from .profiles import PROFILES, TASKS, get_profile, table_configs

# the largest seed a run takes: 32 bits, as most seeding APIs take (numpy's among them)
MAX_SEED = 2**32 - 1


def _unwritable(folder: str) -> str | None:
    """Why runs cannot write into `folder` (created where it is missing), or None where they can."""
    path = Path(folder).expanduser()
    if path.exists():
        if not path.is_dir():
            return "it is a file, not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else "it is not writable"
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        return f"{parent} is a file, not a folder"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"it cannot be created in {parent} (not writable)"


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reproduction", description=__doc__.split("\n")[0])
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--config", required=True,
                        help="baseline | optimized | auto (planned on this machine by trainopt_core.plan(); the plan is kept "
                             "in <out>/../plans) | an ablation step (+accumulation, ...) | a leave-one-out step (-checkpointing, ...)")
    parser.add_argument("--profile", default="quick", choices=PROFILES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for run records (default reports/<profile>/runs)")
    parser.add_argument("--data-policy", default="auto", choices=("auto", "real", "standin"))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    parser.add_argument("--backend", default="torch", choices=("torch", "deepspeed"))
    parser.add_argument("--rerun", action="store_true", help="run even if a complete record exists")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed {args.seed} is invalid: allowed an integer >= 0, at most {MAX_SEED} (2**32 - 1)")
    for flag, folder in (("--out", args.out), ("--data-dir", args.data_dir)):
        if folder is not None and not folder.strip():
            parser.error(f"{flag} {folder!r} is invalid: allowed a folder (empty would "
                         f"{'write into' if flag == '--out' else 'read the data from'} the current one; leave the flag "
                         "out for the default)")
        why = folder is not None and _unwritable(folder)
        if why:
            parser.error(f"{flag} {folder!r} is invalid: {why}; allowed a folder this user can create or write")
    if args.device is not None:
        import torch

        try:
            device = torch.device(args.device)
        except RuntimeError:
            parser.error(f"--device {args.device!r} is invalid: allowed cpu, cuda or cuda:N")
        if device.type not in ("cpu", "cuda"):
            parser.error(f"--device {args.device!r} is invalid: allowed cpu, cuda or cuda:N")
        if device.type == "cuda" and not torch.cuda.is_available():
            parser.error(f"--device {args.device!r} is invalid here: no CUDA GPU (torch.cuda.is_available() is False); "
                         "allowed cpu")
    if args.config != "auto":
        try:
            OptimizationConfig.preset(args.config)
        except ValueError as err:
            parser.error(f"{err} (or 'auto': planned on this machine)")
    return args


def grid_commands(profile: str, seeds: int, *, out: str | None = None, tasks=TASKS, configs=None,
                  data_policy: str = "auto") -> list[str]:
    """One shell command per run of Tables I-III (task x configuration x seed), each writing its
    record into `out` (default reports/<profile>/runs), where the notebooks find and reuse it.
    A task's `auto` runs are listed first, seed 0 leading: the first plans the task on its machine
    and keeps the plan beside the records, so the others (and the notebooks) reuse it."""
    import shlex

    configs = list(configs or table_configs())
    order = sorted(configs, key=lambda c: c != "auto")  # auto first: its plan is made once
    out = out or f"reports/{profile}/runs"
    return [" ".join(["python -m trainopt_core.reproduction", "--task", task, "--config", shlex.quote(config),
                      "--profile", profile, "--seed", str(seed), "--out", shlex.quote(out),
                      "--data-policy", data_policy, "--no-progress"])
            for task in tasks for config in order for seed in range(seeds)]


def _list(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reproduction list",
                                     description="Print the grid of runs of Tables I-III, one command per line.")
    parser.add_argument("--profile", default="quick", choices=PROFILES)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--out", default=None, help="directory for run records (default reports/<profile>/runs)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--configs", nargs="+", default=None,
                        help="configurations (default: the tables' 13: " + " ".join(table_configs()) + ")")
    parser.add_argument("--data-policy", default="auto", choices=("auto", "real", "standin"))
    args = parser.parse_args(argv)
    if not 1 <= args.seeds <= MAX_SEED + 1:
        parser.error(f"--seeds {args.seeds} is invalid: allowed an integer >= 1, at most {MAX_SEED + 1}")
    if args.out is not None and not args.out.strip():
        parser.error(f"--out {args.out!r} is invalid: allowed a folder (or leave the flag out for the default)")
    for config in args.configs or ():
        if config != "auto":
            try:
                OptimizationConfig.preset(config)
            except ValueError as err:
                parser.error(f"--configs: {err} (or 'auto')")
    for task in args.tasks:  # on stderr: stdout stays one command per line, for a shell or a scheduler
        print(f"# {task}, profile {args.profile}: each run trains {get_profile(task, args.profile).run_length()}",
              file=sys.stderr)
    print("\n".join(grid_commands(args.profile, args.seeds, out=args.out, tasks=args.tasks, configs=args.configs,
                                  data_policy=args.data_policy)))
    return 0


@record_errors
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["list"]:
        return _list(argv[1:])
    args = _parse(argv)
    if os.environ.get("RANK", "0") == "0":  # a sign of life before the data and model load (and a plan is made)
        print(f"[trainopt] {args.task} {args.config}, seed {args.seed}, profile {args.profile}: loading the data and "
              f"the model{'; planning first' if args.config == 'auto' else ''}", file=sys.stderr, flush=True)
    from ..distributed import cleanup, init_distributed
    from .runner import run

    info = init_distributed()
    try:
        record = run(
            args.task, args.config, profile=args.profile, seed=args.seed,
            out_dir=args.out or f"reports/{args.profile}/runs",
            data_policy=args.data_policy, data_dir=args.data_dir,
            device=args.device or (str(info.device) if info.is_distributed else None),
            backend=args.backend, rerun=args.rerun, progress=not args.no_progress,
        )
    finally:
        cleanup()
    if info.is_main_process:
        summary = {k: record["metrics"][k] for k in ("throughput", "throughput_unit", "peak_memory_bytes",
                                                     "samples_to_target", "time_to_target_wall_s", "final_quality",
                                                     "quality_name")}
        print(json.dumps(dict(task=record["task"], config=record["config_name"], seed=record["seed"],
                              data_source=record["data_source"], **summary), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
