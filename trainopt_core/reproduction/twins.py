"""Runs that are not trained again (`runner.run`).

A ZeRO rung on one process computes exactly what its ZeRO-0 twin did (`records.computation_hash`),
so it takes the twin's whole record (`as_twin_of`). On the CPU, a configuration that differs from
a finished one only by activation checkpointing trains bit-identically to it
(`records.quality_hash`), so it takes that run's quality curve and measures only its own memory
and speed, in its first optimizer steps (`with_quality_of`). `finished_twin` finds such a run.
"""
from __future__ import annotations

from pathlib import Path

from ..config import OptimizationConfig
from .profiles import TIMING_ONLY_SETTINGS
from .records import condition_differences, load_record, quality_hash, same_computation_notes

# Where a checkpointed configuration's quality curve is trained without checkpointing (runner:
# `_train_curve`): a subfolder of the runs, so the tables, which read the runs folder itself, never
# list these runs as configurations of their own.
CURVE_RUNS = "curves"
CURVE_SUFFIX = " without checkpointing"



def finished_twin(out_dir: Path, task: str, profile: str, seed: int, conditions: dict, same) -> dict | None:
    """The first finished record of this seed, made under the same conditions, for which
    `same(record)` holds (the same computation: `records.computation_hash`; the same quality
    curve: `records.quality_hash`), or None. The runs folder is searched first, then the
    un-checkpointed curve runs in its `curves/` subfolder."""
    pattern = f"{task}__*__{profile}__*__seed{seed}.json"
    for candidate in [*sorted(out_dir.glob(pattern)), *sorted((out_dir / CURVE_RUNS).glob(pattern))]:
        record = load_record(candidate)
        if (record is not None and record.get("seed") == seed
                and not condition_differences(record, conditions, ignore_settings=TIMING_ONLY_SETTINGS) and same(record)):
            return record
    return None


def quality_hash_of(record: dict, **curve) -> str | None:
    try:
        return quality_hash(OptimizationConfig.from_dict(record["config"]), **curve)
    except (KeyError, TypeError, ValueError):  # a record of another code version's configuration
        return None


# optimizer steps a run whose quality curve comes from its checkpointing twin measures itself,
# after the warm-up: the step whose memory is broken down and one timed step
PROBE_MEASURED_STEPS = 2
# what such a run measures itself; the rest of its metrics come from the twin's curve or,
# being clock readings of a whole run, are None
_PROBE_METRICS = ("throughput", "throughput_unit", "peak_memory_bytes", "evaluation_peak_memory_bytes", "memory_source",
                  "memory_breakdown_bytes", "flops_per_item", "peak_flops_per_s", "peak_flops_source", "flops_utilization",
                  "energy_source", "zero_bucket_sizes", "wall_s")
_CURVE_METRICS = ("samples_to_target", "steps_to_target", "target", "final_quality", "quality_name", "skipped_steps",
                  "optimizer_steps")


def with_quality_of(twin: dict, probe: dict, *, resolved_notes=()) -> dict:
    """The record of a run whose quality curve is `twin`'s: identity, memory and speed from its
    own first optimizer steps (`probe`), curve and steps from `twin` without its clock; the notes
    of resolving its configuration (e.g. fp16 -> bf16 on CPU) first, as a run of its own has them."""
    def unclocked(entries: list[dict]) -> list[dict]:
        return [dict(entry, time_s=None) for entry in entries]

    metrics = {key: probe["metrics"].get(key) for key in _PROBE_METRICS}
    metrics.update({key: twin["metrics"].get(key) for key in _CURVE_METRICS})
    metrics.update(time_to_target_wall_s=None, train_time_s=None, energy_j=None,
                   probe_optimizer_steps=probe["metrics"]["optimizer_steps"])
    record = dict(probe, status="complete", quality_from=twin["config_name"], history=unclocked(twin["history"]),
                  steps=unclocked(twin["steps"]), metrics=metrics)
    record["notes"] = [*[n for n in resolved_notes if n not in probe["notes"]], *probe["notes"], (
        f"quality curve from the run of {twin['config_name']!r}: activation checkpointing recomputes the same "
        f"values, so both train bit-identically; memory and throughput measured in this configuration's own first "
        f"{probe['metrics']['optimizer_steps']} optimizer steps; no whole-run clock (time to target comes from the "
        f"interleaved timing windows)")]
    return record


def as_twin_of(twin: dict, cfg: OptimizationConfig, *, resolved_notes=()) -> dict:
    """`twin`'s measurements under `cfg`'s name, saying which run they come from and why, with the
    notes of resolving `cfg` (on a CPU without bf16, +mixed_precision runs fp32: +accumulation's run)."""
    record = dict(twin, config_name=cfg.name, config=cfg.to_dict(), config_hash=cfg.config_hash(),
                  computed_as=twin["config_name"])
    record["notes"] = same_computation_notes(resolved_notes, twin, zero_stage=cfg.zero_stage,
                                             measured_zero_stage=twin.get("config", {}).get("zero_stage", 0),
                                             source=f"measured by the run of {twin['config_name']!r}")
    return record
