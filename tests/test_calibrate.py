"""Targets at convergence: the calibration rule on known curves, and its checks."""
import math

import numpy as np
import pytest

from trainopt_core.reproduction.calibrate import choose_target, load_targets


def saturating(samples, plateau, rate, start=0.1, jitter=0.0):
    return [plateau - (plateau - start) * math.exp(-rate * s) + jitter for s in samples]


SAMPLES = [i * 1000 for i in range(13)]  # 12 evaluations after the first


def test_target_is_the_mean_curve_at_80_percent_rounded_easier_and_checks_pass_on_a_converging_curve():
    curves = [(SAMPLES, saturating(SAMPLES, 0.85, 3e-4, jitter=j)) for j in (-0.01, 0.0, 0.01)]
    result = choose_target(curves, higher_is_better=True)
    at_80 = float(np.interp(9600, SAMPLES, saturating(SAMPLES, 0.85, 3e-4)))
    assert result["target"] == math.floor(at_80 * 200) / 200 and result["target"] <= at_80
    assert all(0.7 <= s["crossing_fraction"] <= 0.9 for s in result["seeds"])
    assert 0.75 <= result["mean_crossing_fraction"] <= 0.8
    assert all(s["evaluations_before_crossing"] >= 8 for s in result["seeds"])
    assert result["ok"], result["checks"]


def test_a_curve_still_rising_steeply_fails_the_plateau_check_and_a_short_curve_the_evaluation_check():
    rising = [(SAMPLES, [0.1 + 0.05 * i + j for i in range(13)]) for j in (-0.04, 0.0, 0.04)]
    result = choose_target(rising, higher_is_better=True)
    assert not result["ok"] and result["tail_gain_fraction"] == pytest.approx(0.2)
    assert not result["checks"]["the last 20% of the run adds < 10% of its improvement"]
    short = [([0, 1, 2, 3, 4, 5], [0.1, 0.5, 0.7, 0.8, 0.82, 0.83])] * 2
    assert not choose_target(short, higher_is_better=True)["checks"][">= 8 evaluations before every crossing"]


def test_perplexity_targets_round_up_and_cross_from_above():
    curves = [(SAMPLES, [4000 * math.exp(-5e-4 * s) + 60 + j for s in SAMPLES]) for j in (-1.0, 0.0, 1.0)]
    result = choose_target(curves, higher_is_better=False)
    mean_at_80 = float(np.interp(9600, SAMPLES, [4000 * math.exp(-5e-4 * s) + 60 for s in SAMPLES]))
    assert mean_at_80 <= result["target"] < mean_at_80 + 1  # 3 significant digits, rounded up
    assert all(s["crossing_samples"] is not None for s in result["seeds"])


def test_a_seed_that_never_reaches_the_target_fails_the_crossing_check():
    slow = [(SAMPLES, saturating(SAMPLES, 0.85, 3e-4)), (SAMPLES, saturating(SAMPLES, 0.85, 3e-4)),
            (SAMPLES, saturating(SAMPLES, 0.60, 3e-4))]
    result = choose_target(slow, higher_is_better=True)
    assert result["seeds"][2]["crossing_fraction"] is None
    assert not result["checks"]["the seed-mean curve crosses within 70%-90% of the run, every seed before its end"]


def test_bad_curves_are_refused_by_name():
    with pytest.raises(ValueError, match="curves"):
        choose_target([], higher_is_better=True)
    with pytest.raises(ValueError, match="finite"):
        choose_target([(SAMPLES, [math.nan] * 13)], higher_is_better=True)


def test_load_targets_reads_the_committed_file_shape(tmp_path):
    path = tmp_path / "targets.json"
    path.write_text('{"quick": {"cifar10": {"target": 0.8, "checks": {}}}}')
    assert load_targets(path) == {"quick": {"cifar10": 0.8}}
    assert load_targets(tmp_path / "missing.json") == {}
