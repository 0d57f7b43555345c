"""The reproduction's `auto` configuration: planned by `trainopt_core.plan()` on the machine that runs it.

`auto` is the baseline's training computed the fastest way this machine allows: `plan(base=<the
baseline's configuration>)` applied as a user's script would apply it. The baseline's LR, schedule,
clipping and effective batch stay; the plan chooses only how a step is computed -- precision,
micro-batch split, checkpointing and its policy, the optimizer's kernels, the memory format,
compile -- measured on one training batch of the task (the baseline's batch), without a memory
budget and with time as eq. 3's only weight. Its quality is then the baseline's within the seeds'
noise and its time to target is its speed; the paper's recipe is what `optimized` measures. The
plan is stored as a record beside the runs (``<reports>/<profile>/plans/plan__<task>.json``) and
reused only under the same conditions (hardware, device, data, torch, profile settings) and the
same planning rule (`PLAN_RULE`), like every other record; each `auto` run record carries the
plan it ran.

The plan comes from timing, so on another machine it may choose differently; within one machine
it decides nothing inside the timing noise (`planner.choice`: a candidate replaces the baseline
only where its whole interval is faster, a tie is decided by one rule); the record says what it
chose and why (`Plan.explain()`).
"""
from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import torch

from .. import measure
from ..config import OptimizationConfig
from ..planner import Plan, plan
from .profiles import TaskProfile
from .progress import minutes, prints_as_progress, say, step
from .records import RECORD_SCHEMA, condition_differences, load_record, run_conditions, write_record

AUTO = "auto"
PLAN_KIND = "plan"
# what `auto` keeps of the baseline: its schedule and clipping, which decide quality, not speed
SCHEDULE_FIELDS = ("schedule", "warmup_fraction", "min_lr_ratio", "lr_scaling", "clip_norm")
# the rule `auto`'s plans are made by; a stored plan made by another is made again. 4: as 3, and a
# candidate measured only where the race keeps its last rounds (`planner.search.race_reserve_s`);
# 3: the candidates raced in paired rounds, the baseline replaced only beyond the noise and the
# kind's margin (`planner.choice.TIE_MARGIN`); 2: plan(base=the baseline), nothing decided inside
# the timing noise; 1: the optimized schedule on the point-best
PLAN_RULE = 4
# `auto` in one sentence, beside every `auto` column (README, reports, notebooks, explorer)
AUTO_SENTENCE = ("`auto` trains the baseline's training -- its LR, schedule, clipping and effective batch -- computed "
                 "the fastest way `plan()` found on this machine (precision, micro-batch split, checkpointing, speed "
                 "options): its quality is the baseline's within the seeds' noise and its time to target is its speed.")


def plans_dir_for(out_dir: str | os.PathLike) -> Path:
    """Where the plans of the reproduction writing into `out_dir` (``reports/<profile>/runs`` or
    ``.../timing``) are kept: ``reports/<profile>/plans``."""
    return Path(out_dir).parent / "plans"


def plan_path(plans_dir: str | os.PathLike, task: str) -> Path:
    return Path(plans_dir) / f"plan__{task}.json"


def load_plan_record(plans_dir: str | os.PathLike, task: str) -> dict | None:
    """The stored plan record of `task`, or None."""
    record = load_record(plan_path(plans_dir, task))
    return record if record is not None and record.get("kind") == PLAN_KIND else None


def auto_from_plan(planned: OptimizationConfig) -> OptimizationConfig:
    """The planned configuration (the baseline with what the plan chose) with the baseline's
    schedule and clipping, named `auto`."""
    baseline = OptimizationConfig.baseline()
    return planned.replace(name=AUTO, **{name: getattr(baseline, name) for name in SCHEDULE_FIELDS})


