"""In-run checkpoints of the reproduction's runs: written atomically, resumed exactly.

A run (`runner.run`) with checkpoints on (the profile's `checkpoint_every_minutes`, or
`RunOptions.checkpoint_every_steps`) writes, between optimizer steps, one file per process:

    <runs>/.checkpoints/<record name>/step<NNNNNNN>.rank<R>.pt

holding the model, the optimizer, the engine (`engine.state_dict()`; with the DeepSpeed backend
these three go through DeepSpeed's checkpoint API into `deepspeed/step<N>/` beside), every random generator
(torch, CUDA, numpy, python), how many micro-batches the data stream has handed out, and the
run's history, step log and clocks so far. A file is written to a temporary name, flushed to
disk and renamed, so a kill leaves either the previous checkpoint or the new one, never half a
file under a checkpoint's name. The newest `KEEP` checkpoints are kept: a corrupt or unreadable
newest one is skipped with a warning and the one before it used. A rerun of the same run (same
identity: task, configuration, seed, profile settings, conditions) resumes from the newest
checkpoint every process can read; the directory is removed once the run record is written.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import warnings
from pathlib import Path

import torch

from .records import as_json

CHECKPOINT_FORMAT = "trainopt-run-checkpoint/1"
KEEP = 2
_NAME = re.compile(r"step(\d{7,})\.rank(\d+)\.pt$")


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (corrupt, partial, or made by another run)."""


def as_saved(identity: dict) -> dict:
    """`identity` as it compares after a save and a load (JSON types: tuples become lists)."""
    return as_json(identity)


def checkpoint_dir(record_path: Path) -> Path:
    record_path = Path(record_path)
    return record_path.parent / ".checkpoints" / record_path.stem


def _path(directory: Path, step: int, rank: int) -> Path:
    return directory / f"step{step:07d}.rank{rank}.pt"


def steps_saved(directory: Path, rank: int) -> list[int]:
    """Optimizer steps with a checkpoint file of `rank`, newest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and int(match.group(2)) == rank:
            found.append(int(match.group(1)))
    return sorted(found, reverse=True)


# ------------------------------------------------------------------ random generators
def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "cuda": None, "numpy": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    name, keys, pos, has_gauss, cached = numpy.random.get_state()
    state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state.get("numpy") is not None:
        import numpy
        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))


# ------------------------------------------------------------------ save / load
def save(directory: Path, step: int, rank: int, payload: dict) -> Path:
    """Writes `payload` as the checkpoint of `step` for `rank` atomically and keeps the newest KEEP."""
    directory.mkdir(parents=True, exist_ok=True)
    final = _path(directory, step, rank)
    partial = final.with_name(final.name + ".partial")
    with open(partial, "wb") as handle:
        torch.save(dict(payload, format=CHECKPOINT_FORMAT, step=step, rank=rank), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, final)
    for old in steps_saved(directory, rank)[KEEP:]:
        _path(directory, old, rank).unlink(missing_ok=True)
    return final


def load(directory: Path, step: int, rank: int, identity: dict) -> dict | None:
    """The checkpoint of `step` for `rank`, or None (with a CheckpointWarning) when it is
    unreadable, not a run checkpoint, or made by another run (`identity` differs)."""
    path = _path(directory, step, rank)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or corrupt file fails inside torch's unpickler/zip reader
        warnings.warn(f"skipping checkpoint {path}: unreadable ({type(error).__name__}: {error})",
                      CheckpointWarning, stacklevel=2)
        return None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        warnings.warn(f"skipping checkpoint {path}: not a {CHECKPOINT_FORMAT} file", CheckpointWarning, stacklevel=2)
        return None
    if payload.get("identity") != identity:
        warnings.warn(f"skipping checkpoint {path}: made by another run (task, configuration, seed, profile "
                      "settings or conditions differ)", CheckpointWarning, stacklevel=2)
        return None
    return payload


def newest_loadable(directory: Path, rank: int, identity: dict, world_size: int = 1) -> dict | None:
    """The newest checkpoint that this rank -- and, under torch.distributed, every rank -- can
    load; None when there is none (the run starts from the beginning)."""
    candidates = steps_saved(directory, rank)
    while True:
        payload = None
        while candidates and payload is None:
            payload = load(directory, candidates.pop(0), rank, identity)
        if world_size == 1:
            return payload
        # All ranks resume from one step: the smallest of their newest readable ones. Every rank
        # sees the same (lowest, highest) and so takes the same branch and the same collectives.
        mine = payload["step"] if payload is not None else -1
        bounds = torch.tensor([mine, -mine], dtype=torch.int64, device=collective_device())
        torch.distributed.all_reduce(bounds, op=torch.distributed.ReduceOp.MIN)
        lowest, highest = int(bounds[0].item()), -int(bounds[1].item())
        if lowest < 0:
            return None
        if lowest == highest:
            return payload
        candidates = [lowest] if lowest in steps_saved(directory, rank) else []


def collective_device() -> torch.device:
    """Where a small tensor for a collective lives: NCCL reduces CUDA tensors only."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def remove(directory: Path) -> None:
    """Drops a finished run's checkpoints (and the parent folder when it is empty)."""
    shutil.rmtree(directory, ignore_errors=True)
    try:
        directory.parent.rmdir()
    except OSError:
        pass
