"""`prepare()`: compose the configured components around a user's model and optimizer.

It applies √L activation checkpointing (eqs. 18-20) when the configuration asks for it, makes a
DDP model all-reduce in the reduced precision (eq. 17), and picks the engine: the torch-native
`TrainingEngine` (one process or DDP) or DeepSpeed's ZeRO stage 0/1/2 behind the same interface.
"""
from __future__ import annotations

import importlib.util

import torch

from . import precision as mp
from ._caller import warn_at_caller
from ._errors import fail
from .checkpointing import (SUPPORTED_MODELS, apply_activation_checkpointing, block_sequence, has_block_sequence,
                            unalias_checkpoint_blocks)
from .config import OptimizationConfig, use_expandable_segments
from .engine import TrainingEngine, model_device
from .engine_arguments import EngineArguments, is_count

BACKENDS = ("torch", "deepspeed", "auto")


def deepspeed_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def _to_channels_last(model: torch.nn.Module) -> None:
    if not any(p.dim() == 4 for p in model.parameters()):
        raise ValueError("memory_format='channels_last' is invalid for a model without 4-D (convolution) weights: "
                         "allowed 'contiguous'")
    model.to(memory_format=torch.channels_last)


def use_optimizer_impl(optimizer: torch.optim.Optimizer, impl: str) -> None:
    """Switch a built torch optimizer to its ``foreach`` or ``fused`` kernels, in place, as its
    constructor would have (Adam, AdamW, SGD and others take both flags)."""
    if impl not in ("foreach", "fused"):
        raise ValueError(f"impl={impl!r} is invalid: allowed 'foreach' or 'fused'")
    if impl not in optimizer.defaults:
        raise ValueError(f"optimizer_impl={impl!r} is invalid for {type(optimizer).__name__}, which has no "
                         f"{impl!r} option: allowed 'default'")
    if impl == "fused":
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        supported = _get_fused_kernels_supported_devices()
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.device.type not in supported or not torch.is_floating_point(param):
                    raise ValueError(f"optimizer_impl='fused' is invalid for a {param.dtype} parameter on "
                                     f"{param.device.type}: fused kernels take floating-point parameters on "
                                     f"{supported}; allowed 'default' or 'foreach'")
    for settings in (optimizer.defaults, *optimizer.param_groups):
        settings["foreach"] = impl == "foreach"
        settings["fused"] = impl == "fused"
    if impl == "fused":
        optimizer._step_supports_amp_scaling = True  # the fused step unscales and skips inf itself


def _device_available(device: torch.device) -> bool:
    """Whether this machine has `device` (a CUDA GPU of that index, an MPS or XPU device, ...)."""
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return torch.backends.mps.is_available()
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "is_available") or not backend.is_available():
        return False
    return device.index is None or device.index < backend.device_count()


def _check_device(device) -> None:
    here = ["'cpu'"] + ([f"'cuda', 'cuda:N' for N < {torch.cuda.device_count()}"] if torch.cuda.is_available() else [])
    allowed = f"None (the model's device) or a device this machine has: {', '.join(here)}"
    if not isinstance(device, (str, torch.device)):
        fail("device", device, allowed)
    try:
        parsed = torch.device(device)
    except RuntimeError:
        fail("device", device, allowed)
    if not _device_available(parsed):
        fail("device", device, allowed + ("" if torch.cuda.is_available() else " (torch.cuda.is_available() is False)"))


def _check_arguments(model, optimizer, config, *, device, world_size, checkpoint_model, backend) -> None:
    """prepare()'s arguments, each refused naming it and what is allowed (the run's shape and
    schedule are `EngineArguments`' to check, how the horizon and warmup combine the schedule's)."""
    if not isinstance(model, torch.nn.Module):
        fail("model", model, "a torch.nn.Module (or a DistributedDataParallel of one)")
    if not isinstance(optimizer, torch.optim.Optimizer):
        fail("optimizer", optimizer, "a torch.optim.Optimizer over the model's parameters")
    if not isinstance(config, OptimizationConfig):
        fail("config", config, "an OptimizationConfig")
    if device is not None:
        _check_device(device)
    if world_size is not None and not is_count(world_size):
        fail("world_size", world_size, "None (torch.distributed's) or an integer >= 1")
    if checkpoint_model is not None and not isinstance(checkpoint_model, torch.nn.Module):
        fail("checkpoint_model", checkpoint_model, "None (the model) or the torch.nn.Module whose blocks are checkpointed")
    if backend not in BACKENDS or not isinstance(backend, str):
        fail("backend", backend, f"one of {BACKENDS}")
    _check_optimizer_trains_model(model, optimizer)


