"""The measurements one `plan()` call makes: each candidate built on its own copy of the model,
its peak memory from one tracked step (after the memory model -- eqs. 8/19, calibrated on the
baseline's step -- had the chance to prune it), its probe-batch loss, and its speed in
interleaved timing windows paired with the fp32 baseline's."""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Sequence

import torch

from ..checkpointing import block_sequence, expected_saved_fraction, has_block_sequence
from ..compose import prepare
from ..measure.energy import EnergyMeter
from ..measure.memory import MemoryTracker, resident_bytes
from ..measure.stats import paired_ratio, summarize
from ..measure.timing import Timer, interleaved_windows
from .choice import choose, measured_part
from .space import Candidate, candidate_of

PRUNE_MARGIN = 1.25       # a prediction this far over the budget is not worth measuring
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}  # |loss - fp32 loss| / |fp32 loss| on the probe batch


def _micro_batches(batch: Sequence[torch.Tensor], k: int) -> list[tuple[torch.Tensor, ...]]:
    return list(zip(*(tensor.chunk(k) for tensor in batch)))


class Trial:
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


class Search:
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
        self.trials: dict[Candidate, Trial] = {}
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
            others_bytes = resident_bytes(self.device)
            try:
                trial = Trial(candidate, self.model, self.optimizer_factory, self.batch, self.loss_fn, self.device,
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

    def best(self, *, weights, min_k: int = 1) -> Candidate | None:
        """The current choice among what is measured so far (None when nothing fits yet)."""
        rows = [measured_part(row) for row in self.rows.values()]
        try:
            choose(rows, self.budget, weights, min_k=min_k, run_samples=self.run_samples)
        except ValueError:
            return None
        return candidate_of(next(row for row in rows if row.get("chosen")))


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
