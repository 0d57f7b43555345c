"""One typed, validated configuration for every component (paper §III), plus the presets.

`OptimizationConfig.baseline()` and `OptimizationConfig.optimized()` are paper §IV-B; the
cumulative ablation ladder of Table III is `ABLATION_LADDER` (data, not code paths).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import warnings
from dataclasses import dataclass
from typing import Literal, Union

import torch

from ._errors import fail
from .accumulation import K_RULES
from .checkpointing import POLICIES as CHECKPOINT_POLICIES

PRECISIONS = ("fp32", "fp16", "bf16")
SCHEDULES = ("constant", "cosine")
ZERO_STAGES = (0, 1, 2)
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
MEMORY_FORMATS = ("contiguous", "channels_last")
# torch.compile's modes a configuration may ask for: "default", or "reduce-overhead" (CUDA graphs:
# each compiled graph is captured once and replayed, so a launch-bound step stops paying for its
# kernel launches)
COMPILE_MODES = ("default", "reduce-overhead")
# What torch.compile compiles: "model", the whole model as one graph; "blocks", each of the model's
# repeated blocks (a transformer Block, a ResNet Bottleneck; `checkpointing.block_sequence`) on its
# own -- PyTorch's regional compilation: the blocks share one compiled code, so compiling costs
# about one block's, and the glue between them (embedding, head, stem) runs eager
COMPILE_SCOPES = ("model", "blocks")
# Which kernel runs torch's scaled_dot_product_attention: "auto" (PyTorch's own choice: flash for
# fp16/bf16 where it can, else memory-efficient, else math), or one of them forced. Flash and
# cuDNN attention run fp16/bf16 only; flash, efficient and cudnn need a CUDA GPU.
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")

Checkpointing = Union[None, Literal["sqrt"], int]
# Fields that stop a failing run but never change what a finished one computed.
GUARD_FIELDS = frozenset({"max_nonfinite_steps"})
# Fields added after run records were committed, with their defaults: a configuration that leaves
# them at the default hashes as it did before they existed, so its records stay valid.
LATER_FIELD_DEFAULTS = {"checkpoint_policy": "full", "compile": False, "optimizer_impl": "default",
                        "memory_format": "contiguous", "compile_mode": "default", "tf32": False,
                        "sdpa_backend": "auto", "expandable_segments": False, "compile_scope": "model"}


# k_rule's default before "critical_batch" became it. A configuration that does not adapt k never
# reads its rule, so it hashes with this one, as records made before the change do.
FORMER_K_RULE = "noise_scale"


# Fields read only by one component, at the value they hash with where that component is off: a
# fixed k reads no k range, rule or noise window; a constant schedule no cosine floor; a precision
# without a loss scaler no loss-scale settings. Two configurations that compute the same run then
# hash alike (the values are the defaults, so records made before this rule keep their hashes).
UNREAD_WITHOUT = {
    "adaptive": {"k_min": 1, "k_max": 1, "k_rule": FORMER_K_RULE, "sigma_target": None, "noise_window": 8},
    "cosine": {"min_lr_ratio": 0.1},
    "fp16": {"initial_loss_scale": 2.0**16, "loss_scale_growth_interval": 2000},
}


def _unread_fields(fields: dict) -> dict:
    """The fields `fields` never reads (UNREAD_WITHOUT), at the values they hash with."""
    unread = {}
    if not fields.get("adaptive", False):
        unread.update(UNREAD_WITHOUT["adaptive"])
    if fields.get("schedule", "constant") == "constant":
        unread.update(UNREAD_WITHOUT["cosine"])
    if fields.get("precision", "fp32") not in ("fp16", "auto"):  # "auto" may become fp16
        unread.update(UNREAD_WITHOUT["fp16"])
    return unread


def computation_part(fields: dict) -> dict:
    """A configuration dict (as a record stores it) without its guards and without the later
    fields at their defaults, with the fields its components never read at fixed values
    (`UNREAD_WITHOUT`) and its lr_scaling default (None) as the False it means for a fixed k: what
    `config_hash` and record comparisons read."""
    part = {key: value for key, value in fields.items()
            if key not in GUARD_FIELDS and not (key in LATER_FIELD_DEFAULTS and value == LATER_FIELD_DEFAULTS[key])}
    part.update({key: value for key, value in _unread_fields(fields).items() if key in part})
    # lr_scaling's default is off for a fixed k, as False was before it; with adaptive k it scales
    # from the starting k's batch (`lr_batch_splits`), not k_min's as True does: a computation of its own
    if "lr_scaling" in part and part["lr_scaling"] is None and not part.get("adaptive", False):
        part["lr_scaling"] = False
    return part


def _fail(field_name: str, value, allowed: str) -> None:
    fail(f"OptimizationConfig.{field_name}", value, allowed)


def _is_number(value) -> bool:
    """A finite int or float, not a bool (True is no loss scale, no fraction of a run)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float (10**400): not a number a float field can hold
        return False


