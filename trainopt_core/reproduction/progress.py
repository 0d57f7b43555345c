"""Progress lines for the reproduction's long steps: planning, training, timing.

A notebook cell that trains or times for minutes must not look dead. `say` prints one line (on
the cell's output, which JupyterLab shows as it comes and papermill shows with `--log-output`)
and appends it to the file named by $TRAINOPT_PROGRESS_LOG (`./run_all.sh` follows that file on
the terminal). While a `step` runs, a heartbeat says what runs and for how long whenever nothing
was said for `HEARTBEAT_S` seconds; the innermost step's `detail` (samples trained, windows
timed) goes with it.

    with progress.step("planning cifar10"):
        ...                        # a line at least every HEARTBEAT_S seconds
        progress.detail("stage 2")
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time

HEARTBEAT_S = 30.0
PROGRESS_LOG = "TRAINOPT_PROGRESS_LOG"  # a file ./run_all.sh shows on the terminal while a notebook runs


class _State:
    def __init__(self):
        self.steps: list[tuple[str, float]] = []  # (label, start), outermost first
        self.detail = ""
        self.last_said = 0.0
        self.out = None  # the real stdout while a step's own prints are taken as progress lines
        self.lock = threading.Lock()


_state = _State()
_clock = time.monotonic


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def say(line: str) -> None:
    """One progress line: printed, and appended to $TRAINOPT_PROGRESS_LOG when set."""
    with _state.lock:
        print(line, file=_state.out or sys.stdout, flush=True)
        path = os.environ.get(PROGRESS_LOG)
        if path:
            with open(path, "a") as handle:
                handle.write(f"  {line}\n")
        _state.last_said = _clock()


def detail(text: str) -> None:
    """What the innermost step is doing now (the next heartbeat line says it)."""
    _state.detail = text


def heartbeat_line(now: float) -> str:
    """What a heartbeat says at `now`: the steps running, the innermost's time so far, its detail."""
    labels = [label for label, _ in _state.steps if label]
    start = next((start for label, start in reversed(_state.steps) if label), _state.steps[0][1])
    doing = " · ".join(labels) if labels else "still running"
    return f"… {doing}: {minutes(now - start)} so far" + (f"; {_state.detail}" if _state.detail else "")


class Heartbeat:
    """Says `heartbeat_line` whenever nothing was said for `interval_s` seconds while steps run
    (`check`, called by a thread every `poll_s`; a test calls it with its own clock)."""

    def __init__(self, interval_s: float = HEARTBEAT_S, poll_s: float | None = None):
        self.interval_s = interval_s
        self.poll_s = poll_s if poll_s is not None else min(1.0, interval_s / 10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainopt-heartbeat", daemon=True)

    def check(self, now: float) -> bool:
        with _state.lock:  # a step may end meanwhile
            due = bool(_state.steps) and now - _state.last_said >= self.interval_s
            line = heartbeat_line(now) if due else None
        if line is not None:
            say(line)
        return line is not None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check(_clock())

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def step(label: str, *, interval_s: float | None = None):
    """A long step: heartbeats name it while it runs, at least every `interval_s` seconds
    (default `HEARTBEAT_S`). The outermost step runs the heartbeat; steps inside it add their
    label. An empty label adds none (a notebook cell)."""
    outermost = not _state.steps
    with _state.lock:
        _state.steps.append((label, _clock()))
        _state.detail = ""
        if outermost:  # the first heartbeat comes `interval_s` after the step began
            _state.last_said = _clock()
    beat = Heartbeat(interval_s or HEARTBEAT_S).start() if outermost else None
    try:
        yield
    finally:
        with _state.lock:
            _state.steps.pop()
            _state.detail = ""
        if beat is not None:
            beat.stop()


class _Lines(io.TextIOBase):
    """A stream whose complete lines are said as progress lines."""

    def __init__(self):
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line.strip():
                say(line)
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def prints_as_progress():
    """What the block prints (a library's own progress lines: `plan(progress=True)`) is said as
    progress lines, so it reaches $TRAINOPT_PROGRESS_LOG too."""
    if _state.out is not None:  # already inside such a block
        yield
        return
    lines, _state.out = _Lines(), sys.stdout
    try:
        with contextlib.redirect_stdout(lines):
            yield
    finally:
        if lines.pending.strip():
            say(lines.pending)
        _state.out = None


__all__ = ["HEARTBEAT_S", "Heartbeat", "PROGRESS_LOG", "detail", "heartbeat_line", "minutes", "prints_as_progress",
           "say", "step"]
