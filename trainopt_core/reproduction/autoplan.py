"""The reproduction's `auto` configuration: planned by `trainopt_core.plan()` on the machine that runs it.

`auto` keeps the paper's learning-rate schedule and clipping (the `optimized` preset's) and takes
everything that decides speed and memory -- precision, micro-batch split, checkpointing and its
policy, the optimizer's kernels, the memory format, compile -- from a plan measured on one
training batch of the task, without a memory budget and with time as eq. 3's only weight. The
plan is stored as a record beside the runs (`<reports>/<profile>/plans/plan__<task>.json`) and
reused only under the same conditions (hardware, device, data, torch, profile settings), like
every other record; each `auto` run record carries the plan it ran.

The plan comes from timing, so on another machine -- or on this one in another reproduction --
it may choose differently; the record says what it chose and why (`Plan.explain()`).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from .. import measure
from ..config import OptimizationConfig
from ..planner import Plan, plan
from .profiles import TaskProfile
from .records import RECORD_SCHEMA, condition_differences, load_record, run_conditions, write_record

AUTO = "auto"
PLAN_KIND = "plan"
# what the paper's recipe contributes to `auto`: its schedule and clipping, which decide quality, not speed
SCHEDULE_FIELDS = ("schedule", "warmup_fraction", "min_lr_ratio", "lr_scaling", "clip_norm")


def plan_path(plans_dir: str | os.PathLike, task: str) -> Path:
    return Path(plans_dir) / f"plan__{task}.json"


def auto_from_plan(planned: OptimizationConfig) -> OptimizationConfig:
    """The planned configuration with the `optimized` preset's schedule and clipping."""
    optimized = OptimizationConfig.optimized()
    return planned.replace(name=AUTO, **{name: getattr(optimized, name) for name in SCHEDULE_FIELDS})


def planned_record(task: str, prof: TaskProfile, device: torch.device, *, plans_dir: str | os.PathLike,
                   data_policy: str = "auto", data_dir=None, rerun: bool = False, progress: bool = False) -> dict:
    """The plan record for `task` on this machine: reused when made under the same conditions,
    else measured (about a minute on a 2-core CPU for the quick models) and written."""
    from .tasks import build_task

    torch.manual_seed(0)
    bundle = build_task(prof, data_policy=data_policy, data_dir=data_dir, device=device, seed=0)
    conditions = run_conditions(device=device, backend="torch", world_size=1, data_source=bundle.data_source,
                                data_policy=data_policy, profile_settings=prof.to_dict())
    path = plan_path(plans_dir, task)
    existing = None if rerun else load_record(path)
    if existing is not None and existing.get("kind") == PLAN_KIND and not condition_differences(existing, conditions):
        return existing
    batch = tuple(t for t in next(bundle.train_batches(prof.baseline_batch_size, seed=0)) if t is not None)

    def optimizer(parameters):
        return torch.optim.AdamW(parameters, lr=prof.lr, betas=prof.betas, weight_decay=prof.weight_decay)

    def loss(model, x, y=None):
        return bundle.loss(model, x, y)

    result = plan(copy.deepcopy(bundle.model).to(device), optimizer, batch, loss, loss_takes_model=True,
                  device=device, progress=progress)
    record = dict(schema=RECORD_SCHEMA, status="complete", kind=PLAN_KIND, task=task, profile=prof.profile,
                  conditions=conditions, plan=result.to_dict(), explanation=result.explain(),
                  manifest=measure.run_manifest(profile=prof.profile, device=device))
    write_record(path, record)
    return record


def auto_config(task: str, prof: TaskProfile, device: torch.device, *, plans_dir: str | os.PathLike,
                **options) -> tuple[OptimizationConfig, dict]:
    """(`auto` for `task` on this machine, its plan record)."""
    record = planned_record(task, prof, device, plans_dir=plans_dir, **options)
    return auto_from_plan(Plan.from_dict(record["plan"]).config), record
