"""What the section notebooks share: their parameters, folders, the runs they need, and the
deterministic tables (configurations, the paper's claims) that nbval checks.

    paths = report_paths(reports_dir, profile)
    records = timed_grid(parse_tasks(tasks), ["baseline", "optimized"], seeds=seeds, profile=profile,
                         paths=paths, data_policy=data_policy)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ..config import OptimizationConfig
from ..reproduction import autoplan
from ..reproduction.data.sources import CHECKOUT
from ..reproduction.executor import check_executor, run_on_ray
from ..reproduction.profiles import PROFILES, TASKS, table_configs
from ..reproduction.progress import minutes, say, step
from ..reproduction.runner import run
from ..reproduction.throughput import measure_throughput, throughput_path
from .figures import figure_image, save_figure
from .index import footnotes_markdown, markdown_table, published_table, write_table
from .results import paper_claims, resolve_reports_dir, with_throughput
from .._errors import fail as _fail

# The paper's model of each task, used in table/figure names (never the data set's name: a
# stand-in may have run) and the paper's table it mirrors.
TASK_LABELS = {
    "cifar10": dict(file="resnet", table="Table I", description="image classification with a bottleneck ResNet "
                    "(paper: CIFAR-10, ResNet-50)"),
    "wikitext2": dict(file="gpt2", table="Table II", description="language modelling with GPT-2 "
                      "(paper: WikiText-2, GPT-2 small)"),
}
# Every configuration Tables I-III compare: timed together, so a ratio means the same in each table.
# `auto` is planned on the machine that runs it (reproduction.autoplan).
TABLE_CONFIGS = table_configs()

# Said once after the timing: why the tables' throughput is not the img/s a run's line gave.
TIMING_NOTE = ("The tables' throughput (and so their time to target) comes from these interleaved windows, every "
               "configuration timed in turn within the same minutes, not from a run's own clock, which measured "
               "each run alone, at its own time, on a machine whose speed drifts.")

# The settings configuration_table shows, in words.
CONFIG_HEADERS = {"precision": "precision (requested)", "k": "k (micro-batches per step)", "adaptive": "adaptive k",
                  "k_min": "k min", "k_max": "k max", "schedule": "LR schedule", "warmup_fraction": "warmup",
                  "min_lr_ratio": "min LR / peak LR", "lr_scaling": "LR × batch scaling", "clip_norm": "clip norm",
                  "checkpointing": "checkpoint segments", "zero_stage": "ZeRO stage"}


@dataclass(frozen=True)
class ReportPaths:
    """``reports/<profile>/`` and its runs/, tables/, figures/ and notebooks/ folders."""

    root: Path
    profile: str

    @property
    def profile_dir(self) -> Path:
        return self.root / self.profile

    @property
    def runs(self) -> Path:
        return self.profile_dir / "runs"

    @property
    def tables(self) -> Path:
        return self.profile_dir / "tables"

    @property
    def figures(self) -> Path:
        return self.profile_dir / "figures"

    @property
    def timing(self) -> Path:
        """Interleaved throughput windows and scaling measurements."""
        return self.profile_dir / "timing"

    @property
    def notebooks(self) -> Path:
        return self.profile_dir / "notebooks"

    @property
    def plans(self) -> Path:
        """The `auto` configuration's plans (reproduction.autoplan), one per task."""
        return autoplan.plans_dir_for(self.runs)

    def shown(self, path: str | os.PathLike) -> str:
        """`path` as a notebook prints it: relative to the checkout (``reports/quick/runs``) when
        the reports are in it, else to the reports folder (``<reports_dir>/quick/runs``), so an
        executed notebook carries no absolute path of the machine that made it."""
        path = Path(path).resolve()
        if path.is_relative_to(CHECKOUT) and (CHECKOUT / "pyproject.toml").is_file():
            return path.relative_to(CHECKOUT).as_posix()
        return "<reports_dir>/" + path.relative_to(self.root.resolve()).as_posix()


def report_paths(reports_dir: str | os.PathLike, profile: str) -> ReportPaths:
    """The folders of `profile` under `reports_dir` (relative paths: see
    `results.resolve_reports_dir`), created if missing."""
    if profile not in PROFILES:
        _fail("profile", profile, f"one of {PROFILES}")
    paths = ReportPaths(resolve_reports_dir(reports_dir), profile)
    for folder in (paths.runs, paths.tables, paths.figures, paths.timing):
        folder.mkdir(parents=True, exist_ok=True)
    return paths


def parse_tasks(tasks) -> list[str]:
    """A list of task names from a list or a comma-separated string (papermill passes strings)."""
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    names = [t for t in names if t]
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        _fail("tasks", tasks, f"a non-empty list (or comma-separated string) of {TASKS}")
    return names


