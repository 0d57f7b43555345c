"""A reports folder's tables and figures rendered again from its records, without training or timing.

The section notebooks make every table from the run records, the interleaved timing records
(``timing/``) and the plans (``plans/``) of ``reports/<profile>/``. This module does the same with
the same functions, reading what the notebooks stored: what the test of the committed reference
compares with its committed tables (a reference the code no longer renders cannot land), and
how a reference is brought up to date when the reporting code changes.

    python -m trainopt_core.reporting.render reports --profile quick           # which tables differ
    python -m trainopt_core.reporting.render reports --profile quick --write   # write tables and figures

A folder's tables and figures are rendered again as it holds them (a section it did not run
stays absent). Tables I-IV, the plans and the error-analysis tables computed from the records are
rendered from the records; the operation profile, the activation bytes by module type and eq. 21's
recomputation overhead are measurements kept only in their tables, so their numbers are read back
from the committed CSV and only their captions and layout are rendered again. Records packed as
``runs.tar.xz`` (reports/other_machines) are read from the archive; ``--runs`` names another
folder's (a second timing of the same runs, in ``rerun/``).
"""
from __future__ import annotations

import argparse
import tarfile
import tempfile
from dataclasses import dataclass
from functools import partial
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


def _load_runs(root: Path, profile: str, runs: Path | None) -> list[dict]:
    """The run records of ``<root>/<profile>/runs/``, of its ``runs.tar.xz``, or of `runs` (a
    folder or an archive of another reports folder)."""
    runs = runs or root / profile / "runs"
    if runs.is_dir():
        if runs.name != "runs":
            _fail("runs", str(runs), "a folder named runs/ or a runs.tar.xz archive")
        return load_records(runs.parent.parent, runs.parent.name)
    archive = runs if runs.suffix == ".xz" else runs.parent / "runs.tar.xz"
    if not archive.is_file():
        _fail("reports", str(runs.parent), "a profile folder holding runs/ or runs.tar.xz (made by ./run_all.sh)")
    with tempfile.TemporaryDirectory() as unpacked, tarfile.open(archive) as packed:
        packed.extractall(Path(unpacked) / profile, filter="data")
        return load_records(unpacked, profile)


class Reports:
    """The stored inputs of ``<root>/<profile>/``: records, timing windows, scaling rows, plans."""

    def __init__(self, root, profile: str, runs=None):
        self.root, self.profile = resolve_reports_dir(root), profile
        self.folder = self.root / profile
        records = _load_runs(self.root, profile, None if runs is None else Path(runs).resolve())
        self.records = with_throughput(records, stored_throughput(self.folder / "timing", TASKS))
        self.tasks = [task for task in TASKS if any(r["task"] == task for r in self.records)]

    def section(self, section: str, seeds=None) -> list[dict]:
        """The records a section notebook holds: its configurations, in the order it runs them."""
        order = _sections()[section]
        chosen = [r for r in self.records if r["config_name"] in order and (seeds is None or r.get("seed") in seeds)]
        return sorted(chosen, key=lambda r: (TASKS.index(r["task"]), order.index(r["config_name"]), r.get("seed", 0)))

    def scaling_rows(self, task: str) -> list[dict] | None:
        record = load_record(self.folder / "timing" / f"scaling__{task}.json")
        return None if record is None else record["rows"]

    def plans(self) -> dict:
        return planning.load_plans(autoplan.plans_dir_for(self.folder / "runs"), self.tasks)

    def present(self, kind: str) -> list[str]:
        """The stems of the tables ("tables") or figures ("figures") the folder holds."""
        suffixes = (".md", ".csv") if kind == "tables" else (".png",)
        return sorted({p.stem for p in (self.folder / kind).glob("*") if p.suffix in suffixes})

    def committed(self, name: str) -> pd.DataFrame | None:
        path = self.folder / "tables" / f"{name}.csv"
        return pd.read_csv(path) if path.is_file() else None


def _of(records: list[dict], task: str, configs=None) -> list[dict]:
    return [r for r in records if r["task"] == task and (configs is None or r["config_name"] in configs)]


def _render(table: pd.DataFrame, name: str, title: str, records: list[dict], display=None) -> Rendered:
    shown, caption_text, notes = published_table(table, name, title, records, display)
    return Rendered(table, table_markdown(name, caption_text, shown, notes))


