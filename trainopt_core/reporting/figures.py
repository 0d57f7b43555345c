"""Figures of the reports (PNG): quality vs training time, memory breakdown, scaling, and the
adaptive-k / gradient-noise trajectory.

Each function returns a `matplotlib.figure.Figure` (no pyplot global state, so a notebook shows
it once and tests need no display). Every title names the data that really ran -- the record's
``data_source`` -- so a stand-in is never presented as CIFAR-10 or WikiText-2.
"""
from __future__ import annotations

import math
import os
import statistics
import textwrap
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..measure.stats import summarize
from .results import aggregate, geometric_summary, timed_speed
from .._errors import fail as _fail

STYLE = "whitegrid"


def _select(records: list[dict], task: str, configs=None) -> list[dict]:
    chosen = [r for r in records if r["task"] == task and (configs is None or r["config_name"] in configs)]
    if configs is not None:  # keep the caller's order (e.g. the ablation ladder)
        chosen.sort(key=lambda r: (list(configs).index(r["config_name"]), r.get("seed", 0)))
    return chosen


def data_label(records: list[dict]) -> str:
    """The data source(s) and profile of `records` ("stand-in: ... (NOT CIFAR-10) (profile quick)")."""
    sources = "; ".join(sorted({r.get("data_source", "?") for r in records})) or "no runs"
    profiles = ", ".join(sorted({str(r.get("profile")) for r in records}))
    return f"{sources} (profile {profiles})"


def figure_title(what: str, records: list[dict], width: int = 80) -> str:
    """``what`` followed by the data source(s) and profile of `records`, wrapped at `width`."""
    return "\n".join(textwrap.wrap(f"{what} — data: {data_label(records)}", width))


def _new_figure(ncols: int = 1, width: float = 7.5, height: float = 4.5):
    with sns.axes_style(STYLE):
        fig = Figure(figsize=(width * ncols, height), layout="constrained")
        axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _palette(names) -> dict:
    names = list(dict.fromkeys(names))
    return dict(zip(names, sns.color_palette("tab10", max(len(names), 1))))


def figure_image(fig: Figure, *, saved: Path | None = None):
    """`fig` as a PNG image for a notebook to show -- the file `saved` when `save_figure` wrote
    it already -- and the figure closed: a Figure itself shows as the text ``<Figure size ...>``
    wherever matplotlib's inline backend is not active."""
    import io

    import matplotlib.pyplot as plt
    from IPython.display import Image

    if saved is None:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
        data = buffer.getvalue()
    else:
        data = Path(saved).read_bytes()
    plt.close(fig)
    return Image(data=data, format="png")


def _empty(fig: Figure, ax, message: str) -> Figure:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


