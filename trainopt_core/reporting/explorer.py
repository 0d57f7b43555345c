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
from ..config import OptimizationConfig, computation_part
from .index import format_number, markdown_table
from .results import aggregate
from .._errors import fail as _fail

FP32_BYTES = 4
ADAMW_STATE_BYTES_PER_PARAMETER = 8   # two FP32 moments
EXPLORER_COMPONENTS = ("accumulation", "mixed_precision", "lr_schedule", "checkpointing", "zero2")
# fields of OptimizationConfig that tell two configurations apart in the explorer
_MATCH_FIELDS = ("k", "adaptive", "k_min", "k_max", "schedule", "lr_scaling", "clip_norm", "checkpointing", "zero_stage")


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
        if adaptive:  # the preset's rule of eq. 6, as its runs used it
            fields.update(k_rule=optimized.k_rule, sigma_target=optimized.sigma_target)
    if "mixed_precision" in components:
        fields.update(precision=precision)
    if "lr_schedule" in components:
        fields.update(schedule=optimized.schedule, warmup_fraction=optimized.warmup_fraction,
                      min_lr_ratio=optimized.min_lr_ratio, lr_scaling=True, clip_norm=optimized.clip_norm)
    elif adaptive and "accumulation" in components:  # the LR as the baseline's, as the "-lr_schedule" runs
        fields.update(lr_scaling=False)                   # kept it (adaptive k's default scales it)
    if "checkpointing" in components:
        fields.update(checkpointing=segments)
    if "zero2" in components:
        fields.update(zero_stage=2)
    return OptimizationConfig.baseline().replace(name="explorer", **fields)


def _settings(config: dict) -> dict:
    """A configuration dict with its defaults resolved as they run (lr_scaling's None)."""
    return {**config, **{f: v for f, v in computation_part(config).items() if f in _MATCH_FIELDS}}


def _precision_matches(record: dict, config: OptimizationConfig) -> bool:
    """fp32 selected: the run ran fp32, also where it asked for reduced precision on a CPU
    without bf16 instructions (it computed what an fp32 run computes). fp16 or bf16 selected: the
    run asked for reduced precision (the two count as one: a CPU profile runs fp16 as bf16),
    whatever ran; each record says what ran."""
    from ..reproduction.runner import asked_for_reduced_precision

    if config.precision == "fp32":
        return record["config"].get("precision", "fp32") == "fp32"
    return asked_for_reduced_precision(record)


def find_measured(records: list[dict], task: str, config: OptimizationConfig) -> list[dict]:
    """Records of `task` run with `config`'s settings (its precision as `_precision_matches`)."""
    wanted = _settings(config.to_dict())
    return [r for r in records if r["task"] == task
            and all(_settings(r["config"]).get(f) == wanted[f] for f in _MATCH_FIELDS)
            and _precision_matches(r, config)]


