"""The paper's tables from run records, measured value beside claimed value (SPEC §6).

Tables I/II (main results), III (ablation ladder and leave-one-out) and IV (scaling); each as
numbers (`*_table`) and as a reader sees them (`format_*`). Every measured value is a mean with
its 95 % CI (``*_ci_low``/``*_ci_high``), every change is measured on paired runs (same seed,
same timing round) with its CI, and the verdict follows `verdicts`. The tables go to
``reports/<profile>/tables/`` as CSV (numbers) and Markdown (formatted, captioned); whether a
claim held follows `verdicts`.
"""
from __future__ import annotations

import math

import pandas as pd

from ..config import ABLATION_LADDER, leave_one_out
from .results import MIN_TIMING_WINDOWS, aggregate, as_number, measured_change, paper_claims
from .verdicts import claim_verdict, efficiency_verdict, relative_change, time_to_target_verdict
from .._errors import fail as _fail

# Tables I and II as data: (row label, record metric, paper claim key, kind, paper unit).
_MAIN_ROWS = {
    "cifar10": ("table1_cifar10_resnet50", [
        ("Time to target", "time_to_target_s", "time_to_85_acc_min", "change", "min"),
        ("Peak memory", "peak_memory_bytes", "peak_memory_gb", "change", "GB"),
        ("Throughput", "throughput", "throughput_img_s", "change", "img/s"),
        ("Final accuracy", "final_quality", "final_accuracy_pct", "comparable", "%"),
        ("Model FLOPs utilization", "flops_utilization", "flops_utilization_pct", "change", "%"),
    ]),
    "wikitext2": ("table2_wikitext2_gpt2", [
        ("Time to target", "time_to_target_s", "time_to_ppl45_hr", "change", "hr"),
        ("Peak memory", "peak_memory_bytes", "peak_memory_gb", "change", "GB"),
        ("Throughput", "throughput", "throughput_tok_s", "change", "tok/s"),
        ("Final perplexity", "final_quality", "final_perplexity", "comparable", ""),
        ("Model FLOPs utilization", "flops_utilization", None, "change", "%"),
    ]),
}

# Metrics taken from the interleaved timing windows when they are attached.
TIMED = ("time_to_target_s", "throughput", "flops_utilization")

# Table III's paper rows under our ladder's names (the paper has no ZeRO-2 rung).
_PAPER_LADDER_NAMES = {
    "baseline": "baseline",
    "+accumulation": "+gradient_accumulation_k4",
    "+mixed_precision": "+mixed_precision",
    "+lr_schedule": "+lr_schedule",
    "+checkpointing": "+activation_checkpointing",
}


# ------------------------------------------------------------------ Tables I and II
def _row_of(agg: pd.DataFrame, task: str, config: str) -> pd.Series | None:
    match = agg[(agg["task"] == task) & (agg["config_name"] == config)]
    return None if match.empty else match.iloc[0]


def _measured_unit(key: str, task: str) -> str:
    return {"time_to_target_s": "s", "peak_memory_bytes": "bytes", "final_quality": "accuracy (0-1)" if task == "cifar10" else "perplexity",
            "flops_utilization": "fraction", "throughput": "img/s" if task == "cifar10" else "tok/s"}.get(key, "")


def _ci(change: dict) -> tuple[float, float]:
    low, high = change.get("ci_low"), change.get("ci_high")
    return (math.nan if low is None else low, math.nan if high is None else high)


