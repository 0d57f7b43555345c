"""The measurements one `plan()` call makes: each candidate built on its own copy of the model,
its peak memory from one tracked step (after the memory model -- eqs. 8/19, calibrated on the
baseline's step -- had the chance to prune it), its probe-batch loss, and its speed in
interleaved timing windows paired with the fp32 baseline's.

The copies are kept between stages so that a later stage times them again without rebuilding.
Where the device's memory is limited (`capacity_bytes`: on CUDA what was free when planning
began), they are kept only while they fit: each holds its weights, gradients and optimizer state
between steps (`held_bytes`), and each step adds its activations and temporaries on top
(`step_bytes`). A candidate is built after releasing the copies least recently used until it
fits (the baseline's is kept: it is in every timing group), and candidates are timed in groups
that fit together, each group with the baseline (every speedup is paired with the baseline's
windows of the same rounds), the group whose copies are still built first; a released copy is
built again when a later group needs it. A group that runs out of memory all the same (the steps'
peaks together, the allocator's fragmentation) is timed again in halves from new copies; a
candidate that does not fit beside the baseline is timed alone between baseline windows timed
alone (`timing.py`), and only one out of memory even alone is rejected as such.

On more than one process (a torch.distributed group) every candidate trains data parallel --
DDP, or DeepSpeed at its ZeRO stage -- and the processes agree on each measurement before it
decides anything (`ranks.py`), so that they build and time the same candidates."""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Sequence

import torch

from ..checkpointing import block_sequence, has_block_sequence
from ..measure.energy import EnergyMeter
from ..measure.memory import resident_bytes
from ..measure.tracker import MemoryTracker, state_bytes
from . import budget as clock
from .choice import choose, cost_intervals_overlap, measured_part, tie_margin
from .memory_model import block_inputs_bytes, calibrate, default_capacity_bytes, partitionable_bytes, predict
from .ranks import Ranks
from .space import Candidate, candidate_of
from .timing import (CPU_WINDOW_S, FIRST_WINDOWS, MAX_STEPS_PER_WINDOW, SHORT_STEP_S, WINDOW_TARGET_S,  # noqa: F401
                     Timing, is_out_of_memory, release, sized_timing)
from .trial import Trial

PRUNE_MARGIN = 1.25       # a prediction this far over the budget is not worth measuring
NEAR_TIES = 3             # candidates within the noise of the choice timed once more, the choice included
# what a compiled candidate's first step is expected to take before one has compiled here (the
# time budget's estimate): 18-61 s from a cold cache on 2-core CPUs, 39.5 s for ResNet-50 on an H100
COMPILE_EXPECTED_S = 40.0
NOT_MEASURED = ("not measured: the planning time budget (time_budget_s) was spent, its last seconds kept for "
                "the race")
# rounds of the race (stages.race) kept in the budget before any candidate is measured: its measurement
# and first windows must leave this many rounds of the baseline, yours and the fastest so far. Without
# it, measuring the busy quick ResNet's splits and their options spent 52-59 s of its 60 and left its
# 1.45x lever (channels-last) 2-3 windows: 2 of 5 plans kept the baseline (commit 900d0bd,
# benchmarks/results/amd_epyc_avx2_f25/plan_regret_900d0bd/)
MIN_RACE_ROUNDS = 4
# |loss - fp32 loss| / |fp32 loss| on the probe batch; TF32 keeps fp16's 10-bit mantissa in its products
LOSS_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 3e-2, "fp16": 1e-2}


def loss_tolerance(candidate: Candidate) -> float:
    return LOSS_TOLERANCE["tf32" if candidate.tf32 and candidate.precision == "fp32" else candidate.precision]


