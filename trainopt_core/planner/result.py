"""`Plan`: what `plan()` measured and chose -- as a table, in words and in figures -- and the
same measurements chosen again under another budget or weights, without running anything."""
from __future__ import annotations

import textwrap

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..config import OptimizationConfig
from .adaptive import adaptive_config, explain_goodput, goodput_choice, size_text, smallest_k
from .choice import baseline_row, check_weights, choose, measured_part, pareto_front, speedup_interval, tie_margin
from .._errors import fail
from ..measure.stats import product_ratio
from .space import candidate_of, configured, with_expandable_segments


def against_yours(row: dict, yours: dict) -> dict:
    """`row`'s speed over the caller's configuration's (`plan(base=...)`): the ratio of their
    speedups over the fp32 baseline, with a 95 % interval from both speedups' intervals, their
    log half-widths added in quadrature (`product_ratio`). It is not a window-by-window pairing of
    the two: their shared baseline windows correlate them, which usually makes it the wider."""
    inverse = {"mean": 1.0 / yours["speedup"], "n": yours.get("timed_windows") or 0,
               "ci_low": None if yours.get("speedup_ci_high") is None else 1.0 / yours["speedup_ci_high"],
               "ci_high": None if yours.get("speedup_ci_low") is None else 1.0 / yours["speedup_ci_low"]}
    return product_ratio({"mean": row["speedup"], "n": row.get("timed_windows") or 0,
                          "ci_low": row.get("speedup_ci_low"), "ci_high": row.get("speedup_ci_high")}, inverse)


# why a measured candidate was not eligible, by how its rejection starts: the figure's legend
_INELIGIBLE = (("over the budget", "over the memory budget"), ("slower than the fp32 baseline", "slower than the fp32 baseline"),
               ("adaptive accumulation is planned with k", "k below adaptive accumulation's"), ("quality", "its loss"))


def _ineligible_reasons(rejections) -> str:
    """The kinds of reason among `rejections` (rejection texts), in one phrase: "slower than the
    fp32 baseline, over the memory budget"; "" when there are none."""
    kinds = []
    for text in rejections:
        if text:
            kinds.append(next((kind for start, kind in _INELIGIBLE if text.startswith(start)), "failed"))
    return ", ".join(dict.fromkeys(kinds))


