"""The `auto` configuration's plans in the reports: the candidate table, the Pareto figure, and
re-choosing from the same measurements under another budget or weights (`Plan.rechoose`).

    plans = load_plans(paths.plans, tasks)          # {task: Plan}, as `auto` ran them
    show_table(format_plan_table(plans["cifar10"]))
    plan_app(plans)                                 # widgets: budget and weights -> chosen again
"""
from __future__ import annotations

import math
import os

import pandas as pd

from ..planner import Plan
from ..reproduction import autoplan


def load_plans(plans_dir: str | os.PathLike, tasks) -> dict[str, Plan]:
    """The stored plan of each of `tasks` that has one (`reproduction.autoplan`)."""
    plans = {}
    for task in tasks:
        record = autoplan.load_plan_record(plans_dir, task)
        if record is not None:
            plans[task] = autoplan.plan_of(record)
    return plans


def plan_frame(plan: Plan) -> pd.DataFrame:
    """Every candidate of `plan`, one row each (numbers; `format_plan_table` for reading)."""
    columns = ["candidate", "chosen", "feasible", "speedup", "speedup_ci_low", "speedup_ci_high", "cost", "cost_ci_low",
               "cost_ci_high", "seconds_per_sample",
               "peak_memory_bytes", "predicted_memory_bytes", "energy_j_per_sample", "loss_rel_diff", "rejected_because"]
    return pd.DataFrame([{column: row.get(column) for column in columns} for row in plan.rows], columns=columns)


def format_plan_table(plan: Plan) -> pd.DataFrame:
    """The candidates as a reader sees them: measured ones by speedup, then those never timed."""
    def mib(value):
        return "—" if value is None or not math.isfinite(value) else f"{value / 2**20:,.1f} MiB"

    rows = []
    for row in sorted(plan.rows, key=lambda r: (r.get("speedup") is None, -(r.get("speedup") or 0.0))):
        speedup = row.get("speedup")
        interval = (f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"
                    if row.get("speedup_ci_low") is not None and row.get("speedup_ci_high") is not None else "")
        rows.append({
            "Candidate": row["candidate"] + (" ← chosen" if row.get("chosen") else ""),
            "vs fp32 baseline (95% interval)": "not timed" if speedup is None else f"{speedup:.2f}×{interval}" + (
                "" if row.get("speedup_over_run") is None else
                f"; {row['speedup_over_run']:.2f}× over the run (compiling {row['compile_s']:.1f} s" + (
                    "" if row.get("run_compile_s") is None else f"; the run's, from the plan's cache, "
                                                                f"{row['run_compile_s']:.1f} s") + ")"),
            "Peak memory": mib(row.get("peak_memory_bytes")),
            "Predicted (eqs. 8/19)": mib(row.get("predicted_memory_bytes")),
            "Energy per sample": "—" if row.get("energy_j_per_sample") is None else f"{row['energy_j_per_sample']:.3g} J",
            "Probe-loss difference": "—" if row.get("loss_rel_diff") is None else f"{row['loss_rel_diff']:.1e}",
            "Feasible": "yes" if row.get("feasible") else "no",
            "Why not chosen": row.get("rejected_because") or "",
        })
    return pd.DataFrame(rows)


def rechoose(plan: Plan, *, budget_fraction: float | None = None, weights=None) -> Plan:
    """`plan` chosen again with a memory budget given as a fraction of its fp32 baseline's peak
    (None: no budget) and/or other eq. 3 weights (time, memory, energy); nothing is run."""
    return plan.rechoose(memory_budget_bytes=_budget_bytes(plan, budget_fraction), weights=weights)


def _budget_bytes(plan: Plan, budget_fraction: float | None) -> float | None:
    if budget_fraction is not None and not (isinstance(budget_fraction, (int, float)) and budget_fraction > 0):
        raise ValueError(f"budget_fraction={budget_fraction!r} is invalid: allowed None (no budget) or a number > 0 "
                         "(of the fp32 baseline's peak memory)")
    return None if budget_fraction is None else budget_fraction * plan.baseline["peak_memory_bytes"]


def choice_under_budget(plan: Plan, budget_fraction: float) -> str:
    """The candidate `plan` chooses under a memory budget of `budget_fraction` of its fp32
    baseline's peak, or, where none of its measured candidates fits, that none does and the
    smallest peak measured (a plan cut short by its time budget may not have measured the
    splits that fit)."""
    budget = _budget_bytes(plan, budget_fraction)  # a fraction that is no budget is refused, not reported as none fitting
    try:
        return plan.rechoose(memory_budget_bytes=budget).chosen["candidate"]
    except ValueError:  # no measured candidate fits the budget
        measured = [row for row in plan.rows if row["peak_memory_bytes"] is not None]
        smallest = min(measured, key=lambda row: row["peak_memory_bytes"])
        return (f"none of the measured candidates fits (the smallest peak, {smallest['candidate']}'s, is "
                f"{smallest['peak_memory_bytes'] / plan.baseline['peak_memory_bytes']:.0%} of the fp32 baseline's); "
                "plan() with this budget measures more")


def plan_app(plans: dict[str, Plan]):
    """An ipywidgets panel: task, a memory budget (% of the fp32 baseline's peak; 0 = none) and
    eq. 3's weights -> the plan chosen again from the same measurements (`rechoose`), its
    explanation, candidate table and Pareto figure. Renders headless too."""
    import ipywidgets as widgets
    from IPython.display import display

    from .figures import figure_image
    from .index import markdown_table
    from .notebook import panel, show_markdown

    if not plans:
        return widgets.HTML("No plans yet: run notebook 1 (its <code>auto</code> runs plan on this machine).")
    full = dict(style={"description_width": "initial"}, continuous_update=False)
    task = widgets.Dropdown(options=list(plans), description="task", style=full["style"])
    budget = widgets.IntSlider(value=0, min=0, max=150, step=5, description="memory budget (% of fp32 peak; 0 = none)",
                               layout=widgets.Layout(width="480px"), **full)
    w_time = widgets.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.1, description="weight: time", **full)
    w_memory = widgets.FloatSlider(value=0.0, min=0.0, max=2.0, step=0.1, description="weight: memory", **full)
    w_energy = widgets.FloatSlider(value=0.0, min=0.0, max=2.0, step=0.1, description="weight: energy", **full)

    def show(task, budget, w_time, w_memory, w_energy):
        try:
            chosen = rechoose(plans[task], budget_fraction=budget / 100 if budget else None,
                              weights=(w_time, w_memory, w_energy))
        except ValueError as error:
            print(f"not a valid choice: {error}")
            return
        print(chosen.explain())
        show_markdown(markdown_table(format_plan_table(chosen)))
        display(figure_image(chosen.pareto_figure()))

    output = widgets.interactive_output(show, dict(task=task, budget=budget, w_time=w_time, w_memory=w_memory,
                                                   w_energy=w_energy))
    controls = widgets.HBox([widgets.VBox([task, budget]), widgets.VBox([w_time, w_memory, w_energy])])
    return panel([controls, output], "The re-plan panel")


__all__ = ["format_plan_table", "load_plans", "plan_app", "plan_frame", "rechoose"]
