"""Error analysis from run records (paper §V-D): where the gains come from.

- by training phase: the time each configuration needs for the early / middle / late phase of
  training, from the records' per-step clocks, and each phase's share of the time saved (the
  paper: 35 % of the improvement in early training). Phases are defined on the baseline's
  converging quality curve (`convergence_phases`): early = its first half of the improvement,
  middle = up to 90 % of it, late = the approach to the plateau;
- by component: leave-one-out -- what removing each component from the optimized
  configuration costs in throughput and memory (the paper: mixed precision is the CNN's best
  component, activation checkpointing the transformer's);
- memory by category (parameters, gradients, optimizer state, activations, temporaries);
- the eq. 21 decomposition  Speedup_net = Throughput_gain / (1 + Recomputation_overhead);
- the adaptive-k and gradient-noise (B_simple) trajectory by phase.

Operation-level profiles (torch.profiler) and timings live in `profiling`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...config import COMPONENTS
from ...measure import time_to_target
from ...reproduction.calibrate import mean_curve
from ..figures import memory_breakdown_frame
from ..results import aggregate, paper_claims, timed_speed
from ..verdicts import relative_change
from ..._errors import fail as _fail

PHASES = ("early", "middle", "late")
# fractions of the baseline's total improvement that end the early and the middle phase
PHASE_IMPROVEMENT_FRACTIONS = (0.5, 0.9)


def _pick(records: list[dict], task: str, config: str) -> list[dict]:
    return [r for r in records if r["task"] == task and r["config_name"] == config]


# ------------------------------------------------------------------ by training phase
def time_at_samples(record: dict, samples: np.ndarray) -> np.ndarray:
    """Training time (s) at which the run had consumed `samples` samples, interpolated on the
    record's per-step clock (evaluation excluded), starting from (0 samples, 0 s)."""
    steps = record.get("steps") or []
    if not steps:
        _fail("record", record.get("config_name"), "a run record with per-step statistics ('steps')")
    if any(s.get("time_s") is None for s in steps):
        _fail("record", record.get("config_name"), "a run record with its own per-step clock (this one's curve "
              f"comes from the run of {record.get('quality_from')!r}; use that run's record)")
    consumed = np.array([0.0] + [s["samples_consumed"] for s in steps])
    clock_s = np.array([0.0] + [s["time_s"] for s in steps])
    return np.interp(samples, consumed, clock_s)


def _clocked(record: dict) -> bool:
    return bool(record.get("steps")) and all(s.get("time_s") is not None for s in record["steps"])


def with_borrowed_clock(record: dict, records: list[dict]) -> dict:
    """`record` itself when it has its own per-step clock. A run whose curve and steps come from
    another run (runner: a checkpointed configuration trains its curve without checkpointing) has
    none: it gets that run's per-step clock (found among `records` under the curve run's name, e.g.
    as the un-checkpointed rung computed by it, same task and seed) scaled by the two
    configurations' interleaved-timed speeds (median samples/s of their windows), which keeps how
    the step times vary over the run (adaptive k) and charges each step what checkpointing costs.
    Without such a run or timing, `record` unchanged (`time_at_samples` then says why)."""
    if _clocked(record) or not record.get("quality_from"):
        return record
    source = record["quality_from"]
    twin = next((r for r in records if r["task"] == record["task"] and r.get("seed") == record.get("seed")
                 and source in (r["config_name"], r.get("computed_as")) and _clocked(r)), None)
    speeds = [timed_speed(r) for r in (twin, record)]
    if twin is None or not all(speed > 0 for speed in speeds) or \
            [s["samples_consumed"] for s in twin["steps"]] != [s["samples_consumed"] for s in record["steps"]]:
        return record
    scale = speeds[0] / speeds[1]
    return dict(record, steps=[dict(step, time_s=twin_step["time_s"] * scale)
                               for step, twin_step in zip(record["steps"], twin["steps"])],
                clock_from=dict(run=twin["config_name"], scale=scale))