# ------------------------------------------------------------------ quality vs time
def quality_curves(records: list[dict], task: str, *, configs=None) -> Figure:
    """Evaluation quality vs training time (evaluation excluded): per configuration the mean over
    its seeds (thick, with markers; perplexity's geometric mean) and the 95 % band across them
    (perplexity's in log space, as its axis), each seed thin beneath; the
    profile's target as a dashed black line (accuracy in %, perplexity on a log axis). A run whose
    curve is its un-checkpointed twin's has no clock of its own: it is placed at samples ÷ its
    interleaved-timed samples/s, dashed. The notes are written below the axes, off the data."""
    chosen = _select(records, task, configs)
    fig, (ax,) = _new_figure()
    if not chosen:
        return _empty(fig, ax, f"no complete runs for task {task!r}")
    colors = _palette(r["config_name"] for r in chosen)
    accuracy = chosen[0]["metrics"].get("quality_name") == "accuracy"
    curves, unclocked, placed = {}, {}, set()
    for r in chosen:
        times = [h["time_s"] for h in r["history"]]
        if None in times:  # its curve is another run's (runner: checkpointing twins), without that run's clock
            speed = timed_speed(r)
            if not speed > 0:
                unclocked.setdefault(r["config_name"], r.get("quality_from"))
                continue
            times = [h["samples"] / speed for h in r["history"]]  # placed by its own interleaved-timed speed
            placed.add(r["config_name"])
        values = [h["quality"] * (100 if accuracy else 1) for h in r["history"]]
        curves.setdefault(r["config_name"], []).append((times, values))
    most_seeds = max((len(runs) for runs in curves.values()), default=1)
    for name, runs in curves.items():
        style = dict(color=colors[name], ls="--" if name in placed else "-")
        if len(runs) > 1:
            for times, values in runs:
                ax.plot(times, values, lw=0.6, alpha=0.35, **style)
        points = min(len(values) for _, values in runs)  # evaluations at the same samples in every seed
        mean_times = [statistics.fmean(times[i] for times, _ in runs) for i in range(points)]
        # perplexity (a log axis) averages as exp(mean loss): its geometric mean, its band in log space
        over_seeds = summarize if accuracy else geometric_summary
        spread = [over_seeds([values[i] for _, values in runs]) for i in range(points)]
        ax.plot(mean_times, [s["mean"] for s in spread], marker="o", ms=3, lw=1.8, label=name, **style)
        if len(runs) > 1:
            ax.fill_between(mean_times, [s["ci_low"] for s in spread], [s["ci_high"] for s in spread],
                            color=style["color"], alpha=0.15, lw=0)
    target = chosen[0]["metrics"].get("target")
    if target is not None:
        ax.axhline(target * (100 if accuracy else 1), color="black", ls="--", lw=1,
                   label=f"target {target * 100:.0f}%" if accuracy else f"target PPL {target:g}")
    if not accuracy:
        ax.set_yscale("log")
    notes = []
    if placed:
        notes.append("dashed: " + ", ".join(sorted(placed)) + ": curve of a run without checkpointing (the same "
                     "values); time = samples ÷ its interleaved-timed samples/s")
    if unclocked:
        notes.append("no clock of their own (same curve as the run named): " + ", ".join(
            f"{name} = {source}" for name, source in unclocked.items()))
    if notes:
        ax.annotate("\n".join(textwrap.fill(note, 120) for note in notes), xy=(0, 0), xycoords="axes fraction",
                    xytext=(0, -30), textcoords="offset points", va="top", fontsize=7, annotation_clip=False)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy (%)" if accuracy else "validation perplexity (log scale)")
    # beside the axes, not over the curves
    mean = "mean" if accuracy else "geometric mean"
    ax.legend(fontsize=8, title=(f"{mean} of {most_seeds} seeds,\n95 % band; seeds thin" if most_seeds > 1 else None),
              title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(figure_title("Quality vs training time", chosen), fontsize=9)
    return fig


# ------------------------------------------------------------------ memory breakdown
def memory_breakdown_frame(records: list[dict], task: str, *, configs=None) -> pd.DataFrame:
    """Mean bytes per memory category (parameters, gradients, optimizer state, activations, ...)
    per configuration; configurations without a breakdown get one "peak (no breakdown)" bar."""
    rows = []
    for r in _select(records, task, configs):
        breakdown = r["metrics"].get("memory_breakdown_bytes") or {}
        if not breakdown:
            breakdown = {"peak (no breakdown)": r["metrics"].get("peak_memory_bytes") or 0}
        for category, value in breakdown.items():
            rows.append(dict(config_name=r["config_name"], seed=r.get("seed"), category=category, bytes=float(value or 0)))
    frame = pd.DataFrame(rows, columns=["config_name", "seed", "category", "bytes"])
    if frame.empty:
        return frame
    order = list(dict.fromkeys(frame["config_name"]))
    table = frame.groupby(["config_name", "category"], sort=False)["bytes"].mean().unstack(fill_value=0.0)
    return table.reindex(order)


def memory_breakdown_bars(records: list[dict], task: str, *, configs=None) -> Figure:
    """Stacked bars: where each configuration's peak memory goes (MiB), mean over seeds; each bar
    named with the precision it ran (a mixed-precision rung that ran fp32 says so)."""
    chosen = _select(records, task, configs)
    table = memory_breakdown_frame(chosen, task)
    fig, (ax,) = _new_figure(width=max(6.0, 1.2 * len(table) + 3))
    if table.empty:
        return _empty(fig, ax, f"no complete runs for task {task!r}")
    colors = _palette(table.columns)
    bottom = [0.0] * len(table)
    for category in table.columns:
        heights = (table[category] / 2**20).tolist()
        ax.bar(range(len(table)), heights, bottom=bottom, label=category, color=colors[category])
        bottom = [b + h for b, h in zip(bottom, heights)]
    runs = aggregate(chosen).set_index("config_name")
    peaks = runs["peak_memory_bytes_mean"]
    for i, name in enumerate(table.index):
        if name in peaks and math.isfinite(peaks[name]):
            ax.plot([i - 0.4, i + 0.4], [peaks[name] / 2**20] * 2, color="black", lw=1.5,
                    label="measured peak" if i == 0 else None)
    ran = [f"{name}\n(ran {runs['precision'][name]})" if name in runs.index and runs["precision"][name] else name
           for name in table.index]
    ax.set_xticks(range(len(table)), ran, rotation=30, ha="right")
    ax.set_ylabel("memory (MiB)")
    ax.legend(fontsize=8)
    ax.set_title(figure_title("Memory breakdown at the tracked training step", chosen,
                              width=int(11 * fig.get_figwidth())), fontsize=9)
    return fig


# ------------------------------------------------------------------ scaling
def scaling_plot(table: pd.DataFrame) -> Figure:
    """Throughput and scaling efficiency T_n/(n·T_1) vs world size; measured points solid, each
    with its 95 % interval as an error bar (an efficiency of 1 process is 1 by definition);
    modelled points hollow with dashed lines; the paper's GPU values as crosses. Each
    configuration is drawn a little apart on x."""
    fig, axes = _new_figure(ncols=2, width=6.0)
    if table is None or len(table) == 0:
        return _empty(fig, axes[0], "no scaling rows")
    colors = _palette(table["config"])
    configs = list(dict.fromkeys(table["config"]))
    for config, group in table.groupby("config", sort=False):
        # each configuration a little apart on x, so error bars at the same world size do not overlap
        shift = 0.04 * (configs.index(config) - (len(configs) - 1) / 2)
        group = group.sort_values("world_size").assign(world_size=lambda g: g["world_size"] + shift)
        measured = group[group["source"] == "measured"]
        modelled = group[group["source"] == "modelled"]
        if len(modelled) and len(measured) and modelled["world_size"].min() > measured["world_size"].max():
            modelled = pd.concat([measured.tail(1), modelled])  # draw the extension from the last measurement
        for ax, column in zip(axes, ("throughput", "efficiency")):
            if len(measured):
                ax.plot(measured["world_size"], measured[column], "o-", color=colors[config], label=f"{config} (measured)")
            if f"{column}_ci_low" in measured:
                with_ci = measured[measured[f"{column}_ci_low"].notna() & measured[f"{column}_ci_high"].notna()]
                if len(with_ci):  # the 95 % interval of each measured point
                    ax.errorbar(with_ci["world_size"], with_ci[column],
                                yerr=[with_ci[column] - with_ci[f"{column}_ci_low"],
                                      with_ci[f"{column}_ci_high"] - with_ci[column]],
                                fmt="none", ecolor=colors[config], capsize=4, lw=1)
            if len(modelled):
                ax.plot(modelled["world_size"], modelled[column], "o--", mfc="none", color=colors[config],
                        label=f"{config} (modelled)")
        # only the efficiency is comparable across hardware; the paper's img/s are GPU numbers
        if "paper_efficiency" in group and group["paper_efficiency"].notna().any():
            axes[1].plot(group["world_size"], group["paper_efficiency"], "x", color=colors[config], ms=8,
                         label=f"{config} (paper, 4x RTX 3090)")
    axes[0].set_ylabel("throughput (items/s)")
    axes[1].set_ylabel("scaling efficiency T_n / (n·T_1)")
    for ax in axes:
        ax.set_xlabel("world size (processes / devices)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
    title = "Data-parallel scaling (Table IV)"
    if "data_source" in table:
        title += " — data: " + "; ".join(sorted(set(table["data_source"].dropna().astype(str))))
    fig.suptitle("\n".join(textwrap.wrap(title, 120)), fontsize=9)
    return fig


# ------------------------------------------------------------------ adaptive k and noise
def noise_trajectory(records: list[dict], task: str, *, configs=None) -> Figure:
    """Adaptive accumulation over training: the chosen k and the pooled gradient-noise scale
    B_simple = tr(Σ)/|G|² (eqs. 6-7) per optimizer step, against samples consumed, one line
    style per seed (a colour per configuration). B_simple is drawn as a line with small filled
    markers where the estimate was significant (|G|² interval above zero) and as hollow markers
    where it was not (k was then held): the line breaks there."""
    chosen = [r for r in _select(records, task, configs) if r.get("steps")]
    fig, axes = _new_figure(ncols=2, width=6.0)
    if not chosen:
        return _empty(fig, axes[0], f"no runs with per-step statistics for task {task!r}")
    colors = _palette(r["config_name"] for r in chosen)
    seeds_seen: dict[str, int] = {}
    weak_said = False
    for r in chosen:
        steps = r["steps"]
        samples = [s["samples_consumed"] for s in steps]
        nth = seeds_seen[r["config_name"]] = seeds_seen.get(r["config_name"], -1) + 1
        style = dict(color=colors[r["config_name"]], ls=("-", "--", ":", "-.")[nth % 4],
                     label=f"{r['config_name']}, seed {r.get('seed')}")
        axes[0].step(samples, [s["k"] for s in steps], where="post", **style)
        significant = [(x, s["b_simple"] if s.get("noise_significant", True) else None)
                       for x, s in zip(samples, steps) if s.get("b_simple")]
        if any(b is not None for _, b in significant):
            # small filled markers too: a significant estimate between two that were not has no line
            axes[1].plot([x for x, _ in significant], [math.nan if b is None else b for _, b in significant],
                         marker="o", markersize=2, **style)
        weak = [(x, s["b_simple"]) for x, s in zip(samples, steps)
                if s.get("b_simple") and s.get("noise_significant") is False]
        if weak:
            axes[1].plot(*zip(*weak), linestyle="none", marker="o", markersize=3, markerfacecolor="none",
                         color=style["color"], label=None if weak_said else "not significant (k held)")
            weak_said = True
    axes[0].set_ylabel("accumulation steps k")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set_ylabel("B_simple (samples, log scale)")
    if axes[1].has_data():
        axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("samples consumed")
        if ax.has_data():
            handles, labels = ax.get_legend_handles_labels()
            order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("not significant"))  # seeds first
            ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8)
    fig.suptitle(figure_title("Adaptive k and gradient-noise scale", chosen), fontsize=9)
    return fig


