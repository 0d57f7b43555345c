"""Peak memory of a run's training steps, and apart from them of its evaluations (SPEC §4).

CUDA: the caching allocator's `max_memory_allocated` (and `max_memory_reserved`) between a reset
at the start of a training step and its end is the step's peak; `PeakMemory` keeps the largest
step's peak, and the evaluations' peak apart.
Any device (the only source on CPU): the live-tensor `MemoryTracker` (`measure.tracker`) around
the steps chosen for it, with its breakdown by what the memory holds.
`cpu_allocator_reading` is an outside check of the tracker on a CPU: the c10 allocator's count
in a profiled span.
"""
from __future__ import annotations

import contextlib

import torch

from .tracker import SOURCE_CUDA, SOURCE_TRACKER, MemoryTracker

def resident_bytes(device: torch.device | str) -> int:
    """What a CUDA device's allocator holds now (0 elsewhere). A `MemoryTracker` on CUDA reads the
    allocator's whole peak, so a caller measuring one of several models held together subtracts
    what was resident before building it."""
    device = torch.device(device)
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def cpu_allocator_reading(prof, mark: str) -> dict[str, int]:
    """What the c10 CPU allocator held in the `record_function(mark)` span of a finished
    `torch.profiler.profile(profile_memory=True)`: {"at_start_bytes", "peak_bytes"}, counted from
    the profiler's start (blocks allocated before it are not in the count). An outside check of
    `MemoryTracker` on a CPU. The profiler sees a free only on a thread it profiles, so a block
    another thread frees (gloo's workers drop finished collectives' tensors) stays counted: a
    reading can be high, never low."""
    from torch._C._profiler import _EventType

    events, spans = [], []  # (time, live bytes after it, size) of every CPU allocation and free

    def walk(node):
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.total_allocated, node.extra_fields.alloc_size))
        elif node.name == mark:
            spans.append((node.start_time_ns, node.end_time_ns))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    if len(spans) != 1 or not events:
        raise ValueError(f"mark={mark!r}: allowed the name of one record_function span in a profile with "
                         f"profile_memory=True (found {len(spans)} spans, {len(events)} allocations)")
    events.sort()
    (start, end), = spans
    offset = events[0][1] - events[0][2]  # the count is the process's: from 0 where profiling began
    at_start = max([total - offset for t, total, _ in events if t < start][-1:] or [0])
    return {"at_start_bytes": at_start,
            "peak_bytes": max([at_start] + [total - offset for t, total, _ in events if start <= t <= end])}


