"""The between-session spread of timings on one machine kind, carried into every timing interval.

A timing interval over the interleaved windows of one session describes that session: the same
run in another session on the same kind of machine (another host, another day) lands outside it
far more often than 5 % of the time. So the tables widen every throughput and time interval by
the spread measured between sittings of that machine kind: `session_floor.json`, made by

    python -m trainopt_core.reporting.floors reports --out trainopt_core/reporting/session_floor.json

from the interleaved timing records (``throughput__<task>.json``) of every committed
reproduction. A machine kind is what predicts that spread: the CPU's instruction set
(``measure.cpu_isa``) and its vendor, family and model (`measure.manifest.cpu_family_model`;
"AVX2" alone spans CPU generations 0.54-0.60x apart in speed). A sitting is a day and a commit:
sessions of one sitting (a reproduction and its immediate rerun) are pooled into one, since
their spread says nothing about another day. For each (machine kind, task, configuration)
timed in two or more sittings, the between-sitting variance of the mean log rate is its variance
across sittings less the mean within-sitting variance of that mean (method of moments, floored
at 0); the floor is the root mean square over those cells -- for absolute rates and for paired
ratios to the baseline. A kind gets a floor only from sittings on at least two days at two
commits. GPUs, CPUs whose family is unknown (manifests before it was recorded) and kinds without
such sittings have no floor: their intervals describe one session only (the tables' notes and
the summary say so). The sittings span commits of the project, so the floor also holds whatever
code changes moved the timings between them: an upper estimate.
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
from ..measure.manifest import cpu_kind
from ..reproduction.profiles import TIMING_ONLY_SETTINGS

FLOOR_FILE = Path(__file__).with_name("session_floor.json")
Z95 = 1.959964  # the normal 95 % quantile: the floor is a standard deviation of a log rate
MIN_SITTINGS = 2  # on at least this many days and at this many commits


def machine_kind(manifest: dict | None) -> str | None:
    """The machine kind a timing's floor is looked up by: "AVX2, AMD family 25 model 1" for a CPU
    timing (with "unknown" for what its manifest does not record: no floor), None for a GPU
    timing or no manifest."""
    if not manifest:
        return None
    device = str(manifest.get("device") or "cpu")
    hardware = manifest.get("hardware") or {}
    if not device.startswith("cpu"):
        return None
    if not hardware.get("cpu_isa"):
        return "CPU, instruction set and family unknown"
    return cpu_kind(hardware)


def _sitting(record: dict) -> tuple[str, str]:
    """(day, commit) of a timing record: the sessions of one sitting."""
    manifest = record.get("manifest") or {}
    git = manifest.get("git") if isinstance(manifest.get("git"), dict) else {}
    return str(manifest.get("date_utc") or "")[:10], str(git.get("commit") or "")


def _cells(paths) -> dict[tuple, list[tuple[str, tuple, float, float]]]:
    """(kind, task, configuration, its hash, profile, "rate" | "ratio") ->
    [(session, its sitting, mean log, its variance)]."""
    cells = defaultdict(list)
    for path in paths:
        record = json.loads(Path(path).read_text())
        if record.get("kind") != "interleaved_throughput" or record.get("status", "complete") != "complete":
            continue
        kind = machine_kind(record.get("manifest"))
        if kind is None:
            continue
        sitting = _sitting(record)
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
                cells[(*key, "rate")].append((str(path), sitting, statistics.mean(logs),
                                              statistics.variance(logs) / len(logs)))
            if name != "baseline" and len(baseline) == len(rates) >= 2 and all(r > 0 for r in baseline + rates):
                logs = [math.log(r / b) for r, b in zip(rates, baseline)]
                cells[(*key, "ratio")].append((str(path), sitting, statistics.mean(logs),
                                               statistics.variance(logs) / len(logs)))
    return cells


def _by_sitting(sessions) -> list[tuple[float, float]]:
    """Each sitting's (mean log, its variance): its sessions' means averaged (their own variance
    averaged and divided by their number, which leaves any spread between them in the estimate)."""
    grouped = defaultdict(list)
    for _, sitting, mean, variance in sessions:
        grouped[sitting].append((mean, variance))
    return [(statistics.mean(m for m, _ in group), statistics.mean(v for _, v in group) / len(group))
            for group in grouped.values()]


def estimate(paths) -> dict:
    """{machine kind: {"rate": relative SD, "ratio": relative SD, "sittings", "days", "commits",
    "cells", "records"}} from interleaved timing records (module docstring): kinds of a known CPU
    family with cells timed in two or more sittings, on two or more days at two or more commits."""
    pooled = defaultdict(lambda: {"rate": [], "ratio": [], "records": set(), "sittings": set()})
    for (kind, *_, what), sessions in _cells(paths).items():
        sittings = _by_sitting(sessions)
        if len(sittings) < MIN_SITTINGS or "unknown" in kind:
            continue
        between = statistics.variance([m for m, _ in sittings]) - statistics.mean([v for _, v in sittings])
        pooled[kind][what].append(max(between, 0.0))
        pooled[kind]["records"].update(path for path, *_ in sessions)
        pooled[kind]["sittings"].update(sitting for _, sitting, *_ in sessions)
    floors = {}
    for kind, parts in sorted(pooled.items()):
        days, commits = {day for day, _ in parts["sittings"]}, {commit for _, commit in parts["sittings"]}
        if not parts["rate"] or not parts["ratio"] or len(days) < MIN_SITTINGS or len(commits) < MIN_SITTINGS:
            continue
        floors[kind] = {
            "rate": math.sqrt(statistics.mean(parts["rate"])),
            "ratio": math.sqrt(statistics.mean(parts["ratio"])),
            "sittings": len(parts["sittings"]), "days": len(days), "commits": len(commits),
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
        return (f"Timing intervals cover this session's interleaved windows only: no between-session spread is "
                f"known for {_unknown_because(kind)}; a rerun on another day or host may land outside them.")
    return (f"Timing intervals cover this session's interleaved windows and the spread between sittings measured "
            f"on {kind} ({100 * floor['rate']:.1f} % for rates, {100 * floor['ratio']:.1f} % for ratios to the "
            f"baseline, relative SD, from {floor['sittings']} sittings on {floor['days']} days).")


def one_session_only(kind: str | None) -> bool:
    """Whether timing intervals of this machine kind describe one session only (no floor)."""
    return floor_for(kind) is None


def _unknown_because(kind: str | None) -> str:
    if kind is None:
        return "a GPU's timings"
    if "unknown" in kind:
        return f"this machine ({kind}: its manifests predate these fields)"
    return f"{kind} (not yet timed in sittings on two days at two commits)"


def rerun_coverage(paths, floor_table: dict | None = None, fresh=()) -> dict:
    """How often one session's value lies inside another session's interval, over every ordered
    pair of sessions of different sittings of each cell (module docstring): {"rate" | "ratio":
    {"pairs", "inside", "inside_one_session"}}, with the intervals widened by `floor_table`
    (default: the committed floors) and as one session's alone. In-sample where the floors came
    from the same records. A 95 % interval of the mean holds the other session's value about 83 %
    of the time when the floor is right (both values vary: 1.96 / sqrt(2) standard deviations).
    With `fresh` (folders), only the pairs of one session under them and one not are counted: out
    of sample when the floors were estimated without the fresh sessions."""
    fresh = [str(Path(folder).resolve()) for folder in fresh]

    def is_fresh(path: str) -> bool:
        return any(str(Path(path).resolve()).startswith(folder.rstrip("/") + "/") for folder in fresh)

    floor_table = floors() if floor_table is None else floor_table
    out = {what: {"pairs": 0, "inside": 0, "inside_one_session": 0} for what in ("rate", "ratio")}
    for (kind, _task, name, *_, what), sessions in _cells(paths).items():
        if kind not in floor_table:
            continue
        summaries, sitting_of = {}, {}
        for path, sitting, _, _ in sessions:
            results = json.loads(Path(path).read_text())["results"]
            rates = results[name]["items_per_s"]
            summaries[path] = (measure.summarize(rates) if what == "rate"
                               else measure.paired_ratio(rates, results["baseline"]["items_per_s"]))
            sitting_of[path] = sitting
        for first, second in ((a, b) for a in summaries for b in summaries if sitting_of[a] != sitting_of[b]):
            if fresh and is_fresh(first) == is_fresh(second):
                continue
            value, interval = summaries[first]["mean"], summaries[second]
            wide = widen(interval, floor_table[kind][what])
            out[what]["pairs"] += 1
            out[what]["inside"] += wide["ci_low"] <= value <= wide["ci_high"]
            out[what]["inside_one_session"] += interval["ci_low"] <= value <= interval["ci_high"]
    return out