# ------------------------------------------------------------------ operation categories
def op_category_bars(frame: pd.DataFrame, records: list[dict] | None = None) -> Figure:
    """Self time per item (ms) by operation category, one panel per task, bars per
    configuration (`analysis.profile_operations` rows); the title names the data of
    `records` (runs of the same tasks and profile)."""
    tasks = list(dict.fromkeys(frame["task"])) if len(frame) else []
    fig, axes = _new_figure(ncols=max(len(tasks), 1), width=6.5)
    if not tasks:
        return _empty(fig, axes[0], "no profiler rows")
    configs = list(dict.fromkeys(frame["config"]))
    colors = _palette(configs)
    for ax, task in zip(axes, tasks):
        part = frame[frame["task"] == task]
        categories = list(dict.fromkeys(part["category"]))
        width = 0.8 / len(configs)
        for j, config in enumerate(configs):
            values = part[part["config"] == config].set_index("category")["time_per_item_ms"].reindex(categories)
            ax.bar([i + (j - (len(configs) - 1) / 2) * width for i in range(len(categories))], values,
                   width=width, color=colors[config], label=config)
        ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
        ax.set_ylabel(f"self time per item (ms, {part['clock'].iloc[0]} clock)")
        ax.set_title(task_label(task, records or []), fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(figure_title("Where a training step's time goes (torch.profiler)",
                              [r for r in records or [] if r["task"] in tasks], width=120), fontsize=9)
    return fig


def task_label(task: str, records: list[dict]) -> str:
    """The model of `task` as run (from the records), else the task's model family."""
    models = sorted({r.get("model_name") for r in records if r["task"] == task and r.get("model_name")})
    return "; ".join(models) or {"cifar10": "ResNet task", "wikitext2": "GPT-2 task"}.get(task, task)


# ------------------------------------------------------------------ saving
def save_figure(fig: Figure, out_dir: str | os.PathLike, name: str, *, dpi: int = 120) -> Path:
    """Write `fig` as ``<out_dir>/<name>.png`` and return the path."""
    if not isinstance(name, str) or not name or any(ch in name for ch in "/\\ "):
        _fail("name", name, "a non-empty file stem without slashes or spaces")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight")  # notes written below the axes included
    return path
