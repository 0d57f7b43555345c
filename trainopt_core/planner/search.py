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
peaks together, the allocator's fragmentation) is timed again in halves from new copies, down
to a candidate beside the baseline alone, which is then rejected as out of memory.

On more than one process (a torch.distributed group) every candidate trains data parallel --
DDP, or DeepSpeed at its ZeRO stage -- and the processes agree on each measurement before it
decides anything (`ranks.py`), so that they build and time the same candidates."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Sequence

import torch

from ..checkpointing import block_sequence, has_block_sequence
from ..measure.energy import EnergyMeter
from ..measure.memory import resident_bytes
from ..measure.stats import paired_ratio, summarize
from ..measure.timing import Timer, interleaved_windows
from ..measure.tracker import MemoryTracker, state_bytes
from .choice import choose, cost_intervals_overlap, measured_part
from .memory_model import block_inputs_bytes, calibrate, default_capacity_bytes, partitionable_bytes, predict
from .ranks import Ranks
from .space import Candidate, candidate_of
from .trial import Trial

PRUNE_MARGIN = 1.25       # a prediction this far over the budget is not worth measuring
NEAR_TIES = 3             # candidates within the noise of the choice timed once more, the choice included
# |loss - fp32 loss| / |fp32 loss| on the probe batch; TF32 keeps fp16's 10-bit mantissa in its products
LOSS_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 3e-2, "fp16": 1e-2}


def loss_tolerance(candidate: Candidate) -> float:
    return LOSS_TOLERANCE["tf32" if candidate.tf32 and candidate.precision == "fp32" else candidate.precision]


# plan()'s default timing on CUDA, sized to the fp32 baseline's step: windows of at least
# WINDOW_TARGET_S (2 to MAX_STEPS_PER_WINDOW steps), and 5 windows instead of 3 for steps under
# SHORT_STEP_S. On an H200, 3 windows of 2 steps of ResNet-50's 27 ms step left its candidates'
# intervals 0.6-1.8x wide and chose fp32 TF32 with CUDA graphs (1.72x); 5 windows of 10 steps
# narrowed them to +-5-10 % and chose bf16 with them (2.72x). GPT-2 124M's steps (0.2-0.65 s)
# keep 3 windows of 2 steps, whose intervals were already +-1 %.
WINDOW_TARGET_S, SHORT_STEP_S, MAX_STEPS_PER_WINDOW = 0.25, 0.1, 20
CPU_TIMING = (3, 2)  # windows, steps per window: CPU steps are long, and planning time counts


def sized_timing(step_s: float, windows: int | None, steps_per_window: int | None) -> tuple[int, int]:
    """(windows, steps per window) for a device whose baseline step takes `step_s`; a value the
    caller gave is kept."""
    steps = steps_per_window or min(max(2, math.ceil(WINDOW_TARGET_S / max(step_s, 1e-9))), MAX_STEPS_PER_WINDOW)
    return windows or (5 if step_s < SHORT_STEP_S else 3), steps


