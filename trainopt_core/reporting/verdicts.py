"""Whether a claim held on this hardware: the rule every paper-vs-measured table applies.

When does a claim hold? (`claim_verdict`)
- a claimed *change* (time, memory, throughput, FLOPs utilization) holds when the measured
  relative change has the claimed sign and at least half the claimed magnitude; the right sign
  with less than half the magnitude is "direction only"; the wrong sign is "not held".
- a claim of *comparable quality* (final accuracy / perplexity) holds when the measured relative
  change is within the paper's ±0.5 % (§V-A: "within statistical noise (±0.5%)"), or, with ≥ 2
  seeds per configuration, within two standard errors of the difference (statistical noise);
  otherwise "not held", saying whether the optimized run's quality was better or worse.
- a claimed *scaling efficiency* T_n/(n·T_1) (Table IV) holds when the measured efficiency at the
  same world size is at most 2 points below the paper's (`efficiency_verdict`); modelled rows are
  never judged: they are not measurements.
"""
from __future__ import annotations

import math

import pandas as pd

HOLD_FRACTION = 0.5            # at least half the claimed magnitude
COMPARABLE_TOLERANCE = 0.005   # paper §V-A: ±0.5 %
EFFICIENCY_TOLERANCE = 0.02    # Table IV: measured efficiency may fall 2 points short of the claim


def _fail(argument: str, value, allowed: str) -> None:
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


# ------------------------------------------------------------------ the claim rule
def relative_change(baseline: float, optimized: float) -> float:
    """(optimized − baseline) / baseline; NaN when either is missing or the baseline is 0."""
    if baseline is None or optimized is None or not (math.isfinite(baseline) and math.isfinite(optimized)) or baseline == 0:
        return math.nan
    return (optimized - baseline) / abs(baseline)


def claim_verdict(claimed_relative: float | None, measured_relative: float, *, kind: str = "change",
                  noise_relative: float | None = None, higher_is_better: bool | None = None) -> str:
    """Did the claim hold on this hardware? (rule in the module docstring)

    `kind` is "change" (a claimed improvement) or "comparable" (a claimed equal quality);
    `noise_relative` is two standard errors of the measured difference, relative to the
    baseline, when ≥ 2 seeds were run (only used for "comparable"); with `higher_is_better`
    given, a quality that is not comparable says whether the optimized run was better or worse.
    """
    if kind not in ("change", "comparable"):
        _fail("kind", kind, "'change' or 'comparable'")
    if claimed_relative is None or (isinstance(claimed_relative, float) and math.isnan(claimed_relative)):
        return "no claim"
    if measured_relative is None or not math.isfinite(measured_relative):
        return "not measured"
    if kind == "comparable":
        tolerance = max(COMPARABLE_TOLERANCE, noise_relative or 0.0)
        if abs(measured_relative) <= tolerance:
            return "held"
        if higher_is_better is None:
            return "not held"
        better = (measured_relative > 0) == higher_is_better
        return f"not held (optimized {'better' if better else 'worse'})"
    if claimed_relative == 0 or math.copysign(1, measured_relative) != math.copysign(1, claimed_relative) or measured_relative == 0:
        return "not held"
    return "held" if abs(measured_relative) >= HOLD_FRACTION * abs(claimed_relative) else "direction only"


def efficiency_verdict(claimed: float | None, measured: float | None, *, modelled: bool = False) -> str:
    """Did a claimed scaling efficiency hold? (rule in the module docstring)"""
    if modelled:
        return "modelled, not judged"
    if claimed is None or not math.isfinite(claimed):
        return "no claim"
    if measured is None or not math.isfinite(measured):
        return "not measured"
    if measured >= claimed - EFFICIENCY_TOLERANCE:
        return "held"
    return f"not held ({100 * (claimed - measured):.1f} points lower)"


def noise_relative(base: pd.Series, opt: pd.Series, key: str) -> float | None:
    """Two standard errors of (optimized − baseline), relative to the baseline mean."""
    n_b, n_o = base[f"{key}_n"], opt[f"{key}_n"]
    if n_b < 2 or n_o < 2 or not base[f"{key}_mean"]:
        return None
    se = math.sqrt(base[f"{key}_std"] ** 2 / n_b + opt[f"{key}_std"] ** 2 / n_o)
    return 2 * se / abs(base[f"{key}_mean"])
