"""Fake timing for plan() tests that check what it chooses: no choice may depend on how busy the
machine is. `FakeWindows` stands in for the planner's interleaved timing windows (each candidate's
rate per window from a table, never measured); `FakeClock` for the planning time budget's clock,
advanced by fake step seconds instead of the machine's (`slow_steps`)."""
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


def without_energy_counter(monkeypatch) -> None:
    """plan()'s energy counter unreadable, as on most machines: where RAPL is readable the planner
    runs extra steps per candidate to measure energy, which would move a fake clock's budget."""
    import functools

    import trainopt_core.planner.search as search
    import trainopt_core.planner.timing as timing
    from trainopt_core.measure.energy import EnergyMeter

    unreadable = functools.partial(EnergyMeter, rapl_root="/nonexistent/powercap")
    monkeypatch.setattr(search, "EnergyMeter", unreadable)
    monkeypatch.setattr(timing, "EnergyMeter", unreadable)


def use_fake_windows(monkeypatch, rates: dict[str, list[float]], **kwargs) -> FakeWindows:
    import trainopt_core.planner.timing as timing

    without_energy_counter(monkeypatch)
    fake = FakeWindows(rates, **kwargs)
    monkeypatch.setattr(timing, "interleaved_windows", fake)
    return fake


def slow_steps(monkeypatch, step_s) -> FakeClock:
    """The time budget's clock made a FakeClock that every real step of a candidate's copy (its
    warm-up and tracked steps) advances by `step_s(candidate name)` seconds; returns the clock."""
    import trainopt_core.planner.budget as budget
    from trainopt_core.planner.trial import Trial

    without_energy_counter(monkeypatch)
    clock = FakeClock()
    monkeypatch.setattr(budget, "now", clock)
    real_step = Trial.step

    def step(self):
        clock.advance(step_s(self.candidate.name))
        return real_step(self)

    monkeypatch.setattr(Trial, "step", step)
    return clock


def without_time_budget(monkeypatch) -> None:
    """plan()'s default planning time budget off: what a test checks must not depend on how busy
    the machine is (the budget itself is tested on a fake clock, tests/test_plan_budget.py)."""
    from trainopt_core.planner import plan

    monkeypatch.setitem(plan.__kwdefaults__, "time_budget_s", None)