def _check_optimizer_trains_model(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """ValueError naming `optimizer` where it holds parameters that are not the model's: the
    engine would step them and train nothing of the model (an optimizer built over another copy)."""
    own = {id(parameter) for parameter in model.parameters()}
    held = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    foreign = sum(id(parameter) not in own for parameter in held)
    if foreign:
        raise ValueError(
            f"optimizer={type(optimizer).__name__}(<{len(held)} parameters, {foreign} of them not the model's>) is "
            "invalid: allowed an optimizer over the model's own parameters, e.g. "
            f"{type(optimizer).__name__}(model.parameters(), ...) built after the model (a copy's parameters, or "
            "another model's, are not trained by the model's forward)")


def _resolved_world_size(world_size: int | None) -> int:
    """`world_size`, or torch.distributed's where None; ValueError naming it where it is > 1 and no
    initialized process group has that many processes (eq. 4's effective batch would count
    replicas that do not exist)."""
    dist = torch.distributed
    group = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    if world_size is None:
        return group or 1
    if world_size > 1 and group != world_size:
        where = (f"the initialized process group has {group} processes" if group is not None else
                 "no process group is initialized here: start the processes with trainopt_core.distributed "
                 "(run_processes, the launch CLI) or torchrun, which initialize one")
        fail("world_size", world_size, f"None (torch.distributed's), 1, or the size of the initialized process group "
             f"({where})")
    return world_size


def _apply_components(model: torch.nn.Module, target: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      config: OptimizationConfig) -> OptimizationConfig:
    """The configured components applied in place: √L checkpointing of `target`'s blocks (eqs.
    18-20), channels-last weights, the optimizer's kernels, compiling, and a DDP model's reduced-
    precision all-reduce (eq. 17). Returns the configuration that runs (checkpointing off where
    `target` has no known blocks)."""
    unalias_checkpoint_blocks(target)
    if config.checkpointing is not None and not has_block_sequence(target):
        # a preset (OptimizationConfig.optimized()) on a model whose blocks are unknown: run it
        # without checkpointing rather than stop, and say once how to turn it on
        warn_at_caller(
            f"activation checkpointing is off: {type(target).__name__} has no known block sequence "
            f"(supported: {'; '.join(SUPPORTED_MODELS)}). To turn it on, list the repeated blocks the "
            "forward calls back to back, as a plain list: model.checkpoint_blocks = list(model.transformer.h) (a "
            "list adds no second owner of their parameters to the state_dict).")
        config = config.replace(checkpointing=None)
    if config.checkpointing is not None:
        apply_activation_checkpointing(target, segments=config.checkpointing, policy=config.checkpoint_policy)
    if config.memory_format == "channels_last":
        _to_channels_last(target)
    if config.optimizer_impl != "default":
        use_optimizer_impl(optimizer, config.optimizer_impl)
    if config.compile:
        # in place: the caller's model object runs compiled ("reduce-overhead": in CUDA graphs);
        # scope "blocks": each repeated block instead, one compiled code for all (regional compilation)
        options = {} if config.compile_mode == "default" else {"mode": config.compile_mode}
        if config.compile_scope == "blocks":
            if not has_block_sequence(target):
                fail("OptimizationConfig.compile_scope", config.compile_scope,
                     f"'model' for {type(target).__name__}, whose repeated blocks are unknown (supported: "
                     f"{'; '.join(SUPPORTED_MODELS)}; or give it checkpoint_blocks, a list of its blocks)")
            for block in block_sequence(target):
                block.compile(**options)
        else:
            target.compile(**options)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and config.precision != "fp32":
        # eq. 17's halving applies to the gradient all-reduce too: communicate in fp16/bf16
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.bf16_compress_hook if config.precision == "bf16" else default_hooks.fp16_compress_hook
        model.register_comm_hook(None, hook)
    return config


def prepare(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: OptimizationConfig,
    *,
    total_samples: int | None = None,
    micro_batch_size: int,
    device: torch.device | str | None = None,
    world_size: int | None = None,
    checkpoint_model: torch.nn.Module | None = None,
    backend: str = "torch",
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    warmup_samples: int | None = None,
    min_lr: float | None = None,
) -> TrainingEngine:
    """Wrap an existing model and optimizer in the configured optimizations.

    Applies √L activation checkpointing to `checkpoint_model` (default: `model`, or its
    `.module` when `model` is DDP-wrapped) when `config.checkpointing` is set. A model whose
    blocks are unknown (`checkpointing.SUPPORTED_MODELS`; give it ``checkpoint_blocks``) runs
    without checkpointing, with one warning, so the presets work on any model; the engine's
    `config` says what runs. `world_size`
    defaults to torch.distributed's when a process group is initialized; a `world_size` > 1 needs an
    initialized process group of that size. The optimizer holds the model's own parameters.

    `backend`: "torch" -- the torch-native engine (one process, or DDP when `model` is a
    DistributedDataParallel); "deepspeed" -- a DeepSpeed engine running ZeRO stage
    `config.zero_stage` (pass the plain module; run the forward through `engine.model`);
    "auto" -- deepspeed when config.zero_stage > 0, world_size > 1 and deepspeed is installed.
    A DDP model in fp16/bf16 all-reduces its gradients in that precision (torch's compress hooks).
    The speed options are applied in place too: `config.memory_format` ("channels_last": the
    model's 4-D weights, for CNNs), `config.optimizer_impl` (the optimizer's foreach/fused
    kernels) and `config.compile` (``model.compile()``: the model object itself runs compiled;
    the first steps compile; `config.compile_mode` "reduce-overhead" replays CUDA graphs).
    `config.tf32` lets fp32 matmuls and convolutions use TF32 inside the engine's autocast()
    and backward().

    The LR schedule runs over `total_samples` samples (sequences, images; what adaptive k needs,
    as its steps change size) with `warmup_samples` -- or over `total_steps` optimizer steps with
    `warmup_steps` (`schedule.StepLRSchedule`) -- and its cosine ends at `min_lr` (an LR value)
    either way. Warmup defaults to the configuration's warmup_fraction of the horizon, min_lr to
    its min_lr_ratio × the base LR. A constant schedule (the config's default) needs no horizon.
    `precision="auto"` in the configuration becomes the fastest precision this device computes
    natively (`precision.choose_precision`; said once); an explicit one that runs slower here
    than another (bf16 emulated on a CPU without bf16 instructions, fp16 on any CPU) warns.
    """
    _check_arguments(model, optimizer, config, device=device, world_size=world_size,
                     checkpoint_model=checkpoint_model, backend=backend)
    world_size = _resolved_world_size(world_size)
    arguments = EngineArguments(
        micro_batch_size=micro_batch_size, device=torch.device(device) if device is not None else model_device(model),
        world_size=world_size, total_samples=total_samples, total_steps=total_steps, warmup_samples=warmup_samples,
        warmup_steps=warmup_steps, min_lr=min_lr)
    config = mp.resolve_precision(config, arguments.device)
    if config.expandable_segments:  # before gradients, optimizer state and activations are allocated
        use_expandable_segments(arguments.device)
    if backend == "auto":
        use_deepspeed = config.zero_stage > 0 and world_size > 1 and deepspeed_available()
        backend = "deepspeed" if use_deepspeed else "torch"
    target = checkpoint_model if checkpoint_model is not None else getattr(model, "module", model)
    config = _apply_components(model, target, optimizer, config)
    engine_class = TrainingEngine
    if backend == "deepspeed":
        from .distributed.deepspeed_engine import DeepSpeedTrainingEngine

        engine_class = DeepSpeedTrainingEngine
    return engine_class(model, optimizer, config, arguments)