def phase_times(record: dict, num_phases: int = 3, total_samples: float | None = None,
                edges: list[float] | None = None) -> list[float]:
    """Seconds spent on each phase: between consecutive sample counts `edges`, or on
    `num_phases` equal slices of the training samples when no edges are given."""
    if edges is None:
        if not isinstance(num_phases, int) or num_phases < 1:
            _fail("num_phases", num_phases, "an integer >= 1")
        total = total_samples or record["steps"][-1]["samples_consumed"]
        edges = np.linspace(0.0, total, num_phases + 1)
    return list(np.diff(time_at_samples(record, np.asarray(edges, dtype=float))))


def convergence_phases(records: list[dict], task: str, *, baseline: str = "baseline",
                       fractions=PHASE_IMPROVEMENT_FRACTIONS) -> list[float] | None:
    """Sample counts [0, end of early, end of middle, end of run] where the seed-mean baseline
    quality curve has made `fractions` (default 50 % and 90 %) of its whole improvement
    (perplexity on the log scale, i.e. in loss). None without baseline records."""
    base = [r for r in _pick(records, task, baseline) if len(r.get("history") or []) >= 2]
    if not base:
        return None
    grid, curve = mean_curve([([h["samples"] for h in r["history"]], [h["quality"] for h in r["history"]])
                              for r in base])
    if not base[0].get("higher_is_better", task == "cifar10"):
        curve = -np.log(curve)  # lower perplexity is better: progress in loss
    progress = (curve - curve[0]) / (curve[-1] - curve[0]) if curve[-1] != curve[0] else np.zeros_like(curve)
    progress = np.maximum.accumulate(progress)  # the first time a fraction was reached
    # each edge: the interpolated first crossing of its fraction (a flat curve never crosses:
    # its phases start at the first evaluation)
    crossings = [time_to_target(grid.tolist(), progress.tolist(), fraction) for fraction in fractions]
    return [0.0, *(float(grid[0]) if c is None else c for c in crossings), float(grid[-1])]


def phase_speedups(records: list[dict], task: str, *, baseline: str = "baseline", optimized: str = "optimized",
                   num_phases: int = 3) -> pd.DataFrame:
    """Per training phase: mean seconds of the baseline and the optimized configuration over
    seeds, the speedup and the phase's share of the total time saved (a run without a clock of its
    own gets its curve run's, scaled: `with_borrowed_clock`). The three phases are
    `convergence_phases` of the baseline curve (equal slices of the samples when
    `num_phases` != 3 or the records have no curve)."""
    base, opt = [[with_borrowed_clock(r, records) for r in _pick(records, task, config)] for config in (baseline, optimized)]
    columns = ["phase", "samples_from", "samples_to", "baseline_s", "optimized_s", "speedup", "share_of_time_saved"]
    if not base or not opt:
        return pd.DataFrame(columns=columns)
    total = min(r["steps"][-1]["samples_consumed"] for r in base + opt if r.get("steps"))
    edges = convergence_phases(records, task, baseline=baseline) if num_phases == 3 else None
    if edges is None:
        edges = list(np.linspace(0.0, total, num_phases + 1))
    edges = [min(e, total) for e in edges]
    base_s = np.mean([phase_times(r, edges=edges) for r in base], axis=0)
    opt_s = np.mean([phase_times(r, edges=edges) for r in opt], axis=0)
    saved = base_s - opt_s
    names = PHASES if num_phases == 3 else [f"phase {i + 1}" for i in range(num_phases)]
    with np.errstate(divide="ignore", invalid="ignore"):
        speedup = base_s / opt_s
    return pd.DataFrame(dict(
        phase=names, samples_from=np.round(edges[:-1]), samples_to=np.round(edges[1:]), baseline_s=base_s,
        optimized_s=opt_s, speedup=speedup,
        share_of_time_saved=saved / saved.sum() if saved.sum() != 0 else np.full(num_phases, math.nan),
    ), columns=columns)