def nearest_measured(records: list[dict], task: str, config: OptimizationConfig) -> tuple[str, list[str]] | None:
    """The measured configuration of `task` nearest to `config` -- the fewest settings that
    differ -- and those settings ("k: 4 measured, 6 selected"); None when `task` has no runs."""
    wanted, best = _settings(config.to_dict()), None
    for record in {r["config_name"]: r for r in records if r["task"] == task}.values():
        measured = _settings(record["config"])
        differ = [f"{field}: {measured.get(field)!r} measured, {wanted[field]!r} selected"
                  for field in _MATCH_FIELDS if measured.get(field) != wanted[field]]
        if not _precision_matches(record, config):
            differ.append(f"precision: {record['config'].get('precision')!r} measured, {config.precision!r} selected")
        if best is None or len(differ) < len(best[1]):
            best = (record["config_name"], differ)
    return best


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
        rows += [dict(quantity=f"memory: {key.replace('_', ' ')}", predicted=value, unit="bytes")
                 for key, value in predicted.items()]
    measured = {}
    if matched:
        agg = aggregate(matched).iloc[0]
        breakdown = pd.DataFrame([r["metrics"].get("memory_breakdown_bytes") or {} for r in matched]).mean()
        measured.update({f"memory: {k.replace('_', ' ')}": v for k, v in breakdown.items()})
        measured["memory: total"] = agg["peak_memory_bytes_mean"]
        metrics = matched[0]["metrics"]
        accuracy = metrics.get("quality_name") == "accuracy"
        quality = "final quality (test accuracy, %)" if accuracy else "final quality (validation perplexity)"
        measured.update({f"throughput ({metrics.get('throughput_unit', 'items/s')})": agg["throughput_mean"],
                         "time to target (s)": agg["time_to_target_s_mean"],
                         quality: agg["final_quality_mean"] * (100 if accuracy else 1)})
    known = {row["quantity"] for row in rows}
    for row in rows:
        row["measured"] = measured.get(row["quantity"], math.nan)
    rows += [dict(quantity=q, predicted=math.nan, measured=v, unit="bytes" if q.startswith("memory") else "")
             for q, v in measured.items() if q not in known]
    frame = pd.DataFrame(rows, columns=["quantity", "predicted", "measured", "unit"])
    ran = {r["config"].get("precision") for r in matched}
    frame["why they differ"] = [_why(row.quantity, row.predicted, row.measured, config, ran_fp32=ran == {"fp32"})
                                for row in frame.itertuples()]
    frame.attrs["note"] = note
    frame.attrs["data_source"] = "; ".join(sorted({r.get("data_source", "?") for r in
                                                    (matched or ([baseline] if baseline else []))}))
    frame.attrs["matched_runs"] = [f"{r['config_name']} (seed {r.get('seed')}, ran {r['config'].get('precision')})"
                                   for r in matched]
    return frame


def _why(quantity: str, predicted: float, measured: float, config: OptimizationConfig, *,
         ran_fp32: bool = False) -> str:
    """Why a measured value differs from the paper's prediction (or what it is, where the
    equations have no term for it): what the live-tensor tracker (`measure.tracker`) counts in
    each category at the step's peak, against what eqs. 8/17/19 assume. `ran_fp32`: the
    matching runs ran fp32 although reduced precision was selected (no autocast ran)."""
    reduced = config.precision != "fp32"
    missing = measured is None or math.isnan(measured)
    category = quantity.removeprefix("memory: ")
    if reduced and ran_fp32 and category in ("parameters", "gradients", "activations", "temporaries"):
        own = _why(quantity, predicted, measured, config.replace(precision="fp32"))
        halved = f"eq. 17 predicts {config.precision}; " if category in ("parameters", "gradients") else ""
        return f"{halved}these runs ran fp32 (their CPU has no bf16 instructions), so no autocast ran: {own}"
    if category == "parameters":
        if reduced:
            return (f"eq. 17 assumes {config.precision} weights (half of FP32); autocast keeps the FP32 weights the "
                    f"optimizer updates and casts {config.precision} copies for its ops, which count as activations "
                    f"where saved for backward, else as temporaries")
        return "FP32 weights, as eq. 8 assumes"
    if category == "gradients":
        if not missing and not math.isnan(predicted) and measured < 0.05 * predicted:
            return ("the breakdown is a snapshot at the step's peak, reached as backward begins, before most "
                    "gradients exist (their own maximum comes later, once activations are freed)")
        if reduced:
            return "gradients of FP32 weights are FP32 under autocast; eq. 17 halves them"
        return "one FP32 gradient per parameter, as eq. 8 assumes"
    if category == "optimizer state":
        return "AdamW's two FP32 moments per parameter, as eq. 8 assumes"
    if category == "activations":
        parts = []
        if config.checkpointing is not None:
            parts.append("with checkpointing only each segment's input stays saved; the segment recomputed in "
                         "backward holds its activations as temporaries, while eq. 19 counts them here and assumes "
                         "equal blocks")
        if config.batch_splits > 1:
            parts.append(f"eq. 8 scales the baseline's activations by the micro-batch (÷ {config.batch_splits}"
                         + (": with adaptive k the baseline batch is split into k_min micro-batches, whatever k starts at"
                            if config.adaptive else "") + ")")
        if reduced:
            parts.append(f"autocast saves many activations in {config.precision} (half of FP32), which eqs. 8/17 "
                         "do not model")
        return "; ".join(parts) or "the baseline's activations: the calibration point of the prediction"
    if category == "buffers":
        return ("the model's buffers (a ResNet's BatchNorm running statistics, the GPT-2's vocabulary-padding "
                "bias); no term in the paper's equations") if not missing and measured > 0 else "no buffers in this model"
    if category == "temporaries":
        return ("outputs awaiting their consumer, backward buffers"
                + (", autocast's low-precision weight copies" if reduced else "")
                + (" and the recomputed segment's activations" if config.checkpointing is not None else "")
                + "; no term in the paper's equations")
    if category == "total":
        return "predicted: the sum of eq. 8's four terms; measured: the step's peak (the sum of every memory row at that moment)"
    if quantity.startswith("throughput"):
        return "mean of the interleaved timing windows (or each run's own clock); the equations predict no speed"
    if quantity.startswith("time to target"):
        return "samples to target × seconds per sample; the equations predict no time"
    return ""