class Search:
    """The measurements one `plan()` call makes: trials, rows, the memory model."""

    def __init__(self, model, optimizer_factory, batch, loss_fn, device, budget, windows, steps_per_window, progress,
                 loss_takes_model, run_samples=None, capacity_bytes=None, optimizer_takes_model=False):
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
        self.calibration = None
        self.compile_s = 0.0
        self.compiled_modes: set[str] = set()  # torch.compile modes this search compiled graphs in
        self.progress = progress
        probe = EnergyMeter(device).start()
        probe.stop()
        readable = self.ranks.all(probe.energy_j is not None)
        self.energy_source = probe.energy_source if readable else None
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
                if candidate in self.held_bytes:  # measured before (its copy perhaps released since)
                    ran.append(candidate)
                continue
            row = self.rows[candidate] = {
                "candidate": candidate.name, **dataclasses.asdict(candidate), "predicted_memory_bytes": None,
                "peak_memory_bytes": None, "loss_rel_diff": None, "seconds_per_sample": None, "speedup": None,
                "speedup_ci_low": None, "speedup_ci_high": None, "timed_windows": 0, "energy_j_per_sample": None,
                "compile_s": None, "speedup_over_run": None, "feasible": False, "cost": None, "cost_ci_low": None,
                "cost_ci_high": None, "rejected_because": None}
            if self.calibration is not None:
                row["predicted_memory_bytes"] = predicted = predict(self.calibration, candidate, self.size,
                                                                    self.ranks.world_size)
                if self.budget is not None and predicted > PRUNE_MARGIN * self.budget:
                    row["rejected_because"] = (f"pruned: eqs. 8/19 predict {predicted / 2**20:.1f} MiB, over "
                                               f"{PRUNE_MARGIN}x the budget")
                    continue
            self._say(f"memory: {candidate.name}")
            self._make_room(row["predicted_memory_bytes"] or 0, keep=(Candidate(),))  # in every timing group
            measured = self._measure_one(candidate, row)
            if measured is None and self.trials and not row["rejected_because"].startswith("failed"):
                # out of memory: perhaps only the other copies were in the way
                self._release_copies(keep=())
                measured = self._measure_one(candidate, row)
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
                trial.step()
        except (torch.OutOfMemoryError, RuntimeError) as caught:
            if not _is_out_of_memory(caught) and not candidate.compile and candidate.sdpa_backend == "auto":
                raise
            if _is_out_of_memory(caught):
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
            _release(self.device)
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
                _release(self.device)
                return None
        return trial, tracker, others_bytes, (sum(inputs_bytes) / len(inputs_bytes) if inputs_bytes else None)

    def _built(self, candidate: Candidate, batch=None) -> tuple[Trial, float]:
        """A new copy of the candidate after one warm-up step (optimizer state allocated, kernels
        chosen or compiled), and that step's seconds; stepping `batch` (default: the probe batch)."""
        trial = Trial(candidate, self.model, self.optimizer_factory, self.batch if batch is None else batch,
                      self.loss_fn, self.device, self.loss_takes_model, world_size=self.ranks.world_size,
                      optimizer_takes_model=self.optimizer_takes_model)
        started = time.perf_counter()
        trial.step()
        return trial, time.perf_counter() - started

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
            _release(self.device)

    def _release_copies(self, keep: Sequence[Candidate]) -> None:
        """Releases every copy but those in `keep` (after an out-of-memory error: with or without a
        capacity, the other copies may be what was in the way)."""
        for candidate in [c for c in self.trials if c not in keep]:
            del self.trials[candidate]
        _release(self.device)

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

    def timing_groups_of(self, candidates: Sequence[Candidate]) -> list[list[Candidate]]:
        """`candidates` (the baseline first) in groups that fit in the capacity together -- what
        they hold between steps plus the largest step's peak -- each group led by the baseline.
        One group without a capacity; a candidate that does not fit even beside the baseline alone
        is still timed beside it (its out-of-memory error, if any, is real)."""
        baseline, others = candidates[0], list(candidates[1:])
        if self.capacity_bytes is None or not others:
            return [list(candidates)]
        groups, group = [], [baseline]
        for candidate in others:
            together = group + [candidate]
            need = sum(self.held_bytes[c] for c in together) + max(self.step_bytes[c] for c in together)
            if need > self.capacity_bytes and len(group) > 1:
                groups.append(group)
                group = [baseline, candidate]
            else:
                group = together
        return groups + [group]

    def timing(self) -> tuple[int, int]:
        """(windows, steps per window); where `plan()` left them to the device (None), sized once
        to the fp32 baseline's step, the median of 3 timed after its warm-up, and agreed on by
        every process."""
        if self.windows is None or self.steps_per_window is None:
            baseline = Candidate()
            self._ensure([baseline])
            seconds = []
            for _ in range(3):
                with Timer(self.device) as timer:
                    self.trials[baseline].step()
                seconds.append(timer.elapsed_s)
            step_s = sorted(seconds)[1]
            sized = sized_timing(step_s, self.windows, self.steps_per_window)
            self.windows, self.steps_per_window = (int(v) for v in self.ranks.min(list(sized)))
            self.timing_note = (f"Timing: {self.windows} windows of {self.steps_per_window} steps, sized to the fp32 "
                                f"baseline's {1000 * step_s:.0f} ms step (windows of >= {WINDOW_TARGET_S} s; 5 windows "
                                f"for steps under {SHORT_STEP_S} s).")
            self._say(self.timing_note)
        return self.windows, self.steps_per_window

    def time(self, candidates: Sequence[Candidate]) -> None:
        """Times `candidates` (and the baseline) in interleaved windows; each row gets seconds
        per sample and its speedup over the baseline paired window by window, and energy per
        sample where a counter is readable (once per candidate). A candidate timed in several
        rounds keeps the windows of all of them (`timed_windows` counts them): a later round
        adds to its evidence instead of replacing it."""
        baseline = Candidate()
        names = [baseline] + [c for c in dict.fromkeys(candidates) if c != baseline and c in self.held_bytes]
        groups = self.timing_groups_of(names)
        split = len(groups) > 1
        while groups:  # the group whose copies are still built first: fewer copies built again
            group = min(groups, key=lambda g: sum(c not in self.trials for c in g))
            groups.remove(group)
            if self._timed_within_memory(group):
                continue
            # out of memory after all (steps' peaks together, the allocator's fragmentation): every
            # copy released (the one that failed may have stopped inside its step, its gradients half
            # accumulated), the group timed again in halves, each with the baseline
            split = True
            self.out_of_memory_splits += 1
            self._release_copies(keep=())
            others = group[1:]
            if len(others) > 1:
                groups += [[baseline] + others[:len(others) // 2], [baseline] + others[len(others) // 2:]]
            else:  # the baseline or the candidate: the baseline alone decides (raised if it is out of memory)
                if not self.windows_timed.get(baseline):
                    self._time_group([baseline])
                if not self.windows_timed.get(others[0]):  # timed in no earlier round either
                    self.rows[others[0]]["rejected_because"] = "out of memory: while timed beside the baseline alone"
        self.split_rounds += split

    def _timed_within_memory(self, group: list[Candidate]) -> bool:
        """Times the group; False if it ran out of memory (the baseline alone doing so is raised)."""
        try:
            self._time_group(group)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not _is_out_of_memory(error) or len(group) == 1:
                raise
            self._say(f"out of memory timing {len(group)} candidates: {str(error).splitlines()[0][:120]}")
            return False
        return True

    def _time_group(self, names: list[Candidate]) -> None:
        baseline = names[0]
        self._ensure(names)
        self.timing()  # the baseline's copy is built now: it is in every group
        self._say(f"timing {len(names)} candidates in {self.windows} interleaved windows")
        try:
            rates = interleaved_windows({c.name: self.trials[c].step for c in names}, windows=self.windows,
                                        steps_per_window=self.steps_per_window, warmup_steps=0, device=self.device)
            error = None
        except (torch.OutOfMemoryError, RuntimeError) as caught:
            if not _is_out_of_memory(caught):
                raise
            error = caught
        if not self.ranks.all(error is None):  # on every process, or on none
            raise error or torch.OutOfMemoryError("out of memory on another process while timing")
        # each window's rate: the slowest process's (a data-parallel step ends with its last process)
        flat = self.ranks.min([rate for c in names for rate in rates[c.name]])
        rates = {c.name: flat[i * self.windows:(i + 1) * self.windows] for i, c in enumerate(names)}
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
                # the geometric mean of the paired ratios, the statistic its interval is about (the
                # median of bimodal windows fell outside the mean's interval)
                row.update(speedup=ratio["mean"], speedup_ci_low=ratio["ci_low"], speedup_ci_high=ratio["ci_high"])
            if self.energy_source is not None and row["energy_j_per_sample"] is None:
                with EnergyMeter(self.device) as meter:
                    samples = sum(self.trials[candidate].step() for _ in range(self.steps_per_window))
                energy_j, samples = self.ranks.mean([meter.energy_j or 0.0, samples])  # every process's device
                row["energy_j_per_sample"] = None if meter.energy_j is None else energy_j / samples

    def chosen_rows(self, weights, min_k: int) -> list[dict] | None:
        """The rows measured so far with eq. 3's choice marked on them (None when nothing fits yet)."""
        rows = [measured_part(row) for row in self.rows.values()]
        try:
            choose(rows, self.budget, weights, min_k=min_k, run_samples=self.run_samples)
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


def _is_out_of_memory(error: BaseException) -> bool:
    message = str(error).lower()
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in message or "can't allocate memory" in message


def _release(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
