"""The run record on disk (SPEC §6): one JSON file per (task, configuration, profile, seed).

The file name carries the configuration hash and the seed. A record is written atomically and
marked complete, so a reader sees either nothing, an older record, or the finished one -- never
a partial run that looks complete.

A record is reused only under the conditions it was made in (`run_conditions`): the same kind of
machine (`measure.hardware_fingerprint`), device type, backend, world size, data source and data
policy, torch version, profile settings and, for GPT-2, the model's implementation. Anything else is measured again, so a reproduction
on another machine measures that machine.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from ..config import OptimizationConfig, computation_part
from ..measure import hardware_fingerprint, run_manifest
from ..measure.allocator import host_allocator
from .gpt2 import MODEL_VERSION as GPT2_MODEL_VERSION

RECORD_SCHEMA = 2  # 2: conditions, samples/steps to target, wall-clock time to target kept beside


def file_stem(config_name: str) -> str:
    """A configuration's name as it appears in file names ("+zero2" -> "plus_zero2")."""
    return config_name.replace('+', 'plus_').replace('-', 'minus_').replace(' ', '_')


def record_path(out_dir: Path, task: str, cfg: OptimizationConfig, profile: str, seed: int) -> Path:
    return Path(out_dir) / f"{task}__{file_stem(cfg.name)}__{profile}__{cfg.config_hash()}__seed{seed}.json"


def load_record(path: Path) -> dict | None:
    """A finished record, or None (missing, unreadable, or not marked complete)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if record.get("status") != "complete" or record.get("schema") != RECORD_SCHEMA:
        return None
    return record


def run_conditions(*, device: torch.device | str, backend: str, world_size: int, data_source: str,
                   data_policy: str, profile_settings: dict) -> dict:
    """The conditions a measurement holds for; a record is reused only when they are equal. A
    GPT-2 task's conditions name its model's implementation (`model_version`), so a record made
    with another one (transformers' GPT2LMHeadModel before it) is measured again."""
    device = torch.device(device)
    conditions = dict(hardware=hardware_fingerprint(device), device_type=device.type, backend=backend,
                      world_size=world_size, data_source=data_source, data_policy=data_policy,
                      torch=torch.__version__, host_allocator=host_allocator(), profile_settings=profile_settings)
    version = model_version(profile_settings.get("task"))
    if version is not None:  # the ResNet's records keep their conditions
        conditions["model_version"] = version
    return as_json(conditions)


def model_version(task: str | None) -> str | None:
    """The implementation of `task`'s model where more than one has run it (GPT-2), else None."""
    return GPT2_MODEL_VERSION if task == "wikitext2" else None


# Profile settings no measurement reads: how often a run checkpoints itself changes nothing it records.
NEVER_COMPARED_SETTINGS = ("checkpoint_every_minutes",)


def condition_differences(record: dict, conditions: dict, *, ignore_settings=()) -> list[str]:
    """The conditions under which `record` was made that differ from `conditions` (empty: reusable).

    `ignore_settings`: profile settings that cannot change what the record measured (a training
    run does not read the throughput timing's window counts), left out of the comparison."""
    made = dict(record.get("conditions") or {})
    conditions = dict(conditions)
    ignore_settings = set(ignore_settings) | set(NEVER_COMPARED_SETTINGS)
    for side in (made, conditions):
        if isinstance(side.get("profile_settings"), dict):
            side["profile_settings"] = {k: v for k, v in side["profile_settings"].items() if k not in ignore_settings}
    return [key for key in sorted(set(made) | set(conditions)) if made.get(key) != conditions.get(key)]


def computation_hash(cfg: OptimizationConfig, *, world_size: int, backend: str) -> str:
    """What the run computes, independent of the configuration's name: ZeRO partitions nothing
    on one process with the torch engine, so there a configuration and its ZeRO-0 twin train
    bit-identically (same losses, same memory) and one run serves both."""
    fields = cfg.computation_fields()
    fields.pop("name")
    if world_size == 1 and backend == "torch":
        fields["zero_stage"] = 0
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def same_computation_notes(own_notes, measured: dict, *, zero_stage: int, measured_zero_stage: int,
                           source: str) -> list[str]:
    """The notes of a result borrowed from the measurement of another configuration that computes
    the same (`computation_hash`): `own_notes` the measurement lacks, its notes, then why the two
    are one (`source`, e.g. "timed as '+zero2'", names the measurement)."""
    why = (f"on one process with the torch engine ZeRO-{zero_stage} partitions nothing, so both compute exactly the same"
           if zero_stage != measured_zero_stage else "the same computation under another name")
    return [*[n for n in own_notes if n not in measured["notes"]], *measured["notes"], f"{source}: {why}"]


def quality_hash(cfg: OptimizationConfig, *, world_size: int, backend: str, device_type: str) -> str | None:
    """What a run's quality curve depends on: its computation (`computation_hash`) without its
    activation checkpointing. Checkpointing recomputes the same values in backward (dropout
    replays its RNG, BatchNorm statistics are kept across the recompute), so on the CPU, one
    process and the torch engine a configuration and its checkpointing twin train bit-identically
    and differ only in memory and speed; tests/test_runner.py checks it. None where that
    is not established: CUDA kernels need not be deterministic, and several processes or
    DeepSpeed reduce and partition in their own order."""
    if device_type != "cpu" or world_size != 1 or backend != "torch":
        return None
    return computation_hash(cfg.replace(checkpointing=None, checkpoint_policy="full"), world_size=world_size, backend=backend)


def kept_record(path: Path, *, kind: str, settings: dict, conditions: dict, ignore_settings=()) -> dict | None:
    """The finished measurement of `kind` at `path` when it was made with `settings` under
    `conditions` (`condition_differences`), else None: what a timing kept beside the runs is
    reused by."""
    record = load_record(path)
    if (record is None or record.get("kind") != kind or record.get("settings") != as_json(settings)
            or condition_differences(record, conditions, ignore_settings=ignore_settings)):
        return None
    return record


def keep_record(path: Path, *, kind: str, settings: dict, conditions: dict, profile: str, device, **fields) -> None:
    """Write a finished measurement of `kind` (`fields`: what it measured) with its settings,
    conditions and manifest, for `kept_record` to find."""
    write_record(path, dict(schema=RECORD_SCHEMA, status="complete", kind=kind, profile=profile, settings=settings,
                            conditions=conditions, **fields, manifest=run_manifest(profile=profile, device=device)))


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial.json")
    tmp.write_text(json.dumps(record, indent=1, default=_json_default))
    os.replace(tmp, path)  # atomic: readers see the old state or the finished record


def as_json(value):
    """`value` as it reads back from a record (tuples become lists)."""
    return json.loads(json.dumps(value, default=_json_default))


def _json_default(value):
    if isinstance(value, (torch.Tensor,)):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value)}")