def plan_task(bundle, prof: TaskProfile, device: torch.device, *, progress: bool = False, **plan_options) -> Plan:
    """`plan(base=<the baseline's configuration>)` on the task's model (a copy), the profile's
    AdamW and one training batch of the baseline's size: the way the reproduction trains it, over
    as many samples as its runs train on (a compiled candidate's compile time is spread over
    those), within the profile's planning time budget (`TaskProfile.plan_time_budget_s`)."""
    batch = tuple(t for t in next(bundle.train_batches(prof.baseline_batch_size, seed=0)) if t is not None)

    def optimizer(parameters):
        return torch.optim.AdamW(parameters, lr=prof.lr, betas=prof.betas, weight_decay=prof.weight_decay)

    def loss(model, x, y=None):
        return bundle.loss(model, x, y)

    # as runner.run trains, or the run the profile plans for (the gpu profile: the paper's)
    plan_options.setdefault("run_samples", prof.plan_run_samples or bundle.run_samples(prof.epochs))
    plan_options.setdefault("time_budget_s", prof.plan_time_budget_s)
    plan_options.setdefault("base", OptimizationConfig.baseline())
    return plan(copy.deepcopy(bundle.model).to(device), optimizer, batch, loss, loss_takes_model=True,
                device=device, progress=progress, **plan_options)


def planned_record(task: str, prof: TaskProfile, device: torch.device, *, plans_dir: str | os.PathLike,
                   data_policy: str = "auto", data_dir=None, rerun: bool = False, progress: bool = True) -> dict:
    """The plan record for `task` on this machine: reused when made under the same conditions,
    else measured (minutes on a 2-core CPU for the quick models) and written. `progress`: plan()'s
    stage lines, said as progress lines (`reproduction.progress`); planning says when it starts
    and ends, and a heartbeat at least every `progress.HEARTBEAT_S` seconds either way."""
    from .tasks import build_task

    torch.manual_seed(0)
    bundle = build_task(prof, data_policy=data_policy, data_dir=data_dir, device=device, seed=0)
    conditions = run_conditions(device=device, backend="torch", world_size=1, data_source=bundle.data_source,
                                data_policy=data_policy, profile_settings=prof.to_dict())
    existing = None if rerun else load_plan_record(plans_dir, task)
    if (existing is not None and not condition_differences(existing, conditions)
            and existing.get("plan_rule") == PLAN_RULE):
        if not existing["plan"].get("fell_back"):
            return existing
        say(f"planning {task} again: the stored plan fell back (its time budget timed nothing but the baseline), "
            "so it compared nothing and is not reused")
    start = time.perf_counter()
    say(f"planning {task} for `auto` on this machine (kept in {plan_path('plans', task).as_posix()}) ...")
    with step(f"planning {task}"), prints_as_progress():
        result = plan_task(bundle, prof, device, progress=progress)
    say(f"planning {task}: chose {result.chosen['candidate']} in {minutes(time.perf_counter() - start)}")
    record = dict(schema=RECORD_SCHEMA, status="complete", kind=PLAN_KIND, task=task, profile=prof.profile,
                  plan_rule=PLAN_RULE, conditions=conditions, data_source=bundle.data_source, model_name=bundle.model_name,
                  config=auto_from_plan(result.config).to_dict(), plan=result.to_dict(), explanation=result.explain(),
                  manifest=measure.run_manifest(profile=prof.profile, device=device))
    write_record(plan_path(plans_dir, task), record)
    return record


def auto_config(task: str, prof: TaskProfile, device: torch.device, *, plans_dir: str | os.PathLike,
                **options) -> tuple[OptimizationConfig, dict]:
    """(`auto` for `task` on this machine, its plan record)."""
    record = planned_record(task, prof, device, plans_dir=plans_dir, **options)
    return OptimizationConfig.from_dict(record["config"]), record


def plan_summary(record: dict) -> dict:
    """What an `auto` run record keeps of its plan: the whole plan and where it came from."""
    return dict(record["plan"], path=plan_path("plans", record["task"]).as_posix(), plan_rule=record.get("plan_rule"),
                explanation=record["explanation"], manifest=record["manifest"])


def baselines_training(records: list[dict]) -> bool:
    """Whether every `auto` run among `records` trained the baseline's training (a plan made by
    `PLAN_RULE` 2 or later: `AUTO_SENTENCE` is true of them); False where none ran."""
    auto = [r for r in records if r.get("config_name") == AUTO]
    return bool(auto) and all(((r.get("plan") or {}).get("plan_rule") or 1) >= 2 for r in auto)


def plan_of(record: dict) -> Plan:
    """The `Plan` of a plan record or of an `auto` run record."""
    return Plan.from_dict(record["plan"])


__all__ = ["AUTO", "AUTO_SENTENCE", "PLAN_RULE", "auto_config", "baselines_training", "auto_from_plan", "load_plan_record", "plan_of", "plan_path", "plan_task",
           "planned_record", "plans_dir_for"]