class Renderer:
    """Each table of the section notebooks, as they make it, from a folder's stored inputs."""

    def __init__(self, reports: Reports):
        self.reports = reports
        self.main, self.ablation, self.errors = (reports.section(s) for s in ("01", "02", "04"))

    # notebook 01
    def main_table(self, task: str) -> Rendered:
        table = tables.main_results_table(self.main, task)
        label = TASK_LABELS[task]
        return _render(table, table_name("table1" if task == "cifar10" else "table2", task),
                       f"{label['table']} analogue: {label['description']}", _of(self.main, task),
                       tables.format_main_table(table))

    def plan(self, task: str) -> Rendered:
        plan = self.reports.plans()[task]
        return _render(planning.plan_frame(plan), table_name("plan", task),
                       f"The auto plan: {TASK_LABELS[task]['description']}", _of(self.main, task, ["auto"]),
                       planning.format_plan_table(plan))

    # notebooks 02 and 03
    def ablation_table(self, task: str) -> Rendered:
        table = tables.ablation_table(self.ablation, task)
        return _render(table, table_name("table3_ablation", task),
                       f"Table III analogue (ablation): {TASK_LABELS[task]['description']}",
                       _of(self.ablation, task), tables.format_ablation_table(table))

    def scaling_table(self, task: str) -> Rendered:
        table = tables.scaling_table(self.reports.scaling_rows(task), task=task)
        return _render(table, table_name("table4_scaling", task),
                       f"Table IV analogue (scaling): {TASK_LABELS[task]['description']}",
                       _of(self.reports.section("03", seeds=(0,)), task), tables.format_scaling_table(table))

    # notebook 04
    def phases(self, task: str) -> Rendered:
        return _render(analysis.phase_speedups(self.errors, task), table_name("phases", task),
                       f"Time saved by training phase: {TASK_LABELS[task]['description']}",
                       _of(self.errors, task, ["baseline", "optimized"]))

    def memory_categories(self, task: str) -> Rendered:
        table = analysis.memory_by_category(self.errors, task, configs=["baseline", "+checkpointing", "optimized"])
        return _render(table.reset_index(), table_name("memory_categories", task),
                       f"Memory by category at the peak: {TASK_LABELS[task]['description']}", _of(self.errors, task),
                       format_bytes_frame(table.reset_index()))

    def activations_by_module(self, task: str) -> Rendered:
        name = table_name("activations_by_module", task)
        by_module = self.reports.committed(name)  # a measurement kept only in its table
        return _render(by_module, name, f"Activation bytes by module type (one micro-batch): "
                       f"{TASK_LABELS[task]['description']}", _of(self.errors, task, ["baseline", "optimized"]),
                       format_bytes_frame(by_module))

    def noise_by_phase(self, task: str) -> Rendered:
        return _render(analysis.noise_by_phase(self.errors, task, configs=["optimized"]),
                       table_name("noise_by_phase", task), f"Adaptive k by phase: {TASK_LABELS[task]['description']}",
                       _of(self.errors, task, ["optimized"]))

    def _profiled(self) -> list[dict]:
        """The runs of the configurations notebook 04 profiles (notebook 01's)."""
        return [r for r in self.main if r["config_name"] in ("baseline", "optimized", "auto")]

    def op_categories(self) -> Rendered:
        return _render(self.reports.committed("op_categories"), "op_categories",
                       "Self time by operation category (torch.profiler)", self._profiled())

    def architecture_patterns(self) -> Rendered:
        return _render(analysis.architecture_patterns(self.errors), "architecture_patterns",
                       "Best component per architecture (leave-one-out)", self.errors)

    def eq21_decomposition(self) -> Rendered:
        rows = []
        for _, kept in self.reports.committed("eq21_decomposition").iterrows():  # the overhead as timed
            overhead = kept["recompute_overhead"] if kept.get("recompute_overhead_source") == "direct timing" else None
            rows.append({**analysis.eq21_decomposition(self.errors, kept["task"], recompute_overhead=overhead),
                         **{k: kept[k] for k in ("forward_share", "segments", "blocks") if k in kept}})
        return _render(pd.DataFrame(rows), "eq21_decomposition", "Eq. 21 decomposition, measured", self.errors)

    def builders(self) -> dict:
        """{table's file stem: how to render it}, computed only when called."""
        out = {}
        for task in self.reports.tasks:
            per_task = {table_name("table1" if task == "cifar10" else "table2", task): self.main_table,
                        table_name("table3_ablation", task): self.ablation_table,
                        table_name("phases", task): self.phases, table_name("noise_by_phase", task): self.noise_by_phase,
                        table_name("memory_categories", task): self.memory_categories,
                        table_name("activations_by_module", task): self.activations_by_module}
            if self.reports.scaling_rows(task) is not None:
                per_task[table_name("table4_scaling", task)] = self.scaling_table
            out.update({name: partial(build, task) for name, build in per_task.items()})
        out.update({table_name("plan", task): partial(self.plan, task) for task in self.reports.plans()})
        return {**out, "op_categories": self.op_categories, "architecture_patterns": self.architecture_patterns,
                "eq21_decomposition": self.eq21_decomposition}

    def figures(self) -> dict:
        """{figure's file stem: how to draw it}."""
        ladder = [c.name for c in ABLATION_LADDER] + ["optimized"]
        out = {}
        for task in self.reports.tasks:
            out[table_name("curves", task)] = partial(figures.quality_curves, self.main, task)
            out[table_name("memory_ladder", task)] = partial(figures.memory_breakdown_bars, self.ablation, task,
                                                             configs=ladder)
            out[table_name("noise_trajectory", task)] = partial(figures.noise_trajectory, self.errors, task,
                                                                configs=["optimized"])
            if self.reports.scaling_rows(task) is not None:
                out[table_name("scaling", task)] = lambda task=task: figures.scaling_plot(self.scaling_table(task).table)
        for task, plan in self.reports.plans().items():
            auto_runs = _of(self.main, task, ["auto"])
            out[table_name("plan_pareto", task)] = partial(plan.pareto_figure,
                                                           data=figures.data_label(auto_runs) if auto_runs else None)
        out["op_categories"] = lambda: figures.op_category_bars(self.reports.committed("op_categories"), self._profiled())
        return out


