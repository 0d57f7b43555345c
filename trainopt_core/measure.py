"""The measurement layer every table uses (SPEC §4): throughput, time-to-target, FLOPs
utilization and the cost of eq. 3. Peak memory lives in `measure_memory`, and peak FLOP/s,
energy and the run manifest in `measure_device`; all are importable from here.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Iterable, Sequence

import torch

from .measure_device import (
    GPU_DATASHEET_FLOPS, EnergyMeter, datasheet_peak_flops, matmul_probe_flops, measure_peak_flops,
    _synchronize, peak_flops, precision_name, run_manifest,
)
from .measure_memory import CATEGORIES as MEMORY_CATEGORIES
from .measure_memory import MemoryTracker, PeakMemory


def _fail(argument: str, value, allowed: str) -> None:
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


# ----------------------------------------------------------------------------- time
def elapsed_s(start: float, device: torch.device | str | None = None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds since `start` (a `clock()` reading), after waiting for queued CUDA work."""
    _synchronize(device)
    return clock() - start


class Timer:
    """Wall time of a block; on CUDA synchronized at both boundaries so queued kernels count.

        with Timer(device) as timer: step()
        timer.elapsed_s
    """

    def __init__(self, device: torch.device | str | None = None, clock: Callable[[], float] = time.perf_counter):
        self.device = device
        self.clock = clock
        self.elapsed_s: float | None = None

    def __enter__(self) -> "Timer":
        _synchronize(self.device)
        self._start = self.clock()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.elapsed_s = elapsed_s(self._start, self.device, self.clock)