# ------------------------------------------------------------------ what a seed determines
DETERMINISTIC_METRICS = ("final_quality", "peak_memory_bytes", "memory_breakdown_bytes", "optimizer_steps", "skipped_steps",
           "flops_per_item", "target")
DETERMINISTIC_HISTORY = ("samples", "step", "quality", "train_loss", "lr", "k", "loss_scale", "effective_batch_size", "b_simple")
DETERMINISTIC_STEPS = ("step", "loss", "lr", "k", "effective_batch_size", "loss_scale", "skipped_steps", "grad_norm", "sigma_sq",
         "grad_sq", "b_simple", "samples_consumed")
IDENTITY_FIELDS = ("task", "config_name", "config", "config_hash", "profile", "seed", "data_source", "model_name",
            "num_parameters", "micro_batch_size", "world_size", "status")


def deterministic_fields(record: dict) -> dict:
    """What a seed determines in a run record, flattened to {field: value}: identity, the
    deterministic metrics (quality, memory, steps), every evaluation and every optimizer step
    without its clock readings. Equal on one machine for the same code path and data order."""
    identity = {key: record.get(key) for key in IDENTITY_FIELDS}
    if isinstance(identity["config"], dict):  # guards decide only whether a run may go on; fields
        # added later, at their defaults, compute what records made before they existed computed
        identity["config"] = computation_part(identity["config"])
    return {
        **identity,
        **{f"metrics.{key}": record["metrics"].get(key) for key in DETERMINISTIC_METRICS},
        **{f"history[{i}].{key}": entry.get(key) for i, entry in enumerate(record["history"]) for key in DETERMINISTIC_HISTORY},
        "history.length": len(record["history"]),
        **{f"steps[{i}].{key}": entry.get(key) for i, entry in enumerate(record["steps"]) for key in DETERMINISTIC_STEPS},
        "steps.length": len(record["steps"]),
    }


def record_differences(reference: dict, other: dict) -> list[str]:
    """Every deterministic field (`deterministic_fields`) in which `other` differs from `reference`."""
    ref, new = deterministic_fields(reference), deterministic_fields(other)
    return [f"{key}: {ref.get(key)!r} != {new.get(key)!r}" for key in sorted(set(ref) | set(new))
            if ref.get(key) != new.get(key)]
