"""The DeepSpeed config an `OptimizationConfig` becomes (`deepspeed_config`), the ZeRO bucket
sizes fitted to the model (`zero_bucket_sizes`), and what a ZeRO stage partitions
(`zero_partitioning`). Plain dicts and strings: DeepSpeed itself is not imported here.
"""
from __future__ import annotations

import math

from ..config import OptimizationConfig

# DeepSpeed's fp16 loss-scale floor (its fp16.min_loss_scale takes integers only; GradScaler's
# floor, precision.MIN_LOSS_SCALE, is lower).
DEEPSPEED_MIN_LOSS_SCALE = 1
# DeepSpeed's default ZeRO bucket size (elements), and the smallest bucket we size to a model.
DEEPSPEED_DEFAULT_BUCKET_ELEMENTS = 500_000_000
MIN_BUCKET_ELEMENTS = 65_536


def zero_bucket_sizes(num_parameters: int) -> dict[str, int]:
    """ZeRO-1/2 bucket sizes (elements) for a model with `num_parameters` trainable parameters.

    DeepSpeed's default of 5e8 elements allocates a reduce buffer of that size (1 GB in fp16,
    2 GB in fp32) whatever the model: on a 4M-parameter model a ZeRO-2 run's memory would be the
    bucket, not ZeRO. A bucket of the parameter count holds all gradients -- one reduction per
    step, as with the default on such a model -- and costs at most one more gradient copy.
    Capped at DeepSpeed's default (large models keep its bucketing); at least
    `MIN_BUCKET_ELEMENTS` (256 KiB in fp32: tiny models keep a bucket of useful size).
    """
    if not isinstance(num_parameters, int) or isinstance(num_parameters, bool) or num_parameters < 0:
        raise ValueError(f"num_parameters={num_parameters!r} is invalid: allowed an integer >= 0")
    size = min(max(num_parameters, MIN_BUCKET_ELEMENTS), DEEPSPEED_DEFAULT_BUCKET_ELEMENTS)
    return {"reduce_bucket_size": size, "allgather_bucket_size": size}


def deepspeed_config(config: OptimizationConfig, *, micro_batch_size: int, k: int, num_parameters: int) -> dict:
    """The DeepSpeed config dict for `config` (k: the starting gradient_accumulation_steps;
    num_parameters: the model's trainable parameters, which size the ZeRO buckets).

    fp16 follows torch.amp.GradScaler's dynamic loss scaling (eqs. 15-16): loss_scale 0 means
    dynamic, 2^initial_scale_power to start, ×2 after loss_scale_window clean steps, and
    hysteresis 1 halves the scale on the first overflow (DeepSpeed's default 2 waits for a second).
    ZeRO stages 1-2 get `zero_bucket_sizes(num_parameters)` as reduce/allgather bucket sizes.
    """
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size!r} is invalid: allowed an integer >= 1")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is invalid: allowed an integer >= 1")
    zero: dict = {"stage": config.zero_stage}
    buckets = zero_bucket_sizes(num_parameters)  # validates num_parameters for every stage
    if config.zero_stage > 0:
        zero.update(buckets)
    ds_config: dict = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": k,
        "gradient_clipping": float(config.clip_norm) if config.clip_norm is not None else 0.0,
        "zero_optimization": zero,
        # ZeRO-1/2 partition whatever torch optimizer the user built; DeepSpeed only lists
        # Adam/AdamW/Adagrad as tested and refuses the others without this flag.
        "zero_allow_untested_optimizer": True,
    }
    if config.precision == "fp16":
        power = math.log2(config.initial_loss_scale)
        if power != int(power):
            raise ValueError(
                f"OptimizationConfig.initial_loss_scale={config.initial_loss_scale!r} is invalid for "
                "DeepSpeed: allowed a power of two (DeepSpeed sets it as 2^initial_scale_power)"
            )
        ds_config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": int(power),
            "loss_scale_window": config.loss_scale_growth_interval,
            "hysteresis": 1,
            # DeepSpeed takes only an integer floor; at it, one more overflow raises its error,
            # which the engine reports as a collapsed loss scale (precision.check_loss_scale).
            "min_loss_scale": DEEPSPEED_MIN_LOSS_SCALE,
        }
    elif config.precision == "bf16":
        ds_config["bf16"] = {"enabled": True}
    return ds_config


def zero_partitioning(zero_stage: int, world_size: int) -> str:
    """What a DeepSpeed engine at `zero_stage` partitions over `world_size` processes."""
    if zero_stage == 0:
        if world_size == 1:
            return "none: ZeRO stage 0, single process"
        return f"none: ZeRO stage 0 (DeepSpeed data parallel over {world_size} processes)"
    if world_size == 1:
        return f"ZeRO-{zero_stage} requested; 1 process: nothing partitioned"
    what = "optimizer state" if zero_stage == 1 else "optimizer state and gradients"
    return f"ZeRO-{zero_stage} over {world_size} processes ({what} partitioned)"
