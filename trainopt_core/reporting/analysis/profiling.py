"""Error analysis by operation and module (paper §V-D), measured on a few training steps.

- `profile_operations`: torch.profiler over a few optimizer steps of a task's model, self time
  aggregated by operation category (convolution, matmul/attention, normalization, dropout,
  element-wise, optimizer, communication, other) -- where the step's time goes, CNN vs transformer;
- `activation_bytes_by_module_type`: activation bytes autograd keeps for backward, attributed
  to the innermost module type that saved them (Conv2d, BatchNorm2d, GPT2Attention, ...);
- `measure_recompute_overhead`: step time with √L checkpointing over step time without, minus
  one (the recomputation overhead of eqs. 20-21), alternating the two to share noise.

Both are timings: given `out_dir`, each is kept there as a record (with its manifest) and reused
only when made under the same conditions and settings, like the throughput timing, so that
rendering the reports again shows the same measurement instead of a new draw of the noise.
"""
from __future__ import annotations

import os
import re
import statistics
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ...checkpointing import apply_activation_checkpointing, remove_activation_checkpointing
from ...config import OptimizationConfig
from ...precision import autocast
from ...reproduction.profiles import get_profile
from ...reproduction.records import file_stem, keep_record, kept_record, run_conditions
from ...reproduction.runner import build_engine, resolve_config
from ...reproduction.tasks import build_task
from ..._errors import fail as _fail

OP_CATEGORIES = ("convolution", "matmul/attention", "normalization", "dropout", "element-wise", "optimizer",
                 "communication", "other")
OPTIMIZER_REGION = "trainopt::optimizer_step"

# Matched against the op name without its namespace and without a trailing "Backward<N>", in
# snake case (aten::addmm, AddmmBackward0 -> "addmm"; NativeBatchNormBackward0 ->
# "native_batch_norm"). First match wins. "dropout" is drawing the random masks (on a CPU
# aten::bernoulli_; applying a mask is a multiplication, element-wise); "element-wise" holds the
# reductions too (sums, norms, the isneginf/all checks of masked softmax) and AccumulateGrad,
# autograd adding a parameter's gradient into .grad; "other" is what is left: allocation,
# views, embedding look-ups, the loss's nll.
_PATTERNS = (
    ("communication", re.compile(r"all_?reduce|all_?gather|reduce_?scatter|broadcast|nccl|gloo|c10d|barrier")),
    ("convolution", re.compile(r"conv")),
    ("matmul/attention", re.compile(r"^(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv|dot|_addmm_activation)$"
                                    r"|attention|sdpa|flash|efficient_attention")),
    ("normalization", re.compile(r"batch_norm|layer_norm|group_norm|instance_norm|rms_norm|native_norm")),
    ("dropout", re.compile(r"^(bernoulli|dropout|native_dropout|fused_dropout|feature_dropout)_?$")),
    ("element-wise", re.compile(
        r"^(add|sub|mul|div|neg|relu|gelu|silu|tanh|sigmoid|threshold|pow|sqrt|rsqrt|exp|log|clamp|clamp_min|"
        r"clamp_max|where|masked_fill|copy|fill|zero|clone|to|_to_copy|to_copy|softmax|_softmax|_safe_softmax|"
        r"log_softmax|_log_softmax|maximum|minimum|lerp|addcmul|addcdiv|abs|sign|hardtanh|leaky_relu|"
        r"isneginf|isposinf|isinf|isnan|isfinite|sum|mean|all|any|norm|linalg_vector_norm|accumulate_grad)_?$"
        r"|^(relu|gelu|threshold|tanh|softmax|_softmax|log_softmax|_log_softmax)")),
)
# what a kept op profile was categorized by: a profile kept under other rules is measured again
CATEGORY_RULES = tuple((category, pattern.pattern) for category, pattern in _PATTERNS)


