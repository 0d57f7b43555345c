"""Choose the configuration by measured cost on this machine: eq. 3 under a memory budget.

The paper's fixed recipe is not the fastest everywhere (on a CPU √L checkpointing recomputes
far more than the 0.12 of a step it assumes), and the paper names the fix: adaptive policies
that disable an optimization when its overhead exceeds its benefit. `plan()` does that by
measurement, on the user's model, batch and device:

1. Candidates: precision (fp32; bf16 where the device computes it natively; fp16 on CUDA) ×
   micro-batch splits k of the effective batch; × activation checkpointing (⌈√L⌉ segments,
   every block) where the model has a block sequence and memory counts (a budget, or w2 > 0).
2. Prune: one measured fp32 step calibrates the memory model (eq. 8: activations scale with the
   micro-batch; eq. 19: checkpointing keeps a fraction of them); a candidate whose prediction
   exceeds the budget by more than `PRUNE_MARGIN` is not run.
3. Measure the rest: one step tracked for peak memory (an out-of-memory error makes the candidate
   infeasible, caught in-process) and for the loss on the probe batch (finite, and equal to
   fp32's within the precision's tolerance); then all of them timed in interleaved windows
   (warm-up excluded), seconds per sample as median and 95 % interval.
4. Choose by eq. 3 (C = w1·T + w2·M + w3·E over the baseline's values) among candidates within
   the budget whose quality check passed, never one slower than the fp32 baseline unless the
   budget rules the baseline out (the plan then says so).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .checkpointing import block_sequence, expected_saved_fraction, has_block_sequence, resolve_segments
from .compose import prepare
from .config import OptimizationConfig
from .measure.costs import cost
from .measure.memory import MemoryTracker
from .measure.stats import paired_ratio, summarize
from .measure.timing import interleaved_windows

PRUNE_MARGIN = 1.25       # a prediction this far over the budget is not worth measuring
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}  # |loss - fp32 loss| / |fp32 loss| on the probe batch


def _fail(argument: str, value, allowed: str) -> None:
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


def native_reduced_precisions(device: torch.device) -> tuple[str, ...]:
    """The reduced precisions `device` computes natively: CUDA fp16 always, bf16 where the GPU
    supports it; a CPU bf16 where it has AVX-512 BF16 or AMX (else bf16 autocast is emulated and
    slow, and fp16 on a CPU is always slow)."""
    if device.type == "cuda":
        return ("bf16", "fp16") if torch.cuda.is_bf16_supported() else ("fp16",)
    if device.type == "cpu":
        cpu = getattr(torch.backends, "cpu", None)
        capability = cpu.get_cpu_capability() if cpu is not None else ""
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return ("bf16",) if native or "AVX512_BF16" in capability else ()
    return ()


@dataclass(frozen=True)
class Candidate:
    precision: str = "fp32"
    k: int = 1
    checkpointing: int | str | None = None

    @property
    def name(self) -> str:
        cp = "no checkpointing" if self.checkpointing is None else f"checkpointing {self.checkpointing}"
        return f"{self.precision}, k={self.k}, {cp}"

    def config(self) -> OptimizationConfig:
        return OptimizationConfig(name="auto", precision=self.precision, k=self.k, checkpointing=self.checkpointing)


@dataclass
class Plan:
    """What `plan()` measured and chose. `config` is the chosen OptimizationConfig; `rows` one dict
    per candidate (measured or pruned) with seconds per sample, peak memory, feasibility and why
    a candidate was rejected; `explain()` says it in words."""

    config: OptimizationConfig
    chosen: dict
    baseline: dict
    rows: list[dict]
    memory_budget_bytes: float | None
    weights: tuple[float, float, float]
    planning_s: float
    notes: list[str] = field(default_factory=list)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows).set_index("candidate")

    def explain(self) -> str:
        base, best = self.baseline, self.chosen
        budget = "no memory budget" if self.memory_budget_bytes is None else \
            f"a memory budget of {self.memory_budget_bytes / 2**20:.1f} MiB"
        lines = [f"Chose {best['candidate']} under {budget}, by eq. 3 with weights (time, memory, energy) = "
                 f"{tuple(round(w, 3) for w in self.weights)}:",
                 f"  {best['speedup']:.2f}x the fp32 baseline's samples/s "
                 f"(95 % interval {best['speedup_ci_low']:.2f}-{best['speedup_ci_high']:.2f}), "
                 f"peak memory {best['peak_memory_bytes'] / 2**20:.1f} MiB vs {base['peak_memory_bytes'] / 2**20:.1f} MiB."]
        for row in self.rows:
            if row["candidate"] != best["candidate"] and row["rejected_because"]:
                lines.append(f"  {row['candidate']}: {row['rejected_because']}")
        lines += [f"  {note}" for note in self.notes]
        lines.append(f"Planning took {self.planning_s:.1f} s.")
        return "\n".join(lines)


def _micro_batches(batch: Sequence[torch.Tensor], k: int) -> list[tuple[torch.Tensor, ...]]:
    return list(zip(*(tensor.chunk(k) for tensor in batch)))


class _Trial:
    """One candidate on its own copy of the model and optimizer, stepping the probe batch."""

    def __init__(self, candidate: Candidate, model, optimizer_factory, batch, loss_fn, device):
        self.candidate = candidate
        self.model = copy.deepcopy(model)
        self.optimizer = optimizer_factory(self.model.parameters())
        self.size = len(batch[0])
        self.micro = _micro_batches(batch, candidate.k)
        self.loss_fn = loss_fn
        self.engine = prepare(self.model, self.optimizer, candidate.config(), micro_batch_size=self.size // candidate.k,
                              device=device)

    first_loss: float | None = None

    def step(self) -> float:
        """One optimizer step over the whole probe batch; returns the samples it processed.
        `first_loss` is the batch's mean loss at the initial weights (micro-batches weighted by size),
        the same weights for every candidate."""
        total = 0.0
        for *inputs, target in self.micro:
            with self.engine.autocast():
                loss = self.loss_fn(self.model(*inputs), target)
            self.engine.backward(loss, num_items=len(target))
            self.engine.step()
            if self.first_loss is None:
                total += float(loss.detach()) * len(target)
        if self.first_loss is None:
            self.first_loss = total / self.size
        return float(self.size)


def _candidates(num_blocks: int | None, batch_size: int, device: torch.device, ks: Sequence[int] | None) -> list[Candidate]:
    precisions = ("fp32",) + native_reduced_precisions(device)
    splits = ks if ks is not None else [k for k in (1, 2, 4, 8) if batch_size % k == 0]
    for k in splits:
        if not isinstance(k, int) or k < 1 or batch_size % k:
            _fail("ks", tuple(splits), f"integers >= 1 dividing the batch size {batch_size}")
    return [Candidate(p, k) for p in precisions for k in splits]


def _checkpointed(candidates: Sequence[Candidate], num_blocks: int) -> list[Candidate]:
    """Each candidate with ⌈√L⌉ segments and with every block its own segment."""
    options = sorted({resolve_segments(num_blocks, "sqrt"), num_blocks})
    return [Candidate(c.precision, c.k, segments) for c in candidates for segments in options]


def plan(model: torch.nn.Module, optimizer_factory: Callable, batch: Sequence[torch.Tensor],
         loss_fn: Callable, *, device: torch.device | str | None = None,
         memory_budget_bytes: float | None = None, weights: Sequence[float] = (1.0, 0.0, 0.0),
         ks: Sequence[int] | None = None, windows: int = 3, steps_per_window: int = 2,
         progress: bool = False) -> Plan:
    """Measure the candidate configurations on `batch` and choose one (module docstring).

    `model` is left untouched (each candidate runs on a copy). `optimizer_factory(parameters)`
    builds the optimizer. `batch` is (inputs..., targets), its first dimension the effective batch
    size; `loss_fn(model_output, targets)` returns the mean loss. `memory_budget_bytes`: peak
    memory of a training step allowed (None: no budget). `weights`: eq. 3's (w1, w2, w3) on
    time per sample, peak memory and energy, each relative to the fp32 baseline (energy enters
    only where it is measured; not yet on this path). `ks`: the micro-batch splits to try
    (default the powers of two up to 8 that divide the batch).
    """
    started = time.perf_counter()
    if not batch or not all(isinstance(t, torch.Tensor) for t in batch) or len(batch) < 2:
        _fail("batch", type(batch).__name__, "a sequence (inputs..., targets) of tensors")
    size = len(batch[0])
    if any(len(t) != size for t in batch):
        _fail("batch", [tuple(t.shape) for t in batch], "tensors with the same first dimension (the batch size)")
    if memory_budget_bytes is not None and not memory_budget_bytes > 0:
        _fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0")
    for argument, value in (("windows", windows), ("steps_per_window", steps_per_window)):
        if not isinstance(value, int) or value < 1:
            _fail(argument, value, "an integer >= 1")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    num_blocks = len(block_sequence(model)) if has_block_sequence(model) else None
    candidates = _candidates(num_blocks, size, device, ks)
    # Checkpointing only trades time for memory: it is measured when memory counts (a budget, or
    # a weight on memory), which keeps planning short when it cannot win.
    if num_blocks and (memory_budget_bytes is not None or weights[1] > 0):
        candidates += _checkpointed(candidates, num_blocks)
    baseline = candidates[0]
    assert baseline == Candidate()

    rows: dict[Candidate, dict] = {}
    trials: dict[Candidate, _Trial] = {}
    calibration = None
    for candidate in candidates:
        row = rows[candidate] = {"candidate": candidate.name, "precision": candidate.precision, "k": candidate.k,
                                 "checkpointing": candidate.checkpointing, "predicted_memory_bytes": None,
                                 "peak_memory_bytes": None, "loss_rel_diff": None, "feasible": False,
                                 "rejected_because": None}
        if calibration is not None:
            row["predicted_memory_bytes"] = predicted = _predict(calibration, candidate, size)
            if memory_budget_bytes is not None and predicted > PRUNE_MARGIN * memory_budget_bytes:
                row["rejected_because"] = (f"pruned: eqs. 8/19 predict {predicted / 2**20:.1f} MiB, over "
                                           f"{PRUNE_MARGIN}x the budget")
                continue
        others_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0  # earlier candidates'
        try:
            trial = _Trial(candidate, model, optimizer_factory, batch, loss_fn, device)
            trial.step()  # warm-up: optimizer state allocated, kernels chosen
            with MemoryTracker(trial.model, trial.optimizer, device) as tracker:
                trial.step()
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not _is_out_of_memory(error):
                raise
            row["rejected_because"] = f"out of memory: {str(error).splitlines()[0][:120]}"
            trial = None
            _release(device)
            continue
        row["peak_memory_bytes"] = tracker.peak_bytes - others_bytes
        if candidate == baseline:
            calibration = _calibrate(tracker, size, num_blocks)
            row["predicted_memory_bytes"] = _predict(calibration, candidate, size)
        trials[candidate] = trial
    base_trial = trials[baseline]
    for candidate, trial in trials.items():
        row = rows[candidate]
        row["loss_rel_diff"] = diff = abs(trial.first_loss - base_trial.first_loss) / max(abs(base_trial.first_loss), 1e-12)
        if not math.isfinite(trial.first_loss) or diff > LOSS_TOLERANCE[candidate.precision]:
            row["rejected_because"] = (f"quality: the probe batch's loss differs from fp32's by {diff:.2e} "
                                       f"(allowed {LOSS_TOLERANCE[candidate.precision]:.0e})")

    timed = {candidate.name: trial.step for candidate, trial in trials.items()}
    rates = interleaved_windows(timed, windows=windows, steps_per_window=steps_per_window, warmup_steps=0, device=device)
    base_rates = rates[baseline.name]
    for candidate in trials:
        row = rows[candidate]
        summary = summarize([1.0 / r for r in rates[candidate.name]])
        ratio = paired_ratio(rates[candidate.name], base_rates)
        row.update(seconds_per_sample=summary["median"], seconds_per_sample_ci_low=summary["ci_low"],
                   seconds_per_sample_ci_high=summary["ci_high"], speedup=ratio["median"],
                   speedup_ci_low=ratio["ci_low"], speedup_ci_high=ratio["ci_high"])
    notes = _choose(rows, baseline, memory_budget_bytes, tuple(weights))
    chosen = next(c for c, row in rows.items() if row.get("chosen"))
    return Plan(config=chosen.config(), chosen=rows[chosen], baseline=rows[baseline], rows=list(rows.values()),
                memory_budget_bytes=memory_budget_bytes, weights=tuple(weights),
                planning_s=time.perf_counter() - started, notes=notes)


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
    prune, so it leans low: temporaries are scaled like activations."""
    activations = calibration["activation_bytes_per_sample"] * batch_size / candidate.k
    if candidate.checkpointing is not None and calibration["num_blocks"]:
        activations *= min(1.0, expected_saved_fraction(calibration["num_blocks"], candidate.checkpointing))
    temporaries = calibration["temporary_bytes_per_sample"] * batch_size / candidate.k
    factor = 1.0 if candidate.precision == "fp32" else 0.5
    return calibration["fixed_bytes"] + factor * (activations + temporaries)


