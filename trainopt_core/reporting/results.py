"""Run records -> one frame of results: load, aggregate over seeds, and the paper's claims.

Records live in ``reports/<profile>/runs/*.json`` (written by `trainopt_core.reproduction.run`;
what counts as a finished record is `trainopt_core.reproduction.records.load_record`). Every
measured number is a mean with its 95 % confidence interval: over seeds for what a training run
measures, over interleaved timing windows for throughput (`with_throughput`).
"""
from __future__ import annotations

import json
import math
import numbers
import os
import statistics
import tarfile
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

import pandas as pd

from .. import measure
from ..reproduction.records import load_record  # the one definition of a finished record
from .._errors import fail as _fail
from . import session_floor

# Record metrics that every table aggregates over seeds (keys of record["metrics"]).
SEED_METRICS = ("samples_to_target", "steps_to_target", "time_to_target_wall_s", "peak_memory_bytes", "throughput",
                "final_quality", "flops_utilization", "energy_j", "train_time_s")
# What the tables show: the per-seed metrics plus time to target, which combines samples to
# target (per seed) with seconds per sample (interleaved timing windows, when attached).
METRIC_KEYS = ("time_to_target_s", "peak_memory_bytes", "throughput", "final_quality",
               "flops_utilization", "energy_j", "train_time_s", "samples_to_target")
# Bit-identical for every seed and rerun (SPEC §4): one measurement has no spread to estimate.
DETERMINISTIC = ("peak_memory_bytes",)
# An interval over timing windows needs at least this many windows (`over_windows`).
MIN_TIMING_WINDOWS = 3


# ------------------------------------------------------------------ paths and loading
def timed_speed(record: dict | None) -> float:
    """Median samples/s of a record's interleaved timing windows; nan when it has none (a run
    whose curve is another run's has no clock of its own, only this)."""
    return statistics.median(((record or {}).get("timing") or {}).get("samples_per_s") or [math.nan])


def resolve_reports_dir(reports_dir: str | os.PathLike) -> Path:
    """The reports root. A relative path is taken relative to the ``notebooks/`` folder (the
    notebooks' parameter ``"../reports"``), whether the kernel runs there or in the repo root;
    where no such folder exists but one does relative to the working folder (``"reports"`` typed
    in the repo root), that one."""
    path = Path(reports_dir)
    if path.is_absolute():
        return path
    cwd = Path.cwd()
    base = cwd if cwd.name == "notebooks" or not (cwd / "notebooks").is_dir() else cwd / "notebooks"
    if not (base / path).exists() and (cwd / path).is_dir():
        return (cwd / path).resolve()
    return (base / path).resolve()


def profile_dir(reports_dir: str | os.PathLike, profile: str) -> Path:
    return resolve_reports_dir(reports_dir) / profile


def runs_dir(reports_dir: str | os.PathLike, profile: str) -> Path:
    """Where the runner writes this profile's run records."""
    return profile_dir(reports_dir, profile) / "runs"


def load_records(reports_dir: str | os.PathLike, profile: str, *, tasks=None) -> list[dict]:
    """Every complete run record of ``reports/<profile>/runs/`` (partial and truncated records
    and unreadable files are left out), optionally only those of `tasks`. A reproduction whose
    records are packed (``<profile>/runs.tar.xz`` and no ``runs/``, as in reports/other_machines)
    is read from its archive."""
    from ..reproduction.profiles import PROFILES

    if profile not in PROFILES:
        _fail("profile", profile, f"one of {PROFILES} (a typo gives empty tables)")
    if not resolve_reports_dir(reports_dir).is_dir():
        _fail("reports_dir", str(reports_dir), "an existing folder (the reports folder ./run_all.sh writes; "
              "a typo gives empty tables)")
    folder = runs_dir(reports_dir, profile)
    archive = folder.parent / "runs.tar.xz"
    if not folder.is_dir() and archive.is_file():
        with tempfile.TemporaryDirectory() as unpacked, tarfile.open(archive) as packed:
            packed.extractall(Path(unpacked) / profile, filter="data")
            return load_records(unpacked, profile, tasks=tasks)
    records = []
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".partial.json"):
            continue
        record = load_record(path)
        if record is not None and (tasks is None or record.get("task") in tasks):
            records.append(record)
    return records


@lru_cache(maxsize=1)
def paper_claims() -> dict:
    """The paper's numbers (trainopt_core/reporting/paper_claims.json)."""
    return json.loads(resources.files(__package__).joinpath("paper_claims.json").read_text())


