"""Noise-robust measurement: confidence intervals, interleaved timing windows, the throughput
record and its reuse, and the rerun agreement check."""
import itertools
import json
import math

import pandas as pd
import pytest

from trainopt_core import measure
from trainopt_core.reporting import agreement
from trainopt_core.reproduction import get_profile, measure_throughput, throughput_path
from trainopt_core.reproduction.throughput import timing_windows


# ------------------------------------------------------------------ statistics
# Student's t 0.975 quantiles as printed in standard tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042), (31, 2.040),
                                   (40, 2.021), (60, 2.000), (120, 1.980), (1000, 1.962)])
def test_t_quantile_matches_published_tables(df, t):
    assert measure.t_quantile_975(df) == pytest.approx(t, abs=1.5e-3)


def test_summarize_gives_mean_and_t_interval_and_leaves_out_missing_values():
    summary = measure.summarize([1.0, 2.0, 3.0, None, math.nan])
    assert summary["n"] == 3 and summary["mean"] == 2.0 and summary["median"] == 2.0
    half = 4.303 * 1.0 / math.sqrt(3)
    assert summary["ci_low"] == pytest.approx(2.0 - half) and summary["ci_high"] == pytest.approx(2.0 + half)
    one = measure.summarize([5.0])
    assert one["mean"] == 5.0 and one["ci_low"] is None  # one value has no interval
    assert measure.summarize([])["mean"] is None
    with pytest.raises(ValueError, match="df=0"):
        measure.t_quantile_975(0)


def test_paired_ratio_cancels_what_a_pair_shares():
    machine_state = [1.0, 0.7, 1.2, 0.9]  # a slow round slows both members of the pair
    baseline = [1000 * s for s in machine_state]
    optimized = [1300 * s for s in machine_state]
    ratio = measure.paired_ratio(optimized, baseline)
    assert ratio["mean"] == pytest.approx(1.3) and ratio["ci_low"] == pytest.approx(1.3)
    unpaired = measure.summarize(optimized)
    assert unpaired["ci_high"] - unpaired["ci_low"] > 0.3 * unpaired["mean"]  # unpaired, the noise stays
    with pytest.raises(ValueError, match="as many values"):
        measure.paired_ratio([1.0], [1.0, 2.0])


def test_product_ratio_adds_log_half_widths_in_quadrature():
    a = dict(n=3, mean=0.8, ci_low=0.8 / 1.1, ci_high=0.8 * 1.1)
    b = dict(n=8, mean=0.5, ci_low=0.5 / 1.2, ci_high=0.5 * 1.2)
    product = measure.product_ratio(a, b)
    assert product["mean"] == pytest.approx(0.4)
    half = math.hypot(math.log(1.1), math.log(1.2))
    assert product["ci_high"] == pytest.approx(0.4 * math.exp(half))
    assert measure.product_ratio(a, dict(n=1, mean=0.5, ci_low=None, ci_high=None))["ci_low"] is None


# ------------------------------------------------------------------ interleaved windows
def test_interleaved_windows_take_turns_and_rotate_the_order():
    log = []
    clock = itertools.count(0.0, 0.5).__next__  # each reading advances by 0.5 s

    def workload(name, items):
        def step():
            log.append(name)
            return items
        return step

    rates = measure.interleaved_windows({"A": workload("A", 10), "B": workload("B", 20), "C": workload("C", 30)},
                                        windows=3, steps_per_window=2, warmup_steps=1, clock=clock)
    assert log[:3] == ["A", "B", "C"]  # warm-up, untimed
    windows = [log[3 + 2 * i] for i in range(9)]
    assert windows == ["A", "B", "C", "B", "C", "A", "C", "A", "B"]  # A,B,C then rotated
    assert rates == {"A": [40.0] * 3, "B": [80.0] * 3, "C": [120.0] * 3}  # 2 steps in 0.5 s
    with pytest.raises(ValueError, match="windows=0"):
        measure.interleaved_windows({"A": workload("A", 1)}, windows=0, steps_per_window=1)
    with pytest.raises(ValueError, match="workloads"):
        measure.interleaved_windows({}, windows=1, steps_per_window=1)


# ------------------------------------------------------------------ the throughput record
def test_throughput_record_is_interleaved_and_reused_only_under_the_same_conditions(tmp_path):
    configs = ["baseline", "+zero2"]
    record = measure_throughput("wikitext2", configs, profile="smoke", seeds=1, out_dir=tmp_path,
                                data_policy="standin", progress=False)
    assert record["configs"] == configs and record["windows"] == 2
    for name in configs:
        result = record["results"][name]
        assert len(result["items_per_s"]) == 2 and all(r > 0 for r in result["items_per_s"])
        assert result["samples_per_s"][0] == pytest.approx(result["items_per_s"][0] / result["items_per_sample"])
    assert record["conditions"]["data_policy"] == "standin" and record["conditions"]["world_size"] == 1
    again = measure_throughput("wikitext2", ["baseline"], profile="smoke", seeds=1, out_dir=tmp_path,
                               data_policy="standin", progress=False)
    assert again == json.loads(json.dumps(record))  # a subset of what was timed: reused
    stale = json.loads(throughput_path(tmp_path, "wikitext2").read_text())
    stale["conditions"]["hardware"] = {"gpu_name": "NVIDIA A100-SXM4-80GB", "gpu_count": 1}
    throughput_path(tmp_path, "wikitext2").write_text(json.dumps(stale))
    remeasured = measure_throughput("wikitext2", ["baseline"], profile="smoke", seeds=1, out_dir=tmp_path,
                                    data_policy="standin", progress=False)
    assert remeasured["configs"] == ["baseline"] and remeasured["conditions"] == record["conditions"]
    with pytest.raises(ValueError, match="configs"):
        measure_throughput("wikitext2", [], profile="smoke", out_dir=tmp_path)


