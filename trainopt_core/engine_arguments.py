"""What `prepare()` tells an engine besides the model, optimizer and configuration: the run's shape
(micro-batch, device, processes) and its LR schedule's horizon. One dataclass, taken by the
torch-native `TrainingEngine` and the `DeepSpeedTrainingEngine` alike, each value checked once here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._errors import MAX_COUNT, fail


def is_count(value, minimum: int = 1) -> bool:
    """An int (not a bool) in [minimum, MAX_COUNT]: what a number of samples, steps or micro-batches may be."""
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= MAX_COUNT


@dataclass(frozen=True, kw_only=True)
class EngineArguments:
    """The engine's arguments (prepare()'s, with `world_size` and `device` resolved).

    `micro_batch_size`: samples per micro-batch on each process. `total_samples` | `total_steps`:
    the LR schedule's horizon in samples or optimizer steps (neither: only a constant schedule),
    with `warmup_samples` | `warmup_steps` in the same unit and `min_lr`, the LR the cosine ends at
    (`schedule.make_schedule` checks how they combine)."""

    micro_batch_size: int
    device: torch.device
    world_size: int = 1
    total_samples: int | None = None
    total_steps: int | None = None
    warmup_samples: int | None = None
    warmup_steps: int | None = None
    min_lr: float | None = None

    def __post_init__(self):
        if not is_count(self.micro_batch_size):
            fail("micro_batch_size", self.micro_batch_size, "an integer >= 1 (samples per micro-batch on each "
                 "process), at most 2**53")
        if not is_count(self.world_size):
            fail("world_size", self.world_size, "None (torch.distributed's) or an integer >= 1")
        for name in ("total_samples", "total_steps"):
            value = getattr(self, name)
            if value is not None and not is_count(value):
                fail(name, value, "None or an integer >= 1, at most 2**53")
        for name in ("warmup_samples", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and not is_count(value, minimum=0):
                fail(name, value, "None or an integer >= 0, at most 2**53")
        if self.min_lr is not None and not (isinstance(self.min_lr, (int, float)) and not isinstance(self.min_lr, bool)
                                            and math.isfinite(self.min_lr) and self.min_lr >= 0):
            fail("min_lr", self.min_lr, "None (the configuration's min_lr_ratio x the base LR) or an LR >= 0")

    def schedule_arguments(self) -> dict:
        """The horizon, warmup and minimum LR as `schedule.make_schedule` takes them."""
        return dict(total_samples=self.total_samples, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                    warmup_samples=self.warmup_samples, min_lr=self.min_lr)
