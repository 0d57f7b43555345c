"""Eq. 3 as a measurement: the cost C = w1·T + w2·M + w3·E of a configuration, and the
cheapest configuration that meets the quality target within a memory budget."""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

from .._errors import fail as _fail


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