def main_results_table(records: list[dict], task: str, *, baseline: str = "baseline",
                       optimized: str = "optimized", auto: str = "auto") -> pd.DataFrame:
    """Table I (cifar10) / Table II (wikitext2): per metric the paper's baseline, optimized and
    relative change beside the measured means with their 95 % CIs, the measured relative change
    (paired: same seeds, same timing rounds) with its CI, and whether the claim held
    (`claim_verdict`). Where `auto` (the configuration `plan()` chose on this machine) ran, its
    measured values and change vs the baseline stand beside them (``measured_auto*``; the paper
    claims nothing for it, so it has no verdict). Attach timing windows first
    (`results.with_throughput`) for throughput and time to target from interleaved windows."""
    if task not in _MAIN_ROWS:
        _fail("task", task, f"one of {tuple(_MAIN_ROWS)}")
    table_key, rows = _MAIN_ROWS[task]
    claims = paper_claims()[table_key]
    task_records = [r for r in records if r["task"] == task]
    agg = aggregate(task_records)
    sides = {"baseline": baseline, "optimized": optimized, "auto": auto}
    measured_rows = {side: _row_of(agg, task, name) if not agg.empty else None for side, name in sides.items()}
    base = measured_rows["baseline"]
    if measured_rows["auto"] is None:
        del measured_rows["auto"]
    out = []
    for label, key, claim_key, kind, paper_unit in rows:
        claim = claims.get(claim_key) if claim_key else None
        measured = {}
        for side, row in measured_rows.items():
            for suffix in ("mean", "std", "ci_low", "ci_high"):
                name = f"measured_{side}" if suffix == "mean" else f"measured_{side}_{suffix}"
                measured[name] = row[f"{key}_{suffix}"] if row is not None else math.nan
            measured[f"measured_{side}_n"] = int(row[f"{key}_n"]) if row is not None else 0
            measured[f"measured_{side}_seeds"] = int(row["n_seeds"]) if row is not None else 0
        if "auto" in measured_rows:
            auto_change = measured_change(task_records, task, baseline, auto, key)
            measured["measured_auto_relative"] = math.nan if auto_change["mean"] is None else auto_change["mean"]
            measured["measured_auto_relative_ci_low"], measured["measured_auto_relative_ci_high"] = _ci(auto_change)
            measured["measured_auto_relative_bound"] = auto_change.get("bound") or ""
        change = measured_change(task_records, task, baseline, optimized, key)
        rel = math.nan if change["mean"] is None else change["mean"]
        ci = _ci(change)
        out.append(dict(
            metric=label, record_metric=key, kind=kind,
            paper_baseline=claim["baseline"] if claim else math.nan,
            paper_optimized=claim["optimized"] if claim else math.nan,
            paper_unit=paper_unit if claim else "",
            paper_relative=claim["relative"] if claim else math.nan,
            **measured,
            measured_unit=_measured_unit(key, task),
            measured_relative=rel, measured_relative_ci_low=ci[0], measured_relative_ci_high=ci[1],
            measured_relative_bound=change.get("bound") or "",
            timing_source=base["timing_source"] if base is not None and key in TIMED else "",
            timing_windows=change.get("windows", math.nan),
            claim_held=time_to_target_verdict(
                claim_verdict(claim["relative"] if claim else None, rel, ci=ci, kind=kind,
                              higher_is_better=task == "cifar10" if kind == "comparable" else None),
                change.get("censoring") if claim else None),
        ))
    return pd.DataFrame(out)


def _display_scale(key: str, unit: str, value: float) -> tuple[float, str]:
    """(multiplier, unit shown) for a measured metric."""
    if key == "peak_memory_bytes":
        return (2.0**-30, " GiB") if abs(value) >= 2**30 else (2.0**-20, " MiB")
    if key == "flops_utilization" or unit.startswith("accuracy"):
        return 100.0, " %"
    if unit in ("", "perplexity"):
        return 1.0, ""
    return 1.0, f" {unit}"


def format_value(value: float, key: str, *, unit: str = "", ci=None, n: int | None = None,
                 seeds: int | None = None, windows: int | None = None) -> str:
    """A measured mean ± half its 95 % CI (same decimals) in readable units; a time to target, a
    geometric mean whose interval combines in log space, as "62.3 s [45.1, 86.0]". NaN -> "—", or
    "not reached" for a time to target that no seed reached. `unit` is the record's unit ("s",
    "img/s", "accuracy (0-1)", ...; memory is always bytes); `windows`, the timing windows of a
    timed metric, says where they were too few for an interval."""
    if value is None or not math.isfinite(value):
        return "not reached" if key == "time_to_target_s" and seeds else "—"
    scale, shown_unit = _display_scale(key, unit or ("s" if key.endswith("_s") else ""), value)
    magnitude = abs(value * scale)
    decimals = 0 if magnitude >= 1000 else 1 if magnitude >= 10 else 2 if magnitude >= 0.1 else 4
    text = f"{value * scale:,.{decimals}f}"
    interval = ci is not None and all(v is not None and math.isfinite(v) for v in ci)
    if interval and key == "time_to_target_s":
        text += f"{shown_unit} [{ci[0] * scale:,.{decimals}f}, {ci[1] * scale:,.{decimals}f}]"
    elif interval:
        half = max(value - ci[0], ci[1] - value) * scale
        text += (f" ± {half:,.{decimals}f}" if round(half, decimals) > 0 else "") + shown_unit
    else:
        text += shown_unit
    if key in TIMED and _too_few(windows):
        text += f" ({int(windows)} windows: no interval)"
    if n is not None and seeds and n < seeds:
        text += f" ({n}/{seeds} seeds reached)" if key == "time_to_target_s" else f" ({n}/{seeds} seeds)"
    return text