def test_timing_windows_grow_with_seeds_and_twins_are_timed_once(tmp_path):
    """Windows = timing_windows_per_seed x seeds (at least 2); a configuration whose computation
    equals an earlier one's (+zero2 and +checkpointing on one process) is not timed again."""
    quick = get_profile("cifar10", "quick")
    assert timing_windows(quick, 1) == quick.timing_windows_per_seed
    assert timing_windows(quick, 3) == 3 * quick.timing_windows_per_seed
    assert timing_windows(get_profile("cifar10", "smoke"), 1) == 2
    with pytest.raises(ValueError, match="seeds"):
        timing_windows(quick, 0)
    configs = ["baseline", "+checkpointing", "+zero2"]
    record = measure_throughput("wikitext2", configs, profile="smoke", seeds=3, out_dir=tmp_path,
                                data_policy="standin", progress=False)
    assert record["windows"] == 3 and record["seeds"] == 3
    twin, timed = record["results"]["+zero2"], record["results"]["+checkpointing"]
    assert twin["timed_as"] == "+checkpointing" and twin["items_per_s"] == timed["items_per_s"]
    assert "timed_as" not in timed and any("timed as" in note for note in twin["notes"])
    again = measure_throughput("wikitext2", configs, profile="smoke", seeds=3, out_dir=tmp_path,
                               data_policy="standin", progress=False)
    assert again == json.loads(json.dumps(record))
    fewer = measure_throughput("wikitext2", configs, profile="smoke", seeds=1, out_dir=tmp_path,
                               data_policy="standin", progress=False)
    assert fewer["windows"] == 2  # another window count: measured again


# ------------------------------------------------------------------ rerun agreement
def _write_tables(folder, throughput_change, verdict, efficiency=0.9):
    tables = folder / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame([dict(metric="Throughput", measured_relative=throughput_change,
                       measured_relative_ci_low=throughput_change - 0.02, measured_relative_ci_high=throughput_change + 0.02,
                       claim_held=verdict)]).to_csv(tables / "table1_resnet.csv", index=False)
    pd.DataFrame([dict(config="optimized", source="measured", world_size=2, efficiency=efficiency,
                       efficiency_ci_low=efficiency - 0.05, efficiency_ci_high=efficiency + 0.05,
                       claim_held="inconclusive")]).to_csv(tables / "table4_scaling_resnet.csv", index=False)


def test_agreement_lists_flipped_verdicts_and_moved_ratios(tmp_path):
    _write_tables(tmp_path / "a", 0.30, "held")
    _write_tables(tmp_path / "b", 0.31, "held (reason differs)")
    same = agreement.compare_reports(tmp_path / "a", tmp_path / "b")
    assert same["agree"] and same["ratios_compared"] == 1 and same["verdicts_compared"] == 2
    assert not same["beyond_ci"]

    _write_tables(tmp_path / "c", 0.20, "inconclusive", efficiency=0.7)
    differ = agreement.compare_reports(tmp_path / "a", tmp_path / "c")
    assert not differ["agree"]
    assert [f["cell"] for f in differ["verdict_flips"]] == ["table1_resnet: Throughput [claim_held]"]
    assert differ["ratio_moves"][0]["moved"] == pytest.approx(1.2 / 1.3 - 1)
    assert {m["cell"] for m in differ["beyond_ci"]} == {
        "table1_resnet: Throughput [measured_relative]", "table4_scaling_resnet: optimized / measured / 2 [efficiency]"}
    text = agreement.format_agreement(differ)
    assert "Agreement: **no**" in text and "| table1_resnet: Throughput [claim_held] | held | inconclusive |" in text
    assert agreement.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "agree.md")]) == 0
    assert agreement.main([str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert (tmp_path / "agree.md").read_text().startswith("# Rerun agreement")


def test_windows_needed_for_rerun_agreement_follows_the_normal_model():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("timing_noise", Path(__file__).parents[1] / "scripts" / "timing_noise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    needed = module.windows_needed(0.113, tolerance=0.05, ratios=24, probability=0.95)

    def all_within(n):
        sd = math.sqrt(2) * 0.113 / math.sqrt(n)
        return math.erf(math.log(1.05) / (sd * math.sqrt(2))) ** 24

    assert all_within(needed) >= 0.95 > all_within(needed - 1)
    assert 90 <= needed <= 115  # ~8x the 12 windows the quick profile's 3 seeds time
    assert module.windows_needed(0.0, tolerance=0.05, ratios=24, probability=0.95) == 2
    assert module.windows_needed(0.2, tolerance=0.05, ratios=24, probability=0.95) > needed
