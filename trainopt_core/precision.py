"""Mixed precision (eqs. 13-17) with torch.amp.

Autocast keeps the parameters -- the master weights of eq. 13 -- in FP32 and runs eligible ops
in FP16/BF16; fp16 adds torch.amp.GradScaler's dynamic loss scaling (eqs. 15-16): initial scale
2^16, ×2 after `growth_interval` clean steps, ×0.5 and skip the step on inf/nan.

A step is skipped exactly when its unscaled gradients hold an inf or nan (GradScaler's found-inf
test); the engines count skips from that, never from the scale's movement, which stops moving
once the scale has underflowed to 0. A scale that can no longer do its job stops the run
(`check_loss_scale`): backing off below `MIN_LOSS_SCALE`, or a scale of 0, inf or nan.
"""
from __future__ import annotations

import contextlib
import math
import sys

import torch

from ._caller import warn_at_caller
from .config import OptimizationConfig

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# The smallest loss scale worth skipping steps for: fp16's smallest subnormal. Below it every
# gradient of magnitude < 1 scales to under what fp16 can hold, so a run that keeps overflowing
# there has non-finite values of its own (a diverged loss, a nan weight), not a range problem
# that a smaller scale fixes. From the initial 2^16, 40 consecutive skipped steps reach it and
# the 41st stops the run.
MIN_LOSS_SCALE = 2.0**-24


def autocast(device: torch.device, precision: str, *, tf32: bool = False, sdpa_backend: str = "auto"):
    """The forward-pass context for `precision` (a no-op for fp32), with fp32 matmuls and
    convolutions on TF32 tensor cores inside it where `tf32` (`tf32_allowed`) and attention on
    the `sdpa_backend` kernel (`kernel_settings`)."""
    if tf32 or sdpa_backend != "auto":
        return _autocast_with_kernels(device, precision, tf32, sdpa_backend)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


@contextlib.contextmanager
def _autocast_with_kernels(device: torch.device, precision: str, tf32: bool, sdpa_backend: str):
    with kernel_settings(tf32=tf32, sdpa_backend=sdpa_backend), autocast(device, precision):
        yield


def kernel_settings(*, tf32: bool = False, sdpa_backend: str = "auto"):
    """The kernel choices a configuration makes, for a forward or a backward: TF32 where `tf32`
    (`tf32_allowed`), and torch's scaled_dot_product_attention restricted to the `sdpa_backend`
    kernel unless "auto" (torch.nn.attention.sdpa_kernel; process-wide, so autograd's backward
    thread -- and a checkpointed segment's recompute in it -- runs the forward's kernel). A plain
    nullcontext where both are at their defaults (every backward enters it)."""
    if not tf32 and sdpa_backend == "auto":
        return contextlib.nullcontext()
    return _kernel_settings(tf32, sdpa_backend)


@contextlib.contextmanager
def _kernel_settings(tf32: bool, sdpa_backend: str):
    with contextlib.ExitStack() as stack:
        if tf32:
            stack.enter_context(tf32_allowed())
        if sdpa_backend != "auto":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                       "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[sdpa_backend]
            stack.enter_context(sdpa_kernel(backend))
        yield


# torch's newer per-backend, per-operation fp32 precision flags (torch >= 2.9): ("cuda", "matmul")
# is torch.backends.cuda.matmul.fp32_precision, ("cudnn", "conv") torch.backends.cudnn.conv's, ...
FP32_PRECISION_FLAGS = (("cuda", "matmul"), ("cudnn", "conv"), ("cudnn", "rnn"),
                        ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))


def _fp32_precision_flags() -> dict[tuple[str, str], str]:
    """The newer flags this torch has, by (backend, operation): {} before torch 2.9."""
    flags = {}
    for backend, op in FP32_PRECISION_FLAGS:
        try:
            flags[backend, op] = getattr(getattr(torch.backends, backend), op).fp32_precision
        except AttributeError:
            pass
    return flags


