"""A seed whose run missed the target in one configuration counts in time to target (censored at
the run's length) instead of being dropped from the paired ratio; one that missed in both is left
out; the verdict says what each counted as, and a ratio every seed only bounds reads as a bound."""
import math

import pytest

from trainopt_core.reporting.results import censored_seeds_ratio, measured_change
from trainopt_core.reporting.tables import format_change
from trainopt_core.reporting.verdicts import claim_verdict, time_to_target_verdict

RUN_SAMPLES = 1_200  # every run trained on this many samples


def _records(config, samples_to_target, *, timed=True):
    out = []
    for seed, samples in enumerate(samples_to_target):
        record = dict(task="cifar10", config_name=config, seed=seed,
                      metrics=dict(samples_to_target=math.nan if samples is None else samples,
                                   time_to_target_wall_s=math.nan if samples is None else samples / 100,
                                   train_time_s=RUN_SAMPLES / 100),
                      history=[dict(samples=RUN_SAMPLES)])
        if timed:  # the same seconds per sample for both: time follows samples to target
            record["timing"] = dict(items_per_s=[100.0, 101.0, 99.0], samples_per_s=[100.0, 101.0, 99.0])
        out.append(record)
    return out


def _verdict(baseline, optimized, claim=-0.30, timed=True):
    records = _records("baseline", baseline, timed=timed) + _records("optimized", optimized, timed=timed)
    change = measured_change(records, "cifar10", "baseline", "optimized", "time_to_target_s")
    verdict = claim_verdict(claim, math.nan if change["mean"] is None else change["mean"],
                            ci=(change["ci_low"], change["ci_high"]))
    return change, time_to_target_verdict(verdict, change.get("censoring"))


@pytest.mark.parametrize("timed", [True, False])
def test_a_seed_that_never_reached_the_target_is_not_dropped(timed):
    # dropped, the two seeds that reached gave -39.5 % and "held" against a -30 % claim
    change, verdict = _verdict([1000, 1000, 1000], [600, 610, None], timed=timed)
    assert change["censoring"] == dict(seeds=3, reached=2, other_missed=1, baseline_missed=0, both_missed=0)
    expected = math.exp((math.log(0.6) + math.log(0.61) + math.log(1.2)) / 3) - 1
    assert change["mean"] == pytest.approx(expected, rel=1e-9)  # the third seed at its bound: 1,200 / 1,000
    assert not verdict.startswith("held")
    assert verdict.endswith("(2 of 3 seeds reached the target in both; 1 that missed only in this configuration "
                            "counts at its run's length, a bound)")
    assert change["bound"] is None  # two seeds measured it


def test_held_cannot_stand_on_a_bound_that_flatters_the_claim():
    # the missed seed's bound (1,200) is still far better than the baseline: held on the bound,
    # but the true samples to target lie beyond it
    change, verdict = _verdict([5000, 5000, 5000], [600, 610, None])
    assert claim_verdict(-0.30, change["mean"], ci=(change["ci_low"], change["ci_high"])) == "held"
    assert verdict.startswith("inconclusive (2 of 3 seeds")


def test_a_target_the_optimized_runs_never_reached_is_not_held_rather_than_not_measured():
    change, verdict = _verdict([1000, 1000, 1000], [None, None, None])
    assert verdict.startswith("not held: the opposite direction (0 of 3 seeds reached the target in both")
    # every seed only bounds the ratio from below: it reads as a bound, what its interval guarantees
    assert change["bound"] == "lower"
    assert format_change(change["mean"], (change["ci_low"], change["ci_high"]), bound=change["bound"]) == \
        f"≥ {100 * change['ci_low']:+.1f}%"


def test_a_seed_that_missed_in_both_is_left_out_and_the_verdict_says_so():
    change, verdict = _verdict([1000, 1000, None], [600, 610, None])
    assert change["censoring"]["both_missed"] == 1 and change["n"] == 2  # two pairs entered the ratio
    assert verdict.endswith("(2 of 3 seeds reached the target in both; 1 that missed in both is left out)")


def test_not_held_cannot_stand_on_a_bound_that_flatters_the_baseline():
    change, verdict = _verdict([None, 1000, 1000], [1500, 1500, 1500])
    assert change["censoring"]["baseline_missed"] == 1
    assert claim_verdict(-0.30, change["mean"], ci=(change["ci_low"], change["ci_high"])).startswith("not held")
    assert verdict.startswith("inconclusive (2 of 3 seeds")


def test_no_seed_reaching_the_target_in_either_is_not_measured():
    _, verdict = _verdict([None, None], [None, None])
    assert verdict == "not measured: no seed reached the target in either configuration (0 of 2)"


def test_every_seed_reaching_the_target_leaves_the_verdict_as_it_was():
    change, verdict = _verdict([1000, 1000, 1000], [600, 610, 620])
    assert verdict == "held" and change["censoring"]["reached"] == 3
    ratio, censoring = censored_seeds_ratio(_records("b", [1000, 1000]), _records("o", [600, 600]), "samples_to_target")
    assert ratio["mean"] == pytest.approx(0.6) and censoring["reached"] == 2


def test_a_verdict_in_brackets_takes_the_seeds_count_inside_its_brackets():
    censoring = dict(seeds=1, reached=0, other_missed=1, baseline_missed=0, both_missed=0)
    assert time_to_target_verdict("inconclusive (no interval)", censoring) == (
        "inconclusive (no interval; 0 of 1 seeds reached the target in both; 1 that missed only in this "
        "configuration counts at its run's length, a bound)")