def paper_tables(reports: Reports) -> dict[str, Rendered]:
    """Tables I-IV as notebooks 01-03 write them (Table IV where the folder holds its scaling rows)."""
    return {name: build() for name, build in Renderer(reports).builders().items() if name in PAPER_TABLES}


def render_tables(reports: Reports, names=None) -> dict[str, Rendered]:
    """The tables `names` (default: every table the folder holds) rendered again."""
    builders = Renderer(reports).builders()
    return {name: builders[name]() for name in (reports.present("tables") if names is None else names)
            if name in builders}


def render_figures(reports: Reports, names=None) -> dict:
    """The figures `names` (default: every figure the folder holds) drawn again: {file stem: Figure}."""
    builders = Renderer(reports).figures()
    return {name: builders[name]() for name in (reports.present("figures") if names is None else names)
            if name in builders}


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
    import matplotlib.pyplot as plt

    folder = reports.folder / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in rendered.items():
        (folder / f"{name}.csv").write_text(table.csv)
        (folder / f"{name}.md").write_text(table.markdown)
    for name, fig in (drawn or {}).items():
        figures.save_figure(fig, reports.folder / "figures", name)
        plt.close(fig)  # the plan's figure is pyplot's


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reporting.render", description=__doc__.splitlines()[0])
    parser.add_argument("reports", help="the reports folder (holding <profile>/runs/ or <profile>/runs.tar.xz)")
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--runs", help="the run records to use instead (a runs/ folder or a runs.tar.xz)")
    parser.add_argument("--write", action="store_true", help="write the tables and figures (default: list what differs)")
    args = parser.parse_args(argv)
    folder = Path(args.reports)
    if not folder.is_dir():
        parser.error(f"reports {args.reports!r} is invalid: {'a file' if folder.exists() else 'no such folder'}; allowed "
                     "a reports folder holding <profile>/runs/ or <profile>/runs.tar.xz")
    records = folder / args.profile
    if args.runs is None and not ((records / "runs").is_dir() and any((records / "runs").glob("*.json"))
                                  or (records / "runs.tar.xz").is_file()):
        parser.error(f"--profile {args.profile!r} is invalid for {args.reports}: no run records in {args.profile}/runs/ "
                     f"or {args.profile}/runs.tar.xz; allowed a profile whose reproduction has run "
                     f"(./run_all.sh --profile {args.profile})")
    reports = Reports(folder.resolve(), args.profile, runs=args.runs)
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


__all__ = ["PAPER_TABLES", "Rendered", "Renderer", "Reports", "differing", "main", "paper_tables", "render_figures",
           "render_tables", "write"]
