"""The between-session spread of timings on one machine kind, carried into every timing interval.

A timing interval over the interleaved windows of one session describes that session: the same
run in another session on the same kind of machine (another host, another day) lands outside it
far more often than 5 % of the time. So the tables widen every throughput and time interval by
the spread measured between sessions of that machine kind: `session_floor.json`, made by

    python -m trainopt_core.reporting.floors reports --out trainopt_core/reporting/session_floor.json

from the interleaved timing records (``throughput__<task>.json``) of every committed
reproduction. For each (machine kind, task, configuration) timed in two or more sessions, the
between-session variance of the session's mean log rate is its variance across sessions less the
mean within-session variance of that mean (method of moments, floored at 0); the floor is the
root mean square over those cells -- for absolute rates and for paired ratios to the baseline.
A machine kind is the CPU's instruction set as the manifests name it (``measure.cpu_isa``); GPUs
and CPUs of a kind with fewer than two sessions have no floor, and their intervals still describe
one session only (the tables' notes say which). The sessions span commits of the project, so
the floor also holds whatever code changes moved the timings between them: an upper estimate.
"""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from .. import measure
from ..reproduction.profiles import TIMING_ONLY_SETTINGS

FLOOR_FILE = Path(__file__).with_name("session_floor.json")
Z95 = 1.959964  # the normal 95 % quantile: the floor is a standard deviation of a log rate
MIN_SESSIONS = 2


def machine_kind(manifest: dict | None) -> str | None:
    """The machine kind a timing's floor is looked up by: the CPU's instruction set for a CPU
    timing, None for a GPU timing or a manifest without it."""
    if not manifest:
        return None
    device = str(manifest.get("device") or "cpu")
    if not device.startswith("cpu"):
        return None
    return (manifest.get("hardware") or {}).get("cpu_isa")


def _cells(paths) -> dict[tuple, list[tuple[str, float, float]]]:
    """(kind, task, configuration, its hash, profile, "rate" | "ratio") -> [(session, mean log, its variance)]."""
    cells = defaultdict(list)
    for path in paths:
        record = json.loads(Path(path).read_text())
        if record.get("kind") != "interleaved_throughput" or record.get("status", "complete") != "complete":
            continue
        kind = machine_kind(record.get("manifest"))
        if kind is None:
            continue
        results = record.get("results") or {}
        baseline = (results.get("baseline") or {}).get("items_per_s") or []
        # the same workload: the run's conditions but the host's identity and the timing's own settings
        conditions = dict(record.get("conditions") or {"profile": record.get("profile")})
        conditions.pop("hardware", None)
        conditions["profile_settings"] = {k: v for k, v in (conditions.get("profile_settings") or {}).items()
                                          if k not in TIMING_ONLY_SETTINGS}
        profile = hashlib.sha1(json.dumps(conditions, sort_keys=True, default=str).encode()).hexdigest()[:8]
        for name, result in results.items():
            rates = result.get("items_per_s") or []
            key = (kind, record.get("task"), name, result.get("config_hash"), profile)
            if len(rates) >= 2 and all(r > 0 for r in rates):
                logs = [math.log(r) for r in rates]
                cells[(*key, "rate")].append((str(path), statistics.mean(logs), statistics.variance(logs) / len(logs)))
            if name != "baseline" and len(baseline) == len(rates) >= 2 and all(r > 0 for r in baseline + rates):
                logs = [math.log(r / b) for r, b in zip(rates, baseline)]
                cells[(*key, "ratio")].append((str(path), statistics.mean(logs), statistics.variance(logs) / len(logs)))
    return cells


def estimate(paths) -> dict:
    """{machine kind: {"rate": relative SD, "ratio": relative SD, "sessions", "cells", "records"}}
    from interleaved timing records (module docstring); kinds with cells of two or more sessions."""
    pooled = defaultdict(lambda: {"rate": [], "ratio": [], "records": set()})
    for (kind, *_, what), sessions in _cells(paths).items():
        if len(sessions) < MIN_SESSIONS:
            continue
        means = [m for _, m, _ in sessions]
        between = statistics.variance(means) - statistics.mean([v for _, _, v in sessions])
        pooled[kind][what].append((max(between, 0.0), len(sessions)))
        pooled[kind]["records"].update(p for p, _, _ in sessions)
    floors = {}
    for kind, parts in sorted(pooled.items()):
        if not parts["rate"] or not parts["ratio"]:
            continue
        floors[kind] = {
            "rate": math.sqrt(statistics.mean(v for v, _ in parts["rate"])),
            "ratio": math.sqrt(statistics.mean(v for v, _ in parts["ratio"])),
            "sessions": max(n for _, n in parts["rate"] + parts["ratio"]),
            "cells": len(parts["rate"]) + len(parts["ratio"]),
            "records": sorted(parts["records"]),
        }
    return floors


