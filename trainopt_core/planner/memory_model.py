"""The planner's memory model: a candidate's training-step peak predicted from one tracked fp32
step (eq. 8: activations scale with the micro-batch; eq. 19: checkpointing keeps a fraction of
them), used to prune candidates before they are built, and how much device memory the
candidates' copies may hold together."""
from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_leaves

from ..checkpointing import block_sequence, expected_saved_fraction
from ..measure.tracker import MemoryTracker, ddp_bucket_bytes, optimizer_state_tensors, storage_bytes
from .space import Candidate

CAPACITY_FRACTION = 0.9   # of a CUDA device's free memory, what the candidates' copies may use (fragmentation)


def default_capacity_bytes(device: torch.device) -> int | None:
    """What the candidates' copies may hold together: on CUDA `CAPACITY_FRACTION` of what the
    device has free now, counting what PyTorch's caching allocator has reserved but not handed
    out; elsewhere None (no limit: host memory is not the planner's to ration)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(CAPACITY_FRACTION * (free + cached))


@contextlib.contextmanager
def block_inputs_bytes(model):
    """Collects, for each call of one of the model's blocks, the bytes of its tensor inputs: what
    a checkpoint boundary keeps (β·A of eq. 19)."""
    seen: list[int] = []

    def record(_module, args, kwargs):
        seen.append(storage_bytes(tree_leaves((args, kwargs))))

    handles = [block.register_forward_pre_hook(record, with_kwargs=True) for block in block_sequence(model)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def calibrate(tracker: MemoryTracker, peak_bytes: int, batch_size: int, num_blocks: int | None,
               block_input_bytes: float | None) -> dict:
    """The baseline step's peak (less what was resident before it) split into what does not scale
    with the micro-batch (parameters, buffers, gradients, optimizer state) and what does
    (activations, temporaries), per sample; and eq. 19's β, a block's input over a block's share
    of the saved activations (all of them counted as the blocks', so β leans low)."""
    parts = tracker.breakdown_at_peak
    scaling = {key: parts.get(key, 0) / batch_size for key in ("activations", "temporaries")}
    fixed = peak_bytes - batch_size * sum(scaling.values())
    boundary_fraction = 1.0
    if num_blocks and block_input_bytes is not None and parts.get("activations"):
        boundary_fraction = min(1.0, block_input_bytes / (parts["activations"] / num_blocks))
    return {"fixed_bytes": fixed, "activation_bytes_per_sample": scaling["activations"],
            "temporary_bytes_per_sample": scaling["temporaries"], "num_blocks": num_blocks,
            "boundary_fraction": boundary_fraction}


def partitionable_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What ZeRO partitions, whole (a step's peak may come before the gradients exist): the
    optimizer's state as the step left it, and a gradient the size of each trainable parameter;
    and what it does without: a DDP wrapper's gradient buckets (DeepSpeed replaces DDP)."""
    return {"optimizer_state_bytes": storage_bytes(optimizer_state_tensors(optimizer)),
            "gradient_bytes": storage_bytes(p for p in model.parameters() if p.requires_grad),
            "ddp_bucket_bytes": ddp_bucket_bytes(model)}


def predict(calibration: dict, candidate: Candidate, batch_size: int, world_size: int = 1) -> float:
    """Eq. 8 (activations of one micro-batch of B/k samples) and eq. 19 (checkpointing keeps a
    fraction of them, with the measured β). Reduced precision is taken to halve what scales with
    the batch (autocast keeps FP32 weights, so eq. 17's halving of weights and gradients is not
    assumed). Meant to prune, so it leans low: temporaries are scaled like activations, and the
    selective policy is taken to keep what full checkpointing keeps. ZeRO-1 keeps 1/W of the
    optimizer state on each of `world_size` processes, ZeRO-2 also 1/W of the gradients, and
    neither has DDP's gradient buckets (DeepSpeed's own buffers not counted: it leans low)."""
    activations = calibration["activation_bytes_per_sample"] * batch_size / candidate.k
    if candidate.checkpointing is not None and calibration["num_blocks"]:
        activations *= min(1.0, checkpointed_fraction(calibration["num_blocks"], candidate.checkpointing,
                                                      calibration.get("boundary_fraction", 1.0)))
    temporaries = calibration["temporary_bytes_per_sample"] * batch_size / candidate.k
    factor = 1.0 if candidate.precision == "fp32" else 0.5
    return (calibration["fixed_bytes"] - zero_saving_bytes(calibration, candidate.zero_stage, world_size)
            + factor * (activations + temporaries))


def checkpointed_fraction(num_blocks: int, segments, boundary_fraction: float) -> float:
    """Eq. 19's fraction of the activations a checkpointed step holds at its peak, less the one
    boundary eq. 19 counts twice: the segment recomputed in backward saves its own input again
    (its first op keeps it: a Linear, convolution or LayerNorm does), and that input is the
    boundary already held. Without this, checkpointing every block of a 10-block MLP was predicted
    3.2 % above its measured peak (3,652,830 against 3,540,804 bytes), where the model must lean low."""
    return expected_saved_fraction(num_blocks, segments, boundary_fraction) - boundary_fraction / num_blocks


def zero_saving_bytes(calibration: dict, zero_stage: int, world_size: int) -> float:
    """What ZeRO at `zero_stage` takes off each of `world_size` processes, measured against DDP:
    all but 1/W of the optimizer state (stage >= 1) and of the gradients (stage 2), and DDP's
    gradient buckets (DeepSpeed reduces through buffers of its own)."""
    if not zero_stage:
        return 0.0
    return ((1 - 1 / world_size) * (calibration.get("optimizer_state_bytes", 0)
                                    + calibration.get("gradient_bytes", 0) * (zero_stage >= 2))
            + calibration.get("ddp_bucket_bytes", 0))
