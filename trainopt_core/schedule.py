"""Learning-rate schedule (eqs. 10-11) and gradient clipping (eq. 12).

Progress is measured in *samples consumed*, not optimizer steps, so the schedule stays right
when adaptive accumulation changes the effective batch (and so the number of steps) mid-run.
A loop that states its schedule in optimizer steps (warmup steps, a decay horizon, a minimum LR)
gets `StepLRSchedule` instead (`prepare(..., total_steps=..., warmup_steps=..., min_lr=...)`).
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

    unit = "samples"  # what the schedule's position counts

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


@dataclass(frozen=True)
class StepLRSchedule:
    """η as a function of the optimizer step, for loops that count their schedule in steps: the
    common "linear warmup, then cosine to a minimum LR" written per iteration. For the step
    t = 0, 1, ... being taken, the factor on each group's base LR is

      t < W:       (t + 1) / (W + 1)
      W <= t <= D: r + (1 - r) · ½(1 + cos(π (t - W) / (D - W)))
      t > D:       r
      (constant kind: 1), × B_eff / B_base with linear scaling (eq. 11),

    with W = `warmup_steps`, D = `decay_steps` (the horizon; later steps stay at the minimum)
    and r = `min_lr_ratio` (η_min = r · η_base). With adaptive k the steps hold different
    numbers of samples; this schedule follows the steps, as such a loop's own formula does."""

    unit = "steps"

    decay_steps: int
    kind: str = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    lr_scaling: bool = False
    base_batch_size: int = 1

    def __post_init__(self):
        if isinstance(self.decay_steps, bool) or not isinstance(self.decay_steps, int) or self.decay_steps < 1:
            raise ValueError(f"total_steps={self.decay_steps!r} is invalid: allowed an integer >= 1 (the decay horizon)")
        if (isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int)
                or not 0 <= self.warmup_steps < self.decay_steps):
            raise ValueError(f"warmup_steps={self.warmup_steps!r} is invalid: allowed an integer in "
                             f"[0, total_steps) = [0, {self.decay_steps})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr ratio {self.min_lr_ratio!r} is invalid: allowed a value in [0, 1] of the base LR")
        if self.base_batch_size < 1:
            raise ValueError(f"base_batch_size={self.base_batch_size!r} is invalid: allowed an integer >= 1")

    def shape(self, step: int) -> float:
        if self.kind == "constant":
            return 1.0
        warmup, horizon, r = self.warmup_steps, self.decay_steps, self.min_lr_ratio
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if step > horizon:
            return r
        progress = (step - warmup) / (horizon - warmup)
        return r + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - r)

    def batch_factor(self, effective_batch_size: int) -> float:
        return effective_batch_size / self.base_batch_size if self.lr_scaling else 1.0

    def lr_multiplier(self, step: int, effective_batch_size: int) -> float:
        return self.shape(step) * self.batch_factor(effective_batch_size)