def _too_few(windows) -> bool:
    return windows is not None and math.isfinite(windows) and windows < MIN_TIMING_WINDOWS


def format_change(value: float, ci=None, *, bound: str | None = None, windows: int | None = None) -> str:
    """A relative change with its 95 % CI: "+27.4% [+20.1, +34.0]"; a bound (`bound` "lower" or
    "upper": a time to target some runs never reached, `results.censored_bound`) as what the
    interval guarantees, "≥ +20.0%"; from too few timing `windows`, "+3.1% (2 windows: no interval)"."""
    text = _pct(value)
    has_interval = ci is not None and all(v is not None and math.isfinite(v) for v in ci)
    if text == "—":
        return text
    if bound in ("lower", "upper"):
        edge = (ci[0] if bound == "lower" else ci[1]) if has_interval else value
        return f"{'≥' if bound == 'lower' else '≤'} {_pct(edge)}"
    if has_interval:
        return text + f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    if _too_few(windows):
        return text + f" ({int(windows)} windows: no interval)"
    return text


def _pct(value: float) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:+.1f}%"


def _paper_value(value, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.2f}".rstrip("0").rstrip(".") + (f" {unit}" if unit and unit != "%" else unit)


def format_main_table(table: pd.DataFrame) -> pd.DataFrame:
    """Table I/II as a reader sees it: strings with units, claim beside measurement."""
    rows = []
    for _, r in table.iterrows():
        key = r["record_metric"]
        windows = r.get("timing_windows", math.nan)
        rows.append({
            "Metric": r["metric"],
            "Paper baseline": _paper_value(r["paper_baseline"], r["paper_unit"]),
            "Paper optimized": _paper_value(r["paper_optimized"], r["paper_unit"]),
            "Paper change": _pct(r["paper_relative"]),
            **{f"Measured {side}": _side_value(r, side, windows) for side in ("baseline", "optimized")},
            "Measured change (95% CI)": change_cell(r, "measured_relative", windows),
            "Claim held?": r["claim_held"],
        })
        if "measured_auto" in table.columns:  # the planned configuration, beside (no claim, no verdict)
            rows[-1].update({"Measured auto (planned here)": _side_value(r, "auto", windows),
                             "Auto change (95% CI)": change_cell(r, "measured_auto_relative", windows)})
    return pd.DataFrame(rows)


def _side_value(r, side: str, windows) -> str:
    """One configuration's measured value of a Table I/II row (`side`: baseline, optimized, auto)."""
    return format_value(r[f"measured_{side}"], r["record_metric"], unit=r["measured_unit"],
                        ci=(r[f"measured_{side}_ci_low"], r[f"measured_{side}_ci_high"]),
                        n=r[f"measured_{side}_n"], seeds=r[f"measured_{side}_seeds"], windows=windows)


def change_cell(r, column: str, windows=math.nan) -> str:
    """`format_change` of a table row's change `column` (with its ``_ci_low``/``_ci_high`` and,
    where the table has it, ``_bound``): the same text in a table and in the summary."""
    bound = r.get(f"{column}_bound")
    return format_change(as_number(r.get(column)), (as_number(r.get(f"{column}_ci_low")),
                                                    as_number(r.get(f"{column}_ci_high"))),
                         bound=bound if isinstance(bound, str) else None, windows=as_number(windows))


