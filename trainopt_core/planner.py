"""Choose the configuration by measured cost on this machine: eq. 3 under a memory budget.

The paper's fixed recipe is not the fastest everywhere (on a CPU √L checkpointing recomputes
far more than the 0.12 of a step it assumes), and the paper names the fix: adaptive policies
that disable an optimization when its overhead exceeds its benefit. `plan()` does that by
measurement, on the user's model, batch and device, in three stages, each timed in interleaved
windows together with the fp32 baseline (so every speedup is a paired ratio to the baseline
measured in the same windows):

1. Precision × split: fp32, plus bf16 where the device computes it natively, plus fp16 on
   CUDA; × splits of the effective batch into k micro-batches.
2. Memory (only when it counts: a budget, or w2 > 0): activation checkpointing -- ⌈√L⌉ segments,
   every block its own segment, and every block with the selective policy (matmul outputs kept,
   cheap ops recomputed) -- on the stage-1 candidates it could help: those over the budget, or
   with w2 > 0 those on the time-memory Pareto front. Checkpointing only adds recompute, so a
   candidate that already fits is not checkpointed.
3. Speed options on the best so far: the optimizer's fused kernels (foreach where it has none), channels-last
   weights for CNNs, torch.compile where it is tried; then the options that helped, together.
4. With adaptive accumulation only (`adaptive_accumulation=True`): k sets the effective batch
   k·b of the chosen micro-batch b, so it is chosen by goodput -- samples/s × statistical
   efficiency, the efficiency from the gradient noise scale B_simple of the batch (measured with
   its 95 % interval, `accumulation.probe_noise_scale`), the samples/s from the chosen
   candidate's timed micro-batch and optimizer-step seconds.

Before a candidate is timed, the memory model (eq. 8: activations scale with the micro-batch;
eq. 19: checkpointing keeps a fraction of them), calibrated on one tracked fp32 step, prunes it
when its prediction exceeds the budget by more than `PRUNE_MARGIN`. Each measured candidate gets
one tracked step (peak memory; an out-of-memory error makes it infeasible, caught in-process)
and a quality check (its probe-batch loss is finite and equal to fp32's within the precision's
tolerance; computed in eval mode, where dropout and BatchNorm's micro-batch statistics do not
move it). Eq. 3 (C = w1·T + w2·M + w3·E, each over the baseline's) chooses among candidates within the
budget, never one slower than the fp32 baseline unless the budget rules the baseline out (the
plan then says so). Given the run's length (`run_samples`), T is the run's: a compiled
candidate's compiling step is spread over the run's samples, so compiling is chosen only where
the run earns it back.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .accumulation import goodput, probe_noise_scale
from .checkpointing import block_sequence, expected_saved_fraction, has_block_sequence, resolve_segments
from .compose import prepare
from .config import OptimizationConfig
from .measure.costs import cost
from .measure.energy import EnergyMeter
from .measure.manifest import cpu_computes_bf16_natively
from .measure.memory import MemoryTracker
from .measure.stats import paired_ratio, summarize
from .measure.timing import Timer, interleaved_windows

PRUNE_MARGIN = 1.25       # a prediction this far over the budget is not worth measuring
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}  # |loss - fp32 loss| / |fp32 loss| on the probe batch
MAX_CHECKPOINTED = 6      # checkpointed candidates measured at most (the fastest twins first)
# why try_compile defaults to off on a CPU (the quick GPT-2, fp32, one process; interleaved windows)
COMPILE_ON_CPU = ("on 2-core CPUs compiling the quick GPT-2's step took 40-53 s from a cold cache, against a 35-45 s "
                  "training run, and the compiled step was not faster on an AVX-512 machine; on an AVX2 one it was "
                  "1.06-1.08x the eager step at k=1 and 1.00x [0.98, 1.04] at the fused k=2 that plans choose there")


def _fail(argument: str, value, allowed: str) -> None:
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


def native_reduced_precisions(device: torch.device) -> tuple[str, ...]:
    """The reduced precisions `device` computes natively: CUDA fp16 always, bf16 where the GPU
    supports it; a CPU bf16 where it has AVX-512 BF16 or AMX (else bf16 autocast is emulated and
    slow, and fp16 on a CPU is always slow)."""
    if device.type == "cuda":
        return ("bf16", "fp16") if torch.cuda.is_bf16_supported() else ("fp16",)
    if device.type == "cpu":
        return ("bf16",) if cpu_computes_bf16_natively() else ()
    return ()


@dataclass(frozen=True)
class Candidate:
    """One point of the search space; `config()` is the OptimizationConfig that runs it."""

    precision: str = "fp32"
    k: int = 1
    checkpointing: int | None = None
    checkpoint_policy: str = "full"
    optimizer_impl: str = "default"
    memory_format: str = "contiguous"
    compile: bool = False

    @property
    def name(self) -> str:
        parts = [self.precision, f"k={self.k}"]
        if self.checkpointing is not None:
            parts.append(f"checkpointing {self.checkpointing} segments" + (
                f" {self.checkpoint_policy}" if self.checkpoint_policy != "full" else ""))
        if self.optimizer_impl != "default":
            parts.append(f"{self.optimizer_impl} optimizer")
        if self.memory_format != "contiguous":
            parts.append(self.memory_format)
        if self.compile:
            parts.append("compiled")
        return ", ".join(parts)

    def replace(self, **changes) -> "Candidate":
        return dataclasses.replace(self, **changes)

    def config(self) -> OptimizationConfig:
        return OptimizationConfig(name="auto", **dataclasses.asdict(self))


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

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows).set_index("candidate")

    def to_dict(self) -> dict:
        """JSON-ready: what a run record stores."""
        return {"config": self.config.computation_fields(), "chosen": self.chosen["candidate"],
                "memory_budget_bytes": self.memory_budget_bytes, "weights": list(self.weights),
                "planning_s": self.planning_s, "compile_s": self.compile_s, "notes": list(self.notes),
                "energy_source": self.energy_source, "rows": [dict(row) for row in self.rows],
                "goodput": self.goodput, "run_samples": self.run_samples}

    @classmethod
    def from_dict(cls, values: dict) -> "Plan":
        rows = [dict(row) for row in values["rows"]]
        chosen = next(row for row in rows if row["candidate"] == values["chosen"])
        baseline = _baseline_row(rows)
        return cls(config=OptimizationConfig.from_dict(values["config"]), chosen=chosen, baseline=baseline, rows=rows,
                   memory_budget_bytes=values["memory_budget_bytes"], weights=tuple(values["weights"]),
                   planning_s=values["planning_s"], compile_s=values.get("compile_s", 0.0),
                   notes=list(values.get("notes", [])), energy_source=values.get("energy_source"),
                   goodput=values.get("goodput"), run_samples=values.get("run_samples"))

    def rechoose(self, *, memory_budget_bytes: float | None = None, weights: Sequence[float] | None = None) -> "Plan":
        """The same measurements chosen again under another budget and/or weights (nothing is
        run). Candidates this plan did not measure stay unmeasured: with a tighter budget,
        checkpointing may only have been measured where this plan's budget called for it, and
        the returned plan says so; `plan()` again measures them."""
        weights = self.weights if weights is None else _check_weights(weights)
        if memory_budget_bytes is not None and not memory_budget_bytes > 0:
            _fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0")
        rows = [_measured_part(row) for row in self.rows]
        notes = _choose(rows, memory_budget_bytes, weights, min_k=2 if self.goodput else 1, run_samples=self.run_samples)
        if not any(row["checkpointing"] is not None and row["peak_memory_bytes"] is not None for row in rows):
            notes.append("Checkpointing was not measured in the plan this one re-chooses from; plan() again "
                         "with this budget to measure it.")
        chosen = next(row for row in rows if row.get("chosen"))
        baseline = _baseline_row(rows)
        config, good = _candidate_of(chosen).config(), None
        if self.goodput:
            # the same noise scale and optimizer-step time; a micro-batch's time from the newly
            # chosen candidate's timed seconds per sample when it is not the one measured
            micro_s = self.goodput["micro_s"] if chosen["candidate"] == self.chosen["candidate"] else None
            good = _goodput_choice(chosen, self.goodput["noise_scale"], optimizer_s=self.goodput["optimizer_s"],
                                   micro_s=micro_s, batch_size=self.goodput["batch_size"], k_max=self.goodput["k_max"])
            config = _adaptive_config(config, good)
        return Plan(config=config, chosen=chosen, baseline=baseline, rows=rows,
                    memory_budget_bytes=memory_budget_bytes, weights=weights, planning_s=self.planning_s,
                    compile_s=self.compile_s, notes=notes, energy_source=self.energy_source, goodput=good,
                    run_samples=self.run_samples)

    def explain(self) -> str:
        base, best = self.baseline, self.chosen
        budget = "no memory budget" if self.memory_budget_bytes is None else \
            f"a memory budget of {self.memory_budget_bytes / 2**20:.1f} MiB"
        lines = [f"Chose {best['candidate']} under {budget}, by eq. 3 with weights (time, memory, energy) = "
                 f"{tuple(round(w, 3) for w in self.weights)}:",
                 f"  {best['speedup']:.2f}x the fp32 baseline's samples/s "
                 f"(95 % interval {_interval(best)}), peak memory {best['peak_memory_bytes'] / 2**20:.1f} MiB "
                 f"vs {base['peak_memory_bytes'] / 2**20:.1f} MiB.",
                 f"  Energy: {self.energy_source or 'not measured'}."]
        for row in self.rows:
            if row["candidate"] != best["candidate"] and row["rejected_because"]:
                lines.append(f"  {row['candidate']}: {row['rejected_because']}")
        lines += [f"  {note}" for note in self.notes]
        if self.goodput:
            lines += ["  " + line for line in _explain_goodput(self.goodput)]
        lines.append(f"Planning took {self.planning_s:.1f} s" +
                     (f", of which compiling {self.compile_s:.1f} s." if self.compile_s else "."))
        return "\n".join(lines)

    def pareto_figure(self, ax=None):
        """Seconds per sample (relative to the fp32 baseline, 1/speedup) against peak memory for
        every measured candidate: the Pareto front joined, the chosen one ringed, infeasible ones
        grey, the budget as a line. Returns the matplotlib Figure."""
        import matplotlib.pyplot as plt

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
        ax.set_xlabel("peak memory of a training step (MiB)")
        ax.set_ylabel("seconds per sample / fp32 baseline's")
        ax.set_title("Candidates measured by plan() (squares: checkpointing; grey: rejected)", fontsize=10)
        ax.legend(fontsize=8)
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
        ends = [_goodput_choice({"k": good["k_min"], "candidate": good["measured_on"]},
                                dict(noise, b_simple=value), optimizer_s=good["optimizer_s"], micro_s=good["micro_s"],
                                batch_size=good["batch_size"], k_max=good["k_max"])["rows"]
                for value in (noise["ci_low"], noise["ci_high"])]
        low, high = ([min(a["relative_goodput"], b["relative_goodput"]) for a, b in zip(*ends)],
                     [max(a["relative_goodput"], b["relative_goodput"]) for a, b in zip(*ends)])
        ax.fill_between(ks, low, high, color="tab:blue", alpha=0.15,
                        label=f"goodput over B_simple's 95 % interval ({_size(noise['ci_low'])}-{_size(noise['ci_high'])})")
        chosen = next(row for row in good["rows"] if row["k"] == good["k"])
        ax.scatter([good["k"]], [chosen["relative_goodput"]], s=200, facecolors="none", edgecolors="tab:red", lw=2,
                   zorder=4, label=f"chosen: k = {good['k']}")
        ax.set_xlabel(f"k (micro-batches of {good['micro_batch_size']:.3g} per optimizer step)")
        ax.set_ylabel(f"relative to k = {good['k_min']}")
        ax.set_title(f"Goodput by k (B_simple {_size(noise['b_simple'])} at the initial weights)", fontsize=10)
        ax.legend(fontsize=8)
        return ax.figure


def pareto_front(rows: Sequence[dict]) -> list[dict]:
    """The rows no other row beats on both time (higher speedup) and peak memory, by memory."""
    ordered = sorted(rows, key=lambda r: (r["peak_memory_bytes"], -r["speedup"]))
    front, best_speedup = [], -math.inf
    for row in ordered:
        if row["speedup"] > best_speedup:
            front.append(row)
            best_speedup = row["speedup"]
    return front


def _interval(row: dict) -> str:
    low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    return "n/a" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _check_weights(weights: Sequence[float]) -> tuple[float, float, float]:
    weights = tuple(weights)
    if len(weights) != 3 or not all(isinstance(w, (int, float)) and w >= 0 and math.isfinite(w) for w in weights) \
            or weights[0] + weights[1] <= 0:
        _fail("weights", weights, "three finite numbers >= 0 (time, memory, energy) with time + memory > 0")
    return tuple(float(w) for w in weights)


def _micro_batches(batch: Sequence[torch.Tensor], k: int) -> list[tuple[torch.Tensor, ...]]:
    return list(zip(*(tensor.chunk(k) for tensor in batch)))


class _Trial:
    """One candidate on its own copy of the model and optimizer, stepping the probe batch."""

    def __init__(self, candidate: Candidate, model, optimizer_factory, batch, loss_fn, device, loss_takes_model=False):
        self.candidate = candidate
        self.loss_takes_model = loss_takes_model
        self.model = copy.deepcopy(model)
        self.optimizer = optimizer_factory(self.model.parameters())
        self.size = len(batch[0])
        self.micro = _micro_batches(batch, candidate.k)
        self.loss_fn = loss_fn
        self.engine = prepare(self.model, self.optimizer, candidate.config(), micro_batch_size=self.size // candidate.k,
                              device=device)
        self.first_loss = self._probe_loss()

    def _loss(self, micro) -> tuple[torch.Tensor, float]:
        with self.engine.autocast():
            if self.loss_takes_model:
                out = self.loss_fn(self.model, *micro)
            else:
                *inputs, target = micro
                out = self.loss_fn(self.model(*inputs), target)
        return out if isinstance(out, tuple) else (out, len(micro[-1]))

    def _probe_loss(self) -> float:
        """The probe batch's mean loss at the initial weights (the same for every candidate), in
        this candidate's precision and micro-batches, micro-batches weighted by their items. In
        eval mode: dropout masks and BatchNorm's per-micro-batch statistics would make it differ
        between candidates for reasons that are not numerical."""
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                parts = [self._loss(micro) for micro in self.micro]
        finally:
            self.model.train(training)
        return sum(float(loss) * float(items) for loss, items in parts) / sum(float(items) for _, items in parts)

    def _backward(self, micro) -> None:
        loss, items = self._loss(micro)
        self.engine.backward(loss, num_items=items)

    def step(self) -> float:
        """One optimizer step over the whole probe batch; returns the samples it processed."""
        for micro in self.micro:
            self._backward(micro)
            self.engine.step()
        return float(self.size)

    def split_step(self, device) -> tuple[float, float]:
        """One optimizer step, timed in two parts: (seconds of its k micro-batches, seconds of
        the boundary -- unscale, clip, optimizer update, zero_grad)."""
        with Timer(device) as whole:
            for micro in self.micro[:-1]:
                self._backward(micro)
                self.engine.step()  # not a boundary: returns at once
            self._backward(self.micro[-1])
            with Timer(device) as boundary:
                self.engine.step()
        return whole.elapsed_s - boundary.elapsed_s, boundary.elapsed_s


class _Search:
    """The measurements one `plan()` call makes: trials, rows, the memory model."""

    def __init__(self, model, optimizer_factory, batch, loss_fn, device, budget, windows, steps_per_window, progress,
                 loss_takes_model, run_samples=None):
        self.model, self.optimizer_factory, self.batch, self.loss_fn = model, optimizer_factory, batch, loss_fn
        self.loss_takes_model = loss_takes_model
        self.device, self.budget = device, budget
        self.windows, self.steps_per_window = windows, steps_per_window
        self.run_samples = run_samples
        self.size = len(batch[0])
        self.num_blocks = len(block_sequence(model)) if has_block_sequence(model) else None
        self.rows: dict[Candidate, dict] = {}
        self.trials: dict[Candidate, _Trial] = {}
        # every timing window of a candidate, each with the baseline's window of the same round
        self.windows_timed: dict[Candidate, tuple[list[float], list[float]]] = {}
        self.calibration = None
        self.compile_s = 0.0
        self.progress = progress
        probe = EnergyMeter(device).start()
        probe.stop()
        self.energy_source = probe.energy_source if probe.energy_j is not None else None
        self.energy_unavailable = None if self.energy_source else probe.energy_source

    def _say(self, message: str) -> None:
        if self.progress:
            print(f"[plan] {message}", flush=True)

    def measure_memory(self, candidates: Sequence[Candidate], limit: int | None = None) -> list[Candidate]:
        """Builds each new candidate (unless the memory model prunes it), runs a warm-up step and
        a tracked step, until `limit` have run; returns those that ran."""
        ran = []
        for candidate in candidates:
            if limit is not None and len(ran) >= limit:
                break
            if candidate in self.rows:
                if candidate in self.trials:
                    ran.append(candidate)
                continue
            row = self.rows[candidate] = {
                "candidate": candidate.name, **dataclasses.asdict(candidate), "predicted_memory_bytes": None,
                "peak_memory_bytes": None, "loss_rel_diff": None, "seconds_per_sample": None, "speedup": None,
                "speedup_ci_low": None, "speedup_ci_high": None, "timed_windows": 0, "energy_j_per_sample": None,
                "compile_s": None, "speedup_over_run": None, "feasible": False, "cost": None, "cost_ci_low": None,
                "cost_ci_high": None, "rejected_because": None}
            if self.calibration is not None:
                row["predicted_memory_bytes"] = predicted = _predict(self.calibration, candidate, self.size)
                if self.budget is not None and predicted > PRUNE_MARGIN * self.budget:
                    row["rejected_because"] = (f"pruned: eqs. 8/19 predict {predicted / 2**20:.1f} MiB, over "
                                               f"{PRUNE_MARGIN}x the budget")
                    continue
            self._say(f"memory: {candidate.name}")
            others_bytes = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
            try:
                trial = _Trial(candidate, self.model, self.optimizer_factory, self.batch, self.loss_fn, self.device,
                               self.loss_takes_model)
                started = time.perf_counter()
                trial.step()  # warm-up: optimizer state allocated, kernels chosen (compiled)
                if candidate.compile:  # the compiling step, whole: compilation plus one step
                    row["compile_s"] = time.perf_counter() - started
                    self.compile_s += row["compile_s"]
                with MemoryTracker(trial.model, trial.optimizer, self.device) as tracker:
                    trial.step()
            except (torch.OutOfMemoryError, RuntimeError) as error:
                if not _is_out_of_memory(error):
                    raise
                row["rejected_because"] = f"out of memory: {str(error).splitlines()[0][:120]}"
                trial = None
                _release(self.device)
                continue
            row["peak_memory_bytes"] = tracker.peak_bytes - others_bytes
            if candidate == Candidate():
                self.calibration = _calibrate(tracker, self.size, self.num_blocks)
                row["predicted_memory_bytes"] = _predict(self.calibration, candidate, self.size)
            self.trials[candidate] = trial
            ran.append(candidate)
        base_loss = self.trials[Candidate()].first_loss
        for candidate in ran:
            row, loss = self.rows[candidate], self.trials[candidate].first_loss
            row["loss_rel_diff"] = diff = abs(loss - base_loss) / max(abs(base_loss), 1e-12)
            if not math.isfinite(loss) or diff > LOSS_TOLERANCE[candidate.precision]:
                row["rejected_because"] = (f"quality: the probe batch's loss differs from fp32's by {diff:.2e} "
                                           f"(allowed {LOSS_TOLERANCE[candidate.precision]:.0e})")
        return ran

    def time(self, candidates: Sequence[Candidate]) -> None:
        """Times `candidates` (and the baseline) in interleaved windows; each row gets seconds
        per sample and its speedup over the baseline paired window by window, and energy per
        sample where a counter is readable (once per candidate). A candidate timed in several
        rounds keeps the windows of all of them (`timed_windows` counts them): a later round
        adds to its evidence instead of replacing it."""
        baseline = Candidate()
        names = [baseline] + [c for c in dict.fromkeys(candidates) if c != baseline and c in self.trials]
        self._say(f"timing {len(names)} candidates in {self.windows} interleaved windows")
        rates = interleaved_windows({c.name: self.trials[c].step for c in names}, windows=self.windows,
                                    steps_per_window=self.steps_per_window, warmup_steps=0, device=self.device)
        for candidate in names:
            own, paired_baseline = self.windows_timed.setdefault(candidate, ([], []))
            own += rates[candidate.name]
            paired_baseline += rates[baseline.name]
            row = self.rows[candidate]
            row.update(seconds_per_sample=summarize([1.0 / r for r in own])["median"], timed_windows=len(own))
            if candidate == baseline:
                row.update(speedup=1.0, speedup_ci_low=1.0, speedup_ci_high=1.0)
            else:
                ratio = paired_ratio(own, paired_baseline)
                row.update(speedup=ratio["median"], speedup_ci_low=ratio["ci_low"], speedup_ci_high=ratio["ci_high"])
            if self.energy_source is not None and row["energy_j_per_sample"] is None:
                with EnergyMeter(self.device) as meter:
                    samples = sum(self.trials[candidate].step() for _ in range(self.steps_per_window))
                row["energy_j_per_sample"] = None if meter.energy_j is None else meter.energy_j / samples


def plan(model: torch.nn.Module, optimizer_factory: Callable, batch: Sequence[torch.Tensor],
         loss_fn: Callable, *, loss_takes_model: bool = False, device: torch.device | str | None = None,
         memory_budget_bytes: float | None = None, weights: Sequence[float] = (1.0, 0.0, 0.0),
         ks: Sequence[int] | None = None, speed_options: bool = True, try_compile: bool | None = None,
         adaptive_accumulation: bool = False, k_max: int = 8, run_samples: int | None = None,
         windows: int = 3, steps_per_window: int = 2, progress: bool = False) -> Plan:
    """Measure candidate configurations on `batch` and choose one (module docstring).

    `model` is left untouched (each candidate runs on a copy). `optimizer_factory(parameters)`
    builds the optimizer. `batch` is (inputs..., targets), its first dimension the effective batch
    size; `loss_fn(model_output, targets)` returns the mean loss -- or, with `loss_takes_model`,
    `loss_fn(model, *micro_batch)` runs the model itself and returns the mean loss or (mean loss,
    items it averages) (a Hugging Face model called with labels, say). `memory_budget_bytes`: peak
    memory of a training step allowed (None: no budget). `weights`: eq. 3's (w1, w2, w3) on
    time per sample, peak memory and energy per sample, each relative to the fp32 baseline (the
    energy term is dropped, and said, where no counter is readable). `ks`: the micro-batch splits
    to try (default the powers of two up to 8 that divide the batch). `speed_options`: also try
    the optimizer's foreach/fused kernels, channels-last (models with convolutions) and, where
    `try_compile` (default: on CUDA only -- `COMPILE_ON_CPU` says what it did on 2-core CPUs),
    torch.compile; its compile time is reported apart (`Plan.compile_s`, and each compiled row's
    `compile_s`: its first, compiling step). `run_samples`: how many samples the run will train on
    (None: unknown). Given, a compiled candidate is judged over the run -- eq. 3's T then counts
    its compile seconds spread over those samples (`speedup_over_run`) -- so compiling is chosen
    only where the run is long enough to earn it back.
    `adaptive_accumulation`: the plan is for variance-aware accumulation (`OptimizationConfig`
    with adaptive=True), where k sets the effective batch k·b of a fixed micro-batch b, so k is
    chosen by goodput -- samples/s × statistical efficiency -- not by samples/s alone. The
    splits tried are then those with k >= 2 (eq. 7 needs two micro-batches per step on one
    process); the chosen split gives b = batch/k and k_min = k (the effective batch never falls
    below `batch`); the gradient noise scale B_simple of `batch` at the initial weights
    (`accumulation.probe_noise_scale`, with its 95 % interval) and the chosen candidate's timed
    micro-batch and optimizer-step seconds give the goodput of each k in [k_min, `k_max`]; the
    best is the starting k (`Plan.goodput` has the table and k at the interval's two ends).
    `windows` × `steps_per_window` steps time each candidate; `progress` prints each stage.
    """
    started = time.perf_counter()
    if not batch or len(batch) < (1 if loss_takes_model else 2) or not all(isinstance(t, torch.Tensor) for t in batch):
        _fail("batch", type(batch).__name__, "a sequence (inputs..., targets) of tensors (with loss_takes_model, "
              "of at least one tensor)")
    size = len(batch[0])
    if any(len(t) != size for t in batch):
        _fail("batch", [tuple(t.shape) for t in batch], "tensors with the same first dimension (the batch size)")
    if memory_budget_bytes is not None and not memory_budget_bytes > 0:
        _fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0")
    weights = _check_weights(weights)
    if run_samples is not None and (not isinstance(run_samples, int) or isinstance(run_samples, bool) or run_samples < 1):
        _fail("run_samples", run_samples, "None (the run's length unknown) or an integer >= 1 (samples the run trains on)")
    for argument, value in (("windows", windows), ("steps_per_window", steps_per_window)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(argument, value, "an integer >= 1")
    min_k = 2 if adaptive_accumulation else 1
    if adaptive_accumulation and (not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 2):
        _fail("k_max", k_max, "an integer >= 2 (the largest k adaptive accumulation may reach)")
    if adaptive_accumulation and size < 6:
        _fail("batch", f"a batch of {size}", "with adaptive_accumulation, a batch of >= 6 samples (>= 3 micro-batches "
              "for the noise scale's interval, split into >= 2)")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if try_compile is None:
        try_compile = device.type == "cuda"
    search = _Search(model, optimizer_factory, batch, loss_fn, device, memory_budget_bytes, windows, steps_per_window,
                     progress, loss_takes_model, run_samples)
    notes = []
    if search.energy_source is None and weights[2] > 0:
        notes.append(f"Energy weight {weights[2]} not used: {search.energy_unavailable}.")

    # 1. precision × split
    stage1 = _candidates(size, device, ks, min_k=min_k)
    first = search.measure_memory(stage1)
    search.time(first)
    best = _best(search, weights=weights, min_k=min_k)

    # 2. checkpointing, where memory counts
    if search.num_blocks and (memory_budget_bytes is not None or weights[1] > 0):
        rows = search.rows

        def over_budget(c: Candidate) -> bool:  # measured over it, or pruned / out of memory
            row = rows[c]
            if memory_budget_bytes is None:
                return False
            if row["peak_memory_bytes"] is None:
                return (row["rejected_because"] or "").startswith(("pruned", "out of memory"))
            return row["peak_memory_bytes"] > memory_budget_bytes and not row["rejected_because"]

        twins = [c for c in stage1 if over_budget(c)]
        if best is not None and weights[1] == 0:
            # something fits already, and checkpointing only adds recompute: only a twin faster
            # than the best fitting candidate can give a faster one
            bar = rows[best]["speedup"]
            twins = [c for c in twins if rows[c]["speedup"] is not None and rows[c]["speedup"] > bar]
        if weights[1] > 0:
            twins += [_candidate_of(r) for r in pareto_front([rows[c] for c in first if rows[c]["speedup"] and not rows[c]["rejected_because"]])]
        # measured twins first: under a budget the fastest (the cheapest way to fit), weighing
        # memory without one the smallest (checkpointing extends the low-memory end); then the
        # unmeasured ones, reduced precision and fewer splits first
        measured = [c for c in dict.fromkeys(twins) if rows[c]["speedup"] is not None]
        measured.sort(key=lambda c: -rows[c]["speedup"] if memory_budget_bytes is not None
                      else rows[c]["peak_memory_bytes"])
        unmeasured = sorted((c for c in dict.fromkeys(twins) if rows[c]["speedup"] is None),
                            key=lambda c: (c.precision == "fp32", c.k))
        checkpointed = [c for twin in measured + unmeasured for c in _checkpointed(twin, search.num_blocks)]
        ran = search.measure_memory(checkpointed, limit=MAX_CHECKPOINTED)
        if ran:
            search.time([best] + ran if best else ran)
            best = _best(search, weights=weights, min_k=min_k)
    elif memory_budget_bytes is not None and not search.num_blocks:
        notes.append("Checkpointing not tried: the model has no known block sequence (give it checkpoint_blocks).")

    # 3. speed options on the best so far, then the ones that helped, together
    if speed_options and best is not None:
        options = _speed_options(best, search, try_compile)
        ran = search.measure_memory([best.replace(**option) for option in options])
        if ran:
            search.time([best] + ran)
            base_s = search.rows[Candidate()]["seconds_per_sample"]
            helped = [c for c in ran if _helps(search.rows[c], search.rows[best], memory_budget_bytes, base_s,
                                               run_samples)]
            if len(helped) > 1:
                together = best.replace(**{key: value for c in helped for key, value in _changes(best, c).items()})
                # timed with the baseline only: every speedup is paired with the baseline's windows,
                # so it compares with the options' own (re-timing them cost ~6 s of a ResNet plan)
                built = search.measure_memory([together])
                if built:
                    search.time(built)
        if not try_compile:
            notes.append(f"torch.compile not tried (try_compile=False, the default off CUDA: {COMPILE_ON_CPU}).")

    rows = list(search.rows.values())
    notes += _choose(rows, memory_budget_bytes, weights, min_k=min_k, run_samples=run_samples)
    chosen = next(row for row in rows if row.get("chosen"))
    config, good = _candidate_of(chosen).config(), None
    if adaptive_accumulation:
        good = _measure_goodput(search, _candidate_of(chosen), k_max=k_max)
        config = _adaptive_config(config, good)
    return Plan(config=config, chosen=chosen, baseline=search.rows[Candidate()], rows=rows,
                memory_budget_bytes=memory_budget_bytes, weights=weights, planning_s=time.perf_counter() - started,
                compile_s=search.compile_s, notes=notes, energy_source=search.energy_source, goodput=good,
                run_samples=run_samples)


def _candidates(batch_size: int, device: torch.device, ks: Sequence[int] | None, min_k: int = 1) -> list[Candidate]:
    precisions = ("fp32",) + native_reduced_precisions(device)
    splits = ks if ks is not None else [k for k in (1, 2, 4, 8) if batch_size % k == 0 and k >= min_k]
    for k in splits:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or batch_size % k:
            _fail("ks", tuple(splits), f"integers >= 1 dividing the batch size {batch_size}")
    if not any(k >= min_k for k in splits):
        _fail("ks", tuple(splits), f"at least one k >= {min_k} (adaptive accumulation needs >= 2 micro-batches "
              f"per step on one process), dividing the batch size {batch_size}")
    candidates = [Candidate(p, k) for p in precisions for k in splits]
    if Candidate() not in candidates:
        candidates.insert(0, Candidate())  # the baseline is always measured
    return sorted(candidates, key=lambda c: c != Candidate())


def _checkpointed(twin: Candidate, num_blocks: int) -> list[Candidate]:
    """`twin` with ⌈√L⌉ segments, with every block its own segment, and every block selective."""
    sqrt = resolve_segments(num_blocks, "sqrt")
    options = [(sqrt, "full")] + ([(num_blocks, "full")] if num_blocks != sqrt else []) + [(num_blocks, "selective")]
    return [twin.replace(checkpointing=segments, checkpoint_policy=policy) for segments, policy in options]


def _speed_options(best: Candidate, search: _Search, try_compile: bool) -> list[dict]:
    options = []
    probe = search.optimizer_factory([torch.nn.Parameter(torch.zeros(1, device=search.device))])
    # the fused kernel where the optimizer has one for this device, else foreach (fused does the
    # same update in fewer passes, so trying both would spend planning time on the slower)
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    fused = "fused" in probe.defaults and search.device.type in _get_fused_kernels_supported_devices()
    impl = "fused" if fused else "foreach" if "foreach" in probe.defaults else None
    if impl and best.optimizer_impl == "default":
        options.append({"optimizer_impl": impl})
    if best.memory_format == "contiguous" and any(p.dim() == 4 for p in search.model.parameters()):
        options.append({"memory_format": "channels_last"})
    if try_compile and not best.compile:
        options.append({"compile": True})
    return options


def _changes(base: Candidate, other: Candidate) -> dict:
    return {key: value for key, value in dataclasses.asdict(other).items() if getattr(base, key) != value}


def _helps(row: dict, best: dict, budget: float | None, base_s: float | None = None,
           run_samples: int | None = None) -> bool:
    fits = budget is None or row["peak_memory_bytes"] <= budget
    return fits and not row["rejected_because"] and (_over_run(row, row["speedup"], base_s, run_samples)
                                                     > _over_run(best, best["speedup"], base_s, run_samples))


def _over_run(row: dict, speedup: float | None, base_s: float | None, run_samples: int | None) -> float | None:
    """`speedup` (over the fp32 baseline's seconds per sample `base_s`) with the row's compile
    seconds spread over a run of `run_samples` samples; unchanged for a row that did not compile
    or when the run's length is not known."""
    if speedup is None or not speedup > 0 or not run_samples or not row.get("compile_s") or not base_s:
        return speedup
    return base_s / (base_s / speedup + row["compile_s"] / run_samples)


def _candidate_of(row: dict) -> Candidate:
    return Candidate(**{f.name: row[f.name] for f in dataclasses.fields(Candidate)})


def _best(search: _Search, *, weights, min_k: int = 1) -> Candidate | None:
    """The current choice among what is measured so far (None when nothing fits yet)."""
    rows = [_measured_part(row) for row in search.rows.values()]
    try:
        _choose(rows, search.budget, weights, min_k=min_k, run_samples=search.run_samples)
    except ValueError:
        return None
    return _candidate_of(next(row for row in rows if row.get("chosen")))


def _measured_part(row: dict) -> dict:
    """A row without what `_choose` decides (so a choice can be made again)."""
    out = dict(row, feasible=False, chosen=False, cost=None, cost_ci_low=None, cost_ci_high=None, speedup_over_run=None)
    if out["rejected_because"] and not out["rejected_because"].startswith(("pruned", "out of memory", "quality")):
        out["rejected_because"] = None
    return out


def _cost_interval(row: dict) -> str:
    return f"{row['cost_ci_low']:.3f}-{row['cost_ci_high']:.3f}"


def _cost_intervals_overlap(row: dict, best: dict) -> bool:
    """Whether two rows' eq. 3 cost intervals (from their speedups' 95 % intervals) overlap."""
    if any(r.get(end) is None for r in (row, best) for end in ("cost_ci_low", "cost_ci_high")):
        return False
    return row["cost_ci_low"] <= best["cost_ci_high"] and best["cost_ci_low"] <= row["cost_ci_high"]


def _baseline_row(rows) -> dict:
    return next(row for row in rows if row["candidate"] == Candidate().name)


def _is_out_of_memory(error: BaseException) -> bool:
    message = str(error).lower()
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in message or "can't allocate memory" in message


def _release(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _calibrate(tracker: MemoryTracker, batch_size: int, num_blocks: int | None) -> dict:
    """The baseline step's peak split into what does not scale with the micro-batch (parameters,
    buffers, gradients, optimizer state) and what does (activations, temporaries), per sample."""
    parts = tracker.breakdown_at_peak
    scaling = {key: parts.get(key, 0) / batch_size for key in ("activations", "temporaries")}
    fixed = tracker.peak_bytes - batch_size * sum(scaling.values())
    return {"fixed_bytes": fixed, "activation_bytes_per_sample": scaling["activations"],
            "temporary_bytes_per_sample": scaling["temporaries"], "num_blocks": num_blocks}


def _predict(calibration: dict, candidate: Candidate, batch_size: int) -> float:
    """Eq. 8 (activations of one micro-batch of B/k samples) and eq. 19 (checkpointing keeps a
    fraction of them). Reduced precision is taken to halve what scales with the batch (autocast
    keeps FP32 weights, so eq. 17's halving of weights and gradients is not assumed). Meant to
    prune, so it leans low: temporaries are scaled like activations, and the selective policy
    is taken to keep what full checkpointing keeps."""
    activations = calibration["activation_bytes_per_sample"] * batch_size / candidate.k
    if candidate.checkpointing is not None and calibration["num_blocks"]:
        activations *= min(1.0, expected_saved_fraction(calibration["num_blocks"], candidate.checkpointing))
    temporaries = calibration["temporary_bytes_per_sample"] * batch_size / candidate.k
    factor = 1.0 if candidate.precision == "fp32" else 0.5
    return calibration["fixed_bytes"] + factor * (activations + temporaries)


def _choose(rows: list[dict], budget: float | None, weights: tuple, min_k: int = 1,
            run_samples: int | None = None) -> list[str]:
    """Marks the chosen row (eq. 3 among feasible timed rows with k >= `min_k`) and why each
    other measured row lost; returns notes. ValueError when no measured candidate fits the budget.
    With `run_samples`, a compiled row's time is its seconds per sample plus its compile seconds
    spread over the run (`speedup_over_run`): eq. 3's T is the run's time, compiling included."""
    notes = []
    base = _baseline_row(rows)

    def speed(row: dict, key: str = "speedup") -> float | None:
        return _over_run(row, row[key], base.get("seconds_per_sample"), run_samples)

    for row in rows:
        if run_samples and row.get("compile_s") and row["speedup"] is not None:
            row["speedup_over_run"] = speed(row)
    for row in rows:
        if row["peak_memory_bytes"] is None or row["rejected_because"] or row["speedup"] is None:
            continue
        if budget is not None and row["peak_memory_bytes"] > budget:
            row["rejected_because"] = f"over the budget: peak {row['peak_memory_bytes'] / 2**20:.1f} MiB"
            continue
        row["feasible"] = True
    base_fits = base["feasible"]
    for row in rows:
        if row["feasible"] and row["k"] < min_k:
            row["feasible"] = False
            row["rejected_because"] = (f"adaptive accumulation needs k >= {min_k} micro-batches per step on one "
                                       "process (the baseline is the reference)")
    feasible = [row for row in rows if row["feasible"]]
    if not feasible:
        smallest = min((r for r in rows if r["peak_memory_bytes"] is not None),
                       key=lambda r: r["peak_memory_bytes"], default=None)
        _fail("memory_budget_bytes", budget, "a budget some candidate fits; the smallest measured peak was "
              + ("none" if smallest is None else f"{smallest['peak_memory_bytes']} bytes ({smallest['candidate']})"))
    forced_by_k = False
    if base_fits:
        slower = [row for row in feasible if row is not base and speed(row) < 1.0]
        if len(slower) == len(feasible):  # only with adaptive accumulation (the baseline is feasible otherwise)
            fastest = max(feasible, key=speed)
            notes.append(f"Every split with k >= {min_k} runs slower than the fp32 baseline: with adaptive "
                         f"accumulation the plan runs at {speed(fastest):.2f}x its speed at best.")
            slower, forced_by_k = [], True
        for row in slower:
            row["feasible"] = False
            row["rejected_because"] = f"slower than the fp32 baseline ({row['speedup']:.2f}x)"
            if row.get("speedup_over_run") is not None:
                row["rejected_because"] = (f"slower than the fp32 baseline over the run ({row['speedup_over_run']:.2f}x: "
                                           f"{row['speedup']:.2f}x per step, but compiling took "
                                           f"{row['compile_s']:.1f} s, spread over {run_samples:,} samples)")
        feasible = [row for row in feasible if row["feasible"]]
    else:
        notes.append("The budget rules out the fp32 baseline (peak "
                     f"{base['peak_memory_bytes'] / 2**20:.1f} MiB): the plan may be slower than it.")
    # time enters as 1/speedup (paired with the baseline in the same windows), energy per sample
    with_energy = all(row["energy_j_per_sample"] is not None for row in feasible + [base])
    reference = {"time_to_target_s": 1.0, "peak_memory_bytes": base["peak_memory_bytes"],
                 "energy_j": base["energy_j_per_sample"] if with_energy else None}

    def eq3(row: dict, speedup: float) -> float:
        return cost(1.0 / speedup, row["peak_memory_bytes"], row["energy_j_per_sample"] if with_energy else None,
                    baseline=reference, weights=weights)["cost"]

    for row in feasible:
        row["cost"] = eq3(row, speed(row))
        ends = (speed(row, "speedup_ci_low"), speed(row, "speedup_ci_high"))
        if all(end is not None and end > 0 for end in ends):  # the speedup's 95 % interval, as cost
            row["cost_ci_low"], row["cost_ci_high"] = sorted(eq3(row, end) for end in ends)
    best = min(feasible, key=lambda row: row["cost"])
    best["chosen"] = True
    within_noise = []
    for row in feasible:
        if row is not best:
            row["rejected_because"] = f"higher eq. 3 cost ({row['cost']:.3f} vs {best['cost']:.3f})"
            if _cost_intervals_overlap(row, best):
                row["rejected_because"] += (f"; within the timing noise: 95 % intervals {_cost_interval(row)} vs "
                                            f"{_cost_interval(best)} overlap")
                within_noise.append(row["candidate"])
    if within_noise:
        notes.append("Within the timing noise of the choice (eq. 3 cost intervals overlap): "
                     f"{'; '.join(repr(name) for name in within_noise)}; a plan made again may choose one of them.")
    if base in feasible and base is not best and base["candidate"] in within_noise:
        notes.append(f"The choice's speedup interval ({_interval(best)}) reaches 1x: this timing cannot tell it "
                     "from the fp32 baseline.")
    if speed(best) < 1.0 and not forced_by_k:
        notes.append(f"The chosen configuration runs at {speed(best):.2f}x the fp32 baseline's speed: "
                     "the budget forces it.")
    if best.get("speedup_over_run") is not None:
        notes.append(f"The choice compiles: {best['speedup']:.2f}x the baseline per step, {best['speedup_over_run']:.2f}x "
                     f"over the run's {run_samples:,} samples with compiling's {best['compile_s']:.1f} s "
                     "(a recompile later in the run, for a new input shape or evaluation mode, is not counted; "
                     "evaluating under torch.compiler.set_stance('force_eager') avoids one).")
    return notes


# ----------------------------------------------------------------------------- adaptive accumulation
def _measure_goodput(search: _Search, chosen: Candidate, *, k_max: int) -> dict:
    """The noise scale of the probe batch at the initial weights and the chosen candidate's
    micro-batch and optimizer-step seconds (medians over windows × steps_per_window steps), then
    k by goodput (`_goodput_choice`)."""
    search._say("adaptive accumulation: the gradient noise scale, then micro-batch and optimizer-step time")
    probe = probe_noise_scale(copy.deepcopy(search.model), search.batch, search.loss_fn,
                              loss_takes_model=search.loss_takes_model)
    trial = search.trials[chosen]
    parts = [trial.split_step(search.device) for _ in range(search.windows * search.steps_per_window)]
    micro_s = statistics.median(m for m, _ in parts) / chosen.k
    optimizer_s = statistics.median(o for _, o in parts)
    return _goodput_choice(search.rows[chosen], probe.to_dict(), optimizer_s=optimizer_s, micro_s=micro_s,
                           batch_size=search.size, k_max=k_max)


def _goodput_choice(chosen: dict, noise_scale: dict, *, optimizer_s: float, micro_s: float | None,
                    batch_size: int, k_max: int) -> dict:
    """Goodput (`accumulation.goodput`) of k = k_min..k_max micro-batches of the chosen split's
    b = batch_size / k_min, relative to k_min's; the best k, and the best at either end of the
    noise scale's interval. Without a measured `micro_s` it comes from the chosen row's timed
    seconds per sample (a step of k_min micro-batches minus the optimizer's part)."""
    k_min = chosen["k"]
    b = batch_size / k_min
    if micro_s is None:
        micro_s = max(chosen["seconds_per_sample"] * batch_size - optimizer_s, 0.0) / k_min
    ks = range(k_min, max(k_max, k_min) + 1)

    def table(b_simple: float) -> list[dict]:
        rows = [goodput(k, micro_batch_size=b, micro_s=micro_s, optimizer_s=optimizer_s, b_simple=b_simple,
                        reference_batch=batch_size) for k in ks]
        for row in rows:
            row["relative_goodput"] = row["goodput"] / rows[0]["goodput"]
        return rows

    def best(rows: list[dict]) -> int:
        return max(rows, key=lambda row: row["goodput"])["k"]

    rows = table(noise_scale["b_simple"])
    phi = noise_scale["b_simple"]
    closed_form = math.inf if math.isinf(phi) else math.sqrt(phi * optimizer_s / (b * micro_s)) if micro_s > 0 else math.inf
    return {"noise_scale": noise_scale, "micro_batch_size": b, "batch_size": batch_size, "micro_s": micro_s,
            "optimizer_s": optimizer_s, "k_min": k_min, "k_max": max(k_max, k_min), "k": best(rows),
            "k_at_interval": [best(table(noise_scale["ci_low"])), best(table(noise_scale["ci_high"]))],
            "closed_form_k": closed_form, "rows": rows, "measured_on": chosen["candidate"]}


def _adaptive_config(config: OptimizationConfig, good: dict) -> OptimizationConfig:
    return config.replace(adaptive=True, k=good["k"], k_min=good["k_min"], k_max=good["k_max"])


def _size(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:.3g}"


def _explain_goodput(good: dict) -> list[str]:
    noise = good["noise_scale"]
    rows = {row["k"]: row for row in good["rows"]}
    chosen = rows[good["k"]]
    lines = [f"Adaptive accumulation: gradient noise scale B_simple {_size(noise['b_simple'])} samples "
             f"(95 % interval {_size(noise['ci_low'])}-{_size(noise['ci_high'])}) at the initial weights, from "
             f"{noise['micro_batches']} micro-batches of {noise['micro_batch_size']:.3g};",
             f"  a micro-batch of {good['micro_batch_size']:.3g} takes {good['micro_s'] * 1e3:.3g} ms and the "
             f"optimizer step {good['optimizer_s'] * 1e3:.3g} ms (on {good['measured_on']}), so goodput (samples/s "
             f"× statistical efficiency) peaks at k* = sqrt(B_simple·t_opt/(b·t_micro)) = {_size(good['closed_form_k'])};",
             f"  starting k = {good['k']} in [{good['k_min']}, {good['k_max']}] (effective batch "
             f"{chosen['effective_batch']:.3g}; {good['k_at_interval'][0]} to {good['k_at_interval'][1]} across the "
             "interval); eq. 6 moves k as the noise scale changes in training."]
    if len(rows) > 1:
        last = rows[good["k_max"]]
        lines.append(f"  k = {good['k_max']} would give {last['relative_goodput']:.2f}x k = {good['k_min']}'s goodput "
                     f"({last['samples_per_s'] / rows[good['k_min']]['samples_per_s']:.2f}x its samples/s, "
                     f"{last['statistical_efficiency']:.2f} of its statistical efficiency).")
    return lines