class Search(Timing):
    """The measurements one `plan()` call makes: trials, rows, the memory model; the timing of
    them is `timing.Timing`'s, within `time_budget_s` seconds of planning (None: no limit)."""

    def __init__(self, model, optimizer_factory, batch, loss_fn, device, budget, windows, steps_per_window, progress,
                 loss_takes_model, run_samples=None, capacity_bytes=None, optimizer_takes_model=False,
                 time_budget_s: float | None = None):
        self.model, self.optimizer_factory, self.batch, self.loss_fn = model, optimizer_factory, batch, loss_fn
        self.loss_takes_model, self.optimizer_takes_model = loss_takes_model, optimizer_takes_model
        self.device, self.budget = device, budget
        # None: sized to the baseline's step before the first timing (`timing`)
        self.windows, self.steps_per_window = windows, steps_per_window
        self.timing_note = None
        self.run_samples = run_samples
        self.size = len(batch[0])
        self.num_blocks = len(block_sequence(model)) if has_block_sequence(model) else None
        self.rows: dict[Candidate, dict] = {}
        self.trials: dict[Candidate, Trial] = {}  # the copies built now, least recently used first
        self.ranks = Ranks(device)
        self.capacity_bytes = capacity_bytes if capacity_bytes is not None else default_capacity_bytes(device)
        if self.capacity_bytes is not None:  # the device with the least room decides
            self.capacity_bytes = int(self.ranks.min([self.capacity_bytes])[0])
        self.held_bytes: dict[Candidate, int] = {}  # held between steps by a candidate's copy
        self.step_bytes: dict[Candidate, int] = {}  # a step's peak above that
        self.first_loss: dict[Candidate, float] = {}  # the probe batch's loss at the initial weights
        self.split_rounds = 0  # rounds of timing that memory split into groups
        self.out_of_memory_splits = 0  # timing groups that ran out of memory and were timed again in halves
        self.rebuilt = 0  # copies built again after being released for room
        # every timing window of a candidate, each with the baseline's window of the same round
        self.windows_timed: dict[Candidate, tuple[list[float], list[float]]] = {}
        # each candidate's rate by round number (`Timing.paired_between` pairs any two by round)
        self.round_rates: dict[Candidate, dict[int, float]] = {}
        self.round_number = 0
        self.rounds_wanted: int | None = None
        self.calibration = None
        self.compile_s = 0.0
        self.compiled_modes: set[str] = set()  # torch.compile modes this search compiled graphs in
        self.progress = progress
        self.time_budget = clock.TimeBudget(time_budget_s)
        self.said_at, self.windows_done = clock.now(), 0  # progress: when the last line was printed
        self.step_s: dict[Candidate, float] = {}  # a step's seconds, from its first steps (the budget's clock)
        self.measure_s: list[float] = []  # seconds a candidate's memory measurement took, each (no compiling)
        self.pace = 1.0  # how long the last round of windows took over what its steps' seconds predicted
        probe = EnergyMeter(device).start()
        probe.stop()
        readable = self.ranks.all(probe.energy_j is not None)
        self.energy_source = probe.energy_source if readable else None
        self.energy_unavailable = None if self.energy_source else probe.energy_source

    def measure_memory(self, candidates: Sequence[Candidate], limit: int | None = None,
                       always: bool = False) -> list[Candidate]:
        """Builds each new candidate (unless the memory model prunes it, or the time budget has no
        room for it beside the race's reserve, `race_reserve_s`, and it is not the baseline or
        `always`), runs a warm-up step and a tracked step, until `limit` have run; returns those
        that ran."""
        ran = []
        for candidate in candidates:
            if limit is not None and len(ran) >= limit:
                break
            if candidate in self.rows:
                if candidate in self.held_bytes:  # measured before (its copy perhaps released since)
                    ran.append(candidate)
                continue
            row = self.rows[candidate] = {
                "candidate": candidate.name, **dataclasses.asdict(candidate), "predicted_memory_bytes": None,
                "peak_memory_bytes": None, "loss_rel_diff": None, "seconds_per_sample": None, "speedup": None,
                "speedup_ci_low": None, "speedup_ci_high": None, "timed_windows": 0, "energy_j_per_sample": None,
                "compile_s": None, "run_compile_s": None, "speedup_over_run": None, "feasible": False, "cost": None, "cost_ci_low": None,
                "cost_ci_high": None, "rejected_because": None, "paired_with": None}
            if self.calibration is not None:
                row["predicted_memory_bytes"] = predicted = predict(self.calibration, candidate, self.size,
                                                                    self.ranks.world_size)
                if self.budget is not None and predicted > PRUNE_MARGIN * self.budget:
                    row["rejected_because"] = (f"pruned: eqs. 8/19 predict {predicted / 2**20:.1f} MiB, over "
                                               f"{PRUNE_MARGIN}x the budget")
                    continue
            if not (always or candidate == Candidate()) and not self.ranks.all(
                    self.time_budget.allows(self.measure_estimate_s(candidate) + self.race_reserve_s())):
                row["rejected_because"] = NOT_MEASURED
                self.time_budget.cut("not measured", [candidate.name])
                continue
            self._say(f"memory: {candidate.name}")
            started = clock.now()
            # the baseline's copy kept (it is in every timing group) where the candidate fits beside it
            predicted = row["predicted_memory_bytes"] or 0
            beside = (self.capacity_bytes is None or Candidate() not in self.held_bytes
                      or self.held_bytes[Candidate()] + predicted <= self.capacity_bytes)
            self._make_room(predicted, keep=(Candidate(),) if beside else ())
            measured = self._measure_one(candidate, row)
            if measured is None and self.trials and not row["rejected_because"].startswith("failed"):
                # out of memory: perhaps only the other copies were in the way
                self._release_copies(keep=())
                measured = self._measure_one(candidate, row)
            if not candidate.compile:
                self.measure_s.append(clock.now() - started)
            if measured is None:
                continue
            trial, tracker, others_bytes, inputs_bytes = measured
            row["rejected_because"] = None
            # the largest process's memory, the mean of the processes' probe losses
            peak, held, inputs_bytes = self.ranks.max([tracker.peak_bytes - others_bytes,
                                                       state_bytes(trial.tracked, trial.optimizer), inputs_bytes or 0])
            row["peak_memory_bytes"], self.held_bytes[candidate] = int(peak), int(held)
            self.step_bytes[candidate] = max(row["peak_memory_bytes"] - self.held_bytes[candidate], 0)
            if candidate == Candidate():
                self.calibration = calibrate(tracker, row["peak_memory_bytes"], self.size, self.num_blocks,
                                              inputs_bytes or None)
                self.calibration.update(partitionable_bytes(trial.tracked, trial.optimizer))
                sizes = [key for key in self.calibration if key.endswith(("_bytes", "_per_sample", "_fraction"))]
                self.calibration.update(zip(sizes, self.ranks.max([self.calibration[key] for key in sizes])))
                row["predicted_memory_bytes"] = predict(self.calibration, candidate, self.size, self.ranks.world_size)
                self.trials[candidate] = trial
                self.timing()  # windows sized to its step now, so that the budget's estimates use them
            self.trials[candidate] = trial
            self.first_loss[candidate] = self.ranks.mean([trial.first_loss])[0]
            ran.append(candidate)
            del measured, trial, tracker  # a released copy must not live on here while the next is built
        base_loss = self.first_loss[Candidate()]
        for candidate in ran:
            row, loss = self.rows[candidate], self.first_loss[candidate]
            row["loss_rel_diff"] = diff = abs(loss - base_loss) / max(abs(base_loss), 1e-12)
            if not math.isfinite(loss) or diff > loss_tolerance(candidate):
                row["rejected_because"] = (f"quality: the probe batch's loss at the initial weights differs from "
                                           f"fp32's by {diff:.2e} "
                                           f"(allowed {loss_tolerance(candidate):.0e})")
        return ran

    def _measure_one(self, candidate: Candidate, row: dict):
        """Builds the candidate's copy, a warm-up step, then one tracked step. Returns (trial,
        tracker, bytes resident before it was built, the baseline's block inputs or None), or
        None after an out-of-memory error (recorded in the row)."""
        others_bytes = resident_bytes(self.device)
        inputs_bytes, error = None, None
        graphs_before = graphs_compiled()
        try:
            trial, warmup_s = self._built(candidate)
            with contextlib.ExitStack() as stack:
                if candidate == Candidate() and self.num_blocks:
                    inputs_bytes = stack.enter_context(block_inputs_bytes(trial.model))
                # CUDA graphs: the allocator's peak only (the breakdown's dispatch mode would leave
                # the graphs replaying at eager speed in the timing that follows)
                tracker = stack.enter_context(MemoryTracker(trial.tracked, trial.optimizer, self.device,
                                                            breakdown=not candidate.config().cuda_graphs))
                started = clock.now()
                trial.step()
            self.step_s[candidate] = min(warmup_s, clock.now() - started)  # what the time budget expects of it
        except (torch.OutOfMemoryError, RuntimeError) as caught:
            if not is_out_of_memory(caught) and not candidate.compile and candidate.sdpa_backend == "auto":
                raise
            if is_out_of_memory(caught):
                error = f"out of memory: {str(caught).splitlines()[0][:120]}"
            elif candidate.compile:  # compiling (or capturing CUDA graphs) failed: a speed option that does not run here
                error = f"failed: compiling: {type(caught).__name__}: {str(caught).splitlines()[0][:160]}"
            else:  # no such attention kernel for this model's call (e.g. flash with an explicit mask)
                error = (f"failed: {candidate.sdpa_backend} attention does not run this model's attention: "
                         f"{(str(caught).splitlines() or [''])[0][:160]}")
        except Exception as caught:  # torch.compile's own errors (dynamo, inductor) are not RuntimeErrors
            if not candidate.compile:
                raise
            error = f"failed: compiling: {type(caught).__name__}: {(str(caught).splitlines() or [''])[0][:160]}"
        if not self.ranks.all(error is None):  # on every process, or on none
            row["rejected_because"] = error or "failed or out of memory: on another process"
            trial = tracker = None
            release(self.device)
            return None
        if candidate.compile:  # the compiling step, whole: compilation plus one step (the slowest process's)
            row["compile_s"] = self.ranks.max([warmup_s])[0]
            self.compile_s += row["compile_s"]
            if self.ranks.all(graphs_compiled() > graphs_before):
                self.compiled_modes.add(candidate.compile_mode)
            elif candidate.compile_mode not in self.compiled_modes:
                # dynamo's cache handed it the code another candidate compiled in another mode: not a
                # measurement of itself (the same mode's code, reused, is what it would compile)
                row["rejected_because"] = ("failed: compiling: dynamo compiled no graph for it (another compiled "
                                           "candidate's code, cached in this process, ran instead)")
                trial = tracker = None
                release(self.device)
                return None
            row["run_compile_s"] = self._compiled_again_s(trial)
        return trial, tracker, others_bytes, (sum(inputs_bytes) / len(inputs_bytes) if inputs_bytes else None)

    def _compiled_again_s(self, trial: Trial) -> float:
        """The compiling step once more after dynamo has forgotten its code (`torch._dynamo.reset()`):
        what a run of this configuration pays when it compiles from the compile caches this plan
        filled (inductor's and AOTAutograd's, on disk: a run on this machine after the plan), the
        slowest process's. With those caches off it compiles from scratch, and says so by its seconds."""
        torch._dynamo.reset()
        started = clock.now()
        trial.step()
        return self.ranks.max([clock.now() - started])[0]

    def measure_estimate_s(self, candidate: Candidate) -> float:
        """The seconds the time budget expects building and measuring `candidate` to take (the
        last such measurement's; a compiled one's compiling on top), and then timing it in its first
        windows beside the baseline and the other candidates measured but not yet timed."""
        compiling = max([COMPILE_EXPECTED_S] + [r["compile_s"] or 0.0 for r in self.rows.values()]) if candidate.compile else 0.0
        untimed = [Candidate()] + [c for c in self.held_bytes if c != Candidate() and not self.windows_timed.get(c)]
        # the last measurement's seconds (the baseline's, the first, also built the memory model)
        measuring = self.measure_s[-1] if self.measure_s else 0.0
        return measuring + compiling + min(FIRST_WINDOWS, self.windows or FIRST_WINDOWS) * self.round_s(untimed + [candidate])

    def race_reserve_s(self) -> float:
        """The seconds a new candidate's measurement must leave for the race: `MIN_RACE_ROUNDS`
        rounds of the baseline, yours (`plan(base=...)`) and the fastest candidate timed so far."""
        timed = [c for c, row in self.rows.items() if row["speedup"] is not None and not row["rejected_because"]]
        fastest = max(timed, key=lambda c: self.rows[c]["speedup"], default=Candidate())
        pinned = [c for c in (Candidate(), self.yours(), fastest) if c is not None]
        return MIN_RACE_ROUNDS * self.round_s(list(dict.fromkeys(pinned)))

    def _built(self, candidate: Candidate, batch=None) -> tuple[Trial, float]:
        """A new copy of the candidate after one warm-up step (optimizer state allocated, kernels
        chosen or compiled), and that step's seconds; stepping `batch` (default: the probe batch)."""
        trial = Trial(candidate, self.model, self.optimizer_factory, self.batch if batch is None else batch,
                      self.loss_fn, self.device, self.loss_takes_model, world_size=self.ranks.world_size,
                      optimizer_takes_model=self.optimizer_takes_model)
        started = clock.now()
        trial.step()
        return trial, clock.now() - started

    def _make_room(self, need_bytes: float, keep: Sequence[Candidate]) -> None:
        """Releases the copies least recently used (not those in `keep`) until what the rest hold
        plus `need_bytes` fits in the capacity (nothing is released without one)."""
        if self.capacity_bytes is None:
            return
        released = False
        for candidate in list(self.trials):
            if sum(self.held_bytes[c] for c in self.trials) + need_bytes <= self.capacity_bytes:
                break
            if candidate not in keep:
                del self.trials[candidate]
                released = True
        if released:
            release(self.device)

    def _release_copies(self, keep: Sequence[Candidate]) -> None:
        """Releases every copy but those in `keep` (after an out-of-memory error: with or without a
        capacity, the other copies may be what was in the way)."""
        for candidate in [c for c in self.trials if c not in keep]:
            del self.trials[candidate]
        release(self.device)

    def trial(self, candidate: Candidate) -> Trial:
        """The candidate's copy, built again (with a warm-up step) if it was released for room."""
        self._ensure([candidate])
        return self.trials[candidate]

    def twin_trial(self, candidate: Candidate) -> Trial:
        """A copy of a k = 1 candidate that steps the probe batch twice over in two micro-batches
        of its size (after a warm-up step), so that a step's first micro-batch, which exchanges no
        gradients, can be timed apart from the last. Built beside the copies that fit with it."""
        self._make_room(self.held_bytes[candidate] + self.step_bytes[candidate], keep=())
        twice = tuple(torch.cat([tensor, tensor]) for tensor in self.batch)
        return self._built(candidate.replace(k=2), batch=twice)[0]

    def _ensure(self, group: Sequence[Candidate]) -> None:
        """Every copy of `group` built, the others released as far as the group needs the room."""
        missing = [c for c in group if c not in self.trials]
        need = sum(self.held_bytes[c] for c in missing) + max(self.step_bytes[c] for c in group)
        self._make_room(need, keep=group)
        for candidate in missing:
            self._say(f"building again (released for room): {candidate.name}")
            self.trials[candidate], _ = self._built(candidate)
            self.rebuilt += 1
        for candidate in group:  # most recently used last
            self.trials[candidate] = self.trials.pop(candidate)

    def pair_with_yours(self) -> None:
        """Each timed row's speed over the caller's configuration's (`plan(base=...)`), paired round
        by round (`vs_yours`, `vs_yours_ci_low`, `vs_yours_ci_high`, `vs_yours_rounds`; None where
        the two share fewer than two rounds). Where yours is the fp32 baseline, its speedup is that."""
        yours = self.yours()
        if yours is None:
            return
        for candidate, row in self.rows.items():
            paired = None if candidate == yours or row["speedup"] is None else self.paired_between(candidate, yours)
            if candidate != yours and yours == Candidate() and row["speedup"] is not None:
                paired = {"mean": row["speedup"], "ci_low": row["speedup_ci_low"], "ci_high": row["speedup_ci_high"],
                          "n": row["timed_windows"]}
            row.update(vs_yours=paired and paired["mean"], vs_yours_ci_low=paired and paired["ci_low"],
                       vs_yours_ci_high=paired and paired["ci_high"], vs_yours_rounds=paired and paired["n"])

    def paired_by_name(self, a: str, b: str) -> dict | None:
        """`paired_between` for two candidates named as their rows name them."""
        by_name = {c.name: c for c in self.rows}
        return self.paired_between(by_name[a], by_name[b]) if a in by_name and b in by_name else None

    def chosen_rows(self, weights, min_k: int) -> list[dict] | None:
        """The rows measured so far with eq. 3's choice marked on them (None when nothing fits yet);
        those dropped from the race stay out."""
        self.pair_with_yours()
        rows = [measured_part(row, keep_dropped=True) for row in self.rows.values()]
        try:
            choose(rows, self.budget, weights, min_k=min_k, run_samples=self.run_samples,
                   margin=tie_margin(self.device.type), paired=self.paired_by_name)
        except ValueError:
            return None
        return rows

    def best(self, *, weights, min_k: int = 1) -> Candidate | None:
        """The current choice among what is measured so far (None when nothing fits yet)."""
        rows = self.chosen_rows(weights, min_k)
        return None if rows is None else candidate_of(next(row for row in rows if row.get("chosen")))

    def near_ties(self, *, weights, min_k: int = 1, most: int = NEAR_TIES) -> list[Candidate]:
        """The current choice and the candidates whose eq. 3 cost interval overlaps its, the lowest
        cost first, `most` in all; [] when no other is within the timing noise of the choice."""
        rows = self.chosen_rows(weights, min_k)
        if rows is None:
            return []
        chosen = next(row for row in rows if row.get("chosen"))
        tied = sorted((row for row in rows if row["feasible"] and row is not chosen
                       and cost_intervals_overlap(row, chosen)), key=lambda row: row["cost"])
        return [candidate_of(row) for row in [chosen] + tied[:most - 1]] if tied else []


def graphs_compiled() -> int:
    """How many graphs torch.compile (dynamo) has compiled in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