def op_category(name: str) -> str:
    """The operation category of a profiler event name (one of `OP_CATEGORIES`)."""
    base = name.split(": ")[-1]                     # "autograd::engine::evaluate_function: XBackward0"
    base = base.split("::")[-1]                     # drop namespaces (aten::, c10d::)
    base = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()   # autograd nodes: NativeBatchNorm -> native_batch_norm
    base = re.sub(r"_?backward\d*$", "", base).rstrip("_")    # in-place variants: add_ -> add
    for category, pattern in _PATTERNS:
        if pattern.search(base):
            return category
    return "other"


# ------------------------------------------------------------------ profiler by category
def _inside_optimizer(event) -> bool:
    parent = event
    while parent is not None:
        if parent.name == OPTIMIZER_REGION:
            return True
        parent = parent.cpu_parent
    return False


def profile_training_steps(step: Callable[[], int], *, steps: int = 2, warmup_steps: int = 1,
                           device: torch.device | str = "cpu") -> pd.DataFrame:
    """Run `step` (one optimizer step; returns the items it trained on, and wraps its optimizer
    update in ``record_function(OPTIMIZER_REGION)``) `warmup_steps` times, then `steps` times
    under torch.profiler. Returns self time per category in ms (device time on CUDA, else CPU
    time), its share, and time per trained item."""
    if not isinstance(steps, int) or steps < 1:
        _fail("steps", steps, "an integer >= 1")
    device = torch.device(device)
    for _ in range(warmup_steps):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # the profiler library's own start/stop lines and, without a GPU, its failed device query are
    # printed to the process's stderr (into an executed notebook); read at its first use, a
    # level set by the user wins
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    items = 0
    with profile(activities=activities) as prof:
        for _ in range(steps):
            items += step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    cpu_us, device_us = defaultdict(float), defaultdict(float)
    for event in prof.events():
        if getattr(event, "device_type", None) is not None and event.device_type.name != "CPU":
            continue
        category = "optimizer" if _inside_optimizer(event) else op_category(event.name)
        cpu_us[category] += event.self_cpu_time_total
        device_us[category] += getattr(event, "self_device_time_total", 0.0) or 0.0
    use_device = device.type == "cuda" and sum(device_us.values()) > 0
    times = device_us if use_device else cpu_us
    total = sum(times.values()) or 1.0
    rows = [dict(category=c, self_time_ms=times[c] / 1e3, share=times[c] / total,
                 time_per_item_ms=times[c] / 1e3 / max(items, 1), clock="device" if use_device else "cpu")
            for c in OP_CATEGORIES]
    return pd.DataFrame(rows)


def _task_setup(task: str, config, *, profile: str, data_policy: str, data_dir, device, seed: int, plans_dir=None):
    """Model, optimizer, engine and micro-batches of a task exactly as the runner builds them
    (``"auto"`` as planned in `plans_dir`)."""
    prof = get_profile(task, profile)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg, _ = resolve_config(config, prof, device, plans_dir=plans_dir, data_policy=data_policy, data_dir=data_dir)
    torch.manual_seed(seed)
    bundle = build_task(prof, data_policy=data_policy, data_dir=data_dir, device=device, seed=seed)
    engine, micro = build_engine(bundle, prof, cfg, device=device)
    return bundle, engine.model, engine, bundle.train_batches(micro, seed=seed), cfg, device


def _kept(out_dir, name: str, kind: str, settings: dict, task: str, bundle, device, profile: str, data_policy: str):
    """(path, conditions, the record kept there under them with `settings` or None); all None
    without `out_dir`."""
    if out_dir is None:
        return None, None, None
    path = Path(out_dir) / f"{name}.json"
    conditions = run_conditions(device=device, backend="torch", world_size=1, data_source=bundle.data_source,
                                data_policy=data_policy, profile_settings=get_profile(task, profile).to_dict())
    return path, conditions, kept_record(path, kind=kind, settings=settings, conditions=conditions)


def _keep(path, conditions, kind: str, settings: dict, result, *, task: str, profile: str, device) -> None:
    if path is not None:
        keep_record(path, kind=kind, settings=settings, conditions=conditions, profile=profile, device=device,
                    task=task, result=result)


