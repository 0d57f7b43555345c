"""Variance-aware gradient accumulation (eqs. 4-9).

Per-micro-batch squared gradient norms come from tensor hooks on the parameters: a hook sees
each micro-batch's gradient before autograd adds it into `.grad`, so |g_j|² is a reduction of a
tensor that exists anyway -- no per-micro-batch gradient copies (which would cost the memory
that accumulation is meant to save).

With micro-batch gradients g_1..g_k (each a mean over its micro-batch of b items) and the
accumulated gradient G = mean_j g_j:

  eq. 7   σ²     = 1/(k-1) Σ_j |g_j - G|²  =  (Σ_j |g_j|² - k |G|²) / (k-1)
          |G|²   ≈ |G_acc|² - σ²/k         (E|G_acc|² = |G_true|² + σ²/k: unbiased estimate)
          B_simple = tr(Σ)/|G|² = b σ² / |G|²    (McCandlish et al. 2018, with tr(Σ) ≈ b σ²)
  eq. 6   k      = clip(⌈σ² / (σ_target² + ε)⌉, k_min, k_max)
          σ_target² = sigma_target²            (absolute)
          σ_target² = sigma_target² · |G|²     (relative: k ≈ B_simple / (sigma_target² b))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EPS = 1e-12


@dataclass
class NoiseEstimate:
    """One step's (or the EMA's) gradient-noise statistics, all in unscaled units."""

    sigma_sq: float          # eq. 7: variance of a micro-batch gradient around the accumulated one
    grad_sq: float           # unbiased |G|²
    micro_batch_size: float  # mean items per micro-batch (b)
    num_micro_batches: int

    @property
    def b_simple(self) -> float:
        """Gradient noise scale B_simple = tr(Σ)/|G|² (inf when |G|² is not positive)."""
        if self.grad_sq <= 0:
            return math.inf
        return self.micro_batch_size * self.sigma_sq / self.grad_sq


def estimate_noise(micro_sq_norms: list[float], micro_sizes: list[float], accumulated_sq_norm: float) -> NoiseEstimate:
    """Eq. 7 and the unbiased |G|² from per-micro-batch |g_j|² and |G_acc|².

    `micro_sq_norms[j]` is |g_j|² where g_j is micro-batch j's mean gradient; with unequal sizes
    the sizes weight nothing here (the estimate treats each micro-batch as one draw) but b is
    their mean.
    """
    k = len(micro_sq_norms)
    if k < 2:
        raise ValueError(f"estimate_noise needs >= 2 micro-batch gradients (eq. 7), got {k}")
    sigma_sq = max((sum(micro_sq_norms) - k * accumulated_sq_norm) / (k - 1), 0.0)
    grad_sq = accumulated_sq_norm - sigma_sq / k
    return NoiseEstimate(sigma_sq, grad_sq, sum(micro_sizes) / k, k)


def choose_k(estimate: NoiseEstimate, *, sigma_target: float, mode: str, k_min: int, k_max: int) -> int:
    """Eq. 6, clipped to [k_min, k_max]."""
    if mode == "absolute":
        target_sq = sigma_target**2
    else:
        target_sq = sigma_target**2 * max(estimate.grad_sq, 0.0)
    if target_sq <= 0:  # |G|² estimate not positive: noise dominates, accumulate as much as allowed
        return k_max
    k = math.ceil(estimate.sigma_sq / (target_sq + EPS))
    return int(min(k_max, max(k_min, k)))


class GradientNoiseMonitor:
    """Collects per-micro-batch |g_j|² with parameter hooks and keeps EMA-smoothed estimates.

    Per micro-batch: `begin_micro_batch(device, grad_to_mean, items)` before its backward, where
    grad_to_mean turns the hooked gradient (loss-scaled and batch-normalized) into the
    micro-batch's mean gradient. At the boundary: `micro_norms()` then `finish_step(|G_acc|², ...)`.
    Non-finite micro-batches (fp16 overflow) are dropped from the estimate.
    """

    def __init__(self, parameters, ema: float = 0.9):
        self.ema = ema
        self.smoothed: NoiseEstimate | None = None
        self.last: NoiseEstimate | None = None
        self._current: torch.Tensor | None = None
        self._micro: list[tuple[torch.Tensor, float, float]] = []
        self._handles = [p.register_hook(self._record) for p in parameters if p.requires_grad]

    def _record(self, grad: torch.Tensor) -> None:
        # Called once per parameter per backward with that micro-batch's gradient; returns None
        # so the gradient is left untouched. A parameter used twice (tied embeddings) gets one
        # call with the summed gradient.
        if self._current is not None:
            self._current += torch.linalg.vector_norm(grad, dtype=torch.float32).square()

    def begin_micro_batch(self, device: torch.device, grad_to_mean: float, items: float) -> None:
        self._current = torch.zeros((), dtype=torch.float32, device=device)
        self._micro.append((self._current, grad_to_mean, items))

    def micro_norms(self) -> list[tuple[float, float]]:
        """This process's (|g_j|², items) for the step so far (one device sync)."""
        if not self._micro:
            return []
        raw = torch.stack([sq for sq, _, _ in self._micro]).tolist()
        return [(sq * scale**2, items) for sq, (_, scale, items) in zip(raw, self._micro)]

    def finish_step(self, accumulated_sq_norm: float, micro: list[tuple[float, float]]) -> NoiseEstimate | None:
        """Updates the estimates from this step's micro-batch norms (all replicas' when given)."""
        self._micro, self._current = [], None
        micro = [(sq, n) for sq, n in micro if math.isfinite(sq)]
        if len(micro) < 2 or not math.isfinite(accumulated_sq_norm):
            return None
        estimate = estimate_noise([sq for sq, _ in micro], [n for _, n in micro], accumulated_sq_norm)
        self.last = estimate
        if self.smoothed is None:
            self.smoothed = estimate
        else:
            # EMA of numerator and denominator separately (McCandlish et al. 2018, app. A.1)
            a = self.ema
            self.smoothed = NoiseEstimate(
                a * self.smoothed.sigma_sq + (1 - a) * estimate.sigma_sq,
                a * self.smoothed.grad_sq + (1 - a) * estimate.grad_sq,
                estimate.micro_batch_size,
                estimate.num_micro_batches,
            )
        return self.smoothed

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
