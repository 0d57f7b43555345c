"""Fake timing for plan() tests that check what it chooses: no choice may depend on how busy the
machine is. `FakeWindows` stands in for the planner's interleaved timing windows (each candidate's
rate per window from a table, never measured); `FakeClock` for the planning time budget's clock,
advanced by fake step seconds instead of the machine's."""
from __future__ import annotations

from collections import Counter


class FakeWindows:
    """Replaces `trainopt_core.planner.search.interleaved_windows`: candidate `name`'s rate in its
    i-th window is `rates[name][i % len(rates[name])]` (a name not in `rates`: `default`), counted
    over every call, so a candidate timed in several rounds continues its sequence. With a
    `clock`, each window advances it by `step_s(name)` × steps per window (a fake slow step)."""

    def __init__(self, rates: dict[str, list[float]], default=(5.0, 5.1, 4.9), clock=None, step_s=None):
        self.rates, self.default, self.clock, self.step_s = rates, list(default), clock, step_s
        self.timed = Counter()  # windows per candidate name
        self.calls: list[list[str]] = []  # the names timed together, call by call

    def __call__(self, steps, *, windows, steps_per_window, progress=None, **kwargs):
        self.calls.append(list(steps))
        out = {}
        for name in steps:
            rates = self.rates.get(name, self.default)
            out[name] = [rates[(self.timed[name] + i) % len(rates)] for i in range(windows)]
            self.timed[name] += windows
            if self.clock is not None:
                self.clock.advance(windows * steps_per_window * self.step_s(name))
            if progress is not None:
                for _ in range(windows):
                    progress()
        return out


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def use_fake_windows(monkeypatch, rates: dict[str, list[float]], **kwargs) -> FakeWindows:
    import trainopt_core.planner.search as search

    fake = FakeWindows(rates, **kwargs)
    monkeypatch.setattr(search, "interleaved_windows", fake)
    return fake