@contextlib.contextmanager
def tf32_allowed():
    """fp32 matmuls (cuBLAS) and convolutions (cuDNN) may run on TF32 tensor cores inside, and on
    leaving every flag is exactly what it was. Set through the settings that keep torch's older and
    newer TF32 flags consistent (`torch.set_float32_matmul_precision`, `torch.backends.cudnn.allow_tf32`):
    setting one of the newer `fp32_precision` flags alone makes reading the older ones an error
    (torch.compile reads them). Put back through the newer flags where torch has them: "highest"
    would leave cuBLAS's and oneDNN's matmul flags at 'ieee' where they were 'none'. The settings
    are process-wide, so autograd's backward thread sees them while the block runs."""
    newer_before = _fp32_precision_flags()
    try:
        matmul_before = torch.get_float32_matmul_precision()
    except RuntimeError:  # the caller set the newer flags apart: set cuBLAS's
        matmul_before = None
    try:
        cudnn_before = torch.backends.cudnn.allow_tf32
    except RuntimeError:  # the caller set convolutions and RNNs apart: set both
        cudnn_before = None
    if matmul_before == "highest":
        torch.set_float32_matmul_precision("high")
    elif matmul_before is None:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    if cudnn_before is False:
        torch.backends.cudnn.allow_tf32 = True
    elif cudnn_before is None:
        torch.backends.cudnn.conv.fp32_precision = torch.backends.cudnn.rnn.fp32_precision = "tf32"
    try:
        yield
    finally:
        if matmul_before == "highest":
            torch.set_float32_matmul_precision(matmul_before)
        if cudnn_before is False:
            torch.backends.cudnn.allow_tf32 = False
        for (backend, op), value in newer_before.items():  # after the older ones, which set them too
            setattr(getattr(getattr(torch.backends, backend), op), "fp32_precision", value)


