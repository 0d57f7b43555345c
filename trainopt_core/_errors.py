"""The one error of every argument check in the package: which value, what is allowed."""
from __future__ import annotations


def fail(argument: str, value, allowed: str) -> None:
    """Raise the ValueError `argument=value is invalid: allowed ...`."""
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


# The largest count (samples, steps, micro-batches, items) the package takes: float64 -- the LR
# schedule's arithmetic, the replicas' all-reduced totals -- holds every integer up to it exactly.
MAX_COUNT = 2**53