def profile_operations(task: str, config: str | OptimizationConfig = "baseline", *, profile: str = "smoke",
                       steps: int = 2, warmup_steps: int = 1, data_policy: str = "auto", data_dir=None, device=None,
                       seed: int = 0, out_dir: str | os.PathLike | None = None,
                       plans_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """Self time by operation category over `steps` optimizer steps of `task` trained with
    `config` (a preset's name, ``"auto"`` as planned in `plans_dir`, or an OptimizationConfig)
    under `profile` (same model, data and engine as `runner.run`); kept in and reused from
    ``<out_dir>/op_profile__<task>__<name>.json`` when `out_dir` is given."""
    bundle, model, engine, batches, cfg, device = _task_setup(
        task, config, profile=profile, data_policy=data_policy, data_dir=data_dir, device=device, seed=seed,
        plans_dir=plans_dir)
    settings = dict(config=cfg.computation_fields(), steps=steps, warmup_steps=warmup_steps, seed=seed,
                    category_rules=CATEGORY_RULES)
    name = f"op_profile__{task}__{file_stem(cfg.name)}"
    path, conditions, kept = _kept(out_dir, name, "op_profile", settings, task, bundle, device, profile,
                                   data_policy)
    if kept is not None:
        engine.close()
        return pd.DataFrame(kept["result"])

    def one_step() -> int:
        items = 0
        while True:
            x, y = next(batches)
            boundary = engine.is_accumulation_boundary
            with engine.autocast():
                loss, num_items = bundle.loss(model, x, y)
            engine.backward(loss, num_items=num_items, num_samples=len(x))
            items += int(num_items)
            if boundary:
                with record_function(OPTIMIZER_REGION):
                    engine.step()
                return items

    try:
        frame = profile_training_steps(one_step, steps=steps, warmup_steps=warmup_steps, device=device)
    finally:
        engine.close()
    frame.insert(0, "config", cfg.name)
    frame.insert(0, "task", task)
    _keep(path, conditions, "op_profile", settings, frame.to_dict("records"), task=task, profile=profile, device=device)
    return frame


# ------------------------------------------------------------------ activations by module type
def activation_bytes_by_module_type(model: torch.nn.Module, forward: Callable[[], object]) -> dict[str, int]:
    """Bytes autograd saves for backward during `forward()` (e.g. forward + loss), attributed
    to the innermost module type running when each tensor was saved; each storage counts once,
    parameters and buffers not at all. Inside non-reentrant checkpointed segments only what the
    checkpoint keeps is saved, so checkpointing shows up as smaller counts."""
    stack: list[str] = []
    excluded = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen, counts = set(), defaultdict(int)

    def push(module, *_):
        stack.append(type(module).__name__)

    def pop(module, *_):
        if stack:
            stack.pop()

    def pack(tensor):
        key = (tensor.device, tensor.untyped_storage().data_ptr())
        if key[1] not in excluded and key not in seen:
            seen.add(key)
            counts[stack[-1] if stack else "(outside modules)"] += tensor.untyped_storage().nbytes()
        return tensor

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(push), m.register_forward_hook(pop))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = forward()
        del output
    finally:
        for handle in handles:
            handle.remove()
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def task_activation_memory(task: str, config: str = "baseline", *, profile: str = "smoke", data_policy: str = "auto",
                           data_dir=None, device=None, seed: int = 0) -> pd.DataFrame:
    """`activation_bytes_by_module_type` for one micro-batch forward of `task` under `config`
    (its micro-batch size, precision and checkpointing)."""
    bundle, model, engine, batches, cfg, device = _task_setup(
        task, config, profile=profile, data_policy=data_policy, data_dir=data_dir, device=device, seed=seed)
    x, y = next(batches)

    def forward():
        with engine.autocast():
            return bundle.loss(model, x, y)[0]

    try:
        counts = activation_bytes_by_module_type(model, forward)
    finally:
        engine.close()
    return pd.DataFrame([dict(task=task, config=cfg.name, precision=cfg.precision, micro_batch_size=len(x),
                              module_type=k, activation_bytes=v) for k, v in counts.items()])


