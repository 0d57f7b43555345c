"""The gradient noise scale of one batch at fixed weights, and goodput: what `plan()` chooses
adaptive accumulation's starting k by.

`probe_noise_scale` measures B_simple = tr(Σ)/|G|² of a batch from its micro-batch gradients
(eq. 7 on one batch, with a jackknife interval), on one process or pooled over the processes of
a torch.distributed group; `goodput` is a step's samples/s times the statistical efficiency of
its batch against that noise scale (Pollux, Qiao et al. 2021; McCandlish et al. 2018). The
engine's running estimate during training is `accumulation.GradientNoiseMonitor`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

import torch

from .accumulation import _eq7
from .measure.stats import t_quantile_975


@dataclass(frozen=True)
class NoiseScaleProbe:
    """B_simple of one batch at fixed weights, with a 95 % interval (`probe_noise_scale`).

    `ci_high` is inf when the interval of |G|² reaches zero (the batch cannot tell the gradient
    from noise: the noise scale is at least `ci_low`); `b_simple` is inf when the point estimate
    of |G|² is not positive."""

    b_simple: float
    ci_low: float
    ci_high: float
    sigma_sq: float
    grad_sq: float
    micro_batch_size: float
    micro_batches: int

    @property
    def significant(self) -> bool:
        """Whether the interval is bounded: |G|² is known to be positive."""
        return math.isfinite(self.ci_high)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "significant": self.significant}


def _signal_to_noise(sq_sum: float, sum_sq: float, sizes: list[float]) -> tuple[float, float, float]:
    """(|G|²/(b σ²), σ², |G|²) of m micro-batch gradients given |Σ g_j|² and Σ |g_j|² (eq. 7)."""
    m = len(sizes)
    sigma_sq, grad_sq = _eq7(sum_sq, m, sq_sum / m**2)  # G_acc = S / m
    b = sum(sizes) / m
    return (grad_sq / (b * sigma_sq) if sigma_sq > 0 else math.inf), sigma_sq, grad_sq


def noise_scale_from_norms(sq_norms: list[float], dots_with_sum: list[float], sum_sq_norm: float,
                           sizes: list[float]) -> NoiseScaleProbe:
    """B_simple and its 95 % interval from m >= 3 micro-batch mean gradients g_j of one batch,
    given |g_j|², g_j · S and |S|² with S = Σ_j g_j (enough for every leave-one-out estimate).

    The interval is a delete-one jackknife on the ratio r = |G|²/(b σ²) = 1/B_simple, which is
    well-behaved where |G|² is near zero (B_simple is not); its t-interval (m - 1 degrees of
    freedom) is inverted, an upper end of r at or below zero giving an unbounded B_simple."""
    m = len(sq_norms)
    if m < 3 or len(dots_with_sum) != m or len(sizes) != m:
        raise ValueError(f"noise_scale_from_norms needs m >= 3 micro-batches with as many dots and sizes, got "
                         f"{m}, {len(dots_with_sum)}, {len(sizes)}")
    total_sq = sum(sq_norms)
    ratio, sigma_sq, grad_sq = _signal_to_noise(sum_sq_norm, total_sq, sizes)
    if not sigma_sq > 0:
        raise ValueError(f"the micro-batch gradients do not vary (σ² = {sigma_sq:.3g}): no noise scale to measure")
    leave_one_out = [_signal_to_noise(sum_sq_norm - 2 * dot + sq, total_sq - sq, sizes[:j] + sizes[j + 1:])[0]
                     for j, (sq, dot) in enumerate(zip(sq_norms, dots_with_sum))]
    pseudo = [m * ratio - (m - 1) * r for r in leave_one_out]
    centre = statistics.fmean(pseudo)
    half = t_quantile_975(m - 1) * statistics.stdev(pseudo) / math.sqrt(m)
    low, high = centre - half, centre + half
    return NoiseScaleProbe(b_simple=1.0 / ratio if ratio > 0 else math.inf,
                           ci_low=1.0 / high if high > 0 else math.inf, ci_high=1.0 / low if low > 0 else math.inf,
                           sigma_sq=sigma_sq, grad_sq=grad_sq, micro_batch_size=sum(sizes) / m, micro_batches=m)


def probe_noise_scale(model: torch.nn.Module, batch, loss_fn, *, micro_batches: int = 16,
                      loss_takes_model: bool = False, seed: int = 0,
                      across_processes: bool = False) -> NoiseScaleProbe:
    """The gradient noise scale B_simple of `batch` at `model`'s current weights (FP32, train
    mode, weights left unchanged; gradients it leaves in `.grad` are cleared).

    The batch is split into `micro_batches` (default 16, at most one sample each) micro-batch
    mean gradients g_j. Two passes keep memory at two gradient copies: the first sums S = Σ g_j
    and |g_j|², the second recomputes each g_j (dropout masks replayed from a per-micro-batch
    seed) for g_j · S. `batch`/`loss_fn` as in `trainopt_core.plan`.

    `across_processes`: every process of the torch.distributed group calls it with its own share
    of the batch, and all return the same estimate from the micro-batches of every share: S is
    summed over the processes (one all-reduce) before the second pass, and each process's |g_j|²,
    g_j · S and sizes are gathered in rank order. Dropout seeds differ between the processes'
    micro-batches, which are then independent draws as on one process."""
    pooled = (across_processes and torch.distributed.is_available() and torch.distributed.is_initialized()
              and torch.distributed.get_world_size() > 1)
    size = len(batch[0])
    m = min(micro_batches, size)
    if m < (1 if pooled else 3):  # pooled, the m of all processes together must be >= 3 (checked on the whole)
        raise ValueError(f"micro_batches={micro_batches!r} with a batch of {size}: allowed >= 3 micro-batches "
                         f"(a batch of >= 3 samples; >= 1 on each process, >= 3 in all, across processes) "
                         "for the noise scale's interval")
    parts = list(zip(*(tensor.chunk(m) for tensor in batch)))
    parameters = [p for p in model.parameters() if p.requires_grad]
    device = parameters[0].device
    training = model.training
    model.train()

    def gradient(index: int, micro) -> list[torch.Tensor]:
        for p in parameters:
            p.grad = None
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed * 100_003 + index)
            if loss_takes_model:
                out = loss_fn(model, *micro)
            else:
                *inputs, target = micro
                out = loss_fn(model(*inputs), target)
            (out[0] if isinstance(out, tuple) else out).backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.detach().float() for p in parameters]

    def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return float(sum(torch.sum(x.double() * y.double()) for x, y in zip(a, b)))

    # each micro-batch its own dropout seed: rank r's follow those of the ranks before it, as one
    # process would number the micro-batches of all the shares laid end to end
    counts = _counts_over_processes(len(parts), device) if pooled else [len(parts)]
    first = sum(counts[:torch.distributed.get_rank()]) if pooled else 0
    try:
        total, sq_norms = None, []
        for index, micro in enumerate(parts, start=first):
            g = gradient(index, micro)
            sq_norms.append(dot(g, g))
            total = [t.clone() for t in g] if total is None else [t.add_(x) for t, x in zip(total, g)]
        if pooled:
            total = _summed_over_processes(total)
        dots = [dot(gradient(index, micro), total) for index, micro in enumerate(parts, start=first)]
    finally:
        for p in parameters:
            p.grad = None
        model.train(training)
    sizes = [float(len(micro[0])) for micro in parts]
    if pooled:
        sq_norms, dots, sizes = _gathered_over_processes(sq_norms, dots, sizes, counts=counts, device=device)
    return noise_scale_from_norms(sq_norms, dots, dot(total, total), sizes)


def _collective_device(device: torch.device) -> torch.device:
    return device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")  # gloo: CPU tensors


def _summed_over_processes(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor summed over the processes, in one all-reduce of their concatenation."""
    device = tensors[0].device
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(_collective_device(device))
    torch.distributed.all_reduce(flat)
    pieces = flat.to(device).split([t.numel() for t in tensors])
    return [piece.view_as(t) for piece, t in zip(pieces, tensors)]


