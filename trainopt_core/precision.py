"""Mixed precision (eqs. 13-17) with torch.amp.

Autocast keeps the parameters -- the master weights of eq. 13 -- in FP32 and runs eligible ops
in FP16/BF16; fp16 adds torch.amp.GradScaler's dynamic loss scaling (eqs. 15-16): initial scale
2^16, ×2 after `growth_interval` clean steps, ×0.5 and skip the step on inf/nan.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

from .config import OptimizationConfig

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(device: torch.device, precision: str):
    """The forward-pass context for `precision` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def make_grad_scaler(device: torch.device, config: OptimizationConfig) -> torch.amp.GradScaler | None:
    """Dynamic loss scaling for fp16; None for fp32/bf16 (bf16 has fp32's exponent range)."""
    if config.precision != "fp16":
        return None
    if device.type == "cpu":
        warnings.warn(
            "fp16 autocast on CPU runs but is slow; bf16 is the fast reduced precision on CPU "
            "(OptimizationConfig.replace(precision='bf16')).",
            stacklevel=3,
        )
    return torch.amp.GradScaler(
        device.type,
        init_scale=config.initial_loss_scale,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=config.loss_scale_growth_interval,
    )
