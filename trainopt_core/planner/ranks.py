"""The processes of a distributed `plan()` agree on every measurement before deciding with it.

With W > 1 processes each calls `plan()` on its share of the effective batch, and each candidate
trains data parallel (DDP, or DeepSpeed's ZeRO stages), so every process must build, time,
prune and reject the same candidates in the same order: a process that skipped a candidate the
others build would leave them waiting in its collectives. Each measurement is therefore reduced
over the processes as soon as it is taken, and decided on only then: a peak memory is the
largest process's (the step must fit on every device), a timing window's rate the slowest
process's (a data-parallel step ends when its last process does), the probe loss the mean over
the processes' shares, an out-of-memory error one if any process had it.

An out-of-memory error on some processes only, inside a collective (a gradient all-reduce),
cannot be agreed on: the others wait in the collective. Processes with the same model, batch
shape and device memory run out together, before their first collective.
"""
from __future__ import annotations

from typing import Sequence

import torch


class Ranks:
    """The processes of the current torch.distributed group (one, without a group)."""

    def __init__(self, device: torch.device):
        dist = torch.distributed
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.world_size = dist.get_world_size() if self.distributed else 1
        # NCCL reduces CUDA tensors only; gloo CPU tensors
        self._device = device if self.distributed and dist.get_backend() == "nccl" else torch.device("cpu")

    def _reduce(self, values: Sequence[float], op: str) -> list[float]:
        if not self.distributed or not values:
            return list(values)
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device)
        torch.distributed.all_reduce(tensor, op=getattr(torch.distributed.ReduceOp, op))
        return tensor.tolist()

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, "MAX")

    def min(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, "MIN")

    def mean(self, values: Sequence[float]) -> list[float]:
        return [v / self.world_size for v in self._reduce(values, "SUM")]

    def all(self, flag: bool) -> bool:
        """True where every process's `flag` is."""
        return bool(self.min([1.0 if flag else 0.0])[0])