def stored_throughput(timing_dir: str | os.PathLike, tasks) -> list[dict]:
    """The interleaved timing records `reproduction.measure_throughput` stored in `timing_dir`
    (``throughput__<task>.json``, complete ones) for `tasks`: what the tables timed, read
    without timing anything."""
    from ..reproduction.throughput import throughput_path

    return [record for record in (load_record(throughput_path(timing_dir, task)) for task in tasks) if record]


def with_throughput(records: list[dict], throughput_records) -> list[dict]:
    """Copies of `records` carrying the interleaved timing windows of their configuration
    (`reproduction.measure_throughput` records, one per task) under ``"timing"``; the tables
    then take throughput, time to target and FLOPs utilization from those windows."""
    by_task = {t["task"]: t for t in (throughput_records or []) if t}
    out = []
    for record in records:
        timed = by_task.get(record["task"], {})
        timing = timed.get("results", {}).get(record["config_name"])
        # the machine kind whose between-session spread its intervals carry (`session_floor`)
        out.append(dict(record, timing=dict(timing, machine_kind=session_floor.machine_kind(timed.get("manifest"))))
                   if timing else record)
    return out


def _floor(timing: dict | None, what: str) -> float | None:
    """The between-session relative SD (`what`: "rate" or "ratio") of the timing's machine kind."""
    floor = session_floor.floor_for((timing or {}).get("machine_kind"))
    return None if floor is None else floor[what]


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per run: identifiers, the precision that ran, and its per-seed metrics."""
    rows = []
    for r in records:
        metrics = r.get("metrics", {})
        row = dict(task=r["task"], config_name=r["config_name"], seed=r.get("seed"), profile=r.get("profile"),
                   precision=r.get("config", {}).get("precision"), data_source=r.get("data_source"),
                   model_name=r.get("model_name"), world_size=r.get("world_size", 1))
        row.update({key: as_number(metrics.get(key)) for key in SEED_METRICS})
        rows.append(row)
    columns = ["task", "config_name", "seed", "profile", "precision", "data_source", "model_name", "world_size",
               *SEED_METRICS]
    return pd.DataFrame(rows, columns=columns)


def as_number(value) -> float:
    """`value` as a float (numpy's numbers included); NaN for anything else (None, text, a bool)."""
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan


def _put(row: dict, key: str, summary: dict, *, deterministic: bool = False) -> None:
    mean = summary.get("mean")
    row[f"{key}_mean"] = math.nan if mean is None else mean
    row[f"{key}_std"] = math.nan if summary.get("std") is None else summary["std"]
    row[f"{key}_n"] = summary.get("n", 0)
    low, high = summary.get("ci_low"), summary.get("ci_high")
    if low is None and deterministic and mean is not None:
        low = high = mean
    row[f"{key}_ci_low"] = math.nan if low is None else low
    row[f"{key}_ci_high"] = math.nan if high is None else high


def _timing_of(records: list[dict]) -> dict | None:
    return next((r["timing"] for r in records if r.get("timing")), None)


def _scaled(summary: dict, factor: float) -> dict:
    return {k: (v * factor if k in ("mean", "ci_low", "ci_high", "median", "min", "max", "std") and v is not None else v)
            for k, v in summary.items()}


def geometric_summary(values) -> dict:
    """`measure.summarize` of the logs of positive `values`, reported back on their own scale: the
    geometric mean and a 95 % interval that stays above zero (what times and their combinations
    need: a t-interval of three times can reach below zero)."""
    return dict(measure.paired_ratio(list(values), [1.0] * len(values)), std=measure.summarize(values)["std"])


def over_windows(summary: dict) -> dict:
    """A summary over timing windows, its interval dropped where there are fewer than
    `MIN_TIMING_WINDOWS`: from 2 windows t(0.975, 1) = 12.7 spans orders of magnitude."""
    if summary.get("n", 0) >= MIN_TIMING_WINDOWS:
        return summary
    return dict(summary, ci_low=None, ci_high=None)


def _log_halves(summary: dict) -> tuple[float, float] | None:
    """The (lower, upper) half-widths of a positive summary's interval in log space."""
    mean, low, high = summary.get("mean"), summary.get("ci_low"), summary.get("ci_high")
    if low is None or high is None or not 0 < low <= mean <= high:
        return None
    return math.log(mean / low), math.log(high / mean)


def _time_to_target(samples: dict, samples_per_s: dict) -> dict:
    """samples to target (geometric mean over seeds) ÷ samples/s (over windows), the two factors'
    half-widths added in quadrature in log space (independent measurements), so the interval
    stays above zero however wide."""
    if samples.get("mean") is None or not samples_per_s.get("mean"):
        return dict(n=samples.get("n", 0), mean=None)
    mean = samples["mean"] / samples_per_s["mean"]
    halves_samples, halves_speed = _log_halves(samples), _log_halves(samples_per_s)
    if halves_samples is None or halves_speed is None:
        return dict(n=samples["n"], mean=mean, ci_low=None, ci_high=None, std=None)
    # a faster speed (its upper half) lowers the time
    below, above = math.hypot(halves_samples[0], halves_speed[1]), math.hypot(halves_samples[1], halves_speed[0])
    return dict(n=samples["n"], mean=mean, ci_low=mean * math.exp(-below), ci_high=mean * math.exp(above), std=None)


def aggregate(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """Per (task, config): mean, 95 % CI (``_ci_low``/``_ci_high``), standard deviation
    (ddof=1) and count (``_n``) of every metric. Per-seed metrics are summarized over seeds (a
    metric missing in some seeds, e.g. a target never reached, over the seeds that have it).
    With timing windows attached (`with_throughput`) throughput is summarized over windows, time
    to target is samples to target × seconds per sample and FLOPs utilization follows the
    windows' throughput; ``timing_source`` says which was used."""
    if isinstance(records, pd.DataFrame):
        frame, by_key = records, {}
    else:
        frame = records_frame(records)
        by_key = {}
        for r in records:
            by_key.setdefault((r["task"], r["config_name"]), []).append(r)
    out = []
    for (task, config), group in frame.groupby(["task", "config_name"], sort=False):
        row = dict(task=task, config_name=config, n_seeds=len(group),
                   precision=", ".join(sorted(set(group["precision"].dropna()))))
        for key in SEED_METRICS:
            _put(row, key, measure.summarize(group[key].tolist()), deterministic=key in DETERMINISTIC)
        group_records = by_key.get((task, config), [])
        timing = _timing_of(group_records)
        if timing:
            # intervals over this session's windows, widened by the machine kind's between-session spread
            rate_floor = _floor(timing, "rate")
            throughput = session_floor.widen(over_windows(measure.summarize(timing["items_per_s"])), rate_floor)
            _put(row, "throughput", throughput)
            samples_per_s = session_floor.widen(over_windows(geometric_summary(timing["samples_per_s"])), rate_floor)
            _put(row, "time_to_target_s", _time_to_target(geometric_summary(group["samples_to_target"].tolist()),
                                                          samples_per_s))
            metrics = group_records[0].get("metrics", {})
            if metrics.get("flops_per_item") and metrics.get("peak_flops_per_s"):
                _put(row, "flops_utilization", _scaled(throughput, metrics["flops_per_item"] / metrics["peak_flops_per_s"]))
            row["timing_windows"] = len(timing["items_per_s"])
            row["timing_source"] = f"interleaved windows ({len(timing['items_per_s'])})"
            row["timing_covers"] = session_floor.describe(timing.get("machine_kind"))
        else:
            _put(row, "time_to_target_s", geometric_summary(group["time_to_target_wall_s"].tolist()))
            row["timing_source"] = "each run's own clock (not interleaved)"
        out.append(row)
    return pd.DataFrame(out)


def _per_seed(records: list[dict], key: str) -> dict[int, float]:
    return {r.get("seed"): as_number(r.get("metrics", {}).get(key)) for r in records}


# where a run that missed its target stopped: samples to target > the samples it trained on,
# and time to target > its training time
_CENSORED_AT = {"samples_to_target": lambda r: (r.get("history") or [{}])[-1].get("samples"),
                "time_to_target_wall_s": lambda r: r.get("metrics", {}).get("train_time_s")}


def censored_seeds_ratio(base: list[dict], other: list[dict], metric: str) -> tuple[dict, dict]:
    """The paired ratio other/baseline of a time-to-target metric over seeds, where a seed whose
    run missed the target in one configuration counts instead of being dropped: censored at that
    run's length (the target lies beyond it), so its pair enters the ratio at its bound. A seed
    that missed in both is left out: its pair bounds the ratio neither way. Returns (the
    `paired_ratio` summary over the seeds that entered, censoring): censoring counts the seeds,
    those that reached the target in both, those where only the other configuration missed (its
    true ratio is higher than the bound), only the baseline (lower) and both (left out)."""
    b, o = _per_seed(base, metric), _per_seed(other, metric)
    runs_b = {r.get("seed"): as_number(_CENSORED_AT[metric](r)) for r in base}
    runs_o = {r.get("seed"): as_number(_CENSORED_AT[metric](r)) for r in other}
    numerators, denominators = [], []
    censoring = dict(seeds=0, reached=0, other_missed=0, baseline_missed=0, both_missed=0)
    for seed in sorted(set(b) & set(o), key=str):
        censoring["seeds"] += 1
        reached_b, reached_o = math.isfinite(b[seed]), math.isfinite(o[seed])
        if reached_b and reached_o:
            censoring["reached"] += 1
            numerators.append(o[seed]), denominators.append(b[seed])
        elif reached_b:  # the other missed: its ratio is above other's run length / baseline
            censoring["other_missed"] += 1
            numerators.append(runs_o[seed]), denominators.append(b[seed])
        elif reached_o:  # the baseline missed: the ratio is below other / baseline's run length
            censoring["baseline_missed"] += 1
            numerators.append(o[seed]), denominators.append(runs_b[seed])
        else:
            censoring["both_missed"] += 1
    return measure.paired_ratio(numerators, denominators), censoring


def censored_bound(censoring: dict) -> str | None:
    """"lower" where every seed that bounds the ratio has the other configuration missing the
    target (and none reached it in both): the true ratio lies above what was measured; "upper"
    where the baseline missed instead; None where some seed measured it (or none bounds it)."""
    if censoring["reached"] or bool(censoring["other_missed"]) == bool(censoring["baseline_missed"]):
        return None
    return "lower" if censoring["other_missed"] else "upper"


def measured_change(records: list[dict], task: str, baseline: str, other: str, key: str) -> dict:
    """Relative change other/baseline − 1 of one metric, with its 95 % CI, from paired
    measurements: the same seed for per-seed metrics, the same timing round for throughput;
    time to target multiplies the samples-to-target ratio (seeds) by the seconds-per-sample
    ratio (windows), a seed that missed the target counting at its run's length
    (`censored_seeds_ratio`). Returns {mean, ci_low, ci_high, n} (None where not measured); for time
    to target also `censoring` and `bound` (`censored_bound`), and for a timed metric `windows`, the
    timing windows it rests on (no interval below `MIN_TIMING_WINDOWS`)."""
    base = [r for r in records if r["task"] == task and r["config_name"] == baseline]
    opt = [r for r in records if r["task"] == task and r["config_name"] == other]
    empty = dict(mean=None, ci_low=None, ci_high=None, n=0)
    if not base or not opt:
        return empty
    base_timing, opt_timing = _timing_of(base), _timing_of(opt)
    timed = base_timing is not None and opt_timing is not None

    def seeds_ratio(metric: str) -> dict:
        b, o = _per_seed(base, metric), _per_seed(opt, metric)
        common = sorted(set(b) & set(o), key=str)
        return measure.paired_ratio([o[s] for s in common], [b[s] for s in common])

    censoring = None
    # a timed ratio's interval carries the machine kind's between-session spread of ratios
    sigma = _floor(base_timing, "ratio") if timed else None

    def windows_ratio(unit: str, numerator: dict, denominator: dict) -> dict:
        return session_floor.widen(over_windows(measure.paired_ratio(numerator[unit], denominator[unit])), sigma)

    if key == "throughput" and timed:
        ratio = windows_ratio("items_per_s", opt_timing, base_timing)
    elif key == "time_to_target_s" and timed:
        samples, censoring = censored_seeds_ratio(base, opt, "samples_to_target")
        ratio = measure.product_ratio(samples, windows_ratio("samples_per_s", base_timing, opt_timing))
    elif key == "time_to_target_s":
        ratio, censoring = censored_seeds_ratio(base, opt, "time_to_target_wall_s")
    elif key == "flops_utilization" and timed:
        b_m, o_m = base[0]["metrics"], opt[0]["metrics"]
        factor = (o_m["flops_per_item"] / o_m["peak_flops_per_s"]) / (b_m["flops_per_item"] / b_m["peak_flops_per_s"])
        ratio = _scaled(windows_ratio("items_per_s", opt_timing, base_timing), factor)
    else:
        ratio = seeds_ratio(key)
    extra = {} if censoring is None else dict(censoring=censoring, bound=censored_bound(censoring))
    if timed and key in ("throughput", "time_to_target_s", "flops_utilization"):
        extra["windows"] = min(len(base_timing["items_per_s"]), len(opt_timing["items_per_s"]))
    if ratio.get("mean") is None:
        return dict(empty, **extra)
    low, high = ratio.get("ci_low"), ratio.get("ci_high")
    if low is None and key in DETERMINISTIC:
        low = high = ratio["mean"]
    return dict(mean=ratio["mean"] - 1, ci_low=None if low is None else low - 1,
                ci_high=None if high is None else high - 1, n=ratio.get("n", 0), **extra)