def parse_seeds(seeds) -> list[int]:
    """Seeds 0..N-1 from a count N >= 1."""
    if isinstance(seeds, str) and seeds.strip().isdigit():
        seeds = int(seeds)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        _fail("seeds", seeds, "an integer >= 1 (the number of seeds)")
    return list(range(seeds))


progress = say  # one progress line (reproduction.progress): the cell's output and ./run_all.sh's terminal


def _record_files(folder) -> dict[str, int]:
    """Each run record file in `folder` with its modification time (ns)."""
    folder = Path(folder)
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")} if folder.is_dir() else {}


def _run_line(task: str, config: str, seed: int, record: dict) -> str:
    m = record["metrics"]
    return (f"{task} {config} seed {seed}: final {m['quality_name']} {m['final_quality']:.4g}, "
            f"{m['throughput']:.4g} {m['throughput_unit']} on its own clock")


def _runs(count: int, what: str = "run") -> str:
    return f"{count} {what}{'s' if count != 1 else ''}"


def _shown_runs(out_dir, profile: str) -> str:
    """The runs folder as a notebook prints it (`ReportPaths.shown`), or as given when it is not
    ``<reports_dir>/<profile>/runs``."""
    folder = Path(out_dir).resolve()
    if folder.name == "runs" and folder.parent.name == profile:
        return ReportPaths(folder.parent.parent, profile).shown(folder)
    return str(out_dir)


def grid_line(*, trained: int, trained_s: float, reused: int, runs_shown: str) -> str:
    """What a grid of runs did, in one line: the runs reused are said here, once, not a line each."""
    reused_line = f"reused {_runs(reused, 'finished run')} from {runs_shown} (made under the same conditions"
    if not trained:
        return reused_line + "; nothing trained again)"
    trained_line = f"{_runs(trained)} trained in {minutes(trained_s)}"
    return f"{trained_line}; {reused_line})" if reused else f"{trained_line} (records in {runs_shown})"


def run_grid(tasks, configs, *, seeds, profile: str, out_dir, data_policy: str = "auto", executor: str = "local",
             ray_address: str | None = None, **options) -> list[dict]:
    """`runner.run` for every task x configuration x seed (a finished record is reused, not
    re-run), and returns the records. Says one progress line per run trained (which of how many,
    the time so far and the time left at the pace of the runs trained so far), the runs reused
    once at the end (`grid_line`), and while a run trains or plans, a heartbeat line at least every
    `progress.HEARTBEAT_S` seconds. `executor="ray"`: the runs are Ray tasks
    (`reproduction.executor`), on the cluster at `ray_address` or on one started here."""
    grid = [(task, config, seed) for task in parse_tasks(tasks) for config in configs for seed in parse_seeds(seeds)]
    if check_executor(executor) == "ray":
        with step(f"{len(grid)} runs on Ray"):
            records = run_on_ray(grid, profile=profile, out_dir=out_dir, data_policy=data_policy,
                                 address=ray_address or None, options=options, report=say)
        for (task, config, seed), record in zip(grid, records):
            print(_run_line(task, config, seed, record))
        return records
    records = []
    started, trained_s, trained, reused = time.perf_counter(), 0.0, 0, 0
    for index, (task, config, seed) in enumerate(grid, 1):
        start = time.perf_counter()
        made_after = datetime.now(timezone.utc).isoformat(timespec="seconds")
        before = _record_files(out_dir)
        with step(f"run {index}/{len(grid)}: {task} {config} seed {seed}"):
            record = run(task, config, profile=profile, seed=seed, out_dir=out_dir, data_policy=data_policy,
                         progress=False, **options)
        records.append(record)
        seconds = time.perf_counter() - start
        # reused: no record written (a record made in the same second as this run began has the
        # same date_utc), or one copied from a twin made earlier
        if (_record_files(out_dir) == before
                or record.get("manifest", {}).get("date_utc", made_after) < made_after):
            reused += 1
            continue
        trained_s, trained = trained_s + seconds, trained + 1
        left = len(grid) - index
        eta = f", about {minutes(left * trained_s / trained)} left" if left else ""
        say(f"run {index}/{len(grid)}: {_run_line(task, config, seed, record)}; trained in {minutes(seconds)}; "
            f"{minutes(time.perf_counter() - started)} so far{eta}")
    say(grid_line(trained=trained, trained_s=trained_s, reused=reused, runs_shown=_shown_runs(out_dir, profile)))
    return records


