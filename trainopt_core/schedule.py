"""Learning-rate schedule (eqs. 10-11) and gradient clipping (eq. 12).

Progress is measured in *samples consumed*, not optimizer steps, so the schedule stays right
when adaptive accumulation changes the effective batch (and so the number of steps) mid-run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LRSchedule:
    """η as a function of samples consumed and the current effective batch.

    lr_multiplier() returns the factor applied to each parameter group's base LR:
      warmup (eq. 10, first branch):  s / s_warmup
      cosine (eq. 10, second branch): r + (1 - r) · ½(1 + cos(π (s - s_warmup) / (S - s_warmup)))
      linear scaling (eq. 11):        × B_eff / B_base
    with r = min_lr_ratio (η_min = r · η_base), S = total_samples, s_warmup = warmup_fraction · S.
    """

    total_samples: int
    kind: str = "constant"
    warmup_fraction: float = 0.0
    min_lr_ratio: float = 0.1
    lr_scaling: bool = False
    base_batch_size: int = 1

    def __post_init__(self):
        if self.total_samples < 1:
            raise ValueError(f"total_samples={self.total_samples!r} is invalid: allowed an integer >= 1")
        if self.base_batch_size < 1:
            raise ValueError(f"base_batch_size={self.base_batch_size!r} is invalid: allowed an integer >= 1")

    @property
    def warmup_samples(self) -> float:
        return self.warmup_fraction * self.total_samples

    def shape(self, samples_consumed: float) -> float:
        """Eq. 10 divided by η_base (1.0 for the constant schedule)."""
        if self.kind == "constant":
            return 1.0
        s = min(max(samples_consumed, 0.0), float(self.total_samples))
        warmup = self.warmup_samples
        if warmup > 0 and s <= warmup:
            return s / warmup
        progress = (s - warmup) / max(self.total_samples - warmup, 1e-12)
        r = self.min_lr_ratio
        return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def batch_factor(self, effective_batch_size: int) -> float:
        """Eq. 11's B_eff / B_base (1.0 when linear scaling is off)."""
        return effective_batch_size / self.base_batch_size if self.lr_scaling else 1.0

    def lr_multiplier(self, samples_consumed: float, effective_batch_size: int) -> float:
        return self.shape(samples_consumed) * self.batch_factor(effective_batch_size)


def remember_base_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each group's LR as the user configured it: the η_base that eqs. 10-11 multiply."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return [group["initial_lr"] for group in optimizer.param_groups]


def set_lr(optimizer: torch.optim.Optimizer, base_lrs: list[float], multiplier: float) -> None:
    for group, base_lr in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base_lr * multiplier


def clip_gradients(parameters, clip_norm: float | None) -> torch.Tensor:
    """Eq. 12 on the (already unscaled) gradients; returns the pre-clip global L2 norm."""
    parameters = [p for p in parameters if p.grad is not None]
    if clip_norm is None:
        return torch.nn.utils.get_total_norm([p.grad for p in parameters])
    return torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
