"""Data-parallel training: process groups, DeepSpeed ZeRO behind the engine interface, launchers.

- `init_distributed()` joins the job's process group from the launcher's environment (torchrun,
  the DeepSpeed launcher or `run_processes`), with a bounded collective timeout.
- `run_processes(fn, nproc)` runs N local ranks from a notebook or a test; a failing rank ends
  the job with its traceback instead of a hang.
- `python -m trainopt_core.distributed --nproc N -- ...` (`launch`) wraps torchrun / DeepSpeed.
- `DeepSpeedTrainingEngine` is what `prepare(..., backend="deepspeed")` returns (ZeRO-0/1/2);
  DeepSpeed itself is imported only when such an engine is built.
- `ds_config`: the DeepSpeed config an `OptimizationConfig` becomes (`deepspeed_config`), with
  ZeRO buckets sized to the model, and what a ZeRO stage partitions (`zero_partitioning`).
"""
from .ds_config import deepspeed_config, zero_partitioning
from .deepspeed_engine import DeepSpeedTrainingEngine
from .launch import build_launch_command, launch_env
from .process_group import (
    ALLOWED_BACKENDS, DistInfo, all_gather_object, available_cpu_cores, barrier, cleanup, default_backend,
    default_threads_per_process, find_free_port, init_distributed, is_main_process,
)
from .spawn import LaunchError, LaunchTimeoutError, RankFailedError, run_processes

__all__ = [
    "ALLOWED_BACKENDS", "DeepSpeedTrainingEngine", "DistInfo", "LaunchError", "LaunchTimeoutError",
    "RankFailedError", "all_gather_object", "available_cpu_cores", "barrier", "build_launch_command", "cleanup",
    "deepspeed_config", "default_backend", "default_threads_per_process", "find_free_port", "init_distributed",
    "is_main_process", "launch_env", "run_processes", "zero_partitioning",
]
