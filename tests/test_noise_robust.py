"""Noise-robust measurement: confidence intervals, interleaved timing windows, the throughput
record and its reuse, and the rerun agreement check."""
import itertools
import json
import math
import platform
import subprocess
import sys

import pandas as pd
import pytest

import torch

from trainopt_core import measure
from trainopt_core.measure import allocator
from trainopt_core.measure.probes import MatmulProbe, MemoryCopyProbe, machine_probes
from trainopt_core.reporting import agreement
from trainopt_core.reproduction import RECORD_SCHEMA, get_profile, measure_throughput, throughput_path
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


# ------------------------------------------------------------------ machine probes
def test_machine_probes_do_their_work_and_count_the_bytes_and_flops_of_it():
    copy = MemoryCopyProbe(copy_mib=1)
    copy._source.fill_(3.0)
    assert copy() == 4 * 2 * 2**20  # 4 copies, each reading and writing 1 MiB
    assert torch.equal(copy._target, copy._source)
    product = MatmulProbe(size=8)
    assert product() == 4 * 2 * 8**3
    assert torch.allclose(product._out, product._a @ product._b)
    assert set(machine_probes("cpu")) == {"memory_copy", "matmul"}
    with pytest.raises(ValueError, match="copy_mib=0"):
        MemoryCopyProbe(copy_mib=0)
    with pytest.raises(ValueError, match="size=True"):
        MatmulProbe(size=True)


# ------------------------------------------------------------------ host allocator
_HELD_AFTER_FREE = """
import ctypes, sys, torch
from trainopt_core.measure import allocator
if sys.argv[1] == "keep":
    allocator.keep_freed_host_memory()
print(allocator.host_allocator())
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
x = torch.empty(64 << 18); x.fill_(1.0); del x  # 64 MiB, above glibc's largest adaptive mmap threshold
print(libc.mallinfo2().fordblks)
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_kept_host_memory_stays_in_the_heap_after_a_large_block_is_freed():
    """With glibc's defaults a 64 MiB block is its own mapping, returned to the kernel on free
    (the next step faults it in again); once kept, the freed block stays in the heap for reuse."""
    def held_after_free(mode):
        lines = subprocess.run([sys.executable, "-c", _HELD_AFTER_FREE, mode], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        return lines[0], int(lines[1])

    default_state, default_free = held_after_free("default")
    kept_state, kept_free = held_after_free("keep")
    assert default_state == allocator.GLIBC_DEFAULT and kept_state == allocator.KEPT
    assert default_free < 16 * 2**20 <= 64 * 2**20 <= kept_free
    assert allocator.host_allocator() == allocator.KEPT  # importing the reproduction kept it here
    assert allocator.keep_freed_host_memory() == allocator.KEPT  # idempotent
    assert allocator.minor_page_faults() >= 0


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
    probes = record["machine_probes"]  # timed in the same rounds, kept apart from the configurations
    assert set(probes) == {"memory_copy", "matmul"} and not set(probes) & set(record["results"])
    assert all(len(p["per_window"]) == 2 and min(p["per_window"]) > 0 for p in probes.values())
    assert all(record["results"][name]["minor_page_faults_per_step"] >= 0 for name in configs)
    again = measure_throughput("wikitext2", ["baseline"], profile="smoke", seeds=1, out_dir=tmp_path,
                               data_policy="standin", progress=False)
    assert again.pop("reused") is True and again == json.loads(json.dumps(record))  # a subset of what was timed
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
    assert again.pop("reused") is True and again == json.loads(json.dumps(record))
    assert "reused" not in record and "reused" not in json.loads(throughput_path(tmp_path, "wikitext2").read_text())
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


def _write_ratio_tables(folder, throughput, time, half_width):
    """Table I's throughput and time-to-target ratios (as changes) with intervals of `half_width`."""
    tables = folder / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame([dict(metric=metric, measured_relative=value, measured_relative_ci_low=value - half_width,
                       measured_relative_ci_high=value + half_width, claim_held="inconclusive")
                  for metric, value in (("Throughput", throughput), ("Time to target", time))]
                 ).to_csv(tables / "table1_resnet.csv", index=False)