@dataclass
class Plan:
    """What `plan()` measured and chose. `config` is the chosen OptimizationConfig; `rows` one dict
    per candidate (measured or pruned): seconds per sample, speedup over the fp32 baseline (paired,
    with its 95 % interval), peak memory, energy per sample where measurable, feasibility and why a
    candidate was rejected. `explain()` says it in words; `pareto_figure()` draws it;
    `rechoose()` applies another budget or weights to the same measurements."""

    config: OptimizationConfig
    chosen: dict
    baseline: dict
    rows: list[dict]
    memory_budget_bytes: float | None
    weights: tuple[float, float, float]
    planning_s: float
    compile_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    energy_source: str | None = None
    goodput: dict | None = None  # with adaptive accumulation: the noise scale and k by goodput
    run_samples: int | None = None  # the run's length, over which a compiled candidate's compile time is spread
    stage_s: dict = field(default_factory=dict)  # planning seconds by stage (where planning time goes)
    base: OptimizationConfig | None = None  # the caller's configuration (plan(base=...)): what `config` keeps
    world_size: int = 1  # processes planned on
    device: str | None = None  # what it was planned on (rechoose() turns expandable segments on as plan() does)

    @property
    def fell_back(self) -> bool:
        """Whether the plan could time nothing but the fp32 baseline and yours (`plan(base=...)`):
        the time budget spent, or every other candidate failing, so that it compared nothing else
        (and kept yours, or the baseline without a base). A reproduction plans again rather than
        reuse such a plan."""
        base = self.baseline.get("candidate")
        return all(row.get("speedup") is None for row in self.rows
                   if row is not self.baseline and row.get("candidate") != base and not row.get("yours"))

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows).set_index("candidate")

    def to_dict(self) -> dict:
        """JSON-ready: what a run record stores."""
        return {"config": self.config.to_dict(), "chosen": self.chosen["candidate"],
                "memory_budget_bytes": self.memory_budget_bytes, "weights": list(self.weights),
                "planning_s": self.planning_s, "compile_s": self.compile_s, "notes": list(self.notes),
                "energy_source": self.energy_source, "rows": [dict(row) for row in self.rows],
                "goodput": self.goodput, "run_samples": self.run_samples, "stage_s": dict(self.stage_s),
                "world_size": self.world_size, "device": self.device, "fell_back": self.fell_back}

    @classmethod
    def from_dict(cls, values: dict) -> "Plan":
        rows = [dict(row) for row in values["rows"]]
        chosen = next(row for row in rows if row["candidate"] == values["chosen"])
        baseline = baseline_row(rows)
        return cls(config=OptimizationConfig.from_dict(values["config"]), chosen=chosen, baseline=baseline, rows=rows,
                   memory_budget_bytes=values["memory_budget_bytes"], weights=tuple(values["weights"]),
                   planning_s=values["planning_s"], compile_s=values.get("compile_s", 0.0),
                   notes=list(values.get("notes", [])), energy_source=values.get("energy_source"),
                   goodput=values.get("goodput"), run_samples=values.get("run_samples"),
                   stage_s=dict(values.get("stage_s") or {}), world_size=values.get("world_size", 1),
                   device=values.get("device"))

    def split_for(self, batch_size: int, accumulation_steps: int = 1) -> tuple[int, int]:
        """(micro_batch_size, k): the plan's split applied to a script that trains on micro-batches
        of `batch_size` samples, `accumulation_steps` of them per optimizer step -- the effective
        batch plan() was given, now split as the plan chose (k from `config`: the starting k when
        k adapts, whose micro-batches are the effective batch over k_min). Assign them to the
        training loop's own names; an evaluation batch that reads the script's `batch_size` is
        left as it was:

            micro_batch_size, k = result.split_for(batch_size, gradient_accumulation_steps)"""
        for name, value in (("batch_size", batch_size), ("accumulation_steps", accumulation_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                fail(name, value, "an integer >= 1")
        effective, splits = batch_size * accumulation_steps, self.config.batch_splits
        if effective % splits:
            fail("batch_size", batch_size, f"one whose effective batch ({batch_size} x {accumulation_steps}) the "
                 f"plan's {splits} micro-batches divide: the batch given to plan() (its first dimension)")
        return effective // splits, self.config.k

    def rechoose(self, *, memory_budget_bytes: float | None = None, weights: Sequence[float] | None = None) -> "Plan":
        """The same measurements chosen again under another budget and/or weights (nothing is
        run). Candidates this plan did not measure stay unmeasured: with a tighter budget,
        checkpointing may only have been measured where this plan's budget called for it, and
        the returned plan says so; `plan()` again measures them."""
        weights = self.weights if weights is None else check_weights(weights)
        if memory_budget_bytes is not None and not memory_budget_bytes > 0:
            fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0")
        rows = [measured_part(row) for row in self.rows]
        min_k = smallest_k(bool(self.goodput), self.goodput.get("world_size", 1) if self.goodput else 1)
        notes = choose(rows, memory_budget_bytes, weights, min_k=min_k, run_samples=self.run_samples,
                       margin=tie_margin(self.device))
        if not any(row["checkpointing"] is not None and row["peak_memory_bytes"] is not None for row in rows):
            notes.append("Checkpointing was not measured in the plan this one re-chooses from; plan() again "
                         "with this budget to measure it.")
        chosen = next(row for row in rows if row.get("chosen"))
        baseline = baseline_row(rows)
        config, good = configured(candidate_of(chosen), self.base, self.world_size), None
        if self.goodput:
            # the same noise scale and optimizer-step time; a micro-batch's time from the newly
            # chosen candidate's timed seconds per sample when it is not the one measured
            micro_s = self.goodput["micro_s"] if chosen["candidate"] == self.chosen["candidate"] else None
            good = goodput_choice(chosen, self.goodput["noise_scale"], optimizer_s=self.goodput["optimizer_s"],
                                  micro_s=micro_s, batch_size=self.goodput["batch_size"], k_max=self.goodput["k_max"],
                                  world_size=self.goodput.get("world_size", 1))
            config = adaptive_config(config, good)
        if self.device is not None:
            config = with_expandable_segments(config, torch.device(self.device), memory_budget_bytes, notes)
        return Plan(config=config, chosen=chosen, baseline=baseline, rows=rows,
                    memory_budget_bytes=memory_budget_bytes, weights=weights, planning_s=self.planning_s,
                    compile_s=self.compile_s, notes=notes, energy_source=self.energy_source, goodput=good,
                    run_samples=self.run_samples, stage_s=dict(self.stage_s), base=self.base,
                    world_size=self.world_size, device=self.device)

    def explain(self) -> str:
        base, best = self.baseline, self.chosen
        budget = "no memory budget" if self.memory_budget_bytes is None else \
            f"a memory budget of {self.memory_budget_bytes / 2**20:.1f} MiB"
        yours = " (yours)" if best.get("yours") else ""
        lines = [f"Chose {best['candidate']}{yours} under {budget}, by eq. 3 with weights (time, memory, energy) = "
                 f"{tuple(round(w, 3) for w in self.weights)}:",
                 f"  {best['speedup']:.2f}x the fp32 baseline's samples/s "
                 f"(95 % interval {speedup_interval(best)}), peak memory {best['peak_memory_bytes'] / 2**20:.1f} MiB "
                 f"vs {base['peak_memory_bytes'] / 2**20:.1f} MiB.",
                 f"  Energy: {self.energy_source or 'not measured'}."]
        own = next((row for row in self.rows if row.get("yours")), None)
        if own is not None and own is not best and own.get("speedup") and best.get("speedup"):
            versus = against_yours(best, own)
            interval = "" if versus["ci_low"] is None else \
                f" (95 % interval {versus['ci_low']:.2f}-{versus['ci_high']:.2f}, the two speedups' intervals combined)"
            lines.append(f"  Against your configuration ({own['candidate']}, {own['speedup']:.2f}x the fp32 baseline): "
                         f"{versus['mean']:.2f}x its samples/s{interval}, peak memory "
                         f"{own['peak_memory_bytes'] / 2**20:.1f} MiB.")
        for row in self.rows:
            if row["candidate"] != best["candidate"] and row["rejected_because"]:
                lines.append(f"  {row['candidate']}{' (yours)' if row.get('yours') else ''}: {row['rejected_because']}")
        lines += [f"  {note}" for note in self.notes]
        if self.goodput:
            lines += ["  " + line for line in explain_goodput(self.goodput)]
        lines.append(f"Planning took {self.planning_s:.1f} s" +
                     (f", of which compiling {self.compile_s:.1f} s" if self.compile_s else "") +
                     (" (" + ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in self.stage_s.items()) + ")"
                      if self.stage_s else "") + ".")
        return "\n".join(lines)

    def pareto_figure(self, ax=None, *, data: str | None = None):
        """Seconds per sample (relative to the fp32 baseline, 1/speedup) against peak memory for
        every measured candidate: the Pareto front joined, the chosen one ringed, those over the
        memory budget or otherwise not eligible grey, checkpointed ones square (the legend names only what is drawn), the
        budget as a line. `data` (e.g. the runs' data source) goes into the title. Returns the
        matplotlib Figure."""
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4.5))
        measured = [r for r in self.rows if r.get("speedup") and r["peak_memory_bytes"] is not None]
        for row in measured:
            x, y = row["peak_memory_bytes"] / 2**20, 1.0 / row["speedup"]
            ax.scatter(x, y, color="tab:blue" if row["feasible"] else "0.7", zorder=3,
                       marker="s" if row["checkpointing"] is not None else "o")
        front = pareto_front(measured)
        ax.plot([r["peak_memory_bytes"] / 2**20 for r in front], [1.0 / r["speedup"] for r in front],
                color="tab:blue", lw=1, label="Pareto front (time, memory)")
        best = self.chosen
        ax.scatter(best["peak_memory_bytes"] / 2**20, 1.0 / best["speedup"], s=200, facecolors="none",
                   edgecolors="tab:red", lw=2, zorder=4, label=f"chosen: {best['candidate']}")
        base = self.baseline
        ax.annotate("fp32 baseline", (base["peak_memory_bytes"] / 2**20, 1.0), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
        if self.memory_budget_bytes is not None:
            ax.axvline(self.memory_budget_bytes / 2**20, color="tab:red", ls="--", lw=1, label="memory budget")
        handles, _ = ax.get_legend_handles_labels()
        marker = dict(ls="none", markersize=6)
        budget = "" if self.memory_budget_bytes is None else ", within the memory budget"
        handles.append(Line2D([], [], marker="o", color="tab:blue", label=f"eligible candidate{budget}", **marker))
        reasons = _ineligible_reasons(r["rejected_because"] for r in measured if not r["feasible"])
        if reasons:
            handles.append(Line2D([], [], marker="o", color="0.7", **marker,
                                  label=f"not eligible: {reasons} (see the table)"))
        if any(r["checkpointing"] is not None for r in measured):
            handles.append(Line2D([], [], marker="s", color="tab:blue", label="with checkpointing", **marker))
        ax.set_xlabel("peak memory of a training step (MiB)")
        ax.set_ylabel("seconds per sample / fp32 baseline's")
        title = "Candidates measured by plan()" + (f" — data: {data}" if data else "")
        ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)
        ax.legend(handles=handles, fontsize=8)
        return ax.figure

    def goodput_figure(self, ax=None):
        """With adaptive accumulation: goodput, samples/s and statistical efficiency against k,
        each relative to k_min's, with the goodput at the two ends of the noise scale's 95 %
        interval as a band and the chosen k marked. Returns the matplotlib Figure."""
        import matplotlib.pyplot as plt

        if not self.goodput:
            raise ValueError("goodput_figure() needs a plan made with adaptive_accumulation=True")
        good = self.goodput
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4.5))
        ks = [row["k"] for row in good["rows"]]
        first = good["rows"][0]
        ax.plot(ks, [row["samples_per_s"] / first["samples_per_s"] for row in good["rows"]], "--", color="0.4",
                label="samples/s (step-time model)")
        ax.plot(ks, [row["statistical_efficiency"] for row in good["rows"]], ":", color="0.4",
                label="statistical efficiency")
        ax.plot(ks, [row["relative_goodput"] for row in good["rows"]], "o-", color="tab:blue", label="goodput")
        noise = good["noise_scale"]
        ends = [goodput_choice({"k": good["k_min"], "candidate": good["measured_on"]},
                               dict(noise, b_simple=value), optimizer_s=good["optimizer_s"], micro_s=good["micro_s"],
                               batch_size=good["batch_size"], k_max=good["k_max"],
                               world_size=good.get("world_size", 1))["rows"]
                for value in (noise["ci_low"], noise["ci_high"])]
        low, high = ([min(a["relative_goodput"], b["relative_goodput"]) for a, b in zip(*ends)],
                     [max(a["relative_goodput"], b["relative_goodput"]) for a, b in zip(*ends)])
        ax.fill_between(ks, low, high, color="tab:blue", alpha=0.15,
                        label=f"goodput over B_simple's 95 % interval ({size_text(noise['ci_low'])}-{size_text(noise['ci_high'])})")
        chosen = next(row for row in good["rows"] if row["k"] == good["k"])
        ax.scatter([good["k"]], [chosen["relative_goodput"]], s=200, facecolors="none", edgecolors="tab:red", lw=2,
                   zorder=4, label=f"chosen: k = {good['k']}")
        ax.set_xlabel(f"k (micro-batches of {good['micro_batch_size']:.3g} per optimizer step)")
        ax.set_ylabel(f"relative to k = {good['k_min']}")
        ax.set_title(f"Goodput by k (B_simple {size_text(noise['b_simple'])} at the initial weights)", fontsize=10)
        ax.legend(fontsize=8)
        return ax.figure