# ------------------------------------------------------------------ Table III
def ablation_table(records: list[dict], task: str) -> pd.DataFrame:
    """Table III: the cumulative ladder (baseline → … → +zero2), the optimized configuration, `auto`
    (planned on this machine, where it ran) and leave-one-out from the optimized configuration, with the paper's row (CIFAR-10 only) beside the measured one and
    each configuration's change vs the baseline (time to target, peak memory, throughput)."""
    paper_rows = {row["config"]: row for row in paper_claims()["table3_ablation_cifar10"]}
    paper_base = paper_rows["baseline"]
    task_records = [r for r in records if r["task"] == task]
    agg = aggregate(task_records)
    base = _row_of(agg, task, "baseline") if not agg.empty else None
    names = [c.name for c in ABLATION_LADDER] + ["optimized", "auto"] + [c.name for c in leave_one_out()]
    out = []
    for name in names:
        row = _row_of(agg, task, name) if not agg.empty else None
        if name == "auto" and row is None:
            continue  # not run: planned only where asked for
        paper = paper_rows.get(_PAPER_LADDER_NAMES.get(name, "")) if task == "cifar10" else None
        entry = dict(
            task=task, config=name, group="ladder" if name in _PAPER_LADDER_NAMES or name == "+zero2" else
            name if name in ("optimized", "auto") else "leave-one-out",
            paper_time_min=paper["time_min"] if paper else math.nan,
            paper_memory_gb=paper["memory_gb"] if paper else math.nan,
            paper_accuracy_pct=paper["accuracy_pct"] if paper else math.nan,
            paper_time_change=relative_change(paper_base["time_min"], paper["time_min"]) if paper else math.nan,
            paper_memory_change=relative_change(paper_base["memory_gb"], paper["memory_gb"]) if paper else math.nan,
            n_seeds=int(row["n_seeds"]) if row is not None else 0,
            precision=row["precision"] if row is not None else "",
        )
        for key in ("time_to_target_s", "peak_memory_bytes", "throughput", "final_quality"):
            for suffix in ("mean", "std", "ci_low", "ci_high"):
                entry[f"{key}_{suffix}"] = row[f"{key}_{suffix}"] if row is not None else math.nan
            entry[f"{key}_n"] = int(row[f"{key}_n"]) if row is not None else 0
        entry["timing_source"] = row["timing_source"] if row is not None else ""
        censoring = {}
        for key, short in (("time_to_target_s", "time"), ("peak_memory_bytes", "memory"), ("throughput", "throughput"),
                           ("final_quality", "quality")):
            change = (measured_change(task_records, task, "baseline", name, key)
                      if base is not None and row is not None and name != "baseline" else {"mean": None})
            censoring[short] = change.get("censoring")
            entry[f"measured_{short}_change"] = math.nan if change["mean"] is None else change["mean"]
            entry[f"measured_{short}_change_ci_low"], entry[f"measured_{short}_change_ci_high"] = _ci(change)
            if short == "time":
                entry["measured_time_change_bound"] = change.get("bound") or ""
            if short == "throughput":
                entry["timing_windows"] = change.get("windows", math.nan)
        not_run = _component_not_run(name, entry["precision"]) if paper else None
        for short in ("time", "memory"):
            claimed = entry[f"paper_{short}_change"] if paper and name != "baseline" else None
            if not_run and row is not None:
                entry[f"claim_held_{short}"] = not_run
                continue
            entry[f"claim_held_{short}"] = time_to_target_verdict(claim_verdict(
                claimed, entry[f"measured_{short}_change"],
                ci=(entry[f"measured_{short}_change_ci_low"], entry[f"measured_{short}_change_ci_high"])),
                censoring[short] if claimed is not None else None)
        out.append(entry)
    return pd.DataFrame(out)


def _component_not_run(name: str, precision_ran: str) -> str | None:
    """The verdict of a ladder rung whose added component did not run here, else None: the rung
    that adds mixed precision, run in fp32 (a CPU without bf16 instructions), computes what the
    rung before it computes, so its change says nothing of mixed precision."""
    ladder = list(ABLATION_LADDER)
    for before, rung in zip(ladder, ladder[1:]):
        if rung.name == name and before.precision == "fp32" != rung.precision and precision_ran == "fp32":
            return "not measured: mixed precision did not run here (this rung ran fp32, as the one before it)"
    return None


