"""Variance-aware gradient accumulation (eqs. 4-9).

Per-micro-batch squared gradient norms come from tensor hooks on the parameters: a hook sees
each micro-batch's gradient before autograd adds it into `.grad`, so |g_j|² is a reduction of a
tensor that exists anyway -- no per-micro-batch gradient copies (which would cost the memory
that accumulation is meant to save). The per-parameter squares are summed in float64.

With micro-batch gradients g_1..g_k (each a mean over its micro-batch of b items) and the
accumulated gradient G = mean_j g_j:

  eq. 7   σ²     = 1/(k-1) Σ_j |g_j - G|²  =  (Σ_j |g_j|² - k |G|²) / (k-1)
          |G|²   ≈ |G_acc|² - σ²/k         (E|G_acc|² = |G_true|² + σ²/k: unbiased estimate)
          B_simple = tr(Σ)/|G|² = b σ² / |G|²    (McCandlish et al. 2018, with tr(Σ) ≈ b σ²)
  eq. 6   k      = clip(⌈σ² / (σ_target² + ε)⌉, k_min, k_max)

One step's |G|² estimate is noise-dominated whenever the gradient noise scale exceeds the step's
batch (typical of small models on hard data), and the step-to-step magnitudes shrink by orders
of magnitude early in training, so an exponential average keeps the first steps' values for far
longer than its nominal horizon. The monitor therefore pools the last `window` steps with equal
weights (means of σ² and of |G|²; B_simple is their ratio, as McCandlish et al. recommend) and
calls the pooled estimate *significant* when the 95 % Student-t interval of the per-step |G|²
estimates lies above zero (and at least MIN_POOLED_STEPS steps are pooled). The noise-scale
reading of eq. 6 acts only on significant estimates, the variance reading (σ² only) once
MIN_POOLED_STEPS steps are pooled; otherwise k stays where it is and the step's record says why.

Readings of eq. 6 (`rule`):
  "noise_scale"  σ_target² = sigma_target² · |G|², so k ≈ B_simple / (sigma_target² b): the
                 accumulated batch follows the gradient noise scale, which grows as the loss
                 falls (McCandlish et al. 2018) -- k rises during training.
  "critical_batch"  the same reading with sigma_target = 1 unless one is configured, never
                 calibrated: k·b ≈ B_simple, so k grows only while the effective batch is below
                 the measured noise scale (past it a larger batch trades optimizer steps for
                 little: McCandlish et al.'s critical batch).
  "variance"     σ_target² = sigma_target² (absolute, eq. 6 as printed): k follows the
                 micro-batch gradient variance, which is largest early -- k falls during
                 training, as the paper's text describes ("increases accumulation steps when
                 gradients exhibit high variance (early training)").
`calibrate_sigma_target` sets sigma_target from the first significant estimate so that eq. 6
reproduces the run's starting k there; later k follows the estimate relative to that point.
Both scales are model-specific (|∇L|² has the model's units), so this is what makes one
default configuration meaningful for a ResNet and a GPT-2 alike.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from dataclasses import dataclass

import torch

from .measure.stats import t_quantile_975
from ._errors import fail as _fail

EPS = 1e-12
K_RULES = ("noise_scale", "variance", "critical_batch")
MIN_POOLED_STEPS = 3  # the fewest per-step |G|² estimates whose spread gives an interval


@dataclass(frozen=True)
class NoiseEstimate:
    """Gradient-noise statistics, all in unscaled units: one step's, or pooled over `steps`.

    `grad_sq_half_width` is the half-width of the 95 % t-interval of the pooled |G|² (NaN for a
    single step, which has no interval)."""

    sigma_sq: float          # eq. 7: variance of a micro-batch gradient around the accumulated one
    grad_sq: float           # unbiased |G|²
    micro_batch_size: float  # mean items per micro-batch (b)
    num_micro_batches: int
    steps: int = 1
    grad_sq_half_width: float = math.nan

    @property
    def b_simple(self) -> float:
        """Gradient noise scale B_simple = tr(Σ)/|G|² (inf when |G|² is not positive)."""
        if self.grad_sq <= 0:
            return math.inf
        return self.micro_batch_size * self.sigma_sq / self.grad_sq

    @property
    def significant(self) -> bool:
        """Whether |G|² is known to be positive: >= MIN_POOLED_STEPS steps pooled and the 95 %
        interval of |G|² above zero. B_simple and eq. 6 mean something only then."""
        return (self.steps >= MIN_POOLED_STEPS and math.isfinite(self.grad_sq_half_width)
                and self.grad_sq - self.grad_sq_half_width > 0)


def estimate_noise(micro_sq_norms: list[float], micro_sizes: list[float], accumulated_sq_norm: float) -> NoiseEstimate:
    """Eq. 7 and the unbiased |G|² from per-micro-batch |g_j|² and |G_acc|² (one step).

    `micro_sq_norms[j]` is |g_j|² where g_j is micro-batch j's mean gradient; with unequal sizes
    the sizes weight nothing here (the estimate treats each micro-batch as one draw) but b is
    their mean. σ² is not clamped at zero (a clamp would bias the pooled mean upwards).
    """
    k = len(micro_sq_norms)
    if k < 2:
        raise ValueError(f"estimate_noise needs >= 2 micro-batch gradients (eq. 7), got {k}")
    sigma_sq, grad_sq = _eq7(sum(micro_sq_norms), k, accumulated_sq_norm)
    return NoiseEstimate(sigma_sq, grad_sq, sum(micro_sizes) / k, k)


def _eq7(sum_micro_sq_norms: float, k: int, accumulated_sq_norm: float) -> tuple[float, float]:
    """(σ², unbiased |G|²) from Σ_j |g_j|² over k micro-batches and |G_acc|² (eq. 7)."""
    sigma_sq = (sum_micro_sq_norms - k * accumulated_sq_norm) / (k - 1)
    return sigma_sq, accumulated_sq_norm - sigma_sq / k


def pool_estimates(estimates: list[NoiseEstimate]) -> NoiseEstimate:
    """Equal-weight pool of per-step estimates: mean σ², mean |G|² with its 95 % t half-width."""
    if not estimates:
        raise ValueError("pool_estimates needs >= 1 estimate")
    n = len(estimates)
    grad_sqs = [e.grad_sq for e in estimates]
    half = t_quantile_975(n - 1) * statistics.stdev(grad_sqs) / math.sqrt(n) if n > 1 else math.nan
    return NoiseEstimate(
        sigma_sq=statistics.fmean(e.sigma_sq for e in estimates),
        grad_sq=statistics.fmean(grad_sqs),
        micro_batch_size=statistics.fmean(e.micro_batch_size for e in estimates),
        num_micro_batches=estimates[-1].num_micro_batches,
        steps=n,
        grad_sq_half_width=half,
    )


def _target_sq(estimate: NoiseEstimate, sigma_target: float, rule: str) -> float:
    if rule == "variance":
        return sigma_target**2
    if rule in ("noise_scale", "critical_batch"):
        return sigma_target**2 * max(estimate.grad_sq, 0.0)
    _fail("rule", rule, f"one of {K_RULES}")


def choose_k(estimate: NoiseEstimate, *, sigma_target: float, rule: str, k_min: int, k_max: int) -> int:
    """Eq. 6, clipped to [k_min, k_max]. The noise-scale reading needs a significant estimate:
    with |G|² not positive it is undefined and this raises."""
    target_sq = _target_sq(estimate, sigma_target, rule)
    if target_sq <= 0:
        raise ValueError(f"eq. 6 needs a positive target variance; |G|² = {estimate.grad_sq:.3g} with rule={rule!r}")
    # the relative tolerance keeps a calibrated k (ratio exactly k up to rounding) at k
    k = math.ceil(estimate.sigma_sq / (target_sq + EPS) * (1 - 1e-9))
    return int(min(k_max, max(k_min, k)))


def calibrate_sigma_target(estimate: NoiseEstimate, *, rule: str, k: int) -> float:
    """The sigma_target for which eq. 6 gives `k` at `estimate` (significant, for "noise_scale").

    "variance": sigma_target² = σ²/k; "noise_scale": sigma_target² = σ²/(k |G|²) = B_simple/(k b).
    """
    if rule in ("noise_scale", "critical_batch") and not estimate.significant:
        raise ValueError("calibrate_sigma_target needs a significant estimate (|G|² interval above 0)")
    if not estimate.sigma_sq > 0:
        raise ValueError(f"calibrate_sigma_target needs σ² > 0, got {estimate.sigma_sq:.3g}")
    # eq. 6 at sigma_target = 1 gives σ²/unit; the target that gives k scales it by 1/k
    unit = _target_sq(estimate, 1.0, rule)
    return math.sqrt(estimate.sigma_sq / (k * unit))


def next_k(estimate: NoiseEstimate | None, *, k: int, sigma_target: float | None, rule: str, k_min: int,
           k_max: int) -> tuple[int, float | None, str]:
    """After a step: (the next step's k, sigma_target, why), from the pooled `estimate`.

    k holds while fewer than MIN_POOLED_STEPS steps are pooled, and under the noise-scale reading
    while |G|² is not significant (the reading would act on noise; the variance reading needs σ²
    only, which every step has). Otherwise eq. 6 chooses, with sigma_target calibrated at the
    first such estimate when none was configured (`calibrate_sigma_target`, at the current k)."""
    if estimate is None or estimate.steps < MIN_POOLED_STEPS:
        return k, sigma_target, f"held: fewer than {MIN_POOLED_STEPS} steps pooled"
    if rule in ("noise_scale", "critical_batch") and not estimate.significant:
        return k, sigma_target, "held: |G|² not significant"
    if sigma_target is None:
        sigma_target = 1.0 if rule == "critical_batch" else calibrate_sigma_target(estimate, rule=rule, k=k)
    return choose_k(estimate, sigma_target=sigma_target, rule=rule, k_min=k_min, k_max=k_max), sigma_target, "eq. 6"


def gather_noise_inputs(grad_sq: float, micro: list[tuple[float, float]], *, world_size: int,
                        device: torch.device) -> tuple[float, list[tuple[float, float]]]:
    """Rank 0's |G_acc|² and every replica's (|g_j|², items) per micro-batch, in rank order.

    The hooked norms are per-process; the accumulated gradient is the global mean after the
    boundary all-reduce, so replicas add draws to eq. 7's sample of micro-batch gradients. Every
    rank then runs eqs. 6-7 on the same gathered numbers -- rank 0's |G_acc|² too, in case the
    replicas' reduced gradients differ in the last bit -- so all pick the same k. One process:
    the inputs as they are."""
    if not (world_size > 1 and torch.distributed.is_initialized()):
        return grad_sq, micro
    # One float64 all_gather of rows [|G_acc|², 0], (|g_j|², n_j)...: the replicas agree on k,
    # so the shapes match. Tensors, not all_gather_object: torch's object collectives need
    # numpy, which an install of torch alone does not have.
    local = torch.tensor([(grad_sq, 0.0), *micro], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world_size)]
    torch.distributed.all_gather(gathered, local)
    rows = [rank_rows.tolist() for rank_rows in gathered]
    return rows[0][0][0], [(sq, items) for rank_rows in rows for sq, items in rank_rows[1:]]


def _norm_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


class GradientNoiseMonitor:
    """Collects per-micro-batch |g_j|² with parameter hooks and pools the last `window` steps.

    Per micro-batch: `begin_micro_batch(device, grad_to_mean, items)` before its backward, where
    grad_to_mean turns the hooked gradient (loss-scaled and batch-normalized) into the
    micro-batch's mean gradient. At the boundary: `micro_norms()` then `finish_step(|G_acc|², ...)`.
    Non-finite micro-batches (fp16 overflow) are dropped from the estimate.
    """

    def __init__(self, parameters, window: int = 8):
        if not isinstance(window, int) or window < 1:
            _fail("window", window, "an integer >= 1 (steps pooled)")
        self.window = window
        self.last: NoiseEstimate | None = None
        self.pooled: NoiseEstimate | None = None
        self._recent: collections.deque[NoiseEstimate] = collections.deque(maxlen=window)
        self._current: torch.Tensor | None = None
        self._micro: list[tuple[torch.Tensor, float, float]] = []
        self._handles = [p.register_hook(self._record) for p in parameters if p.requires_grad]

    def _record(self, grad: torch.Tensor) -> None:
        # Called once per parameter per backward with that micro-batch's gradient; returns None
        # so the gradient is left untouched. A parameter used twice (tied embeddings) gets one
        # call with the summed gradient. The norm is taken in at least float32 (float64 for
        # float64 gradients) and its square summed in float64.
        if self._current is not None:
            dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
            norm = torch.linalg.vector_norm(grad, dtype=dtype)
            self._current += norm.to(self._current.dtype).square()

    def begin_micro_batch(self, device: torch.device, grad_to_mean: float, items: float) -> None:
        device = torch.device(device)
        self._current = torch.zeros((), dtype=_norm_dtype(device), device=device)
        self._micro.append((self._current, grad_to_mean, items))

    def micro_norms(self) -> list[tuple[float, float]]:
        """This process's (|g_j|², items) for the step so far (one device sync; scales and item
        counts may be tensors on the device, read in the same transfer)."""
        if not self._micro:
            return []
        if not any(isinstance(value, torch.Tensor) for _, scale, items in self._micro for value in (scale, items)):
            raw = torch.stack([sq for sq, _, _ in self._micro]).tolist()
            return [(sq * scale**2, items) for sq, (_, scale, items) in zip(raw, self._micro)]
        device = self._micro[0][0].device
        dtype = _norm_dtype(device)
        rows = torch.stack([torch.stack([sq.to(dtype), torch.as_tensor(scale, dtype=dtype, device=device).reshape(()),
                                         torch.as_tensor(items, dtype=dtype, device=device).reshape(())])
                            for sq, scale, items in self._micro]).tolist()
        return [(sq * scale**2, items) for sq, scale, items in rows]

    def finish_step(self, accumulated_sq_norm: float, micro: list[tuple[float, float]]) -> NoiseEstimate | None:
        """Adds this step's estimate (from all replicas' micro-batch norms when given) to the
        window and returns the pooled estimate (None before the first usable step)."""
        self._micro, self._current = [], None
        micro = [(sq, n) for sq, n in micro if math.isfinite(sq)]
        if len(micro) >= 2 and math.isfinite(accumulated_sq_norm):
            self.last = estimate_noise([sq for sq, _ in micro], [n for _, n in micro], accumulated_sq_norm)
            self._recent.append(self.last)
            self.pooled = pool_estimates(list(self._recent))
        return self.pooled

    def state_dict(self) -> dict:
        """The pooled window (per-step estimates, oldest first) and the latest estimates.
        Only between optimizer steps: a half-collected step's norms are not state."""
        if self._micro:
            raise RuntimeError("GradientNoiseMonitor.state_dict() mid-step: allowed only between optimizer steps")
        as_dict = lambda e: None if e is None else dataclasses.asdict(e)  # noqa: E731
        return {"window": self.window, "recent": [as_dict(e) for e in self._recent],
                "last": as_dict(self.last), "pooled": as_dict(self.pooled)}

    def load_state_dict(self, state: dict) -> None:
        if state["window"] != self.window:
            _fail("state['window']", state["window"], f"this monitor's window ({self.window})")
        as_estimate = lambda d: None if d is None else NoiseEstimate(**d)  # noqa: E731
        self._recent = collections.deque((as_estimate(d) for d in state["recent"]), maxlen=self.window)
        self.last, self.pooled = as_estimate(state["last"]), as_estimate(state["pooled"])
        self._micro, self._current = [], None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