def format_explore(table: pd.DataFrame) -> pd.DataFrame:
    """`explore`'s table for reading: memory in MiB, other quantities with 4 significant digits,
    and why prediction and measurement differ."""

    def shown(value, unit):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        return f"{value / 2**20:,.3f} MiB" if unit == "bytes" else format_number(float(value))

    out = table[["quantity"]].copy()
    for column in ("predicted", "measured"):
        out[column] = [shown(v, u) for v, u in zip(table[column], table["unit"])]
    if "why they differ" in table:
        out["why they differ"] = table["why they differ"]
    return out


def num_blocks_for(records: list[dict], task: str) -> int | None:
    """L of the model the task's runs trained (from a record's profile settings), or None."""
    for r in records:
        if r["task"] == task and r.get("profile_settings"):
            try:
                return num_blocks_of(r["profile_settings"])
            except ValueError:
                continue
    return None


def precision_that_ran(records: list[dict], task: str | None = None) -> str:
    """The precision the optimized runs ran: bf16 where the paper's fp16 runs as bf16 (a CPU with
    bf16 instructions), fp32 where reduced precision did not run (a CPU without them); the
    paper's fp16 when there are no optimized runs."""
    ran = [r["config"].get("precision") for r in records if r["config_name"] == "optimized"
           and (task is None or r["task"] == task)]
    return next((p for p in ran if p and p != "fp32"), "fp32" if any(ran) else "fp16")


def runs_summary(records: list[dict]) -> pd.DataFrame:
    """One row per task and configuration for reading: seeds, precision that ran, throughput,
    peak memory, time to target and final quality (means over seeds) with their units, and
    the data each ran on (a stand-in says so)."""
    def value(x, scale=1.0, unit=""):
        return "—" if x is None or pd.isna(x) else f"{format_number(float(x) * scale)}{unit}"

    rows = []
    by_task = {r["task"]: r for r in records}
    for row in aggregate(records).itertuples():
        metrics = by_task[row.task]["metrics"]
        accuracy = metrics.get("quality_name") == "accuracy"
        rows.append({"task": row.task, "configuration": row.config_name, "seeds": row.n_seeds,
                     "precision run": row.precision,
                     "throughput": value(row.throughput_mean, unit=f" {metrics.get('throughput_unit', 'items/s')}"),
                     "peak memory": value(row.peak_memory_bytes_mean, 2**-20, " MiB"),
                     "time to target": value(row.time_to_target_s_mean, unit=" s"),
                     "final quality": value(row.final_quality_mean, 100, " % accuracy") if accuracy
                     else value(row.final_quality_mean, unit=" perplexity"),
                     "data": by_task[row.task].get("data_source", "?")})
    return pd.DataFrame(rows)


def default_config(records: list[dict], task: str) -> OptimizationConfig:
    """The panel's selection when it opens: every component, the optimized preset's k and
    adaptive k, the reduced precision the optimized runs used, ⌈√L⌉ segments."""
    optimized = OptimizationConfig.optimized()
    return config_from_components(EXPLORER_COMPONENTS, k=optimized.k, adaptive=optimized.adaptive,
                                  precision=precision_that_ran(records, task), segments="sqrt")