@lru_cache(maxsize=1)
def floors() -> dict:
    """The committed floors (`session_floor.json`): {machine kind: {...}}."""
    return json.loads(FLOOR_FILE.read_text())["floors"] if FLOOR_FILE.is_file() else {}


def floor_for(kind: str | None) -> dict | None:
    return floors().get(kind) if kind else None


def widen(summary: dict, sigma: float | None) -> dict:
    """`summary` (mean, ci_low, ci_high of a positive quantity) with its 95 % interval widened by
    a between-session relative SD `sigma`: half-widths in log space added in quadrature. The
    one-session interval is kept as ``session_ci_low`` / ``session_ci_high``."""
    mean, low, high = summary.get("mean"), summary.get("ci_low"), summary.get("ci_high")
    if not sigma or mean is None or low is None or high is None or not (0 < low <= mean <= high):
        return summary
    extra = (Z95 * sigma) ** 2
    return dict(summary, session_ci_low=low, session_ci_high=high,
                ci_low=mean * math.exp(-math.sqrt(math.log(mean / low) ** 2 + extra)),
                ci_high=mean * math.exp(math.sqrt(math.log(high / mean) ** 2 + extra)))


def describe(kind: str | None) -> str:
    """What a timing interval of this machine kind covers, in words."""
    floor = floor_for(kind)
    if floor is None:
        where = f"machine kind {kind}" if kind else "this machine (its kind unknown, or a GPU)"
        return (f"Timing intervals describe this session's interleaved windows only: no between-session spread is "
                f"known for {where}; a rerun elsewhere may land outside them.")
    return (f"Timing intervals cover this session's interleaved windows and the spread between sessions measured "
            f"on {kind} machines ({100 * floor['rate']:.1f} % for rates, {100 * floor['ratio']:.1f} % for ratios to "
            f"the baseline, relative SD, from {floor['sessions']} sessions).")


def rerun_coverage(paths, floor_table: dict | None = None, fresh=()) -> dict:
    """How often one session's value lies inside another session's interval, over every ordered
    pair of sessions of each cell (module docstring): {"rate" | "ratio": {"pairs", "inside",
    "inside_one_session"}}, with the intervals widened by `floor_table` (default: the committed
    floors) and as one session's alone. In-sample where the floors came from the same records.
    A 95 % interval of the mean holds the other session's value about 83 % of the time when the
    floor is right (both values vary: 1.96 / sqrt(2) standard deviations). With `fresh` (folders),
    only the pairs of one session under them and one not are counted: out of sample when the
    floors were estimated without the fresh sessions."""
    fresh = [str(Path(folder).resolve()) for folder in fresh]

    def is_fresh(path: str) -> bool:
        return any(str(Path(path).resolve()).startswith(folder.rstrip("/") + "/") for folder in fresh)

    floor_table = floors() if floor_table is None else floor_table
    out = {what: {"pairs": 0, "inside": 0, "inside_one_session": 0} for what in ("rate", "ratio")}
    for (kind, _task, name, *_, what), sessions in _cells(paths).items():
        if kind not in floor_table or len(sessions) < MIN_SESSIONS:
            continue
        summaries = {}
        for path, _, _ in sessions:
            results = json.loads(Path(path).read_text())["results"]
            rates = results[name]["items_per_s"]
            summaries[path] = (measure.summarize(rates) if what == "rate"
                               else measure.paired_ratio(rates, results["baseline"]["items_per_s"]))
        for first, second in ((a, b) for a in summaries for b in summaries if a != b):
            if fresh and is_fresh(first) == is_fresh(second):
                continue
            value, interval = summaries[first]["mean"], summaries[second]
            wide = widen(interval, floor_table[kind][what])
            out[what]["pairs"] += 1
            out[what]["inside"] += wide["ci_low"] <= value <= wide["ci_high"]
            out[what]["inside_one_session"] += interval["ci_low"] <= value <= interval["ci_high"]
    return out