def make_schedule(config, *, base_batch_size: int, base_lr: float, total_samples: int | None = None,
                  total_steps: int | None = None, warmup_steps: int | None = None,
                  warmup_samples: int | None = None, min_lr: float | None = None) -> LRSchedule | StepLRSchedule:
    """The configuration's schedule over `total_samples` samples, or -- given `total_steps` --
    over optimizer steps. One vocabulary for both: the horizon (`total_samples` | `total_steps`),
    the warmup in the same unit (`warmup_samples` | `warmup_steps`; default: the configuration's
    warmup_fraction of the horizon) and `min_lr`, the LR value the cosine ends at (default: the
    configuration's min_lr_ratio × the first group's base LR).

    schedule='constant' is the base LR at every step, as a script's ``decay_lr = False`` is: it
    takes the same arguments as the cosine (so one prepare() call serves both) and its shape
    reads none of the warmup and min_lr, as that script's loop leaves them unread; the horizon,
    where given, still ends `done()`."""
    if total_samples is None and total_steps is None and config.schedule == "constant":
        # a constant LR has no horizon to state; decay_steps is never read by its shape
        return StepLRSchedule(decay_steps=1, kind="constant", lr_scaling=config.scales_lr,
                              base_batch_size=base_batch_size)
    if (total_samples is None) == (total_steps is None):
        raise ValueError(f"total_samples={total_samples!r}, total_steps={total_steps!r} is invalid: allowed exactly "
                         "one of them (the schedule's horizon in samples, or in optimizer steps; neither only with "
                         "OptimizationConfig.schedule='constant')")
    if total_samples is not None:
        if isinstance(total_samples, bool) or not isinstance(total_samples, int) or total_samples < 1:
            raise ValueError(f"total_samples={total_samples!r} is invalid: allowed an integer >= 1")
        if warmup_steps is not None:
            raise ValueError(f"warmup_steps={warmup_steps!r} is invalid with total_samples: allowed warmup_samples "
                             "(the warmup in the horizon's unit), or total_steps with warmup_steps")
        fraction = config.warmup_fraction
        if warmup_samples is not None:
            if (isinstance(warmup_samples, bool) or not isinstance(warmup_samples, int)
                    or not 0 <= warmup_samples < total_samples):
                raise ValueError(f"warmup_samples={warmup_samples!r} is invalid: allowed an integer in [0, total_samples) "
                                 f"= [0, {total_samples})")
            fraction = warmup_samples / total_samples
        return LRSchedule(total_samples=total_samples, kind=config.schedule, warmup_fraction=fraction,
                          min_lr_ratio=_min_lr_ratio(config, min_lr, base_lr), lr_scaling=config.scales_lr,
                          base_batch_size=base_batch_size)
    if warmup_samples is not None:
        raise ValueError(f"warmup_samples={warmup_samples!r} is invalid with total_steps: allowed warmup_steps "
                         "(the warmup in the horizon's unit), or total_samples with warmup_samples")
    if warmup_steps is None:
        warmup_steps = int(round(config.warmup_fraction * total_steps)) if isinstance(total_steps, int) else 0
    ratio = _min_lr_ratio(config, min_lr, base_lr)
    return StepLRSchedule(decay_steps=total_steps, kind=config.schedule, warmup_steps=warmup_steps, min_lr_ratio=ratio,
                          lr_scaling=config.scales_lr, base_batch_size=base_batch_size)


def _min_lr_ratio(config, min_lr: float | None, base_lr: float) -> float:
    """`min_lr` (an LR value) as a fraction of the base LR; default the configuration's min_lr_ratio
    (a constant schedule, which never decays to it, reads neither)."""
    if min_lr is None or config.schedule == "constant":
        return config.min_lr_ratio
    if not 0.0 <= min_lr <= base_lr:
        raise ValueError(f"min_lr={min_lr!r} is invalid: allowed an LR in [0, base LR = {base_lr!r}]")
    return min_lr / base_lr if base_lr > 0 else 0.0


def remember_base_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each group's LR as the user configured it: the η_base that eqs. 10-11 multiply."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return [group["initial_lr"] for group in optimizer.param_groups]


def lrs_may_be_a_checkpoints(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's LRs may be a loaded checkpoint's rather than the ones it was built
    with: it holds state (loaded, or stepped before) and not every group records its
    'initial_lr' (torch's LR schedulers and `remember_base_lrs` do; a state_dict carries it)."""
    return bool(optimizer.state) and not all("initial_lr" in group for group in optimizer.param_groups)


def scaled_base_lrs(lr: float | list[float], base_lrs: list[float]) -> list[float]:
    """Base LRs from a given `lr`: one per group, or the first group's, the others keeping their
    ratio to it in `base_lrs`."""
    values = list(lr) if isinstance(lr, (list, tuple)) else [lr]
    if len(values) not in (1, len(base_lrs)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"lr={lr!r} is invalid: allowed a finite LR > 0 (the first parameter group's), or a list "
                         f"of {len(base_lrs)}, one per group")
    if len(values) == len(base_lrs):
        return [float(v) for v in values]
    return [base * values[0] / base_lrs[0] for base in base_lrs]


def set_lr(optimizer: torch.optim.Optimizer, base_lrs: list[float], multiplier: float) -> None:
    for group, base_lr in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base_lr * multiplier


def clip_gradients(parameters, clip_norm: float | None) -> torch.Tensor:
    """Eq. 12 on the (already unscaled) gradients; returns the pre-clip global L2 norm."""
    parameters = [p for p in parameters if p.grad is not None]
    if clip_norm is None:
        return torch.nn.utils.get_total_norm([p.grad for p in parameters])
    return torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
