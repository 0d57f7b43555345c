"""`plan()`'s time budget: what is left of it, whether the next piece of work fits, and what was
left out to keep within it, in words for the plan's notes.

On a busy 2-core CPU a step can take ten times its idle time or more, and planning that times
every candidate in full took 402.7 s for a smoke `auto` run under load 5-8 (358.9 s of it in
precision × split). With a budget each piece of work -- building and measuring a candidate, a
round of timing windows, a round of re-timing near ties, a stage -- starts only where its
estimate (the last such piece's seconds, on this clock) fits in what is left, so planning ends
within about one such piece of its budget; what was cut short is said (`left_out`)."""
from __future__ import annotations

import math
import time
from typing import Sequence


def now() -> float:
    """The budget's clock (tests replace it with a fake one)."""
    return time.perf_counter()


class TimeBudget:
    """Seconds planning may take (None: no limit) from when it was made."""

    def __init__(self, budget_s: float | None):
        self.budget_s = budget_s
        self.started = now()
        self.left_out: dict[str, list[str]] = {}  # what was cut short: {what: [candidates]}

    def elapsed_s(self) -> float:
        return now() - self.started

    def left_s(self) -> float:
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed_s()

    def allows(self, seconds: float) -> bool:
        """Whether work estimated at `seconds` fits in what is left."""
        return seconds <= self.left_s()

    def cut(self, what: str, names: Sequence[str] = ()) -> None:
        """Records `what` was left out to keep within the budget, and of which candidates."""
        entry = self.left_out.setdefault(what, [])
        entry += [name for name in names if name not in entry]

    def note(self) -> str | None:
        """The plan's note on what the budget left out (None when nothing was)."""
        if not self.left_out:
            return None
        parts = [what + (": " + ", ".join(repr(name) for name in names) if names else "")
                 for what, names in self.left_out.items()]
        return (f"Planning time budget {self.budget_s:g} s (time_budget_s), {self.elapsed_s():.1f} s used; to keep "
                "within it: " + "; ".join(parts) + ".")