class ThroughputMeter:
    """Training items (images or tokens) per second of training time (SPEC §4).

    Only training steps are timed (evaluation happens outside them and is never counted), and
    the first `warmup_steps` steps (allocator growth, kernel selection, thread-pool start) are
    left out of the rate. Time a step with `with meter.step(num_items): ...`, or time it
    yourself and call `add_step(num_items, step_s)`.
    """

    def __init__(self, warmup_steps: int = 2, device: torch.device | str | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            _fail("warmup_steps", warmup_steps, "an integer >= 0")
        self.warmup_steps = warmup_steps
        self.device = device
        self.clock = clock
        self.steps = 0
        self.training_time_s = 0.0      # every step, warm-up included (x-axis of quality curves)
        self.training_items = 0
        self.measured_time_s = 0.0      # steps after warm-up: the throughput's denominator
        self.measured_items = 0

    @contextlib.contextmanager
    def step(self, num_items: int):
        timer = Timer(self.device, self.clock)
        with timer:
            yield timer
        self.add_step(num_items, timer.elapsed_s)

    def add_step(self, num_items: int, step_s: float) -> None:
        if num_items < 0:
            _fail("num_items", num_items, "a count >= 0")
        if not (step_s >= 0 and math.isfinite(step_s)):
            _fail("step_s", step_s, "a finite duration >= 0")
        self.steps += 1
        self.training_time_s += step_s
        self.training_items += num_items
        if self.steps > self.warmup_steps:
            self.measured_time_s += step_s
            self.measured_items += num_items

    def items_per_s(self) -> float | None:
        """Items per second after warm-up; None until a step past the warm-up was timed."""
        if self.measured_time_s <= 0:
            return None
        return self.measured_items / self.measured_time_s

    def to_dict(self) -> dict:
        return dict(items_per_s=self.items_per_s(), steps=self.steps, warmup_steps=self.warmup_steps,
                    measured_items=self.measured_items, measured_time_s=self.measured_time_s,
                    training_items=self.training_items, training_time_s=self.training_time_s)


# ----------------------------------------------------------------------------- time-to-target
def time_to_target(history_times_s: Sequence[float], history_quality: Sequence[float], target: float,
                   higher_is_better: bool = True) -> float | None:
    """Training time at which quality first reaches `target`, or None if it never does.

    Quality is evaluated at a fixed cadence; the crossing between the two evaluations that
    bracket it is linearly interpolated (an evaluation exactly at the target returns its time;
    a target met at the first evaluation returns that evaluation's time). Accuracy uses
    `higher_is_better=True` (quality >= target), perplexity False (quality <= target).
    Non-finite qualities (a diverged run) never meet the target.
    """
    times, qualities = list(history_times_s), list(history_quality)
    if len(times) != len(qualities):
        _fail("history_quality", f"{len(qualities)} values", f"as many values as history_times_s ({len(times)})")
    if any(later < earlier for earlier, later in zip(times, times[1:])):
        _fail("history_times_s", times, "non-decreasing times")
    if not math.isfinite(target):
        _fail("target", target, "a finite number")

    def met(q) -> bool:
        return q is not None and math.isfinite(q) and (q >= target if higher_is_better else q <= target)

    for i, quality in enumerate(qualities):
        if not met(quality):
            continue
        previous = qualities[i - 1] if i > 0 else None
        if quality == target or previous is None or not math.isfinite(previous) or previous == quality:
            return float(times[i])
        fraction = (target - previous) / (quality - previous)
        return float(times[i - 1] + fraction * (times[i] - times[i - 1]))
    return None


# ----------------------------------------------------------------------------- FLOPs utilization
def flops_utilization(flops_per_item: float, items_per_s: float | None, peak_flops_per_s: float) -> float | None:
    """Achieved fraction of peak: analytic training FLOPs per item x throughput / peak FLOP/s."""
    if not (flops_per_item > 0 and math.isfinite(flops_per_item)):
        _fail("flops_per_item", flops_per_item, "a finite number > 0")
    if not (peak_flops_per_s > 0 and math.isfinite(peak_flops_per_s)):
        _fail("peak_flops_per_s", peak_flops_per_s, "a finite number > 0")
    if items_per_s is None:
        return None
    if items_per_s < 0:
        _fail("items_per_s", items_per_s, "None or a number >= 0")
    return flops_per_item * items_per_s / peak_flops_per_s


# ----------------------------------------------------------------------------- cost (eq. 3)
_COST_TERMS = (("time", "time_to_target_s"), ("memory", "peak_memory_bytes"), ("energy", "energy_j"))


def cost(time_s: float | None, memory_bytes: float, energy_j: float | None, *, baseline: dict,
         weights: Sequence[float] = (1.0, 1.0, 1.0), include_energy: bool | None = None) -> dict:
    """Eq. 3: C = w1·T + w2·M + w3·E over T, M, E normalized by the baseline's values.

    `baseline` holds "time_to_target_s", "peak_memory_bytes" and "energy_j". Weights are
    rescaled to sum to 1, so the baseline's cost is 1. Without an energy reading (here or in the
    baseline; or `include_energy=False`) the energy term is dropped and w1, w2 are renormalized;
    the returned dict says so. A time-to-target of None (target never reached) has no cost.
    Returns {"cost", "normalized", "weights", "energy_included", "note"}.
    """
    weights = tuple(float(w) for w in weights)
    if len(weights) != 3 or any(not (w >= 0 and math.isfinite(w)) for w in weights) or sum(weights[:2]) <= 0:
        _fail("weights", weights, "three finite weights >= 0 (w1, w2, w3) with w1 + w2 > 0")
    for term, key in _COST_TERMS[:2]:
        value = baseline.get(key)
        if value is None or not (value > 0 and math.isfinite(value)):
            _fail(f"baseline[{key!r}]", value, "a finite number > 0")
    if not (memory_bytes is not None and memory_bytes >= 0 and math.isfinite(memory_bytes)):
        _fail("memory_bytes", memory_bytes, "a finite number >= 0")
    energy_available = energy_j is not None and baseline.get("energy_j") not in (None, 0)
    use_energy = energy_available and include_energy is not False
    notes = []
    if not use_energy:
        reason = "no energy reading" if not energy_available else "energy not available for every compared record"
        notes.append(f"energy term dropped ({reason}); weights renormalized")
    used = weights if use_energy else (weights[0], weights[1], 0.0)
    total = sum(used)
    normalized = {
        "time": None if time_s is None else time_s / baseline["time_to_target_s"],
        "memory": memory_bytes / baseline["peak_memory_bytes"],
        "energy": energy_j / baseline["energy_j"] if energy_available else None,
    }
    result_weights = {"time": used[0] / total, "memory": used[1] / total, "energy": used[2] / total}
    if time_s is None:
        notes.append("time-to-target not reached: no cost")
        value = None
    else:
        value = sum(result_weights[t] * normalized[t] for t in ("time", "memory", "energy") if result_weights[t] > 0)
    return {"cost": value, "normalized": normalized, "weights": result_weights, "energy_included": use_energy,
            "note": "; ".join(notes) or None}


def _metrics(record: dict) -> dict:
    return record.get("metrics", record)  # a runner record keeps them under "metrics"


def _name(record: dict) -> str | None:
    return record.get("config_name", record.get("name"))


def cheapest_config(records: Iterable[dict], quality_ok: Callable[[dict], bool],
                    memory_budget_bytes: float | None = None, *, baseline: dict | None = None,
                    weights: Sequence[float] = (1.0, 1.0, 1.0)) -> dict | None:
    """The lowest eq. 3 cost among records meeting the quality target and the memory budget.

    Records are run records (metrics under "metrics") or flat dicts with "time_to_target_s",
    "peak_memory_bytes", "energy_j". The baseline for normalization is `baseline`, else the
    record named "baseline", else the first record. Energy enters only when the baseline and
    every eligible record have a reading, so all costs stay comparable. Returns
    {"record", "cost", "ranking": [(name, cost), ...]} or None when no record qualifies.
    """
    records = list(records)
    if not records:
        _fail("records", records, "a non-empty list of run records")
    if memory_budget_bytes is not None and not memory_budget_bytes > 0:
        _fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number > 0")
    if baseline is None:
        baseline = next((r for r in records if _name(r) == "baseline"), records[0])
    base = _metrics(baseline)
    eligible = [
        r for r in records
        if quality_ok(r) and _metrics(r).get("time_to_target_s") is not None
        and (memory_budget_bytes is None or _metrics(r)["peak_memory_bytes"] <= memory_budget_bytes)
    ]
    if not eligible:
        return None
    include_energy = base.get("energy_j") is not None and all(_metrics(r).get("energy_j") is not None for r in eligible)
    scored = []
    for record in eligible:
        m = _metrics(record)
        scored.append((cost(m["time_to_target_s"], m["peak_memory_bytes"], m.get("energy_j"), baseline=base,
                            weights=weights, include_energy=include_energy), record))
    scored.sort(key=lambda pair: pair[0]["cost"])
    best_cost, best = scored[0]
    return {"record": best, "cost": best_cost, "ranking": [(_name(r), c["cost"]) for c, r in scored]}


__all__ = [
    "Timer", "elapsed_s", "ThroughputMeter", "time_to_target", "flops_utilization", "cost", "cheapest_config",
    "MemoryTracker", "PeakMemory", "MEMORY_CATEGORIES", "EnergyMeter", "measure_peak_flops", "peak_flops",
    "matmul_probe_flops", "datasheet_peak_flops", "GPU_DATASHEET_FLOPS", "precision_name", "run_manifest",
]