def timed_grid(tasks, configs, *, seeds, profile: str, paths: ReportPaths, data_policy: str = "auto",
               executor: str = "local", ray_address: str | None = None, **options) -> list[dict]:
    """`run_grid`, then every table configuration of each task timed in interleaved windows
    (`reproduction.measure_throughput`, reused when made under the same conditions); returns the
    records with their configuration's windows attached (`results.with_throughput`)."""
    records = run_grid(tasks, configs, seeds=seeds, profile=profile, out_dir=paths.runs, data_policy=data_policy,
                       executor=executor, ray_address=ray_address, **options)
    timing_options = {k: v for k, v in options.items() if k in ("device", "backend", "data_dir")}
    timings = []
    for task in parse_tasks(tasks):
        start = time.perf_counter()
        say(f"timing {task}: the table's configurations in interleaved windows ...")
        with step(f"timing {task}"):
            timing = measure_throughput(task, list(dict.fromkeys([*TABLE_CONFIGS, *configs])), profile=profile,
                                        seeds=len(parse_seeds(seeds)), out_dir=paths.timing, data_policy=data_policy,
                                        progress=False, **timing_options)
        base = timing["results"]["baseline"]["summary"]
        how = (f"reused from {paths.shown(throughput_path(paths.timing, task))} (made under the same conditions; "
               "nothing timed again)" if timing.get("reused") else minutes(time.perf_counter() - start))
        say(f"timing {task}: {len(timing['configs'])} configurations x {timing['windows']} interleaved windows; "
            f"baseline {base['mean']:.4g} {timing['results']['baseline']['item_unit']} "
            f"(range {base['min']:.4g}-{base['max']:.4g}), {how}")
        timings.append(timing)
    say(TIMING_NOTE)
    return with_throughput(records, timings)


def configuration_table(names) -> pd.DataFrame:
    """The settings of named configurations as requested (a profile may change the precision
    on CPU; the tables' captions say what ran), one row each, for reading: no index, unset
    settings as "—", fractions in %; `auto`'s planned settings as "planned" (its plan says what)."""
    rows = []
    for name in names:
        if name == autoplan.AUTO:  # the baseline's schedule and clipping; the rest planned per task and machine
            config = autoplan.auto_from_plan(OptimizationConfig())
            rows.append({"configuration": name, **{header: _setting(f, _value(config, f)) if f in autoplan.SCHEDULE_FIELDS
                                                   else "planned" for f, header in CONFIG_HEADERS.items()}})
            continue
        config = OptimizationConfig.preset(name)
        rows.append({"configuration": name, **{header: _setting(f, _value(config, f)) for f, header in CONFIG_HEADERS.items()}})
    return pd.DataFrame(rows)


def _value(config: OptimizationConfig, field: str):
    """A configuration's setting as it runs (lr_scaling's default resolved)."""
    return config.scales_lr if field == "lr_scaling" else getattr(config, field)