def _is_integer(value, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _one_of(values: tuple):
    """Equal to one of `values` and of its type: 1.0 is no ZeRO stage, True no stage 1."""
    return lambda value: not isinstance(value, bool) and any(isinstance(value, type(allowed)) and value == allowed
                                                             for allowed in values)


def _is_segments(value) -> bool:
    return value is None or (value == "sqrt" if isinstance(value, str) else _is_integer(value))


def _flag(value) -> bool:
    return isinstance(value, bool)


_COUNT = (_is_integer, "an integer >= 1")
MAX_BATCH_SIZE = 10**9  # samples per optimizer step: beyond it a batch size is a typo, not a batch
# What each field of OptimizationConfig accepts, and the words that say so: every field is checked
# for its type and range at construction (the checks between fields follow them)
FIELD_RULES = {
    "name": (lambda value: isinstance(value, str) and value.strip() != "", "a non-empty string (records and "
             "figures are named by it)"),
    "precision": (_one_of((*PRECISIONS, "auto")), f"one of {PRECISIONS}, or 'auto' (the fastest this device computes "
                  "natively: precision.choose_precision)"),
    "k": _COUNT, "k_min": _COUNT, "k_max": _COUNT,
    "adaptive": (_flag, "True or False"),
    "k_rule": (_one_of(K_RULES), f"one of {K_RULES}"),
    "sigma_target": (lambda value: value is None or (_is_number(value) and value > 0),
                     "None (calibrated at the first significant estimate) or a finite number > 0"),
    "noise_window": (_is_integer, "an integer >= 1 (optimizer steps pooled per noise estimate)"),
    "schedule": (_one_of(SCHEDULES), f"one of {SCHEDULES}"),
    "warmup_fraction": (lambda value: _is_number(value) and 0 <= value < 1, "a number in [0, 1)"),
    "min_lr_ratio": (lambda value: _is_number(value) and 0 <= value <= 1, "a number in [0, 1]"),
    "lr_scaling": (lambda value: value is None or _flag(value), "True, False, or None (on with adaptive k, else off)"),
    "base_batch_size": (lambda value: value is None or (_is_integer(value) and value <= MAX_BATCH_SIZE),
                        f"None or an integer in [1, {MAX_BATCH_SIZE:,}] (samples per optimizer step, all processes)"),
    "clip_norm": (lambda value: value is None or (_is_number(value) and value > 0),
                  "None or 0 (no clipping) or a finite number > 0 (the global L2 norm gradients are clipped to)"),
    "checkpointing": (_is_segments,
                      "None, 'sqrt' or an integer number of segments >= 1"),
    "checkpoint_policy": (_one_of(CHECKPOINT_POLICIES), f"one of {CHECKPOINT_POLICIES}"),
    "zero_stage": (_one_of(ZERO_STAGES), f"one of {ZERO_STAGES}"),
    "compile": (_flag, "True or False"),
    "compile_mode": (_one_of(COMPILE_MODES), f"one of {COMPILE_MODES}"),
    "compile_scope": (_one_of(COMPILE_SCOPES), f"one of {COMPILE_SCOPES}"),
    "optimizer_impl": (_one_of(OPTIMIZER_IMPLS), f"one of {OPTIMIZER_IMPLS}"),
    "memory_format": (_one_of(MEMORY_FORMATS), f"one of {MEMORY_FORMATS}"),
    "tf32": (_flag, "True or False"),
    "sdpa_backend": (_one_of(SDPA_BACKENDS), f"one of {SDPA_BACKENDS}"),
    "expandable_segments": (_flag, "True or False"),
    "initial_loss_scale": (lambda value: _is_number(value) and value > 0, "a finite number > 0"),
    "loss_scale_growth_interval": _COUNT,
    "max_nonfinite_steps": (_is_integer, "an integer >= 1 (consecutive inf/nan steps skipped in bf16/fp32 before the "
                            "run stops)"),
}


@dataclass(frozen=True, kw_only=True)
class OptimizationConfig:
    """Which training optimizations are on, and their parameters.

    Accumulation: a fixed `k` (``adaptive=False``) or variance-aware adaptive accumulation
    (``adaptive=True``) choosing k in [k_min, k_max] by eq. 6 from gradient-noise estimates
    pooled over the last ``noise_window`` steps (`trainopt_core.accumulation`). ``k_rule`` is the
    reading of eq. 6: ``"critical_batch"`` (the default: k·b ≈ B_simple, so k grows only while
    the effective batch is below the measured noise scale), ``"noise_scale"`` (σ_target² =
    sigma_target² · |G|², so k ≈ B_simple / (sigma_target² · b), with ``sigma_target=None``
    calibrated at the run's first significant estimate so that eq. 6 gives the starting ``k``
    there: k follows the noise scale's growth from wherever it starts; the optimized preset's) or
    ``"variance"`` (σ_target² = sigma_target², eq. 6 as printed: k is largest while the gradient
    variance is, early). A number for ``sigma_target`` fixes it.
    """

    name: str = "custom"
    # "fp32", "fp16" (with dynamic loss scaling), "bf16", or "auto": resolved by prepare() to the
    # fastest the device computes natively (`precision.choose_precision`), the choice said once
    precision: str = "fp32"
    # accumulation (eqs. 4-9)
    k: int = 1
    adaptive: bool = False
    k_min: int = 1
    k_max: int = 1
    k_rule: str = "critical_batch"
    sigma_target: float | None = None
    noise_window: int = 8
    # schedule (eqs. 10-12)
    schedule: str = "constant"
    warmup_fraction: float = 0.0
    min_lr_ratio: float = 0.1
    # LR × effective batch / base batch (eq. 11's linear scaling); None, the default: on with
    # adaptive k (its k grows the batch; without the LR following it, a run of a fixed number of
    # samples takes fewer steps at the same LR and ends worse: docs/adopting.md), off otherwise.
    # base_batch_size: the batch (samples, all processes) the optimizer's LR is for; default the
    # micro-batch × `lr_batch_splits` × processes
    lr_scaling: bool | None = None
    base_batch_size: int | None = None
    clip_norm: float | None = None  # the global gradient L2 norm clipped to; None or 0: no clipping
    # memory
    checkpointing: Checkpointing = None
    # "full": a segment keeps only its input and recomputes everything in backward; "selective":
    # it also keeps matmul/convolution/attention outputs and recomputes only the cheap ops
    # (torch.utils.checkpoint's selective-checkpoint policies)
    checkpoint_policy: str = "full"
    zero_stage: int = 0
    # speed: torch.compile the model (in place), the optimizer's implementation (torch's
    # foreach or fused kernels, where the optimizer has them) and channels-last weights for CNNs
    compile: bool = False
    compile_mode: str = "default"
    compile_scope: str = "model"   # COMPILE_SCOPES: the whole model, or each repeated block
    optimizer_impl: str = "default"
    memory_format: str = "contiguous"
    # fp32 matmuls and convolutions on TF32 tensor cores (CUDA GPUs of compute capability >= 8.0):
    # the engine sets torch's TF32 flags around the forward and backward it runs, and restores them
    tf32: bool = False
    # the kernel torch's scaled_dot_product_attention runs (SDPA_BACKENDS), set around the forward
    # and the backward (a checkpointed segment's recompute included) the engine runs
    sdpa_backend: str = "auto"
    # CUDA's caching allocator grows its segments in place (PyTorch's expandable_segments) instead of
    # caching blocks of every size it was asked for: what the process reserves stays near what its
    # tensors hold (reports/gpu/nvidia-h200: +3-8 % over the allocated peak, against up to +61 %
    # with the default). Process-wide, from prepare() on; CUDA on Linux only
    # (`expandable_segments_supported`). It changes no computed value, only the memory reserved.
    expandable_segments: bool = False
    # fp16 dynamic loss scaling (torch.amp.GradScaler semantics)
    initial_loss_scale: float = 2.0**16
    loss_scale_growth_interval: int = 2000
    # bf16/fp32 (no loss scaler): a step whose gradients hold an inf/nan is skipped and counted,
    # as fp16 does; this many consecutive such steps stop the run with an error. A guard: it
    # decides whether a run may go on, not what a finished run computed (not in config_hash).
    max_nonfinite_steps: int = 3

    def __post_init__(self):
        if _is_number(self.clip_norm) and self.clip_norm == 0:
            object.__setattr__(self, "clip_norm", None)  # scripts write 0 for "off": the same configuration
        for field in dataclasses.fields(self):
            accepts, allowed = FIELD_RULES[field.name]
            if not accepts(getattr(self, field.name)):
                _fail(field.name, getattr(self, field.name), allowed)
        if self.adaptive:
            if self.k_max < self.k_min:
                _fail("k_max", self.k_max, f"an integer >= k_min ({self.k_min})")
            if not (self.k_min <= self.k <= self.k_max):
                _fail("k", self.k, f"the starting k, within [k_min, k_max] = [{self.k_min}, {self.k_max}]")
        if self.checkpoint_policy != "full" and self.checkpointing is None:
            _fail("checkpoint_policy", self.checkpoint_policy, "'full' while checkpointing is None (set checkpointing "
                  "to 'sqrt' or a number of segments to checkpoint selectively)")
        if self.schedule == "constant" and self.warmup_fraction != 0:
            _fail("warmup_fraction", self.warmup_fraction, "0 with schedule 'constant', which has no warmup (set "
                  "schedule='cosine' for eq. 10's warmup and cosine)")
        if self.compile_mode != "default" and not self.compile:
            _fail("compile_mode", self.compile_mode, "'default' while compile is False (set compile=True to compile "
                  "in another mode)")
        if self.compile_scope != "model" and not self.compile:
            _fail("compile_scope", self.compile_scope, "'model' while compile is False (set compile=True to compile "
                  "each block)")
        if self.sdpa_backend in ("flash", "cudnn") and self.precision == "fp32":
            _fail("sdpa_backend", self.sdpa_backend, "'auto', 'efficient' or 'math' with precision 'fp32' (flash and "
                  "cuDNN attention run fp16/bf16 only)")

    # ------------------------------------------------------------------ derived
    @property
    def k_start(self) -> int:
        return self.k

    @property
    def scales_lr(self) -> bool:
        """Whether the LR follows the effective batch: `lr_scaling`, by default on with adaptive k."""
        return self.adaptive if self.lr_scaling is None else self.lr_scaling

    @property
    def lr_batch_splits(self) -> int:
        """Micro-batches per process of the batch the optimizer's LR is for (base_batch_size's
        default): the starting k with adaptive k under lr_scaling's default (the LR you give is
        the one for the batch you start with, and follows k from there); k_min with adaptive k
        and lr_scaling set (the optimized preset's reading, eq. 11); k when k is fixed."""
        return self.k_min if self.adaptive and self.lr_scaling is not None else self.k

    @property
    def cuda_graphs(self) -> bool:
        """Whether the step replays in CUDA graphs (compiled in mode "reduce-overhead")."""
        return self.compile and self.compile_mode == "reduce-overhead"

    @property
    def batch_splits(self) -> int:
        """How many micro-batches the baseline batch is split into: k, or k_min when k adapts
        (so the effective batch never falls below the baseline's; docs/reproduction.md: our reading
        of the optimized batch)."""
        return self.k_min if self.adaptive else self.k

    def validate_for_run(self, *, device: torch.device | str, world_size: int = 1) -> None:
        """Checks that depend on where the run happens (device, number of replicas)."""
        device = torch.device(device)
        if self.adaptive and self.k_min < 2 and world_size < 2:
            _fail(
                "k_min", self.k_min,
                "an integer >= 2 with adaptive accumulation on one process (eq. 7's variance needs "
                ">= 2 micro-batches per estimate; or run >= 2 data-parallel replicas)",
            )
        if self.tf32 and not tf32_supported(device):
            _fail("tf32", self.tf32, f"False on {device} (TF32 tensor cores need a CUDA GPU of compute capability >= 8.0)")
        if self.compile_mode == "reduce-overhead" and device.type != "cuda":
            _fail("compile_mode", self.compile_mode, f"'default' on {device} (CUDA graphs need a CUDA GPU)")
        if self.sdpa_backend in ("flash", "efficient", "cudnn") and device.type != "cuda":
            _fail("sdpa_backend", self.sdpa_backend, f"'auto' or 'math' on {device} (flash, memory-efficient and cuDNN "
                  "attention kernels need a CUDA GPU)")
        if self.expandable_segments:
            require_expandable_segments(device)
        if self.precision in ("fp16", "bf16"):
            dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
            if not autocast_supports(device.type, dtype):
                _fail("precision", self.precision, f"a precision torch.autocast supports on device {device.type!r}")

    def replace(self, **changes) -> "OptimizationConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "OptimizationConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"OptimizationConfig got unknown fields {sorted(unknown)}; allowed {sorted(known)}")
        return cls(**values)

    def computation_fields(self) -> dict:
        """The fields that decide what a finished run computes: all but the guards
        (`GUARD_FIELDS`), which only decide whether a run may go on, and the later fields at
        their defaults (`LATER_FIELD_DEFAULTS`), so that older records keep their hashes."""
        return computation_part(self.to_dict())

    def config_hash(self) -> str:
        blob = json.dumps(self.computation_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    # ------------------------------------------------------------------ presets
    @classmethod
    def baseline(cls) -> "OptimizationConfig":
        """Paper §IV-B baseline: FP32, no accumulation, constant LR, no clipping/checkpointing."""
        return cls(name="baseline")

    @classmethod
    def optimized(cls) -> "OptimizationConfig":
        """Paper §IV-B optimized: adaptive k in {4..8}, FP16 with dynamic loss scaling,
        5% warmup + cosine to 0.1·η, linear LR scaling, clip 1.0, √L checkpointing, ZeRO-2.

        k starts in the middle of the range (6) and follows the gradient noise scale
        (``k_rule="noise_scale"``, eq. 6 calibrated at the first significant estimate to give
        the starting k), so it can move either way: up as the loss falls and the gradient's
        signal shrinks relative to its noise, which is where a larger batch stops wasting
        samples (McCandlish et al. 2018), down where the signal grows instead. The paper's own wording (more
        accumulation while the variance is high, early) is ``k_rule="variance"`` with k starting
        at k_max; it grows the batch exactly when the signal-to-noise ratio is highest, so it is
        offered, not the default."""
        return cls(
            name="optimized",
            precision="fp16",
            k=6, adaptive=True, k_min=4, k_max=8,
            k_rule="noise_scale", sigma_target=None,
            schedule="cosine", warmup_fraction=0.05, min_lr_ratio=0.1, lr_scaling=True,
            clip_norm=1.0,
            checkpointing="sqrt",
            zero_stage=2,
        )

    @classmethod
    def preset(cls, name: str) -> "OptimizationConfig":
        presets = {"baseline": cls.baseline(), "optimized": cls.optimized()}
        presets.update({step.name: step for step in ABLATION_LADDER})
        presets.update({step.name: step for step in leave_one_out()})
        if name not in presets:
            raise ValueError(f"unknown configuration {name!r}: allowed {sorted(presets)}")
        return presets[name]


def tf32_supported(device: torch.device | str) -> bool:
    """Whether `device` has TF32 tensor cores: a CUDA GPU of compute capability >= 8.0 (Ampere on)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8


def expandable_segments_supported(device: torch.device | str) -> bool:
    """Whether `device` can run with expandable segments: a CUDA GPU on Linux, with a torch that
    sets the allocator's settings at run time."""
    device = torch.device(device)
    return (device.type == "cuda" and sys.platform.startswith("linux") and torch.cuda.is_available()
            and _allocator_settings_setter() is not None)


def _allocator_settings_setter():
    """torch's run-time setter of the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF's
    syntax): the accelerator-wide one where torch has it, else CUDA's older one, else None."""
    return (getattr(torch._C, "_accelerator_setAllocatorSettings", None)
            or getattr(torch.cuda.memory, "_set_allocator_settings", None))


def set_allocator_settings(settings: str) -> None:
    """Set the caching allocator's `settings` (e.g. "expandable_segments:True") for this process."""
    _allocator_settings_setter()(settings)


def require_expandable_segments(device: torch.device | str) -> None:
    """ValueError naming the field where `expandable_segments_supported(device)` is False."""
    if not expandable_segments_supported(device):
        _fail("expandable_segments", True, f"False on {torch.device(device)} (expandable segments are a setting of "
              "CUDA's caching allocator, on Linux)")


def use_expandable_segments(device: torch.device | str) -> None:
    """Turn on expandable segments in CUDA's caching allocator, for this process: blocks cached
    but unused are released first, so that what is allocated from here on comes from expandable
    segments. Raises ValueError where `expandable_segments_supported` is False."""
    require_expandable_segments(device)
    torch.cuda.empty_cache()
    set_allocator_settings("expandable_segments:True")


def autocast_supports(device_type: str, dtype: torch.dtype) -> bool:
    """True when torch.autocast runs `dtype` on `device_type` (it warns and disables otherwise)."""
    if not torch.amp.is_autocast_available(device_type):
        return False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autocast(device_type=device_type, dtype=dtype):
                pass
        except (RuntimeError, AssertionError):
            return False
    return not any("autocast" in str(w.message).lower() for w in caught)


# Table III: each step adds one component to the previous one. ZeRO-2 is the last rung
# (the paper lists it in the optimized configuration but not in its ablation table).
def _ladder() -> list[OptimizationConfig]:
    base = OptimizationConfig.baseline()
    accumulation = base.replace(name="+accumulation", k=4)
    mixed = accumulation.replace(name="+mixed_precision", precision="fp16")
    schedule = mixed.replace(
        name="+lr_schedule", schedule="cosine", warmup_fraction=0.05, min_lr_ratio=0.1,
        lr_scaling=True, clip_norm=1.0,
    )
    checkpoint = schedule.replace(name="+checkpointing", checkpointing="sqrt")
    zero = checkpoint.replace(name="+zero2", zero_stage=2)
    return [base, accumulation, mixed, schedule, checkpoint, zero]


ABLATION_LADDER: tuple[OptimizationConfig, ...] = tuple(_ladder())

# Components of the optimized configuration that leave-one-out removes one at a time,
# each given as the fields that switch it back to the baseline's value.
COMPONENTS: dict[str, dict] = {
    "adaptive_accumulation": dict(adaptive=False, k=1, k_min=1, k_max=1),
    "mixed_precision": dict(precision="fp32"),
    "lr_schedule": dict(schedule="constant", warmup_fraction=0.0, lr_scaling=False, clip_norm=None),
    "checkpointing": dict(checkpointing=None),
    "zero2": dict(zero_stage=0),
}


def leave_one_out() -> list[OptimizationConfig]:
    optimized = OptimizationConfig.optimized()
    return [optimized.replace(name=f"-{component}", **fields) for component, fields in COMPONENTS.items()]


def with_precision(config: OptimizationConfig, precision: str) -> OptimizationConfig:
    """The same configuration at another precision (a profile may use bf16 on CPU; tables say so)."""
    if config.precision == "fp32":
        return config
    return config.replace(precision=precision)