def show_view(records: list[dict], task: str, config: OptimizationConfig) -> None:
    """What the panel shows for a selection: the `explore` table, the matching runs (or the
    nearest measured configuration and the settings that differ) and their quality curves."""
    from IPython.display import display

    from .figures import figure_image, quality_curves
    from .notebook import show_markdown

    try:
        table = explore(records, task, config)
    except ValueError as error:
        print(f"not a valid choice: {error}")
        return
    show_markdown(f"Data: {table.attrs['data_source'] or 'no runs'}\n\n{markdown_table(format_explore(table))}")
    if table.attrs["note"]:
        print(table.attrs["note"])
    if table.attrs["matched_runs"]:
        print("measured runs:", ", ".join(table.attrs["matched_runs"]))
    else:
        nearest = nearest_measured(records, task, config)
        print("measured runs: none with these settings" + (
            f"; the nearest measured is {nearest[0]!r}, which differs in {'; '.join(nearest[1])}" if nearest
            else " (run trainopt_core.reproduction.run with a matching configuration)"))
    matched = find_measured(records, task, config)
    if matched:
        display(figure_image(quality_curves(matched, task)))


def show_default_view(records: list[dict], tasks=("cifar10", "wikitext2")) -> None:
    """The panel's default view of each task, rendered as plain outputs: what a reader of the
    executed notebook sees without a kernel (a widget panel needs one)."""
    from .notebook import show_markdown

    for task in tasks:
        show_markdown(f"### {task}: the default selection")
        show_view(records, task, default_config(records, task))


def explorer_app(records: list[dict], tasks=("cifar10", "wikitext2")):
    """An ipywidgets panel: task, components, k, adaptive, precision and segments -> the
    `explore` table and, for matching runs, quality vs training time. Renders headless too."""
    import ipywidgets as widgets

    from .notebook import panel
    tasks = list(tasks)
    optimized = OptimizationConfig.optimized()
    full = dict(style={"description_width": "initial"})  # labels shown whole, not cut to "compone…"
    task = widgets.Dropdown(options=tasks, description="task", **full)
    components = widgets.SelectMultiple(options=EXPLORER_COMPONENTS, value=EXPLORER_COMPONENTS, description="components",
                                        rows=len(EXPLORER_COMPONENTS), **full)
    k = widgets.IntSlider(value=optimized.k, min=1, max=optimized.k_max,
                          description="k", tooltip="micro-batches per optimizer step (the starting k when adaptive)", **full)
    adaptive = widgets.Checkbox(value=optimized.adaptive, description="adaptive k")
    ran = precision_that_ran(records, tasks[0] if tasks else None)
    precision = widgets.Dropdown(options=list(dict.fromkeys([ran, "bf16", "fp16", "fp32"])), value=ran,
                                 description="precision", **full)
    segments = widgets.IntSlider(value=1, min=1, max=1, description="segments", **full)
    sqrt_segments = widgets.Checkbox(value=True, description="⌈√L⌉ segments")

    def bound_segments(change=None):
        """Segments run from 1 to the selected model's block count L (default ⌈√L⌉)."""
        blocks = num_blocks_for(records, task.value) or max(segments.max, 1)
        segments.max = blocks
        segments.value = min(blocks, math.ceil(math.sqrt(blocks)))
        segments.description = f"segments (L={blocks})"

    bound_segments()
    task.observe(bound_segments, names="value")

    def show(task, components, k, adaptive, precision, segments, sqrt_segments):
        try:
            config = config_from_components(components, k=k, adaptive=adaptive, precision=precision,
                                            segments="sqrt" if sqrt_segments else segments)
        except ValueError as error:
            print(f"not a valid choice: {error}")
            return
        show_view(records, task, config)

    output = widgets.interactive_output(show, dict(task=task, components=components, k=k, adaptive=adaptive,
                                                   precision=precision, segments=segments, sqrt_segments=sqrt_segments))
    controls = widgets.HBox([widgets.VBox([task, components]), widgets.VBox([k, adaptive, precision]),
                             widgets.VBox([segments, sqrt_segments])])
    return panel([controls, output], "The explorer's panel; its default view is below")