# ------------------------------------------------------------------ by component
def component_contributions(records: list[dict], task: str) -> pd.DataFrame:
    """Leave-one-out: for each component, the throughput the optimized configuration loses and
    the peak memory it gains when that component is removed (positive = the component helps),
    plus the change in time to target."""
    agg = aggregate([r for r in records if r["task"] == task])
    if agg.empty:
        return pd.DataFrame(columns=["component", "throughput_contribution", "memory_saving", "time_saving"])
    by_name = agg.set_index("config_name")
    if "optimized" not in by_name.index:
        return pd.DataFrame(columns=["component", "throughput_contribution", "memory_saving", "time_saving"])
    opt = by_name.loc["optimized"]
    rows = []
    for component in COMPONENTS:
        name = f"-{component}"
        if name not in by_name.index:
            continue
        without = by_name.loc[name]
        rows.append(dict(
            component=component,
            throughput_contribution=relative_change(without["throughput_mean"], opt["throughput_mean"]),
            memory_saving=-relative_change(without["peak_memory_bytes_mean"], opt["peak_memory_bytes_mean"]),
            time_saving=-relative_change(without["time_to_target_s_mean"], opt["time_to_target_s_mean"]),
        ))
    return pd.DataFrame(rows)


def architecture_patterns(records: list[dict]) -> pd.DataFrame:
    """CNN vs transformer: the component contributing most throughput and most memory saving
    per task (leave-one-out), beside the paper's claim for that architecture."""
    claims = paper_claims()["error_analysis"]
    paper = {"cifar10": ("CNN (ResNet)", f"speed: {claims['cnn']['best_component']} "
                         f"(+{claims['cnn']['speedup_contribution']:.0%} speedup)"),
             "wikitext2": ("transformer (GPT-2)", f"memory: {claims['transformer']['best_component']} "
                           f"(-{claims['transformer']['memory_reduction']:.0%} memory)")}
    rows = []
    for task, (architecture, claim) in paper.items():
        contributions = component_contributions(records, task)
        row = dict(task=task, architecture=architecture, paper_claim=claim,
                   best_for_throughput="—", throughput_contribution=math.nan,
                   best_for_memory="—", memory_saving=math.nan)
        if len(contributions):
            speed = contributions.loc[contributions["throughput_contribution"].idxmax()]
            memory = contributions.loc[contributions["memory_saving"].idxmax()]
            row.update(best_for_throughput=speed["component"], throughput_contribution=speed["throughput_contribution"],
                       best_for_memory=memory["component"], memory_saving=memory["memory_saving"])
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ memory
MIN_REFERENCE_SHARE = 0.01  # a category under 1 % of the reference's peak is not compared against


def memory_by_category(records: list[dict], task: str, *, configs=None, reference: str = "baseline") -> pd.DataFrame:
    """Mean bytes per memory category and configuration (rows: categories), with each
    configuration's change vs `reference` per category in bytes (``<config> minus <reference>``)
    and relative (``<config> vs <reference>``). The relative change only where it means something:
    where the reference holds that category at its peak (at least `MIN_REFERENCE_SHARE` of its
    total there) or holds as much as the configuration, else NaN -- the fp32 baseline peaks at the
    start of its backward pass, when 10 KiB of gradients exist, and the micro-batched runs hold all
    1.4 MiB of theirs: "+14,521 %" says nothing the bytes do not say better."""
    frame = memory_breakdown_frame(records, task, configs=configs)
    if frame.empty:
        return frame
    table = frame.T
    table.index.name = "category"
    if reference in table.columns:
        floor = MIN_REFERENCE_SHARE * table[reference].sum()
        others = [c for c in table.columns if c != reference]
        for config in others:
            table[f"{config} vs {reference}"] = [relative_change(b, o) if b >= floor or b == o else math.nan
                                                 for b, o in zip(table[reference], table[config])]
        for config in others:
            table[f"{config} minus {reference}"] = table[config] - table[reference]
    return table