def _counts_over_processes(count: int, device: torch.device) -> list[int]:
    """Every process's `count`, in rank order."""
    device = _collective_device(device)
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(counts, torch.tensor([count], dtype=torch.int64, device=device))
    return [int(c) for c in counts]


def _gathered_over_processes(*columns: list[float], counts: list[int], device: torch.device) -> tuple[list[float], ...]:
    """Every process's rows of `columns`, in rank order; process r holds counts[r] of them."""
    device = _collective_device(device)
    local = torch.tensor(list(zip(*columns)), dtype=torch.float64, device=device).reshape(-1, len(columns))
    padded = torch.cat([local, local.new_zeros(max(counts) - len(local), len(columns))])  # all_gather: equal shapes
    gathered = [torch.empty_like(padded) for _ in counts]
    torch.distributed.all_gather(gathered, padded)
    rows = [row for rank_rows, count in zip(gathered, counts) for row in rank_rows[:count].tolist()]
    return tuple(list(column) for column in zip(*rows))


def goodput(k: int, *, micro_batch_size: float, micro_s: float, optimizer_s: float, b_simple: float,
            reference_batch: float) -> dict:
    """Goodput of k micro-batches of b samples per optimizer step (Pollux, Qiao et al. 2021):
    the step's samples/s times the statistical efficiency of its batch M = k·b relative to
    `reference_batch` M0. Reaching a given loss takes samples in proportion to 1 + M/B_simple
    (McCandlish et al. 2018), so E = (B_simple + M0) / (B_simple + M), and 1 for an unbounded
    noise scale. With a step costing k·t_micro + t_optimizer, goodput peaks at
    k* = sqrt(B_simple · t_optimizer / (b · t_micro)): accumulation pays only where the
    optimizer step (with its gradient exchange) is a large part of the step or the noise scale
    is large."""
    batch = k * micro_batch_size
    samples_per_s = batch / (k * micro_s + optimizer_s)
    efficiency = 1.0 if math.isinf(b_simple) else (b_simple + reference_batch) / (b_simple + batch)
    return {"k": k, "effective_batch": batch, "samples_per_s": samples_per_s, "statistical_efficiency": efficiency,
            "goodput": samples_per_s * efficiency}