def choose_precision(device: torch.device | str) -> tuple[str, str]:
    """What ``precision="auto"`` runs on `device`, and why: bf16 where the device computes it
    natively (CUDA GPUs from Ampere on; CPUs with AVX-512 BF16 or AMX), fp16 with dynamic loss
    scaling on CUDA GPUs without bf16, else fp32 (bf16 autocast on a CPU without bf16
    instructions is emulated, several times slower than fp32; fp16 autocast is slow on any CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", f"{name} computes bf16 natively"
        return "fp16", f"{name} has no native bf16; fp16 with dynamic loss scaling instead"
    if device.type == "cpu":
        if _cpu_bf16_native():
            return "bf16", "this CPU has bf16 instructions (AVX-512 BF16 or AMX)"
        return "fp32", f"this CPU has no bf16 instructions ({_cpu_isa()}): {CPU_WITHOUT_BF16}"
    return "fp32", f"no reduced precision known to be faster on {device.type}"


CPU_WITHOUT_BF16 = ("bf16 autocast would be emulated, several times slower than fp32, and fp16 autocast is "
                    "slow on any CPU")
_announced: set[tuple[str, str]] = set()


def resolve_precision(config: OptimizationConfig, device: torch.device | str) -> OptimizationConfig:
    """`config` with ``precision="auto"`` replaced by `choose_precision`'s choice (said once per
    process and choice, on stderr), or as it is -- with a warning at the caller's line when the
    explicit choice runs slower than another on this device: bf16 on a CPU without bf16
    instructions (emulated), fp16 on any CPU."""
    device = torch.device(device)
    if config.precision == "auto":
        chosen, reason = choose_precision(device)
        if (device.type, chosen) not in _announced:
            _announced.add((device.type, chosen))
            print(f"[trainopt] precision='auto' -> {chosen!r} on {device.type}: {reason}", file=sys.stderr)
        return config.replace(precision=chosen)
    if device.type == "cpu" and config.precision in ("fp16", "bf16"):
        faster = "bf16" if _cpu_bf16_native() else "fp32"
        if config.precision == "fp16":
            warn_at_caller(
                f"fp16 autocast on CPU runs but is slow (emulated, with a loss scaler); {faster} is faster on this "
                f"CPU ({_cpu_isa()}): OptimizationConfig.replace(precision={faster!r}), or precision='auto'.")
        elif faster == "fp32":
            warn_at_caller(
                f"bf16 autocast on this CPU ({_cpu_isa()}, no AVX-512 BF16 or AMX) is emulated and runs several "
                "times slower than fp32: OptimizationConfig.replace(precision='fp32'), or precision='auto'.")
    return config


def _cpu_bf16_native() -> bool:
    from .measure.manifest import cpu_computes_bf16_natively  # measure imports this package's modules

    return cpu_computes_bf16_natively()


def _cpu_isa() -> str:
    from .measure.manifest import cpu_isa

    return cpu_isa()


def make_grad_scaler(device: torch.device, config: OptimizationConfig) -> torch.amp.GradScaler | None:
    """Dynamic loss scaling for fp16; None for fp32/bf16 (bf16 has fp32's exponent range)."""
    if config.precision != "fp16":
        return None
    return torch.amp.GradScaler(
        device.type,
        init_scale=config.initial_loss_scale,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=config.loss_scale_growth_interval,
    )


def gradients_non_finite(grad_norm: torch.Tensor | float, grads) -> bool:
    """Whether the (unscaled) gradients hold an inf or nan: GradScaler's found-inf test.

    `grad_norm` is their total norm (what clipping returns): finite gradients give a finite
    norm, except when squaring gradients beyond ~1e19 overflows the norm itself -- only then
    are the gradients inspected element by element.
    """
    if math.isfinite(float(grad_norm)):
        return False
    return any(not bool(torch.isfinite(g).all()) for g in grads)


class NonFiniteTrainingError(RuntimeError):
    """Training stopped because its gradients stayed non-finite (inf/nan): a collapsed fp16 loss
    scale, or `OptimizationConfig.max_nonfinite_steps` consecutive non-finite steps in bf16/fp32."""


NON_FINITE_CAUSES = (
    "likely causes: a learning rate too high for this model (the loss diverged; lower it or add "
    "warmup/clipping), inf/nan values in the input data, or an op that overflows or divides by "
    "zero in the model or the loss"
)


def nonfinite_steps_error(*, step: int, grad_norm: float, consecutive: int, allowed: int, precision: str,
                          backend: str) -> NonFiniteTrainingError:
    """The error both engines raise after too many consecutive non-finite bf16/fp32 steps."""
    return NonFiniteTrainingError(
        f"non-finite gradients at optimizer step {step}: gradient norm {grad_norm!r} in {precision} "
        f"({backend}), {consecutive} consecutive step(s) skipped; allowed at most "
        f"OptimizationConfig.max_nonfinite_steps={allowed} in a row. {NON_FINITE_CAUSES}."
    )


def loss_scale_collapse_error(*, consecutive_skips: int, loss_scale: float, min_loss_scale: float,
                              backend: str, detail: str = "") -> RuntimeError:
    """The error both engines raise for a collapsed fp16 loss scale (what happened, what is allowed)."""
    return NonFiniteTrainingError(
        f"fp16 loss scale collapsed: {consecutive_skips} consecutive skipped steps (inf/nan gradients); "
        f"the {backend} loss scale is now {loss_scale!r}{detail}, allowed: a finite scale that stays >= "
        f"{min_loss_scale!r}, the floor below which skipping steps cannot help. The loss or the weights are "
        "non-finite regardless of scaling: check the data and the learning rate, or train in bf16/fp32."
    )


def check_loss_scale(loss_scale: float, *, consecutive_skips: int, min_loss_scale: float = MIN_LOSS_SCALE,
                     backend: str = "torch.amp.GradScaler") -> None:
    """Raise RuntimeError when fp16 dynamic loss scaling has collapsed.

    Collapsed: the scale is 0, inf or nan, or consecutive skipped steps have backed it off
    below `min_loss_scale` (a step skipped with the scale already at the floor). Each further
    step would be skipped too (the gradients of a zero scale unscale to nan), so the run stops
    instead of training on without updates.
    """
    collapsed = not math.isfinite(loss_scale) or loss_scale <= 0 or (consecutive_skips > 0 and loss_scale < min_loss_scale)
    if collapsed:
        raise loss_scale_collapse_error(consecutive_skips=consecutive_skips, loss_scale=loss_scale,
                                        min_loss_scale=min_loss_scale, backend=backend)
