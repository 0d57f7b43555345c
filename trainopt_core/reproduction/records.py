"""The run record on disk (SPEC §6): one JSON file per (task, configuration, profile, seed).

The file name carries the configuration hash and the seed. A record is written atomically and
marked complete, so a reader sees either nothing, an older record, or the finished one -- never
a partial run that looks complete.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..config import OptimizationConfig

RECORD_SCHEMA = 1


def record_path(out_dir: Path, task: str, cfg: OptimizationConfig, profile: str, seed: int) -> Path:
    return Path(out_dir) / f"{task}__{cfg.name.replace('+', 'plus_').replace('-', 'minus_')}__{profile}__{cfg.config_hash()}__seed{seed}.json"


def load_record(path: Path) -> dict | None:
    """A finished record, or None (missing, unreadable, or not marked complete)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if record.get("status") != "complete" or record.get("schema") != RECORD_SCHEMA:
        return None
    return record


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
