"""`plan()`'s arguments checked before anything is built: each refusal names the argument, the
value and what is allowed (`_errors.fail`). Every argument is checked for its type (a string is
no flag: `try_compile="no"` would be truthy) and its range."""
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
    ks: tuple[int, ...] | None


def positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_arguments(model, optimizer_factory, batch, loss_fn, *, loss_takes_model, device, memory_budget_bytes,
                    weights, ks, speed_options, try_compile, adaptive_accumulation, k_max, run_samples, windows,
                    steps_per_window, planning_memory_bytes, progress, base, optimizer_takes_model,
                    time_budget_s) -> Resolved:
    """Refuses what plan() cannot use; returns what it resolves."""
    _check_flags(loss_takes_model=loss_takes_model, speed_options=speed_options,
                 adaptive_accumulation=adaptive_accumulation, progress=progress,
                 optimizer_takes_model=optimizer_takes_model)
    if try_compile is not None and not isinstance(try_compile, bool):
        fail("try_compile", try_compile, "None (on CUDA only), True or False")
    _check_callables(model, optimizer_factory, loss_fn)
    size = _check_batch(batch, loss_takes_model)
    _check_numbers(memory_budget_bytes=memory_budget_bytes, run_samples=run_samples, windows=windows,
                   steps_per_window=steps_per_window, k_max=k_max, planning_memory_bytes=planning_memory_bytes,
                   time_budget_s=time_budget_s)
    if ks is not None:
        if isinstance(ks, (str, bytes)) or not hasattr(ks, "__iter__"):
            fail("ks", ks, "None (the powers of two up to 8 that divide the batch) or a sequence of integers >= 1")
        ks = tuple(ks)
        if not ks or not all(is_int(k) and k >= 1 for k in ks):
            fail("ks", ks, "None (the powers of two up to 8 that divide the batch) or a sequence of integers >= 1")
    weights = tuple(weights) if hasattr(weights, "__iter__") and not isinstance(weights, (str, bytes)) else weights
    if not isinstance(weights, tuple) or any(isinstance(w, bool) for w in weights):
        fail("weights", weights, "three finite numbers >= 0 (time, memory, energy) with time + memory > 0")
    weights = check_weights(weights)
    if base is not None and not isinstance(base, OptimizationConfig):
        fail("base", type(base).__name__, "None or an OptimizationConfig (the script's own configuration)")
    if base is not None and base.adaptive and not adaptive_accumulation:
        fail("base", "an OptimizationConfig with adaptive=True", "with adaptive_accumulation=True (k is then chosen "
             "by goodput), or a base with adaptive=False")
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if adaptive_accumulation and (size < 2 or size * world < 6):
        fail("batch", f"a batch of {size}" + (f" on each of {world} processes" if world > 1 else ""),
             "with adaptive_accumulation, >= 6 samples in all (>= 3 micro-batches for the noise scale's interval, "
             "split into >= 2), >= 2 on each process")
    device = _device(device, model)
    return Resolved(device=device, weights=weights, world=world, min_k=smallest_k(adaptive_accumulation, world),
                    try_compile=device.type == "cuda" if try_compile is None else try_compile, batch_size=size, ks=ks)


def _check_flags(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            fail(name, value, "True or False")


def _check_callables(model, optimizer_factory, loss_fn) -> None:
    if not isinstance(model, torch.nn.Module):
        fail("model", type(model).__name__, "a torch.nn.Module")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        fail("model", "a DistributedDataParallel", "the plain module (on more than one process every candidate is "
             "wrapped as it needs: DDP, or DeepSpeed at its ZeRO stage)")
    if not any(True for _ in model.parameters()):
        fail("model", type(model).__name__, "a module with parameters to train")
    for name, value, allowed in (("optimizer_factory", optimizer_factory, "a callable building the optimizer from "
                                  "parameters (or, with optimizer_takes_model, from the model)"),
                                 ("loss_fn", loss_fn, "a callable returning the mean loss")):
        if not callable(value):
            fail(name, type(value).__name__, allowed)


def _check_batch(batch, loss_takes_model: bool) -> int:
    """The batch size, after refusing a batch that is not (inputs..., targets) of equal first dimensions."""
    if (not isinstance(batch, (tuple, list)) or len(batch) < (1 if loss_takes_model else 2)
            or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in batch)):
        fail("batch", type(batch).__name__, "a sequence (inputs..., targets) of tensors with a batch dimension (with "
             "loss_takes_model, of at least one tensor)")
    size = len(batch[0])
    if size < 1 or any(len(t) != size for t in batch):
        fail("batch", [tuple(t.shape) for t in batch], "tensors with the same first dimension (the batch size) >= 1")
    return size


def _check_numbers(*, memory_budget_bytes, run_samples, windows, steps_per_window, k_max, planning_memory_bytes,
                   time_budget_s) -> None:
    for name, value, allowed in (
            ("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0"),
            ("planning_memory_bytes", planning_memory_bytes,
             "None (on CUDA 90 % of the free memory, elsewhere no limit) or a number of bytes > 0"),
            ("time_budget_s", time_budget_s, "None (no limit) or a number of seconds > 0 (planning time)")):
        if value is not None and not positive_number(value):
            fail(name, value, allowed)
    if run_samples is not None and not (is_int(run_samples) and run_samples >= 1):
        fail("run_samples", run_samples, "None (the run's length unknown) or an integer >= 1 (samples the run trains on)")
    for name, value in (("windows", windows), ("steps_per_window", steps_per_window)):
        if value is not None and not (is_int(value) and value >= 1):
            fail(name, value, "None (sized to the device) or an integer >= 1")
    if not (is_int(k_max) and k_max >= 2):
        fail("k_max", k_max, "an integer >= 2 (the largest k adaptive accumulation may reach)")


def _device(device, model) -> torch.device:
    """The device to plan on: `device`, else the model's."""
    if device is not None and not isinstance(device, (str, torch.device)):
        fail("device", device, "None (the model's), a torch.device or a device name ('cpu', 'cuda', 'cuda:1')")
    try:
        device = torch.device(device) if device is not None else next(model.parameters()).device
    except RuntimeError:
        fail("device", device, "None (the model's), a torch.device or a device name ('cpu', 'cuda', 'cuda:1')")
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("device", str(device), "a device this machine has (torch.cuda.is_available() is False here; 'cpu')")
    return device
