"""A reports folder's tables and figures rendered again from its records, without training or timing.

The section notebooks make every table from the run records, the interleaved timing records
(``timing/``) and the plans (``plans/``) of ``reports/<profile>/``. This module does the same with
the same functions, reading what the notebooks stored: what the test of the committed reference
compares with its committed tables (a reference the code no longer renders cannot land), and
how a reference is brought up to date when the reporting code changes.

    python -m trainopt_core.reporting.render reports --profile quick           # which tables differ
    python -m trainopt_core.reporting.render reports --profile quick --write   # write tables and figures

Tables I-IV, the plans and the error-analysis tables computed from the records are rendered again;
the operation profile, the activation bytes by module type and eq. 21's recomputation overhead
are measurements kept only in their tables, so their numbers are read back from the committed
CSV and only their captions and layout are rendered again.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..config import ABLATION_LADDER, leave_one_out
from ..reproduction import autoplan
from ..reproduction.records import load_record
from . import analysis, figures, plans as planning, tables
from .index import format_bytes_frame, published_table, table_markdown
from .notebook import TASK_LABELS, table_name
from .results import load_records, resolve_reports_dir, stored_throughput, with_throughput
from .._errors import fail as _fail

TASKS = ("cifar10", "wikitext2")
PAPER_TABLES = ("table1_resnet", "table2_gpt2", "table3_ablation_resnet", "table3_ablation_gpt2",
                "table4_scaling_resnet")


def _sections() -> dict[str, list[str]]:
    """The configurations each section notebook runs, in the order it runs them (the order its
    tables' notes list them in)."""
    ladder, without_one = [c.name for c in ABLATION_LADDER], [c.name for c in leave_one_out()]
    return {"01": ["baseline", "optimized", "auto"], "02": ladder + ["optimized", "auto"] + without_one,
            "03": ["baseline", "optimized"], "04": ["baseline", "+lr_schedule", "+checkpointing", "optimized"] + without_one}


@dataclass
class Rendered:
    """One table as the notebooks write it: its numbers (the CSV) and its Markdown file."""

    table: pd.DataFrame
    markdown: str

    @property
    def csv(self) -> str:
        return self.table.to_csv(index=False)


class Reports:
    """The stored inputs of ``<root>/<profile>/``: records, timing windows, scaling rows, plans."""

    def __init__(self, root, profile: str):
        self.root, self.profile = resolve_reports_dir(root), profile
        self.folder = self.root / profile
        if not (self.folder / "runs").is_dir():
            _fail("reports", str(self.folder), "a profile folder holding runs/ (made by ./run_all.sh)")
        timed = with_throughput(load_records(self.root, profile), stored_throughput(self.folder / "timing", TASKS))
        self.tasks = [task for task in TASKS if any(r["task"] == task for r in timed)]
        self._records = timed

    def section(self, section: str, seeds=None) -> list[dict]:
        """The records a section notebook holds: its configurations, in the order it runs them."""
        order = _sections()[section]
        chosen = [r for r in self._records if r["config_name"] in order and (seeds is None or r.get("seed") in seeds)]
        return sorted(chosen, key=lambda r: (TASKS.index(r["task"]), order.index(r["config_name"]), r.get("seed", 0)))

    def scaling_rows(self, task: str) -> list[dict] | None:
        record = load_record(self.folder / "timing" / f"scaling__{task}.json")
        return None if record is None else record["rows"]

    def plans(self) -> dict:
        return planning.load_plans(autoplan.plans_dir_for(self.folder / "runs"), self.tasks)

    def committed(self, name: str) -> pd.DataFrame | None:
        path = self.folder / "tables" / f"{name}.csv"
        return pd.read_csv(path) if path.is_file() else None


def _records_of(records: list[dict], task: str, configs=None) -> list[dict]:
    return [r for r in records if r["task"] == task and (configs is None or r["config_name"] in configs)]


def _render(table: pd.DataFrame, name: str, title: str, records: list[dict], display=None) -> Rendered:
    shown, caption_text, notes = published_table(table, name, title, records, display)
    return Rendered(table, table_markdown(name, caption_text, shown, notes))


def paper_tables(reports: Reports) -> dict[str, Rendered]:
    """Tables I-IV as notebooks 01-03 write them."""
    out = {}
    main, ablation = reports.section("01"), reports.section("02")
    for task in reports.tasks:
        description = TASK_LABELS[task]["description"]
        table = tables.main_results_table(main, task)
        name = table_name("table1" if task == "cifar10" else "table2", task)
        out[name] = _render(table, name, f"{TASK_LABELS[task]['table']} analogue: {description}",
                            _records_of(main, task), tables.format_main_table(table))
        table = tables.ablation_table(ablation, task)
        name = table_name("table3_ablation", task)
        out[name] = _render(table, name, f"Table III analogue (ablation): {description}", _records_of(ablation, task),
                            tables.format_ablation_table(table))
        rows = reports.scaling_rows(task)
        if rows is not None:
            table = tables.scaling_table(rows, task=task)
            name = table_name("table4_scaling", task)
            out[name] = _render(table, name, f"Table IV analogue (scaling): {description}",
                                _records_of(reports.section("03", seeds=(0,)), task), tables.format_scaling_table(table))
    return out


def plan_tables(reports: Reports) -> dict[str, Rendered]:
    """The `auto` plans' candidate tables, as notebook 01 writes them."""
    main = reports.section("01")
    return {table_name("plan", task): _render(planning.plan_frame(plan), table_name("plan", task),
                                              f"The auto plan: {TASK_LABELS[task]['description']}",
                                              _records_of(main, task, ["auto"]), planning.format_plan_table(plan))
            for task, plan in reports.plans().items()}


def analysis_tables(reports: Reports) -> dict[str, Rendered]:
    """The error-analysis tables of notebook 04: from the records where they come from the records,
    from their committed numbers where they are measurements kept only there."""
    records, out = reports.section("04"), {}
    for task in reports.tasks:
        description = TASK_LABELS[task]["description"]
        name = table_name("phases", task)
        out[name] = _render(analysis.phase_speedups(records, task), name, f"Time saved by training phase: {description}",
                            _records_of(records, task, ["baseline", "optimized"]))
        table = analysis.memory_by_category(records, task, configs=["baseline", "+checkpointing", "optimized"])
        name = table_name("memory_categories", task)
        out[name] = _render(table.reset_index(), name, f"Memory by category at the peak: {description}",
                            _records_of(records, task), format_bytes_frame(table.reset_index()))
        name = table_name("activations_by_module", task)
        if (by_module := reports.committed(name)) is not None:
            out[name] = _render(by_module, name, f"Activation bytes by module type (one micro-batch): {description}",
                                _records_of(records, task, ["baseline", "optimized"]), format_bytes_frame(by_module))
        name = table_name("noise_by_phase", task)
        out[name] = _render(analysis.noise_by_phase(records, task, configs=["optimized"]), name,
                            f"Adaptive k by phase: {description}", _records_of(records, task, ["optimized"]))
    if (ops := reports.committed("op_categories")) is not None:
        out["op_categories"] = _render(ops, "op_categories", "Self time by operation category (torch.profiler)", records)
    out["architecture_patterns"] = _render(analysis.architecture_patterns(records), "architecture_patterns",
                                           "Best component per architecture (leave-one-out)", records)
    if (eq21 := reports.committed("eq21_decomposition")) is not None:
        out["eq21_decomposition"] = _render(_eq21(records, eq21), "eq21_decomposition", "Eq. 21 decomposition, measured",
                                            records)
    return out


def _eq21(records: list[dict], committed: pd.DataFrame) -> pd.DataFrame:
    """Eq. 21 from the records, with the recomputation overhead timed directly as committed."""
    rows = []
    for _, kept in committed.iterrows():
        overhead = kept["recompute_overhead"] if kept.get("recompute_overhead_source") == "direct timing" else None
        rows.append({**analysis.eq21_decomposition(records, kept["task"], recompute_overhead=overhead),
                     **{k: kept[k] for k in ("forward_share", "segments", "blocks") if k in kept}})
    return pd.DataFrame(rows)


def render_tables(reports: Reports) -> dict[str, Rendered]:
    """Every table of the profile folder that can be rendered from what it stores."""
    return {**paper_tables(reports), **plan_tables(reports), **analysis_tables(reports)}


def render_figures(reports: Reports) -> dict:
    """Every figure of the profile folder, drawn again from what it stores: {file stem: Figure}."""
    main, ablation, errors = reports.section("01"), reports.section("02"), reports.section("04")
    ladder = [c.name for c in ABLATION_LADDER]
    out = {}
    for task in reports.tasks:
        out[table_name("curves", task)] = figures.quality_curves(main, task)
        out[table_name("memory_ladder", task)] = figures.memory_breakdown_bars(ablation, task,
                                                                               configs=ladder + ["optimized"])
        out[table_name("noise_trajectory", task)] = figures.noise_trajectory(errors, task, configs=["optimized"])
        if (rows := reports.scaling_rows(task)) is not None:
            out[table_name("scaling", task)] = figures.scaling_plot(tables.scaling_table(rows, task=task))
    for task, plan in reports.plans().items():
        auto_runs = _records_of(main, task, ["auto"])
        out[table_name("plan_pareto", task)] = plan.pareto_figure(data=figures.data_label(auto_runs) if auto_runs else None)
    if (ops := reports.committed("op_categories")) is not None:
        out["op_categories"] = figures.op_category_bars(ops, errors)
    return out


def differing(reports: Reports, rendered: dict[str, Rendered]) -> list[str]:
    """The tables whose committed CSV or Markdown differs from `rendered` (or is missing)."""
    out = []
    for name, table in rendered.items():
        csv_path, md_path = (reports.folder / "tables" / f"{name}{ext}" for ext in (".csv", ".md"))
        if not (csv_path.is_file() and md_path.is_file()) or csv_path.read_text() != table.csv or \
                md_path.read_text() != table.markdown:
            out.append(name)
    return out


def write(reports: Reports, rendered: dict[str, Rendered], drawn: dict | None = None) -> None:
    """Write the rendered tables (CSV + Markdown) and figures (PNG) into the profile folder."""
    folder = reports.folder / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in rendered.items():
        (folder / f"{name}.csv").write_text(table.csv)
        (folder / f"{name}.md").write_text(table.markdown)
    import matplotlib.pyplot as plt

    for name, fig in (drawn or {}).items():
        figures.save_figure(fig, reports.folder / "figures", name)
        plt.close(fig)  # the plan's figure is pyplot's


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reporting.render", description=__doc__.splitlines()[0])
    parser.add_argument("reports", help="the reports folder (holding <profile>/runs/)")
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--write", action="store_true", help="write the tables and figures (default: list what differs)")
    args = parser.parse_args(argv)
    reports = Reports(Path(args.reports).resolve(), args.profile)
    rendered = render_tables(reports)
    stale = differing(reports, rendered)
    if args.write:
        write(reports, rendered, render_figures(reports))
        print(f"wrote {len(rendered)} tables ({len(stale)} changed) and the figures into {reports.folder}")
        return 0
    print("\n".join(f"differs from the records: {name}" for name in stale) or "every table is what the records give")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["PAPER_TABLES", "Rendered", "Reports", "analysis_tables", "differing", "main", "paper_tables",
           "plan_tables", "render_figures", "render_tables", "write"]
