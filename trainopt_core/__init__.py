"""trainopt_core: the training-compute optimizations of paper §III for an existing PyTorch loop.

    from trainopt_core import OptimizationConfig, prepare
    engine = prepare(model, optimizer, OptimizationConfig.optimized(),
                     total_samples=..., micro_batch_size=...)

The thin library (needs only torch) is what sits at this level:

    config.py         OptimizationConfig: one validated configuration, presets, ablation ladder
    compose.py        prepare(): the components composed around a user's model and optimizer
    engine.py         TrainingEngine: backward / step / autocast of the torch-native engine
    accumulation.py   variance-aware gradient accumulation (eqs. 4-9)
    schedule.py       warmup + cosine LR, linear batch scaling, clipping (eqs. 10-12)
    precision.py      mixed precision with dynamic loss scaling (eqs. 13-17)
    checkpointing.py  √L activation checkpointing (eqs. 18-20), full or selective
    planner/          plan(): the configuration chosen by measured cost on this machine (eq. 3)
    distributed/      process groups, DeepSpeed ZeRO engine, launch CLI, run_processes
    measure/          throughput, peak memory, energy, FLOPs utilization, time-to-target, eq. 3
    rng.py            rng_state() / set_rng_state(): every random generator, for an exact resume

Beside it, not imported by it (install `trainopt[reproduction]`):

    reproduction/     the paper's experiments: data, models, tasks, profiles, runner, probes
    reporting/        run records -> tables, figures, error analysis, explorer, notebooks
"""
from . import distributed, measure
from .checkpointing import apply_activation_checkpointing, remove_activation_checkpointing
from .compose import prepare
from .config import ABLATION_LADDER, OptimizationConfig, leave_one_out
from .engine import TrainingEngine
from .planner import Plan, plan
from .rng import rng_state, set_rng_state

__version__ = "0.1.0"

__all__ = [
    "ABLATION_LADDER",
    "OptimizationConfig",
    "Plan",
    "TrainingEngine",
    "apply_activation_checkpointing",
    "distributed",
    "leave_one_out",
    "measure",
    "plan",
    "prepare",
    "remove_activation_checkpointing",
    "rng_state",
    "set_rng_state",
]
