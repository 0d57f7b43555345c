"""Whether a claim held on this hardware: the rule every paper-vs-measured table applies.

Every measured change comes with its 95 % confidence interval (`results.measured_change`: over
seeds, over interleaved timing windows for throughput). A claim is judged only when the whole
interval is on one side of the rule; otherwise the verdict is "inconclusive" -- the measurement
cannot tell, and a rerun could land on either side. Verdicts are "held", "not held" (with what
was measured) or "inconclusive".

- a claimed *change* c (time, memory, throughput, FLOPs utilization) holds when the interval of
  the measured relative change lies entirely at or beyond half the claim, c/2, in the claimed
  direction; it is not held when the interval lies entirely short of c/2 (the wrong sign
  included).
- a claim of *comparable quality* (final accuracy / perplexity, §V-A: "within statistical noise
  (±0.5%)") holds when the interval lies within ±0.5 %; it is not held when the interval lies
  entirely outside ±0.5 %, saying whether the optimized run was better or worse.
- a claimed *scaling efficiency* e = T_n/(n·T_1) (Table IV) holds when the interval of the
  measured efficiency at that world size lies at or above e − 2 points, and is not held when it
  lies entirely below; modelled rows are never judged: they are not measurements.

A single value without an interval (one seed, for a per-seed quantity other than peak memory,
which is bit-identical across seeds and reruns) is always inconclusive.
"""
from __future__ import annotations

import math

from .._errors import fail as _fail


HOLD_FRACTION = 0.5            # at least half the claimed magnitude
COMPARABLE_TOLERANCE = 0.005   # paper §V-A: ±0.5 %
EFFICIENCY_TOLERANCE = 0.02    # Table IV: measured efficiency may fall 2 points short of the claim


# ------------------------------------------------------------------ the claim rule
def relative_change(baseline: float, optimized: float) -> float:
    """(optimized − baseline) / baseline; NaN when either is missing or the baseline is 0."""
    if baseline is None or optimized is None or not (math.isfinite(baseline) and math.isfinite(optimized)) or baseline == 0:
        return math.nan
    return (optimized - baseline) / abs(baseline)


def _unjudgeable(claimed, measured, ci) -> str | tuple[float, float]:
    """The verdict when there is nothing to judge (no claim, no measurement, no interval), else
    the sorted (low, high) interval."""
    if claimed is None or not math.isfinite(claimed):
        return "no claim"
    if measured is None or not math.isfinite(measured):
        return "not measured"
    if ci is None or any(v is None or not math.isfinite(v) for v in ci):
        return "inconclusive (no interval)"
    low, high = sorted(ci)
    return low, high


def claim_verdict(claimed_relative: float | None, measured_relative: float | None, *, ci=None, kind: str = "change",
                  higher_is_better: bool | None = None) -> str:
    """Did the claim hold on this hardware? (rule in the module docstring)

    `kind` is "change" (a claimed improvement) or "comparable" (a claimed equal quality); `ci`
    is the (low, high) 95 % interval of `measured_relative`; with `higher_is_better` given, a
    quality that is not comparable says whether the optimized run was better or worse.
    """
    if kind not in ("change", "comparable"):
        _fail("kind", kind, "'change' or 'comparable'")
    interval = _unjudgeable(claimed_relative, measured_relative, ci)
    if isinstance(interval, str):
        return interval
    low, high = interval
    if kind == "comparable":
        tolerance = COMPARABLE_TOLERANCE
        if -tolerance <= low and high <= tolerance:
            return "held"
        if high < -tolerance or low > tolerance:
            if higher_is_better is None:
                return "not held"
            better = (low > tolerance) == higher_is_better
            return f"not held: optimized {'better' if better else 'worse'} by more than {100 * tolerance:g} %"
        return "inconclusive"
    if claimed_relative == 0:
        return "no claim"
    sign = math.copysign(1, claimed_relative)
    low, high = sorted((sign * low, sign * high))  # in the claimed direction
    threshold = HOLD_FRACTION * abs(claimed_relative)
    if low >= threshold:
        return "held"
    if high < threshold:
        return "not held: the opposite direction" if high < 0 else "not held: under half the claimed change"
    return "inconclusive"


def time_to_target_verdict(verdict: str, censoring: dict | None) -> str:
    """`claim_verdict`'s verdict on a time to target, corrected for seeds that missed the target
    (`results.censored_seeds_ratio`), with what each seed counted as said in the verdict itself.
    A seed where only the other configuration missed enters at a bound that flatters it, so
    "held" cannot stand on it; one where only the baseline missed flatters the baseline, so "not
    held" cannot; one that missed in both is left out. A claim no seed pair informs is "not
    measured"."""
    if not censoring or not censoring["seeds"]:
        return verdict
    if censoring["seeds"] == censoring["both_missed"]:
        return f"not measured: no seed reached the target in either configuration (0 of {censoring['seeds']})"
    category = verdict_category(verdict)
    if (category == "held" and censoring["other_missed"]) or (category == "not held" and censoring["baseline_missed"]):
        verdict = "inconclusive"
    if censoring["reached"] == censoring["seeds"]:
        return verdict
    if verdict.endswith(")"):  # "inconclusive (no interval)": one pair of brackets
        return f"{verdict[:-1]}; {censoring_text(censoring)})"
    return f"{verdict} ({censoring_text(censoring)})"


def censoring_text(censoring: dict) -> str:
    """What the seeds of a time-to-target ratio counted as, in words: "1 of 3 seeds reached the
    target in both; 1 that missed only in this configuration counts at its run's length, a bound;
    1 that missed in both is left out"."""
    def that(n: int, where: str, what: str) -> str:
        verb = ("counts", "is") if n == 1 else ("count", "are")
        return f"{n} that missed {where} {verb[0] if what.startswith('at') else verb[1]} {what}"

    parts = [f"{censoring['reached']} of {censoring['seeds']} seeds reached the target in both"]
    if censoring["other_missed"]:
        parts.append(that(censoring["other_missed"], "only in this configuration", "at its run's length, a bound"))
    if censoring["baseline_missed"]:
        parts.append(that(censoring["baseline_missed"], "only in the baseline", "at the baseline's run's length, a bound"))
    if censoring["both_missed"]:
        parts.append(that(censoring["both_missed"], "in both", "left out"))
    return "; ".join(parts)


def efficiency_verdict(claimed: float | None, measured: float | None, *, ci=None, modelled: bool = False) -> str:
    """Did a claimed scaling efficiency hold? (rule in the module docstring)"""
    if modelled:
        return "modelled, not judged"
    interval = _unjudgeable(claimed, measured, ci)
    if isinstance(interval, str):
        return interval
    floor = claimed - EFFICIENCY_TOLERANCE
    if interval[0] >= floor:
        return "held"
    if interval[1] < floor:
        return f"not held: {100 * (claimed - interval[1]):.1f}+ points lower"
    return "inconclusive"


def verdict_category(verdict: str) -> str:
    """"held", "not held", "inconclusive", "not measured" (with or without its reason), or the
    verdict itself (no claim ...)."""
    for category in ("not held", "held", "inconclusive", "not measured"):
        if verdict.startswith(category):
            return category
    return verdict
