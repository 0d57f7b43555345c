"""The explorer's computations (notebooks/explorer.ipynb): pick components, k, precision and
checkpoint segments; see the memory the paper's equations predict beside what was measured.

The prediction is the paper's memory model, calibrated on one measured baseline run:
- eq. 8:  M_total = M_model + M_optimizer + M_activation / k   (same effective batch split
  into k micro-batches, so activations scale with the micro-batch B_eff / k);
- eq. 17: reduced precision saves 0.5 · (M_weights + M_gradients) (the paper's model; torch
  autocast actually keeps FP32 master weights, which the measured column shows);
- eq. 19: √L checkpointing keeps the fraction `checkpointing.expected_saved_fraction` of the
  activations (segment inputs plus one recomputed segment).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..checkpointing import expected_saved_fraction
from ..config import OptimizationConfig
from .index import format_number
from .results import aggregate

FP32_BYTES = 4
ADAMW_STATE_BYTES_PER_PARAMETER = 8   # two FP32 moments
EXPLORER_COMPONENTS = ("accumulation", "mixed_precision", "lr_schedule", "checkpointing", "zero2")
# fields of OptimizationConfig that tell two configurations apart in the explorer
_MATCH_FIELDS = ("k", "adaptive", "k_min", "k_max", "schedule", "lr_scaling", "clip_norm", "checkpointing", "zero_stage")


def _fail(argument: str, value, allowed: str) -> None:
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


@dataclass(frozen=True)
class MemoryModel:
    """Calibration of eqs. 8/17/19 for one model: parameter count, activation bytes per sample
    (FP32, no checkpointing) and the number of blocks L checkpointing partitions."""

    num_parameters: int
    activation_bytes_per_sample: float
    num_blocks: int


def num_blocks_of(profile_settings: dict) -> int:
    """L: bottleneck blocks of the ResNet (sum of the stages) or transformer blocks of GPT-2."""
    model = profile_settings.get("model", {})
    if "layers" in model:
        return int(sum(model["layers"]))
    if "n_layer" in model:
        return int(model["n_layer"])
    _fail("profile_settings", model, "a profile with a ResNet ('layers') or GPT-2 ('n_layer') model size")


def memory_model_from_record(record: dict) -> MemoryModel:
    """Calibrate on a measured run without checkpointing: activation bytes of its tracked step
    divided by its micro-batch size (an FP32 run gives eq. 8's M_activation directly)."""
    config = record.get("config", {})
    if config.get("checkpointing") is not None:
        _fail("record", record.get("config_name"), "a run record without activation checkpointing")
    breakdown = record["metrics"].get("memory_breakdown_bytes") or {}
    if "activations" not in breakdown:
        _fail("record", record.get("config_name"), "a run record whose memory breakdown has 'activations'")
    return MemoryModel(num_parameters=int(record["num_parameters"]),
                       activation_bytes_per_sample=breakdown["activations"] / record["micro_batch_size"],
                       num_blocks=num_blocks_of(record["profile_settings"]))


def predict_memory_bytes(model: MemoryModel, *, effective_batch_size: int, k: int = 1, precision: str = "fp32",
                         segments: int | str | None = None) -> dict[str, float]:
    """The paper's predicted memory by category (bytes) and its total (module docstring)."""
    if not isinstance(k, int) or k < 1:
        _fail("k", k, "an integer >= 1")
    if precision not in ("fp32", "fp16", "bf16"):
        _fail("precision", precision, "one of ('fp32', 'fp16', 'bf16')")
    if not isinstance(effective_batch_size, int) or effective_batch_size < k:
        _fail("effective_batch_size", effective_batch_size, f"an integer >= k ({k})")
    weights = gradients = FP32_BYTES * model.num_parameters
    if precision != "fp32":                       # eq. 17
        weights, gradients = 0.5 * weights, 0.5 * gradients
    activations = model.activation_bytes_per_sample * effective_batch_size / k     # eq. 8
    if segments is not None:                     # eq. 19
        activations *= expected_saved_fraction(model.num_blocks, segments)
    parts = dict(parameters=weights, gradients=gradients,
                 optimizer_state=float(ADAMW_STATE_BYTES_PER_PARAMETER * model.num_parameters),
                 activations=activations)
    parts["total"] = sum(parts.values())
    return parts


def config_from_components(components, *, k: int | None = None, adaptive: bool = True, precision: str = "fp16",
                           segments: int | str = "sqrt") -> OptimizationConfig:
    """The configuration with the chosen components on (the rest as in the baseline), each
    component taking the optimized preset's settings except `k` (default: the preset's starting
    k), `precision` and `segments`."""
    unknown = set(components) - set(EXPLORER_COMPONENTS)
    if unknown:
        _fail("components", sorted(unknown), f"a subset of {EXPLORER_COMPONENTS}")
    optimized = OptimizationConfig.optimized()
    k = optimized.k if k is None else k
    fields = {}
    if "accumulation" in components:
        fields.update(k=k, adaptive=adaptive, k_min=min(k, optimized.k_min) if adaptive else 1,
                      k_max=max(k, optimized.k_max) if adaptive else 1)
    if "mixed_precision" in components:
        fields.update(precision=precision)
    if "lr_schedule" in components:
        fields.update(schedule=optimized.schedule, warmup_fraction=optimized.warmup_fraction,
                      min_lr_ratio=optimized.min_lr_ratio, lr_scaling=True, clip_norm=optimized.clip_norm)
    if "checkpointing" in components:
        fields.update(checkpointing=segments)
    if "zero2" in components:
        fields.update(zero_stage=2)
    return OptimizationConfig.baseline().replace(name="explorer", **fields)


def find_measured(records: list[dict], task: str, config: OptimizationConfig) -> list[dict]:
    """Records of `task` run with `config`'s settings (fp16 and bf16 count as the same reduced
    precision: a CPU profile runs fp16 as bf16 and its record says so)."""
    def reduced(precision):
        return precision != "fp32"

    wanted = config.to_dict()
    return [r for r in records if r["task"] == task
            and all(r["config"].get(f) == wanted[f] for f in _MATCH_FIELDS)
            and reduced(r["config"].get("precision", "fp32")) == reduced(config.precision)]


def explore(records: list[dict], task: str, config: OptimizationConfig, *, calibration: dict | None = None) -> pd.DataFrame:
    """One table for the explorer: predicted memory by category (eqs. 8/17/19, calibrated on the
    task's measured baseline run or `calibration`) beside the measured means over seeds of the
    matching runs (peak memory, its breakdown, throughput, time to target, final quality)."""
    baseline = calibration or next((r for r in records if r["task"] == task and r["config_name"] == "baseline"), None)
    rows = []
    matched = find_measured(records, task, config)
    model, note = None, ""
    if baseline is None:
        note = f"no baseline run of {task!r} to calibrate the prediction on"
    else:
        try:
            model = memory_model_from_record(baseline)
        except ValueError as error:  # e.g. CUDA runs without a live-tensor breakdown
            note = f"no prediction: {error}"
    if model is not None:
        batch = baseline["micro_batch_size"]  # the baseline batch = the effective batch of eq. 8
        split = config.batch_splits  # the micro-batch as the runs split it
        predicted = predict_memory_bytes(model, effective_batch_size=max(batch, split), k=split,
                                         precision=config.precision, segments=config.checkpointing)
        rows += [dict(quantity=f"memory: {key}", predicted=value, unit="bytes") for key, value in predicted.items()]
    measured = {}
    if matched:
        agg = aggregate(matched).iloc[0]
        breakdown = pd.DataFrame([r["metrics"].get("memory_breakdown_bytes") or {} for r in matched]).mean()
        measured.update({f"memory: {k}": v for k, v in breakdown.items()})
        measured["memory: total"] = agg["peak_memory_bytes_mean"]
        measured.update({"throughput": agg["throughput_mean"], "time to target (s)": agg["time_to_target_s_mean"],
                         "final quality": agg["final_quality_mean"]})
    known = {row["quantity"] for row in rows}
    for row in rows:
        row["measured"] = measured.get(row["quantity"], math.nan)
    rows += [dict(quantity=q, predicted=math.nan, measured=v, unit="bytes" if q.startswith("memory") else "")
             for q, v in measured.items() if q not in known]
    frame = pd.DataFrame(rows, columns=["quantity", "predicted", "measured", "unit"])
    frame.attrs["note"] = note
    frame.attrs["matched_runs"] = [f"{r['config_name']} (seed {r.get('seed')}, ran {r['config'].get('precision')})"
                                   for r in matched]
    return frame


def format_explore(table: pd.DataFrame) -> pd.DataFrame:
    """`explore`'s table for reading: memory in MiB, other quantities with 4 significant digits."""

    def shown(value, unit):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        return f"{value / 2**20:,.3f} MiB" if unit == "bytes" else format_number(float(value))

    out = table[["quantity"]].copy()
    for column in ("predicted", "measured"):
        out[column] = [shown(v, u) for v, u in zip(table[column], table["unit"])]
    return out


def explorer_app(records: list[dict], tasks=("cifar10", "wikitext2")):
    """An ipywidgets panel: task, components, k, adaptive, precision and segments -> the
    `explore` table and, for matching runs, quality vs training time. Renders headless too."""
    import ipywidgets as widgets
    from IPython.display import display

    from .figures import quality_curves

    task = widgets.Dropdown(options=list(tasks), description="task")
    components = widgets.SelectMultiple(options=EXPLORER_COMPONENTS, value=EXPLORER_COMPONENTS, description="components",
                                        rows=len(EXPLORER_COMPONENTS))
    k = widgets.IntSlider(value=OptimizationConfig.optimized().k, min=1, max=8, description="k")
    adaptive = widgets.Checkbox(value=True, description="adaptive k")
    precision = widgets.Dropdown(options=["fp16", "bf16", "fp32"], value="fp16", description="precision")
    segments = widgets.IntSlider(value=4, min=1, max=16, description="segments")
    sqrt_segments = widgets.Checkbox(value=True, description="⌈√L⌉ segments")

    def show(task, components, k, adaptive, precision, segments, sqrt_segments):
        try:
            config = config_from_components(components, k=k, adaptive=adaptive, precision=precision,
                                            segments="sqrt" if sqrt_segments else segments)
            table = explore(records, task, config)
        except ValueError as error:
            print(f"not a valid choice: {error}")
            return
        display(format_explore(table))
        if table.attrs["note"]:
            print(table.attrs["note"])
        print("measured runs:", ", ".join(table.attrs["matched_runs"]) or
              "none with these settings (run trainopt_core.reproduction.run with a matching configuration)")
        matched = find_measured(records, task, config)
        if matched:
            display(quality_curves(matched, task))

    output = widgets.interactive_output(show, dict(task=task, components=components, k=k, adaptive=adaptive,
                                                   precision=precision, segments=segments, sqrt_segments=sqrt_segments))
    controls = widgets.HBox([widgets.VBox([task, components]), widgets.VBox([k, adaptive, precision]),
                             widgets.VBox([segments, sqrt_segments])])
    return widgets.VBox([controls, output])