# ------------------------------------------------------------------ eq. 21
def eq21_decomposition(records: list[dict], task: str, *, recompute_overhead: float | None = None,
                       without_checkpointing: str = "-checkpointing") -> dict:
    """Eq. 21 with measured terms.

    - throughput gain: throughput of the optimized configuration *without* checkpointing over
      the baseline's;
    - recomputation overhead: `recompute_overhead` when given (a direct timing, e.g.
      `profiling.measure_recompute_overhead`), else from the records as
      throughput(without checkpointing) / throughput(optimized) - 1;
    - predicted net speedup = gain / (1 + overhead), beside the measured net throughput ratio
      optimized / baseline and the time-to-target speedup. With the overhead taken from the
      same records the prediction equals the measurement by construction; a direct timing
      makes it a real check.
    """
    agg = aggregate([r for r in records if r["task"] == task])
    by_name = agg.set_index("config_name") if not agg.empty else pd.DataFrame()
    claim = paper_claims()["error_analysis"]["eq21_net_speedup"]

    def throughput(name):
        return by_name.loc[name, "throughput_mean"] if name in by_name.index else math.nan

    base, opt, no_cp = throughput("baseline"), throughput("optimized"), throughput(without_checkpointing)
    gain = no_cp / base if base else math.nan
    overhead_records = no_cp / opt - 1 if opt else math.nan
    overhead = recompute_overhead if recompute_overhead is not None else overhead_records
    ttt = (by_name.loc["baseline", "time_to_target_s_mean"] / by_name.loc["optimized", "time_to_target_s_mean"]
           if {"baseline", "optimized"} <= set(by_name.index) else math.nan)
    return dict(
        task=task,
        throughput_gain=gain,
        recompute_overhead=overhead,
        recompute_overhead_source="direct timing" if recompute_overhead is not None else "records",
        recompute_overhead_from_records=overhead_records,
        predicted_net_speedup=gain / (1 + overhead) if math.isfinite(gain) and math.isfinite(overhead) else math.nan,
        measured_net_speedup=opt / base if base else math.nan,
        time_to_target_speedup=ttt,
        paper_throughput_gain=claim["throughput_gain"],
        paper_recompute_overhead=claim["recompute_overhead"],
        paper_net_speedup=claim["net"],
    )


# ------------------------------------------------------------------ adaptive k / noise
def noise_by_phase(records: list[dict], task: str, *, configs=None, num_phases: int = 3) -> pd.DataFrame:
    """Mean accumulation steps k, effective batch, gradient-noise scale B_simple (median) and
    the share of steps whose noise estimate was significant, per training phase and
    configuration. Phases as in `phase_speedups`: the baseline curve's `convergence_phases`
    (equal thirds of the optimizer steps when there is none or `num_phases` != 3)."""
    edges = convergence_phases(records, task) if num_phases == 3 else None
    rows = []
    for r in records:
        if r["task"] != task or (configs is not None and r["config_name"] not in configs) or not r.get("steps"):
            continue
        if edges is not None:
            consumed = np.array([s["samples_consumed"] for s in r["steps"]], dtype=float)
            # a step belongs to the phase in which it started
            started = np.concatenate([[0.0], consumed[:-1]])
            phase_of = np.clip(np.searchsorted(edges, started, side="right") - 1, 0, num_phases - 1)
            chunks = [np.flatnonzero(phase_of == i) for i in range(num_phases)]
        else:
            chunks = np.array_split(np.arange(len(r["steps"])), num_phases)
        for index, chunk in enumerate(chunks):
            steps = [r["steps"][i] for i in chunk]
            noise = [s["b_simple"] for s in steps if s.get("b_simple") is not None]
            significant = [s["noise_significant"] for s in steps if s.get("noise_significant") is not None]
            rows.append(dict(config=r["config_name"], seed=r.get("seed"),
                             phase=PHASES[index] if num_phases == 3 else f"phase {index + 1}",
                             steps=len(steps),
                             mean_k=np.mean([s["k"] for s in steps]) if steps else math.nan,
                             mean_effective_batch=np.mean([s["effective_batch_size"] for s in steps]) if steps else math.nan,
                             median_b_simple=float(np.median(noise)) if noise else math.nan,
                             significant_share=float(np.mean(significant)) if significant else math.nan))
    values = ["steps", "mean_k", "mean_effective_batch", "median_b_simple", "significant_share"]
    frame = pd.DataFrame(rows, columns=["config", "seed", "phase", *values])
    if frame.empty:
        return frame
    return frame.groupby(["config", "phase"], sort=False)[values].mean().reset_index()
