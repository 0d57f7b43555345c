"""Command line: one training run -> one JSON run record.

    python -m trainopt_core.reproduction --task cifar10 --config optimized --profile quick --seed 0 --out reports/quick/runs

Under `python -m trainopt_core.distributed --nproc N -- ...` every rank runs this; rank 0 writes the record.
"""
from __future__ import annotations

import argparse
import json
import sys

from torch.distributed.elastic.multiprocessing.errors import record as record_errors

from ..config import OptimizationConfig
from .profiles import PROFILES, TASKS


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


@record_errors
def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
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