def _setting(field: str, value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if field == "warmup_fraction":
        return f"{100 * value:g} % of samples"
    if field == "checkpointing" and value == "sqrt":
        return "⌈√L⌉"
    return str(value)


# The paper's metric names in paper_claims.json -> a header with its unit.
_CLAIM_HEADERS = {
    "time_to_85_acc_min": "time to 85 % accuracy (min)", "peak_memory_gb": "peak memory (GB)",
    "throughput_img_s": "throughput (img/s)", "final_accuracy_pct": "final accuracy (%)",
    "flops_utilization_pct": "FLOPs utilization (%)", "time_to_ppl45_hr": "time to perplexity 45 (h)",
    "throughput_tok_s": "throughput (tokens/s)", "final_perplexity": "final perplexity",
    "config": "configuration", "time_min": "time (min)", "memory_gb": "memory (GB)", "accuracy_pct": "accuracy (%)",
    "gpus": "GPUs", "baseline_img_s": "baseline (img/s)", "optimized_img_s": "optimized (img/s)",
    "baseline_efficiency": "baseline efficiency (%)", "optimized_efficiency": "optimized efficiency (%)",
}


def paper_claims_frame(table: str) -> pd.DataFrame:
    """One of the paper's tables as printed (``table1_cifar10_resnet50``, ``table2_wikitext2_gpt2``,
    ``table3_ablation_cifar10``, ``table4_scaling_cifar10``), for reading: metric names with
    their units, relative changes and efficiencies in %, no index."""
    claims = paper_claims()
    if table not in claims or not table.startswith("table"):
        _fail("table", table, f"one of {[k for k in claims if k.startswith('table')]}")
    data = claims[table]
    if isinstance(data, list):
        frame = pd.DataFrame(data)
        for column in [c for c in frame.columns if c.endswith("_efficiency")]:
            frame[column] = [f"{100 * v:.1f}" for v in frame[column]]
        return frame.rename(columns=_CLAIM_HEADERS)
    rows = []
    for metric, values in data.items():
        row = {"metric": _CLAIM_HEADERS.get(metric, metric), **{k: v for k, v in values.items() if k != "relative"}}
        if "relative" in values:
            row["optimized vs baseline"] = f"{100 * values['relative']:+.1f} %"
        rows.append(row)
    return pd.DataFrame(rows)


def heartbeat_in_every_cell() -> None:
    """From the next cell on, a cell that runs longer than `progress.HEARTBEAT_S` seconds says so
    at least that often (in an IPython kernel; elsewhere nothing changes). The steps it runs
    (`run_grid`'s runs, planning, timing) name themselves in those lines."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or id(shell) in _HEARTBEAT_SHELLS:
        return
    running = []

    def cell_started(*_):
        running.append(step(""))
        running[-1].__enter__()

    def cell_ended(*_):
        while running:
            running.pop().__exit__(None, None, None)

    shell.events.register("pre_run_cell", cell_started)
    shell.events.register("post_run_cell", cell_ended)
    _HEARTBEAT_SHELLS.add(id(shell))


_HEARTBEAT_SHELLS: set[int] = set()


def panel(children, what: str):
    """An ipywidgets VBox of `children` whose plain-text form says `what` it is (under 50
    characters) and that it needs a running kernel: a saved notebook shows that text where no
    kernel runs the panel (a repository viewer), instead of ``VBox(children=...``."""
    import ipywidgets as widgets

    class Panel(widgets.VBox):
        def __repr__(self) -> str:
            return f"[{what} (needs a live kernel: run this notebook in JupyterLab)]"

    return Panel(children)


def show_table(frame: pd.DataFrame) -> None:
    """Show a table for reading in a notebook: Markdown, full headers, no index column (the
    numbers formatted by `index.format_number`)."""
    show_markdown(markdown_table(frame))


def show_markdown(text: str) -> None:
    """Render Markdown in a notebook (plain text outside a kernel)."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        print(text)
        return
    if get_ipython() is None:
        print(text)
    else:
        display(Markdown(text))


def table_name(kind: str, task: str | None = None) -> str:
    """File stem of a table or figure: `kind` plus the task's model family (``table1_resnet``)."""
    if task is None:
        return kind
    if task not in TASK_LABELS:
        _fail("task", task, f"one of {tuple(TASK_LABELS)}")
    return f"{kind}_{TASK_LABELS[task]['file']}"


def publish_table(table: pd.DataFrame, paths: ReportPaths, name: str, title: str, records: list[dict],
                  display: pd.DataFrame | None = None) -> None:
    """Caption `table` with the runs' context (its notes numbered below it: `index.published_table`),
    write it (CSV + Markdown) and show it."""
    shown, text, notes = published_table(table, name, title, records, display)
    write_table(table, paths.tables, name, text, display=shown, notes=notes)
    show_markdown(f"**{title}**\n\n{markdown_table(shown)}\n_{text}_\n\n{footnotes_markdown(notes)}")


def publish_figure(fig, paths: ReportPaths, name: str):
    """Save `fig` as ``figures/<name>.png`` and return that PNG as an image for the notebook to
    show; the figure is closed.

    Not the Figure itself: a matplotlib Figure displays as the text ``<Figure size ...>`` wherever
    the inline backend is not active (papermill's kernels under MPLBACKEND=Agg, a notebook
    opened after `matplotlib.use("Agg")`), so the executed notebook would hold no picture. The
    image is the very file the reports link to."""
    return figure_image(fig, saved=save_figure(fig, paths.figures, name))


def records_of(records: list[dict], task: str, configs=None) -> list[dict]:
    """The records of one task (and, optionally, some configurations)."""
    return [r for r in records if r["task"] == task and (configs is None or r["config_name"] in configs)]


def describe_failed_cell(notebook_path: str | os.PathLike) -> str:
    """Which cell of an executed notebook failed and why: its number among the source
    notebook's code cells (papermill's injected-parameters cell not counted), execution count,
    first source line and the error (papermill keeps the error in the output notebook)."""
    import nbformat

    nb = nbformat.read(str(notebook_path), as_version=4)
    code_index = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "injected-parameters" in cell.metadata.get("tags", []):
            continue
        code_index += 1
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                first_line = next((line for line in cell.source.splitlines() if line.strip()), "")
                return (f"code cell {code_index} (In [{cell.get('execution_count')}], id {cell.get('id', '?')}): "
                        f"`{first_line.strip()}` raised {output.get('ename')}: {output.get('evalue')}")
    return "no cell with an error output (the kernel may have died or the notebook could not be read)"
