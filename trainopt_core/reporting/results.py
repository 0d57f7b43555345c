"""Run records -> one frame of results: load, aggregate over seeds, and the paper's claims.

Records live in ``reports/<profile>/runs/*.json`` (written by `trainopt_core.reproduction.run`;
what counts as a finished record is `trainopt_core.reproduction.records.load_record`). Every
measured number is a mean over seeds with its standard deviation and seed count.
"""
from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

import pandas as pd

from ..reproduction.records import load_record  # the one definition of a finished record

# Record metrics that every table aggregates (keys of record["metrics"]).
METRIC_KEYS = ("time_to_target_s", "peak_memory_bytes", "throughput", "final_quality",
               "flops_utilization", "energy_j", "train_time_s")


# ------------------------------------------------------------------ paths and loading
def resolve_reports_dir(reports_dir: str | os.PathLike) -> Path:
    """The reports root. A relative path is taken relative to the ``notebooks/`` folder (the
    notebooks' parameter ``"../reports"``), whether the kernel runs there or in the repo root."""
    path = Path(reports_dir)
    if path.is_absolute():
        return path
    cwd = Path.cwd()
    base = cwd if cwd.name == "notebooks" or not (cwd / "notebooks").is_dir() else cwd / "notebooks"
    return (base / path).resolve()


def profile_dir(reports_dir: str | os.PathLike, profile: str) -> Path:
    return resolve_reports_dir(reports_dir) / profile


def runs_dir(reports_dir: str | os.PathLike, profile: str) -> Path:
    """Where the runner writes this profile's run records."""
    return profile_dir(reports_dir, profile) / "runs"


def load_records(reports_dir: str | os.PathLike, profile: str, *, tasks=None) -> list[dict]:
    """Every complete run record of ``reports/<profile>/runs/`` (partial and truncated records
    and unreadable files are left out), optionally only those of `tasks`."""
    records = []
    for path in sorted(runs_dir(reports_dir, profile).glob("*.json")):
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


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per run: identifiers, the precision that ran, and the metrics of SPEC §4."""
    rows = []
    for r in records:
        metrics = r.get("metrics", {})
        row = dict(task=r["task"], config_name=r["config_name"], seed=r.get("seed"), profile=r.get("profile"),
                   precision=r.get("config", {}).get("precision"), data_source=r.get("data_source"),
                   model_name=r.get("model_name"), world_size=r.get("world_size", 1))
        row.update({key: as_number(metrics.get(key)) for key in METRIC_KEYS})
        rows.append(row)
    columns = ["task", "config_name", "seed", "profile", "precision", "data_source", "model_name", "world_size",
               *METRIC_KEYS]
    return pd.DataFrame(rows, columns=columns)


def as_number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and value is not None else math.nan


def aggregate(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """Mean, standard deviation (ddof=1; NaN with one seed) and seed count of every metric per
    (task, config). A metric missing in some seeds (e.g. target never reached) is averaged over
    the seeds that have it; ``<metric>_n`` says how many."""
    frame = records if isinstance(records, pd.DataFrame) else records_frame(records)
    out = []
    for (task, config), group in frame.groupby(["task", "config_name"], sort=False):
        row = dict(task=task, config_name=config, n_seeds=len(group),
                   precision=", ".join(sorted(set(group["precision"].dropna()))))
        for key in METRIC_KEYS:
            values = group[key].dropna()
            row[f"{key}_mean"] = values.mean() if len(values) else math.nan
            row[f"{key}_std"] = values.std(ddof=1) if len(values) > 1 else math.nan
            row[f"{key}_n"] = len(values)
        out.append(row)
    return pd.DataFrame(out)