# ------------------------------------------------------------------ recomputation overhead
def time_forward_backward_s(model: torch.nn.Module, loss_of: Callable[[object], torch.Tensor], batches: Iterable,
                            *, precision: str = "fp32", device: torch.device | str = "cpu") -> tuple[float, float]:
    """(forward seconds, forward + backward seconds) summed over `batches` (CUDA synchronized)."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    forward_s = total_s = 0.0
    for batch in batches:
        sync()
        start = time.perf_counter()
        with autocast(device, precision) if precision != "fp32" else nullcontext():
            loss = loss_of(batch)
        sync()
        middle = time.perf_counter()
        loss.backward()
        sync()
        end = time.perf_counter()
        forward_s += middle - start
        total_s += end - start
        model.zero_grad(set_to_none=True)
    return forward_s, total_s


def measure_recompute_overhead(task: str, *, config: str = "+lr_schedule", segments="sqrt", profile: str = "smoke",
                               repeats: int = 5, batches_per_repeat: int = 2, data_policy: str = "auto",
                               data_dir=None, device=None, seed: int = 0,
                               out_dir: str | os.PathLike | None = None) -> dict:
    """Recomputation overhead of √L activation checkpointing, timed directly: the median
    forward+backward time with checkpointing over the median without, minus one, on the same
    model, micro-batches and precision (`config` without checkpointing). Also reports the
    forward share of a plain step -- eq. 20's bound: recomputing every checkpointed block once
    costs about one extra forward. Kept in and reused from
    ``<out_dir>/recompute_overhead__<task>.json`` when `out_dir` is given."""
    if not isinstance(repeats, int) or repeats < 1:
        _fail("repeats", repeats, "an integer >= 1")
    plain = OptimizationConfig.preset(config).replace(checkpointing=None) if isinstance(config, str) else config
    bundle, model, engine, batches, cfg, device = _task_setup(
        task, plain, profile=profile, data_policy=data_policy, data_dir=data_dir, device=device, seed=seed)
    engine.close()
    settings = dict(config=cfg.computation_fields(), segments=segments, repeats=repeats,
                    batches_per_repeat=batches_per_repeat, seed=seed)
    path, conditions, kept = _kept(out_dir, f"recompute_overhead__{task}", "recompute_overhead", settings, task,
                                   bundle, device, profile, data_policy)
    if kept is not None:
        return kept["result"]
    fixed = [next(batches) for _ in range(batches_per_repeat)]

    def loss_of(batch):
        return bundle.loss(model, *batch)[0]

    time_forward_backward_s(model, loss_of, fixed[:1], precision=cfg.precision, device=device)  # warm-up
    plain_s, checkpointed_s, forward_s = [], [], []
    for _ in range(repeats):  # alternate so that both see the same background load
        fwd, total = time_forward_backward_s(model, loss_of, fixed, precision=cfg.precision, device=device)
        plain_s.append(total)
        forward_s.append(fwd)
        plan = apply_activation_checkpointing(model, segments)
        checkpointed_s.append(time_forward_backward_s(model, loss_of, fixed, precision=cfg.precision, device=device)[1])
        remove_activation_checkpointing(model)
    step_plain, step_cp = statistics.median(plain_s), statistics.median(checkpointed_s)
    result = dict(task=task, precision=cfg.precision, blocks=plan.num_blocks, segments=plan.segments,
                  step_s_plain=step_plain / batches_per_repeat, step_s_checkpointed=step_cp / batches_per_repeat,
                  recompute_overhead=step_cp / step_plain - 1,
                  forward_share=statistics.median(forward_s) / step_plain, repeats=repeats)
    _keep(path, conditions, "recompute_overhead", settings, result, task=task, profile=profile, device=device)
    return result