class PeakMemory:
    """Peak memory of a run's training steps, and separately of its evaluations.

        memory = PeakMemory(device)
        with memory.training_step():     # every optimizer step (its micro-batches and update)
            ...
        with memory.evaluation():        # every evaluation pass
            ...
        memory.peak_bytes(), memory.evaluation_peak_bytes(), memory.breakdown()

    `peak_bytes()` is what the runner reports as "peak memory": the largest peak of a single
    training step. Evaluation is measured apart because it is not what the paper's techniques
    change and can dwarf the step (GPT-2 evaluated at sequence 1024 holds several GB of logits).

    CUDA (`source` "cuda_max_memory_allocated"): each phase resets the allocator's peak
    statistics on entry (`torch.cuda.reset_peak_memory_stats`) and reads `max_memory_allocated`
    after a synchronize on exit; `peak_bytes()` is the maximum over training steps (and over the
    steps measured with `track_step`), `evaluation_peak_bytes()` the maximum over evaluations. A
    phase's peak includes what was already allocated when it began (model, optimizer state,
    cached batches), so it is directly a device-memory requirement. Memory reserved by the
    caching allocator is not released between phases: `peak_reserved_bytes()` of a training
    step can include blocks an earlier evaluation left cached.

    CPU (`source` "cpu_live_tensor_tracker"): `peak_bytes()` is the largest peak of the steps
    measured with `track_step` (a live-tensor tracker wraps only those steps; it is too slow for
    every step); `training_step()` and `evaluation()` measure nothing there and
    `evaluation_peak_bytes()` is None.

    The breakdown is the tracker's breakdown at the peak of the tracked step with the highest
    peak. A `track_step` tracker may be entered inside `training_step()` or around it. Phases do
    not nest in each other.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.source = SOURCE_CUDA if self.device.type == "cuda" else SOURCE_TRACKER
        self.evaluation_source = SOURCE_CUDA if self.device.type == "cuda" else None
        self.tracks_live_tensors = True
        self.training_steps_measured = 0
        self.evaluations_measured = 0
        self._tracked: list[MemoryTracker] = []
        self._training_peak_bytes: int | None = None
        self._training_reserved_bytes: int | None = None
        self._evaluation_peak_bytes: int | None = None
        self._phase: str | None = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    # ------------------------------------------------------------------ phases
    @contextlib.contextmanager
    def _measure_phase(self, phase: str):
        if self._phase is not None:
            raise RuntimeError(f"PeakMemory.{phase}() entered inside PeakMemory.{self._phase}(): phases do not nest")
        self._phase = phase
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield self
        finally:
            self._phase = None
        if not cuda:
            return
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        if phase == "training_step":
            self.training_steps_measured += 1
            self._training_peak_bytes = max(self._training_peak_bytes or 0, peak)
            reserved = torch.cuda.max_memory_reserved(self.device)
            self._training_reserved_bytes = max(self._training_reserved_bytes or 0, reserved)
        else:
            self.evaluations_measured += 1
            self._evaluation_peak_bytes = max(self._evaluation_peak_bytes or 0, peak)

    def training_step(self):
        """Context around one optimizer step (all its micro-batches): its peak counts in `peak_bytes()`."""
        return self._measure_phase("training_step")

    def evaluation(self):
        """Context around one evaluation: its peak counts in `evaluation_peak_bytes()` only."""
        return self._measure_phase("evaluation")

    # ------------------------------------------------------------------ live-tensor tracker
    def track_step(self, model=None, optimizer=None, *, breakdown: bool = True) -> MemoryTracker:
        """A `MemoryTracker` for one step; hand it to `add_tracked` after its exit. `breakdown=False`
        (CUDA only; a step in CUDA graphs): the allocator's peak alone, no breakdown."""
        return MemoryTracker(model, optimizer, self.device, breakdown=breakdown)

    def add_tracked(self, tracker: MemoryTracker) -> None:
        """Adds a finished tracked step: its breakdown, and its peak to the training peak."""
        if tracker.peak_bytes is None:
            raise ValueError("tracker has not finished: add_tracked(tracker) needs a tracker after its `with` block")
        self._tracked.append(tracker)
        if self.device.type == "cuda":
            # The tracker's own reading covers the step only (it reset the allocator's peak on
            # entry); what came before it (`cuda_peak_before_bytes`: possibly an evaluation) is
            # deliberately left out.
            self._training_peak_bytes = max(self._training_peak_bytes or 0, tracker.peak_bytes)
            self._training_reserved_bytes = max(self._training_reserved_bytes or 0, tracker.peak_reserved_bytes or 0)

    # ------------------------------------------------------------------ results
    def peak_bytes(self) -> int | None:
        """Largest peak of one training step (bytes), evaluation excluded; None if no step was measured."""
        if self.device.type == "cuda":
            return self._training_peak_bytes
        return max((t.peak_bytes for t in self._tracked), default=None)

    def evaluation_peak_bytes(self) -> int | None:
        """Largest peak of one evaluation (CUDA, bytes); None on CPU or if no evaluation was measured."""
        return self._evaluation_peak_bytes

    def peak_reserved_bytes(self) -> int | None:
        """Largest `max_memory_reserved` of a training step (CUDA only, else None)."""
        if self.device.type != "cuda":
            return None
        return self._training_reserved_bytes

    def breakdown(self) -> dict[str, int] | None:
        """The breakdown at the peak of the tracked step with the highest peak; None if no step was
        tracked with a breakdown."""
        tracked = [t for t in self._tracked if t.breakdown]
        if not tracked:
            return None
        return dict(max(tracked, key=lambda t: t.tracked_peak_bytes).breakdown_at_peak)
