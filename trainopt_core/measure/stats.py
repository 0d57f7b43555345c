"""Mean ± 95 % confidence interval, the one summary every measured value gets.

A value measured several times (one run per seed, or one timing window per repeat) is reported
as its mean with a two-sided 95 % Student-t interval, mean ± t(0.975, n−1) · s / √n, together
with the median and the range (min, max) so the spread is visible. Ratios of two things
measured side by side (optimized vs baseline with the same seed, or in adjacent timing windows)
are summarized from the per-pair ratios, so what the pair shares (the seed's data order, the
machine's state during the window) cancels. One value has no interval (None).
"""
from __future__ import annotations

import math
import statistics
from typing import Sequence

from .._errors import fail as _fail

CONFIDENCE = 0.95
# t(0.975, df) for df = 1..30 (two-sided 95 %); beyond 30 the Cornish-Fisher expansion of the
# normal quantile (error < 0.001) is used.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if not isinstance(df, int) or df < 1:
        _fail("df", df, "an integer >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def summarize(values: Sequence[float]) -> dict:
    """Mean, 95 % CI (`ci_low`, `ci_high`; None with fewer than 2 values), median, min, max,
    standard deviation and count of the finite `values` (None and NaN are left out)."""
    xs = _finite(values)
    n = len(xs)
    if n == 0:
        return dict(n=0, mean=None, ci_low=None, ci_high=None, median=None, min=None, max=None, std=None)
    mean = statistics.fmean(xs)
    std = statistics.stdev(xs) if n > 1 else None
    half = t_quantile_975(n - 1) * std / math.sqrt(n) if n > 1 else None
    return dict(n=n, mean=mean, ci_low=None if half is None else mean - half, ci_high=None if half is None else mean + half,
                median=statistics.median(xs), min=min(xs), max=max(xs), std=std)


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> dict:
    """`summarize` of the per-pair ratios numerator_i / denominator_i, computed on the log scale
    (a ratio's interval is symmetric in log: 2× and ½× are equally far from 1) and reported
    back as ratios, so `mean` is the geometric mean of the ratios; pairs with a missing or non-positive member are left out."""
    if len(numerators) != len(denominators):
        _fail("denominators", f"{len(denominators)} values", f"as many values as numerators ({len(numerators)})")
    logs = [math.log(a / b) for a, b in zip(numerators, denominators)
            if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0]
    return _exp_summary(summarize(logs))


def _exp_summary(log_summary: dict) -> dict:
    out = dict(log_summary)
    for key in ("mean", "ci_low", "ci_high", "median", "min", "max"):
        out[key] = None if log_summary[key] is None else math.exp(log_summary[key])
    out["std"] = log_summary["std"]  # of the log ratios
    return out


def product_ratio(*factors: dict) -> dict:
    """The ratio of two products from independently measured factor ratios (each a
    `paired_ratio` summary): time to target = samples to target × seconds per sample. The
    log-scale half-widths add in quadrature (independent factors); with any factor lacking an
    interval the product has none."""
    mean = 1.0
    squares = 0.0
    has_interval = True
    for factor in factors:
        if factor.get("mean") is None:
            return dict(n=0, mean=None, ci_low=None, ci_high=None)
        mean *= factor["mean"]
        if factor.get("ci_low") is None or factor.get("ci_high") is None:
            has_interval = False
            continue
        squares += (math.log(factor["ci_high"]) - math.log(factor["ci_low"])) ** 2 / 4
    if not has_interval:
        return dict(n=min(f.get("n", 0) for f in factors), mean=mean, ci_low=None, ci_high=None)
    half = math.sqrt(squares)
    return dict(n=min(f.get("n", 0) for f in factors), mean=mean, ci_low=mean * math.exp(-half),
                ci_high=mean * math.exp(half))


__all__ = ["CONFIDENCE", "paired_ratio", "product_ratio", "summarize", "t_quantile_975"]
