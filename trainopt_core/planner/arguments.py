"""`plan()`'s arguments checked before anything is built: each refusal names the argument, the
value and what is allowed (`_errors.fail`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._errors import fail
from ..config import OptimizationConfig
from .adaptive import smallest_k
from .choice import check_weights


@dataclass(frozen=True)
class Resolved:
    """What the checks resolve: the device, eq. 3's weights, the processes, the fewest
    micro-batches a plan may choose and whether torch.compile is tried."""

    device: torch.device
    weights: tuple[float, float, float]
    world: int
    min_k: int
    try_compile: bool
    batch_size: int


def positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def check_arguments(model, batch, *, loss_takes_model, device, memory_budget_bytes, weights, run_samples, windows,
                    steps_per_window, adaptive_accumulation, k_max, planning_memory_bytes, base,
                    try_compile, time_budget_s) -> Resolved:
    """Refuses what plan() cannot use; returns what it resolves."""
    if base is not None and not isinstance(base, OptimizationConfig):
        fail("base", type(base).__name__, "None or an OptimizationConfig (the script's own configuration)")
    if base is not None and base.adaptive and not adaptive_accumulation:
        fail("base", "an OptimizationConfig with adaptive=True", "with adaptive_accumulation=True (k is then chosen "
             "by goodput), or a base with adaptive=False")
    if not batch or len(batch) < (1 if loss_takes_model else 2) or not all(isinstance(t, torch.Tensor) for t in batch):
        fail("batch", type(batch).__name__, "a sequence (inputs..., targets) of tensors (with loss_takes_model, "
             "of at least one tensor)")
    size = len(batch[0])
    if any(len(t) != size for t in batch):
        fail("batch", [tuple(t.shape) for t in batch], "tensors with the same first dimension (the batch size)")
    if memory_budget_bytes is not None and not positive_number(memory_budget_bytes):
        fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0")
    weights = check_weights(weights)
    if run_samples is not None and (not isinstance(run_samples, int) or isinstance(run_samples, bool) or run_samples < 1):
        fail("run_samples", run_samples, "None (the run's length unknown) or an integer >= 1 (samples the run trains on)")
    for argument, value in (("windows", windows), ("steps_per_window", steps_per_window)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            fail(argument, value, "None (sized to the device) or an integer >= 1")
    if adaptive_accumulation and (not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 2):
        fail("k_max", k_max, "an integer >= 2 (the largest k adaptive accumulation may reach)")
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if adaptive_accumulation and (size < 2 or size * world < 6):
        fail("batch", f"a batch of {size}" + (f" on each of {world} processes" if world > 1 else ""),
             "with adaptive_accumulation, >= 6 samples in all (>= 3 micro-batches for the noise scale's interval, "
             "split into >= 2), >= 2 on each process")
    if time_budget_s is not None and not positive_number(time_budget_s):
        fail("time_budget_s", time_budget_s, "None (no limit) or a number of seconds > 0 (planning time)")
    if planning_memory_bytes is not None and not positive_number(planning_memory_bytes):
        fail("planning_memory_bytes", planning_memory_bytes,
             "None (on CUDA 90 % of the free memory, elsewhere no limit) or a number of bytes > 0")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("device", str(device), "a device this machine has (torch.cuda.is_available() is False here; 'cpu')")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        fail("model", "a DistributedDataParallel", "the plain module (on more than one process every candidate is "
             "wrapped as it needs: DDP, or DeepSpeed at its ZeRO stage)")
    return Resolved(device=device, weights=weights, world=world, min_k=smallest_k(adaptive_accumulation, world),
                    try_compile=device.type == "cuda" if try_compile is None else try_compile, batch_size=size)