def _choose(rows: dict, baseline: Candidate, budget: float | None, weights: tuple) -> list[str]:
    """Marks the chosen row (eq. 3 among feasible rows) and why each other measured row lost."""
    notes = []
    base = rows[baseline]
    for row in rows.values():
        if row["peak_memory_bytes"] is None or row["rejected_because"]:
            continue
        if budget is not None and row["peak_memory_bytes"] > budget:
            row["rejected_because"] = f"over the budget: peak {row['peak_memory_bytes'] / 2**20:.1f} MiB"
            continue
        row["feasible"] = True
    feasible = [row for row in rows.values() if row["feasible"]]
    if not feasible:
        smallest = min((r for r in rows.values() if r["peak_memory_bytes"] is not None),
                       key=lambda r: r["peak_memory_bytes"], default=None)
        _fail("memory_budget_bytes", budget, "a budget some candidate fits; the smallest measured peak was "
              + ("none" if smallest is None else f"{smallest['peak_memory_bytes']} bytes ({smallest['candidate']})"))
    if base["feasible"]:
        for row in feasible:
            if row is not base and row["speedup"] < 1.0:
                row["feasible"] = False
                row["rejected_because"] = f"slower than the fp32 baseline ({row['speedup']:.2f}x)"
        feasible = [row for row in feasible if row["feasible"]]
    else:
        notes.append("The budget rules out the fp32 baseline (peak "
                     f"{base['peak_memory_bytes'] / 2**20:.1f} MiB): the plan may be slower than it.")
    reference = {"time_to_target_s": base["seconds_per_sample"], "peak_memory_bytes": base["peak_memory_bytes"]}
    for row in feasible:
        row["cost"] = cost(row["seconds_per_sample"], row["peak_memory_bytes"], None, baseline=reference,
                           weights=weights)["cost"]
    best = min(feasible, key=lambda row: row["cost"])
    best["chosen"] = True
    for row in feasible:
        if row is not best:
            row["rejected_because"] = f"higher eq. 3 cost ({row['cost']:.3f} vs {best['cost']:.3f})"
    if best["speedup"] < 1.0:
        notes.append(f"The chosen configuration runs at {best['speedup']:.2f}x the fp32 baseline's speed: "
                     "the budget forces it.")
    return notes
