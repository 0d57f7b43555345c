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
import re
import shutil
import time
import warnings
from pathlib import Path

import torch

from ..rng import rng_state, set_rng_state  # noqa: F401  (the library's; the runner saves them through here)
from .profiles import TaskProfile
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


# ------------------------------------------------------------------ a run's checkpointing
THROUGHPUT_STATE = ("steps", "training_time_s", "training_items", "measured_time_s", "measured_items")


class CountedBatches:
    """The task's micro-batch stream, counting what it handed out (a checkpoint's data position)."""

    def __init__(self, batches):
        self._batches, self.drawn = batches, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._batches)
        self.drawn += 1
        return batch


class RunCheckpoints:
    """When and where a run checkpoints itself, with the functions above (off for truncated runs).

    Torch backend: model, optimizer and engine state go into each rank's checkpoint file. DeepSpeed
    backend: they go through DeepSpeed's own checkpoint API (`engine.save_checkpoint`: module,
    ZeRO-partitioned optimizer state, loss scaler, engine state) into `<checkpoints>/deepspeed/
    step<N>/`, written by every rank before any rank writes its own file; a step counts as saved
    only when every rank's file exists, so a kill during DeepSpeed's save leaves no usable step N.

    `options` is the run's `runner.RunOptions` (checkpoint_every_steps, max_steps, backend, rerun)."""

    def __init__(self, record_file: Path, prof: TaskProfile, options, *, rank: int, world_size: int, identity: dict):
        every = options.checkpoint_every_steps
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 0):
            raise ValueError(f"checkpoint_every_steps={every!r} is invalid: allowed None (the profile's "
                             "checkpoint_every_minutes), 0 (off) or an integer >= 1")
        self.every_steps = every or None
        minutes = prof.checkpoint_every_minutes if every is None else None
        self.every_s = minutes * 60.0 if minutes else None
        self.on = options.max_steps is None and bool(self.every_steps or self.every_s)
        self.deepspeed = options.backend == "deepspeed"
        self.directory = checkpoint_dir(record_file)
        self.engine_dir = self.directory / "deepspeed"
        self.rank, self.world_size, self.identity = rank, world_size, as_saved(identity)
        self.fresh = options.rerun
        self._last_save = time.perf_counter()

    def newest(self) -> dict | None:
        """The checkpoint to resume from; None to start from the beginning. `RunOptions.rerun`
        asks for a new measurement: an interrupted attempt's checkpoints are dropped."""
        if not self.on:
            return None
        if self.fresh:
            if self.rank == 0:
                remove(self.directory)
            if self.world_size > 1:
                torch.distributed.barrier()
            return None
        return newest_loadable(self.directory, self.rank, self.identity, self.world_size)

    def due(self, step: int) -> bool:
        if not self.on:
            return False
        if self.every_steps:
            return step % self.every_steps == 0
        due = time.perf_counter() - self._last_save >= self.every_s
        if self.world_size > 1:  # rank 0's clock decides, so every rank saves the same step
            flag = torch.tensor([int(due)], dtype=torch.int64, device=collective_device())
            torch.distributed.broadcast(flag, src=0)
            due = bool(flag.item())
        return due

    def save(self, step: int, module: torch.nn.Module, engine, payload: dict) -> None:
        if self.deepspeed:
            engine.save_checkpoint(self.engine_dir, tag=self.tag(step))
            if self.world_size > 1:
                torch.distributed.barrier()  # every rank's DeepSpeed files are down before any marks the step
        else:
            payload = dict(payload, model=module.state_dict(), optimizer=engine.optimizer.state_dict(),
                           engine=engine.state_dict())
        save(self.directory, step, self.rank, dict(payload, identity=self.identity))
        if self.deepspeed and self.rank == 0:  # DeepSpeed's folders of the steps no longer kept
            kept = {self.tag(kept_step) for kept_step in steps_saved(self.directory, 0)}
            for folder in self.engine_dir.iterdir():
                if folder.is_dir() and folder.name not in kept and folder.name < self.tag(step):
                    shutil.rmtree(folder, ignore_errors=True)
        self._last_save = time.perf_counter()

    @staticmethod
    def tag(step: int) -> str:
        return f"step{step:07d}"

    def restore_training_state(self, carried: dict, module: torch.nn.Module, engine) -> None:
        """Model, optimizer and engine state of the checkpoint `carried` belongs to."""
        if self.deepspeed:
            engine.load_checkpoint(self.engine_dir, tag=self.tag(carried["step"]))
            return
        module.load_state_dict(carried["model"])
        engine.optimizer.load_state_dict(carried["optimizer"])
        engine.load_state_dict(carried["engine"])

    def finished(self) -> None:
        if self.on and self.rank == 0:
            remove(self.directory)


def restore_position(carried: dict, throughput, batches: CountedBatches) -> None:
    for key in THROUGHPUT_STATE:
        setattr(throughput, key, carried["throughput"][key])
    for _ in range(carried["micro_batches"]):  # the data stream's own generator replays its draws
        next(batches)
    set_rng_state(carried["rng"])


def memory_summary(memory, carried: dict | None) -> dict:
    """Peaks (and the breakdown at the larger peak) over this attempt and the resumed ones."""
    now = dict(peak=memory.peak_bytes(), evaluation_peak=memory.evaluation_peak_bytes(), breakdown=memory.breakdown())
    if carried is None:
        return now
    before = carried["memory"]
    larger = lambda a, b: b if a is None else a if b is None else max(a, b)  # noqa: E731
    earlier_wins = before["peak"] is not None and (now["peak"] is None or before["peak"] >= now["peak"])
    return dict(peak=larger(before["peak"], now["peak"]),
                evaluation_peak=larger(before["evaluation_peak"], now["evaluation_peak"]),
                breakdown=before["breakdown"] if earlier_wins else now["breakdown"])


def energy_so_far(energy, carried: dict | None) -> float | None:
    """Joules of this attempt (a reading since start; the meter keeps counting) plus the
    interrupted attempts' (None where the meter has no counter)."""
    joules, _ = energy.stop()
    if joules is None:
        return None
    return joules + ((carried["energy_j"] or 0.0) if carried else 0.0)
