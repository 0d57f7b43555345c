"""Time, throughput and time-to-target (SPEC §4): what the tables' time columns are made of.

Timings are synchronized with the device (queued CUDA work counts), throughput leaves out the
warm-up steps and evaluation, and time-to-target interpolates the first crossing of the target.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Sequence

import torch

from .._errors import fail as _fail


def synchronize(device) -> None:
    """Wait for queued CUDA work, so that wall-clock readings include it."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- time
def elapsed_s(start: float, device: torch.device | str | None = None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds since `start` (a `clock()` reading), after waiting for queued CUDA work."""
    synchronize(device)
    return clock() - start


class Timer:
    """Wall time of a block; on CUDA synchronized at both boundaries so queued kernels count.

        with Timer(device) as timer: step()
        timer.elapsed_s
    """

    def __init__(self, device: torch.device | str | None = None, clock: Callable[[], float] = time.perf_counter):
        self.device = device
        self.clock = clock
        self.elapsed_s: float | None = None

    def __enter__(self) -> "Timer":
        synchronize(self.device)
        self._start = self.clock()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.elapsed_s = elapsed_s(self._start, self.device, self.clock)


class ThroughputMeter:
    """Training items (images or tokens) per second of training time (SPEC §4).

    Only training steps are timed (evaluation happens outside them and is never counted), and
    the first `warmup_steps` steps (allocator growth, kernel selection, thread-pool start) are
    left out of the rate. Time a step with `with meter.step(num_items): ...`, or time it
    yourself and call `add_step(num_items, step_s)`.
    """

    def __init__(self, warmup_steps: int = 2, device: torch.device | str | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            _fail("warmup_steps", warmup_steps, "an integer >= 0")
        self.warmup_steps = warmup_steps
        self.device = device
        self.clock = clock
        self.steps = 0
        self.training_time_s = 0.0      # every step, warm-up included (x-axis of quality curves)
        self.training_items = 0
        self.measured_time_s = 0.0      # steps after warm-up: the throughput's denominator
        self.measured_items = 0

    @contextlib.contextmanager
    def step(self, num_items: int):
        timer = Timer(self.device, self.clock)
        with timer:
            yield timer
        self.add_step(num_items, timer.elapsed_s)

    def add_step(self, num_items: int, step_s: float) -> None:
        if num_items < 0:
            _fail("num_items", num_items, "a count >= 0")
        if not (step_s >= 0 and math.isfinite(step_s)):
            _fail("step_s", step_s, "a finite duration >= 0")
        self.steps += 1
        self.training_time_s += step_s
        self.training_items += num_items
        if self.steps > self.warmup_steps:
            self.measured_time_s += step_s
            self.measured_items += num_items

    def items_per_s(self) -> float | None:
        """Items per second after warm-up; None until a step past the warm-up was timed."""
        if self.measured_time_s <= 0:
            return None
        return self.measured_items / self.measured_time_s

    def to_dict(self) -> dict:
        return dict(items_per_s=self.items_per_s(), steps=self.steps, warmup_steps=self.warmup_steps,
                    measured_items=self.measured_items, measured_time_s=self.measured_time_s,
                    training_items=self.training_items, training_time_s=self.training_time_s)


# ----------------------------------------------------------------------------- time-to-target
def time_to_target(history_times_s: Sequence[float], history_quality: Sequence[float], target: float,
                   higher_is_better: bool = True) -> float | None:
    """Training time at which quality first reaches `target`, or None if it never does.

    Quality is evaluated at a fixed cadence; the crossing between the two evaluations that
    bracket it is linearly interpolated (an evaluation exactly at the target returns its time;
    a target met at the first evaluation returns that evaluation's time). Accuracy uses
    `higher_is_better=True` (quality >= target), perplexity False (quality <= target).
    Non-finite qualities (a diverged run) never meet the target.
    """
    times, qualities = list(history_times_s), list(history_quality)
    if len(times) != len(qualities):
        _fail("history_quality", f"{len(qualities)} values", f"as many values as history_times_s ({len(times)})")
    if any(later < earlier for earlier, later in zip(times, times[1:])):
        _fail("history_times_s", times, "non-decreasing times")
    if not math.isfinite(target):
        _fail("target", target, "a finite number")

    def met(q) -> bool:
        return q is not None and math.isfinite(q) and (q >= target if higher_is_better else q <= target)

    for i, quality in enumerate(qualities):
        if not met(quality):
            continue
        previous = qualities[i - 1] if i > 0 else None
        if quality == target or previous is None or not math.isfinite(previous) or previous == quality:
            return float(times[i])
        fraction = (target - previous) / (quality - previous)
        return float(times[i - 1] + fraction * (times[i] - times[i - 1]))
    return None


# ----------------------------------------------------------------------------- interleaved windows
def interleaved_windows(workloads: dict[str, Callable[[], float]], *, windows: int, steps_per_window: int,
                        warmup_steps: int = 1, device: torch.device | str | None = None,
                        clock: Callable[[], float] = time.perf_counter, progress=None) -> dict[str, list[float]]:
    """Items per second of each workload in `windows` timing windows, taken in turn in one
    process: A, B, C, then B, C, A, ... (the order rotates each round, so no workload always
    runs right after the same other one). A change in the machine's state (another process, a
    frequency change) then hits every workload instead of one.

    Each workload is a callable running one step and returning the items it processed. Each runs
    `warmup_steps` untimed steps first; a window is `steps_per_window` steps timed together
    (synchronized with the device). Returns {name: [items/s per window]}, window i of every
    workload taken in the same round. `progress` (optional) is called with no argument after
    each window.
    """
    for argument, value, low in (("windows", windows, 1), ("steps_per_window", steps_per_window, 1),
                                 ("warmup_steps", warmup_steps, 0)):
        if not isinstance(value, int) or value < low:
            _fail(argument, value, f"an integer >= {low}")
    if not workloads:
        _fail("workloads", workloads, "a non-empty {name: step callable} dict")
    names = list(workloads)
    for name in names:
        for _ in range(warmup_steps):
            workloads[name]()
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(windows):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            items = 0.0
            with Timer(device, clock) as timer:
                for _ in range(steps_per_window):
                    items += workloads[name]()
            rates[name].append(items / timer.elapsed_s if timer.elapsed_s > 0 else math.nan)
            if progress is not None:
                progress()
    return rates