def format_ablation_table(table: pd.DataFrame) -> pd.DataFrame:
    """Table III as a reader sees it; configurations neither measured nor claimed are left out."""
    rows = []
    for _, r in table.iterrows():
        if r["n_seeds"] == 0 and not math.isfinite(r["paper_time_min"]):
            continue

        windows = r.get("timing_windows", math.nan)
        not_run = _component_not_run(r["config"], r["precision"])

        def measured(key):
            return format_value(r[f"{key}_mean"], key, unit=_measured_unit(key, r["task"]),
                                ci=(r[f"{key}_ci_low"], r[f"{key}_ci_high"]), n=r[f"{key}_n"], seeds=r["n_seeds"],
                                windows=as_number(windows))

        def change(short):
            return change_cell(r, f"measured_{short}_change", windows if short != "memory" else math.nan)

        is_base = r["config"] == "baseline"
        rows.append({
            "Configuration": r["config"],
            "Paper time (min)": _paper_value(r["paper_time_min"], ""),
            "Paper memory (GB)": _paper_value(r["paper_memory_gb"], ""),
            "Paper accuracy (%)": _paper_value(r["paper_accuracy_pct"], ""),
            "Paper vs baseline": "—" if is_base or not math.isfinite(r["paper_time_change"]) else
            f"time {_pct(r['paper_time_change'])}, memory {_pct(r['paper_memory_change'])}",
            "Precision run": r["precision"] or "—",
            "Time to target": measured("time_to_target_s"),
            "Peak memory": measured("peak_memory_bytes"),
            "Throughput": measured("throughput"),
            "Final quality": measured("final_quality"),
            "Measured vs baseline (95% CI)": "—" if is_base or r["n_seeds"] == 0 else
            "— (mixed precision did not run: the rung before it's computation)" if not_run else
            f"time {change('time')}; memory {change('memory')}; throughput {change('throughput')}",
            "Claim held?": "—" if r["claim_held_time"] == "no claim" else r["claim_held_time"]
            if r["claim_held_time"] == r["claim_held_memory"] == not_run else
            f"time: {r['claim_held_time']}; memory: {r['claim_held_memory']}",
        })
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ Table IV
def scaling_table(rows: list[dict], *, task: str = "cifar10") -> pd.DataFrame:
    """Table IV from scaling rows ``{world_size, config, throughput, efficiency, modelled}``:
    each row marked measured or modelled, with the paper's GPU row beside it (CIFAR-10)."""
    paper = {row["gpus"]: row for row in paper_claims()["table4_scaling_cifar10"]} if task == "cifar10" else {}
    out = []
    for row in rows:
        for field in ("world_size", "config", "throughput", "efficiency"):
            if field not in row:
                _fail("rows", row, f"dicts with keys world_size, config, throughput, efficiency, modelled (missing {field!r})")
        claim = paper.get(row["world_size"], {})
        kind = "baseline" if row["config"] == "baseline" else "optimized"
        core = ("world_size", "config", "throughput", "efficiency", "modelled", "source", "throughput_ci",
                "efficiency_ci")
        throughput_ci = row.get("throughput_ci") or (None, None)
        efficiency_ci = row.get("efficiency_ci") or (None, None)
        out.append(dict(
            world_size=int(row["world_size"]), config=row["config"],
            throughput=as_number(row["throughput"]),
            throughput_ci_low=as_number(throughput_ci[0]), throughput_ci_high=as_number(throughput_ci[1]),
            efficiency=as_number(row["efficiency"]),
            efficiency_ci_low=as_number(efficiency_ci[0]), efficiency_ci_high=as_number(efficiency_ci[1]),
            source="modelled" if row.get("modelled") else "measured",
            source_detail=row.get("source", ""),
            paper_throughput=claim.get(f"{kind}_img_s", math.nan),
            paper_efficiency=claim.get(f"{kind}_efficiency", math.nan),
            claim_held=("—" if int(row["world_size"]) == 1 else  # T_1/(1·T_1) = 1 by definition
                        efficiency_verdict(claim.get(f"{kind}_efficiency"), as_number(row["efficiency"]),
                                           ci=efficiency_ci, modelled=bool(row.get("modelled")))),
            **{k: v for k, v in row.items() if k not in core},
        ))
    frame = pd.DataFrame(out)
    if not len(frame):
        return frame
    return frame.sort_values(["config", "source", "world_size"], kind="stable").reset_index(drop=True)


def _efficiency_text(r) -> str:
    if not math.isfinite(r["efficiency"]):
        return "—"
    text = f"{100 * r['efficiency']:.1f}%"
    if int(r["world_size"]) > 1 and math.isfinite(r["efficiency_ci_low"]) and math.isfinite(r["efficiency_ci_high"]):
        text += f" [{100 * r['efficiency_ci_low']:.1f}, {100 * r['efficiency_ci_high']:.1f}]"
    return text


def format_scaling_table(table: pd.DataFrame) -> pd.DataFrame:
    """Table IV as a reader sees it: measured and modelled rows apart, paper beside them."""
    rows = []
    for _, r in table.iterrows():
        rows.append({
            "World size": int(r["world_size"]), "Configuration": r["config"], "Source": r["source"],
            "Precision run": r.get("precision", "—") or "—",
            "Throughput (items/s)": format_value(r["throughput"], "throughput",
                                                 ci=(r["throughput_ci_low"], r["throughput_ci_high"])),
            "Efficiency T_n/(n·T_1) (95% CI)": _efficiency_text(r),
            "Paper throughput (img/s, GPUs)": _paper_value(r["paper_throughput"], ""),
            "Paper efficiency": "—" if not math.isfinite(r["paper_efficiency"]) else f"{100 * r['paper_efficiency']:.1f}%",
            "Claim held?": r["claim_held"],
        })
    return pd.DataFrame(rows)