def test_agreement_bar_is_each_timing_ratio_inside_the_other_runs_interval_not_five_percent(tmp_path):
    # a throughput ratio 1.30 -> 1.39 (+6.9 %) inside intervals widened by the between-session floor
    _write_ratio_tables(tmp_path / "a", 0.30, -0.25, 0.12)
    _write_ratio_tables(tmp_path / "b", 0.39, -0.28, 0.12)
    moved = agreement.compare_reports(tmp_path / "a", tmp_path / "b")
    assert moved["agree"] and moved["timing_ratios_compared"] == 2 and not moved["ratios_outside"]
    assert len(moved["ratio_moves"]) == 1  # still listed, as context
    assert "context: throughput ratios moved by more than ±5 %: 1 of 1" in agreement.format_agreement(moved)
    # the time ratio leaves the other's interval: no agreement, and the cell is named
    _write_ratio_tables(tmp_path / "c", 0.32, -0.05, 0.12)
    outside = agreement.compare_reports(tmp_path / "a", tmp_path / "c")
    assert not outside["agree"] and not outside["ratio_moves"]
    assert [m["cell"] for m in outside["ratios_outside"]] == ["table1_resnet: Time to target [measured_relative]"]
    text = agreement.format_agreement(outside)
    assert "## Throughput and time ratios outside the other run's 95 % CI" in text
    assert "Other values outside" not in text
    assert agreement.main([str(tmp_path / "a"), str(tmp_path / "c")]) == 1


def _write_timing(folder, rates: dict, probes: dict, hashes=None):
    timing = folder / "timing"
    timing.mkdir(parents=True, exist_ok=True)
    results = {name: dict(items_per_s=values, item_unit="img/s", config_hash=(hashes or {}).get(name, name))
               for name, values in rates.items()}
    results["+zero2"] = dict(results["optimized"], timed_as="optimized")
    (timing / "throughput__cifar10.json").write_text(json.dumps(dict(
        schema=RECORD_SCHEMA, status="complete", kind="interleaved_throughput", task="cifar10", results=results,
        machine_probes={name: dict(unit="bytes/s", per_window=values) for name, values in probes.items()})))


def test_agreement_shows_each_configurations_change_in_speed_and_the_machine_probes(tmp_path):
    _write_tables(tmp_path / "a", 0.30, "held")
    _write_tables(tmp_path / "b", 0.10, "held")
    _write_timing(tmp_path / "a", {"baseline": [100, 90, 110], "optimized": [130, 130]}, {"memory_copy": [10, 12]})
    _write_timing(tmp_path / "b", {"baseline": [150, 150], "optimized": [165, 165], "auto": [1.0]},
                  {"memory_copy": [16.5, 16.5]}, hashes={"optimized": "another plan"})
    result = agreement.compare_reports(tmp_path / "a", tmp_path / "b")
    rows = {row["what"]: row for row in result["speeds"]}
    assert set(rows) == {"baseline", "optimized", "machine probe: memory_copy"}  # not the twin, not auto (one side)
    assert rows["baseline"]["change"] == pytest.approx(0.5) and rows["optimized"]["change"] == pytest.approx(165 / 130 - 1)
    assert rows["machine probe: memory_copy"]["change"] == pytest.approx(0.5)
    assert rows["baseline"]["same_config"] and not rows["optimized"]["same_config"]
    text = agreement.format_agreement(result)
    assert "| cifar10 | baseline | 100 img/s | 150 img/s | +50.0% |" in text
    assert "optimized (another configuration: its plan differs)" in text
    assert agreement.compare_speeds(tmp_path / "a", tmp_path / "missing") == []


def test_windows_needed_for_rerun_agreement_follows_the_normal_model():
    import importlib.util
    from pathlib import Path

    probe = Path(__file__).parents[1] / "benchmarks" / "probes" / "timing_noise" / "timing_noise.py"
    spec = importlib.util.spec_from_file_location("timing_noise", probe)
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
