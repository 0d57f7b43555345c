"""Reports: aggregation over seeds, the claim rule, tables on disk, captions and the index.

The run records here are synthetic test fixtures built in this file (made-up numbers with the
runner's record layout), not results.
"""
import json
import math

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from trainopt_core import reporting as reports  # noqa: E402
from trainopt_core.reporting import figures as reports_figures  # noqa: E402

STANDIN = "stand-in: synthetic 10-class 32x32 images (NOT CIFAR-10)"


def make_record(task="cifar10", config="baseline", seed=0, *, time_to_target_s=100.0, peak_memory_bytes=2**30,
                throughput=1000.0, final_quality=0.5, flops_utilization=0.1, precision="fp32",
                data_source=STANDIN, profile="smoke", status="complete", breakdown=None, notes=(),
                samples_to_target="from time", timing=None):
    """A synthetic run record with the runner's layout (test fixture, not a result); `timing`
    (a list of items/s per window) attaches interleaved timing windows as `with_throughput` does."""
    if samples_to_target == "from time":
        samples_to_target = None if time_to_target_s is None else 10 * time_to_target_s
    history = [dict(time_s=t, samples=100 * i, step=10 * i, train_loss=2.0 - 0.1 * i,
                    quality=final_quality * (i + 1) / 4, lr=1e-3, k=4, loss_scale=1.0,
                    effective_batch_size=32, b_simple=None) for i, t in enumerate([0.0, 1.0, 2.0, 3.0])]
    steps = [dict(step=i + 1, time_s=0.1 * (i + 1), lr=1e-3, k=4 + (i % 2), effective_batch_size=32,
                  loss_scale=1.0, skipped_steps=0, grad_norm=1.0, sigma_sq=1.0, grad_sq=0.5,
                  b_simple=50.0 + i, samples_consumed=32 * (i + 1)) for i in range(10)]
    record = dict(
        schema=2, status=status, task=task, config_name=config, config=dict(precision=precision),
        config_hash="abc", profile=profile, seed=seed, world_size=1, micro_batch_size=8,
        data_source=data_source, model_name="tiny test model", num_parameters=1000, notes=list(notes),
        manifest={"date_utc": "2030-01-01T00:00:00+00:00", "profile": profile, "device": "cpu",
                  "hardware": {"cpu_model": "Test CPU", "cpu_logical_cores": 2, "gpus": []},
                  "libraries": {"python": "3.12", "torch": "9.9"}, "git": {"commit": "deadbeef", "dirty": False}},
        history=history, steps=steps,
        metrics=dict(throughput=throughput, throughput_unit="img/s", peak_memory_bytes=peak_memory_bytes,
                     memory_source="test", memory_breakdown_bytes=breakdown or {
                         "parameters": peak_memory_bytes / 4, "activations": peak_memory_bytes / 2},
                     samples_to_target=samples_to_target, steps_to_target=None,
                     time_to_target_wall_s=time_to_target_s, target=0.4, final_quality=final_quality,
                     quality_name="accuracy" if task == "cifar10" else "perplexity",
                     flops_per_item=1.0, peak_flops_per_s=1.0, peak_flops_source="test",
                     flops_utilization=flops_utilization, energy_j=None, energy_source=None,
                     skipped_steps=0, optimizer_steps=10, train_time_s=3.0, wall_s=4.0),
    )
    if timing is not None:
        record["timing"] = dict(items_per_s=list(timing), samples_per_s=list(timing), items_per_sample=1.0)
    return record


def paired_records(**optimized_overrides):
    """Baseline seeds 0/1 and optimized seeds 0/1 (synthetic)."""
    base = [make_record(seed=0, time_to_target_s=100.0, throughput=1000.0),
            make_record(seed=1, time_to_target_s=120.0, throughput=1200.0)]
    opt_kwargs = dict(time_to_target_s=70.0, throughput=1400.0, peak_memory_bytes=0.7 * 2**30,
                      flops_utilization=0.15, precision="bf16")
    opt_kwargs.update(optimized_overrides)
    opt = [make_record(config="optimized", seed=s, **opt_kwargs) for s in (0, 1)]
    return base + opt


# ------------------------------------------------------------------ aggregation
def test_aggregate_gives_mean_sample_std_and_seed_count():
    agg = reports.aggregate(paired_records()).set_index("config_name")
    assert agg.loc["baseline", "throughput_mean"] == pytest.approx(1100.0)
    assert agg.loc["baseline", "throughput_std"] == pytest.approx(math.sqrt(20000.0))  # ddof=1
    # a time to target is a geometric mean: its interval combines in log space and stays above zero
    assert agg.loc["baseline", "time_to_target_s_mean"] == pytest.approx(math.sqrt(100.0 * 120.0))
    assert agg.loc["baseline", "time_to_target_s_std"] == pytest.approx(math.sqrt(200.0))
    assert 0 < agg.loc["baseline", "time_to_target_s_ci_low"] < 100.0  # two seeds: t = 12.7, still above zero
    assert agg.loc["baseline", "n_seeds"] == 2
    assert agg.loc["optimized", "precision"] == "bf16"


def test_aggregate_averages_time_to_target_over_seeds_that_reached_it():
    records = [make_record(seed=0, time_to_target_s=50.0), make_record(seed=1, time_to_target_s=None)]
    row = reports.aggregate(records).iloc[0]
    assert row["time_to_target_s_mean"] == pytest.approx(50.0)
    assert row["time_to_target_s_n"] == 1 and row["n_seeds"] == 2


def test_load_records_keeps_only_complete_records(tmp_path):
    runs = tmp_path / "smoke" / "runs"
    runs.mkdir(parents=True)
    (runs / "a.json").write_text(json.dumps(make_record()))
    (runs / "b.json").write_text(json.dumps(make_record(status="truncated")))
    (runs / "c.partial.json").write_text(json.dumps(make_record()))
    (runs / "d.json").write_text("{not json")
    assert len(reports.load_records(tmp_path, "smoke")) == 1


def test_packed_records_are_read_from_their_archive(tmp_path):
    """A reproduction in reports/other_machines keeps its records as <profile>/runs.tar.xz: its
    index and summary read them there (an index written from a packed folder once said "0 complete
    record(s)", no data, no hardware)."""
    import tarfile

    runs = tmp_path / "quick" / "runs"
    runs.mkdir(parents=True)
    (tmp_path / "quick" / "tables").mkdir()
    (runs / "a.json").write_text(json.dumps(make_record(profile="quick")))
    (runs / "b.json").write_text(json.dumps(make_record(task="wikitext2", profile="quick")))
    with tarfile.open(tmp_path / "quick" / "runs.tar.xz", "w:xz", preset=0) as packed:
        packed.add(runs, arcname="runs")
    unpacked = reports.load_records(tmp_path, "quick")
    for path in runs.iterdir():
        path.unlink()
    runs.rmdir()
    assert reports.load_records(tmp_path, "quick") == unpacked and len(unpacked) == 2
    assert [r["task"] for r in reports.load_records(tmp_path, "quick", tasks=["wikitext2"])] == ["wikitext2"]
    assert "2 complete record(s)" in reports.write_reports_index(tmp_path).read_text()


# ------------------------------------------------------------------ the claim rule
@pytest.mark.parametrize("claimed, ci, verdict", [
    (-0.262, (-0.30, -0.14), "held"),                                 # whole CI beyond half the claim
    (-0.262, (-0.20, -0.10), "inconclusive"),                         # CI straddles -13.1 %
    (-0.262, (-0.12, -0.02), "not held: under half the claimed change"),  # whole CI short of it
    (-0.262, (0.01, 0.05), "not held: the opposite direction"),
    (0.274, (0.137, 0.2), "held"),                                    # exactly half at the CI's edge
    (0.274, (math.nan, 0.2), "inconclusive (no interval)"),
    (0.274, None, "inconclusive (no interval)"),                      # one seed: no interval
])
def test_claim_verdict_judges_only_when_the_interval_clears_the_rule(claimed, ci, verdict):
    measured = None if ci is None or math.isnan(ci[0]) else sum(ci) / 2
    assert reports.claim_verdict(claimed, 0.15 if measured is None else measured, ci=ci) == verdict
    assert reports.verdict_category(verdict) in ("held", "not held", "inconclusive")


def test_claim_verdict_without_claim_or_measurement():
    assert reports.claim_verdict(0.274, math.nan, ci=(0.1, 0.2)) == "not measured"
    assert reports.claim_verdict(None, 0.3, ci=(0.2, 0.4)) == "no claim"


def test_comparable_quality_holds_only_when_the_interval_is_within_half_a_percent():
    assert reports.claim_verdict(-0.002, 0.001, ci=(-0.004, 0.004), kind="comparable") == "held"
    assert reports.claim_verdict(-0.002, 0.001, ci=(-0.03, 0.03), kind="comparable") == "inconclusive"
    assert reports.claim_verdict(-0.002, -0.02, ci=(-0.03, -0.01), kind="comparable") == "not held"
    assert reports.claim_verdict(-0.002, 0.1, ci=(0.05, 0.15), kind="comparable",
                                 higher_is_better=True) == "not held: optimized better by more than 0.5 %"
    assert reports.claim_verdict(0.007, 0.1, ci=(0.05, 0.15), kind="comparable",
                                 higher_is_better=False) == "not held: optimized worse by more than 0.5 %"


def test_claim_verdict_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        reports.claim_verdict(0.1, 0.1, kind="bigger")


# ------------------------------------------------------------------ Table I
def timed_records(windows_base=(1000.0, 1100.0, 1050.0, 980.0), speedup=1.4):
    """Three seeds per configuration with interleaved windows (synthetic): optimized reaches
    the target in 0.75x the samples and runs `speedup` times faster in every window."""
    base = [make_record(seed=s, samples_to_target=1000.0 + 10 * s, timing=windows_base) for s in range(3)]
    opt = [make_record(config="optimized", seed=s, samples_to_target=0.75 * (1000.0 + 10 * s),
                       peak_memory_bytes=0.7 * 2**30, precision="bf16", final_quality=0.5 + 0.0002 * s,
                       timing=[speedup * w for w in windows_base]) for s in range(3)]
    return base + opt


def test_main_results_table_puts_paper_claim_beside_measured_change():
    table = reports.main_results_table(timed_records(), "cifar10").set_index("metric")
    time = table.loc["Time to target", :]
    assert time["paper_baseline"] == 42.3 and time["paper_relative"] == -0.262
    # samples to target x seconds per sample: 0.75 / 1.4 in every pair -> a zero-width interval
    assert time["measured_relative"] == pytest.approx(0.75 / 1.4 - 1)
    assert time["measured_relative_ci_low"] == pytest.approx(0.75 / 1.4 - 1)
    assert time["claim_held"] == "held"
    assert time["timing_source"] == "interleaved windows (4)"
    # geometric means: of samples to target over seeds, of samples/s over windows
    windows = (1000.0, 1100.0, 1050.0, 980.0)
    base_time = time["measured_baseline"]
    assert base_time == pytest.approx((1000.0 * 1010.0 * 1020.0) ** (1 / 3) / math.prod(windows) ** (1 / 4))
    assert 0 < time["measured_baseline_ci_low"] < base_time < time["measured_baseline_ci_high"]
    assert table.loc["Throughput", "measured_relative"] == pytest.approx(0.4)
    assert table.loc["Throughput", "claim_held"] == "held"  # +40 % vs claimed +27.4 %
    assert table.loc["Peak memory", "claim_held"] == "held"  # -30 % in every seed vs claimed -25.6 %
    assert table.loc["Final accuracy", "claim_held"] == "held"  # within ±0.5 % in the whole interval
    shown = reports.format_main_table(table.reset_index()).set_index("Metric")
    assert shown.loc["Throughput", "Measured change (95% CI)"] == "+40.0% [+40.0, +40.0]"


def test_noisy_windows_make_a_throughput_claim_inconclusive_not_flipped():
    base = [make_record(seed=s, timing=(1000.0, 1000.0, 1000.0)) for s in range(3)]
    opt = [make_record(config="optimized", seed=s, precision="bf16", timing=(1400.0, 1000.0, 1100.0))
           for s in range(3)]
    table = reports.main_results_table(base + opt, "cifar10").set_index("metric")
    assert table.loc["Throughput", "measured_relative"] > 0.137  # the mean alone would say "held"
    assert table.loc["Throughput", "claim_held"] == "inconclusive"


def test_two_timing_windows_give_no_interval_and_say_so():
    # a smoke run times 2 windows: t(0.975, 1) = 12.7 made intervals such as [-100.0, +71601482.6]
    base = [make_record(seed=0, timing=(1000.0, 500.0))]
    opt = [make_record(config="optimized", seed=0, precision="bf16", timing=(300.0, 1400.0))]
    table = reports.main_results_table(base + opt, "cifar10").set_index("metric")
    assert math.isnan(table.loc["Throughput", "measured_relative_ci_low"])
    assert table.loc["Throughput", "claim_held"] == "inconclusive (no interval)"
    shown = reports.format_main_table(table.reset_index()).set_index("Metric")
    assert shown.loc["Throughput", "Measured change (95% CI)"].endswith("% (2 windows: no interval)")
    assert shown.loc["Throughput", "Measured baseline"] == "750.0 img/s (2 windows: no interval)"


def test_one_seed_leaves_seed_quantities_inconclusive_but_judges_memory():
    records = [make_record(seed=0), make_record(config="optimized", seed=0, peak_memory_bytes=0.7 * 2**30,
                                                time_to_target_s=70.0)]
    table = reports.main_results_table(records, "cifar10").set_index("metric")
    assert table.loc["Time to target", "claim_held"] == "inconclusive (no interval)"
    assert table.loc["Time to target", "timing_source"] == "each run's own clock (not interleaved)"
    assert table.loc["Peak memory", "claim_held"] == "held"  # bit-identical across seeds and reruns


def test_main_results_table_counts_an_unreached_target_and_says_so():
    records = paired_records(time_to_target_s=None)
    table = reports.main_results_table(records, "cifar10").set_index("metric")
    # the optimized runs missed it in both seeds: they count at their runs' length, a bound that
    # flatters them, so the claim cannot be held (it was "not measured" when missed seeds were dropped)
    verdict = table.loc["Time to target", "claim_held"]
    assert verdict.startswith("inconclusive (0 of 2 seeds reached the target in both")
    shown = reports.format_main_table(table.reset_index()).set_index("Metric")
    assert shown.loc["Time to target", "Measured optimized"] == "not reached"


def test_wikitext_table_has_no_flops_claim():
    records = [make_record(task="wikitext2", config=c, final_quality=q, data_source="stand-in: text (NOT WikiText-2)")
               for c, q in (("baseline", 300.0), ("optimized", 310.0))]
    table = reports.main_results_table(records, "wikitext2").set_index("metric")
    assert table.loc["Model FLOPs utilization", "claim_held"] == "no claim"
    assert table.loc["Final perplexity", "claim_held"] == "inconclusive (no interval)"  # one seed


def test_auto_stands_beside_the_optimized_configuration_with_its_change_and_no_verdict():
    records = timed_records()
    windows = (1000.0, 1100.0, 1050.0, 980.0)
    records += [make_record(config="auto", seed=s, samples_to_target=1000.0 + 10 * s, precision="bf16",
                            peak_memory_bytes=0.5 * 2**30, timing=[2.0 * w for w in windows]) for s in range(3)]
    table = reports.main_results_table(records, "cifar10").set_index("metric")
    assert table.loc["Throughput", "measured_auto_relative"] == pytest.approx(1.0)  # 2x in every window
    assert table.loc["Peak memory", "measured_auto_relative"] == pytest.approx(-0.5)
    assert table.loc["Throughput", "claim_held"] == "held"  # the verdict stays the optimized one's
    shown = reports.format_main_table(table.reset_index()).set_index("Metric")
    assert shown.loc["Throughput", "Auto change (95% CI)"] == "+100.0% [+100.0, +100.0]"
    assert "Measured auto (planned here)" in shown.columns
    without = reports.format_main_table(reports.main_results_table(timed_records(), "cifar10"))
    assert "Auto change (95% CI)" not in without.columns  # not run: no empty columns
    ablation = reports.ablation_table(records, "cifar10").set_index("config")
    assert ablation.loc["auto", "group"] == "auto"
    assert list(ablation.index).index("auto") == list(ablation.index).index("optimized") + 1
    assert ablation.loc["auto", "measured_throughput_change"] == pytest.approx(1.0)
    assert ablation.loc["auto", "claim_held_time"] == "no claim"
    assert "auto" not in set(reports.ablation_table(timed_records(), "cifar10")["config"])


def test_main_results_table_rejects_unknown_task():
    with pytest.raises(ValueError, match="task='imagenet'"):
        reports.main_results_table([], "imagenet")


# ------------------------------------------------------------------ Table III / IV
def test_ablation_table_orders_ladder_then_leave_one_out_with_changes_vs_baseline():
    records = [make_record(config="baseline", seed=s, time_to_target_s=100.0 + s) for s in range(3)]
    records += [make_record(config="+accumulation", seed=s, time_to_target_s=0.8 * (100.0 + s), peak_memory_bytes=2**29)
                for s in range(3)]
    records += [make_record(config="-checkpointing", seed=s, time_to_target_s=90.0) for s in range(3)]
    table = reports.ablation_table(records, "cifar10").set_index("config")
    assert list(table.index[:6]) == ["baseline", "+accumulation", "+mixed_precision", "+lr_schedule",
                                     "+checkpointing", "+zero2"]
    assert table.loc["+accumulation", "measured_time_change"] == pytest.approx(-0.2)
    assert table.loc["+accumulation", "measured_memory_change"] == pytest.approx(-0.5)
    assert table.loc["+accumulation", "paper_time_min"] == 38.1
    assert table.loc["-checkpointing", "group"] == "leave-one-out"
    assert math.isnan(table.loc["+zero2", "paper_time_min"])  # the paper has no ZeRO-2 rung
    # paper: +accumulation time -9.9 %, memory -13.6 %; measured -20 % and -50 %
    assert table.loc["+accumulation", ["claim_held_time", "claim_held_memory"]].tolist() == ["held", "held"]
    assert table.loc["-checkpointing", "claim_held_time"] == "no claim"
    shown = reports.format_ablation_table(table.reset_index())
    assert "+zero2" not in set(shown["Configuration"])  # neither measured nor claimed
    verdicts = shown.set_index("Configuration")["Claim held?"]
    assert verdicts["+accumulation"] == "time: held; memory: held" and verdicts["-checkpointing"] == "—"
    slower = reports.ablation_table(records[:3] + [make_record(config="+accumulation", seed=s, time_to_target_s=120.0 + s)
                                                   for s in range(3)], "cifar10").set_index("config")
    assert slower.loc["+accumulation", "claim_held_time"] == "not held: the opposite direction"


def test_a_mixed_precision_rung_that_ran_fp32_judges_no_claim_and_counts_as_not_measured(tmp_path):
    from trainopt_core.reporting.summary import counts, verdict_summary

    records = [make_record(config="baseline", seed=s, time_to_target_s=100.0 + s) for s in range(3)]
    for precision in ("fp32", "bf16"):  # a CPU without bf16 instructions, and one with them
        runs = records + [make_record(config=name, seed=s, time_to_target_s=0.8 * (100.0 + s), peak_memory_bytes=2**29,
                                      precision="fp32" if name == "+accumulation" else precision)
                          for name in ("+accumulation", "+mixed_precision") for s in range(3)]
        table = reports.ablation_table(runs, "cifar10").set_index("config")
        verdicts = table.loc["+mixed_precision", ["claim_held_time", "claim_held_memory"]].tolist()
        shown = reports.format_ablation_table(table.reset_index()).set_index("Configuration")["Claim held?"]
        if precision == "bf16":
            assert verdicts == ["held", "held"]
            continue
        assert verdicts == [reports.tables._component_not_run("+mixed_precision", "fp32")] * 2
        assert verdicts[0].startswith("not measured: mixed precision did not run here")
        assert shown["+mixed_precision"] == verdicts[0]  # said once, not for time and memory apart
        changes = reports.format_ablation_table(table.reset_index()).set_index("Configuration")
        assert changes.loc["+mixed_precision", "Measured vs baseline (95% CI)"].startswith("— (mixed precision did not")
        assert table.loc["+accumulation", "claim_held_time"] == "held"  # its own component ran
        table.reset_index().to_csv(tmp_path / "table3_ablation_resnet.csv", index=False)
        summary = verdict_summary(tmp_path).set_index("claim")
        assert summary.loc[["ResNet +mixed_precision: time to target", "ResNet +mixed_precision: peak memory"],
                           "category"].tolist() == ["not measured"] * 2  # "–" in the counts
        assert summary.loc["ResNet +mixed_precision: time to target", "measured"] == "—"  # not +accumulation's
        assert counts(summary)["not measured"] >= 2


def test_scaling_table_marks_modelled_rows_and_adds_paper_values():
    rows = [dict(world_size=1, config="baseline", throughput=100.0, efficiency=1.0, modelled=False, source="measured"),
            dict(world_size=4, config="baseline", throughput=350.0, efficiency=0.875, modelled=True,
                 source="modelled: ring all-reduce", latency_s=1e-5)]
    table = reports.scaling_table(rows).set_index("world_size")
    assert table.loc[1, "source"] == "measured" and table.loc[4, "source"] == "modelled"
    assert table.loc[4, "source_detail"] == "modelled: ring all-reduce" and table.loc[4, "latency_s"] == 1e-5
    assert table.loc[4, "paper_efficiency"] == 0.857
    shown = reports.format_scaling_table(table.reset_index()).set_index("World size")
    assert shown.loc[4, "Source"] == "modelled" and shown.loc[4, "Efficiency T_n/(n·T_1) (95% CI)"] == "87.5%"
    assert table.loc[4, "claim_held"] == "modelled, not judged" and table.loc[1, "claim_held"] == "—"
    with pytest.raises(ValueError, match="missing 'efficiency'"):
        reports.scaling_table([dict(world_size=1, config="baseline", throughput=1.0)])


@pytest.mark.parametrize("measured, ci, verdict", [
    (0.95, (0.93, 0.97), "held"), (0.92, (0.915, 0.925), "held"), (0.92, (0.85, 0.99), "inconclusive"),
    (0.85, (0.83, 0.87), "not held: 6.1+ points lower"), (0.95, None, "inconclusive (no interval)")])
def test_measured_scaling_efficiency_is_judged_against_the_papers_at_the_same_world_size(measured, ci, verdict):
    rows = [dict(world_size=2, config="baseline", throughput=2 * measured * 100, efficiency=measured, modelled=False,
                 efficiency_ci=ci)]
    table = reports.scaling_table(rows)  # paper: baseline 93.1 % on 2 GPUs
    assert table.loc[0, "claim_held"] == verdict
    assert reports.format_scaling_table(table).loc[0, "Claim held?"] == verdict
    assert reports.efficiency_verdict(None, measured) == "no claim"


# ------------------------------------------------------------------ files, captions, index
def test_write_table_writes_csv_numbers_and_markdown_with_caption(tmp_path):
    records = paired_records()
    table = reports.main_results_table(records, "cifar10")
    text = reports.caption("Table I", records)
    paths = reports.write_table(table, tmp_path, "table1", text, display=reports.format_main_table(table))
    csv = pd.read_csv(paths["csv"])
    assert csv.loc[csv["metric"] == "Throughput", "measured_optimized"].item() == pytest.approx(1400.0)
    markdown = paths["markdown"].read_text()
    assert "| Metric | Paper baseline |" in markdown and "| Throughput |" in markdown
    assert STANDIN in markdown


def test_caption_names_the_stand_in_and_the_precision_that_ran():
    records = paired_records()
    records[-1]["notes"] = ["precision fp16 -> bf16 on CPU"]
    text, notes = reports.caption("Table I", records), "\n".join(reports.footnotes(records))
    assert "NOT CIFAR-10" in text and "Test CPU" in text and len(text.split()) <= 40
    assert "bf16 (optimized)" in notes and "fp32 (baseline)" in notes
    assert "Precision fp16 -> bf16 on CPU." in notes


def test_a_timed_tables_notes_say_the_target_each_time_to_target_is_to():
    records = [make_record(seed=s, timing=[10.0, 11.0]) for s in (0, 1)]
    records += [make_record(task="wikitext2", seed=0, timing=[10.0]) | {"profile": "quick"}]
    records[-1]["metrics"]["target"] = 92.9
    notes = reports.footnotes(records)
    assert "Target: accuracy ≥ 40 % on the evaluation split, the `smoke` profile's for this model and data (the " \
        "paper's times are to its own targets)." in notes
    assert any(note.startswith("Target: perplexity ≤ 92.9 on the evaluation split, the `quick` profile's")
               for note in notes)
    assert not any(note.startswith("Target:") for note in reports.footnotes(records, timing=False))


def test_notes_are_listed_once_and_runs_with_the_same_reason_are_merged(tmp_path):
    records = paired_records()
    why = "activation checkpointing recomputes the same values, so both train bit-identically"
    records[0]["notes"] = [f"quality curve from the run of 'A': {why}; no whole-run clock",
                           "precision fp16 -> fp32 on this CPU: no bf16; mixed precision is off"]
    records[1]["notes"] = [f"quality curve from the run of 'B': {why}; no whole-run clock; precision fp16 -> fp32 "
                           "on this CPU: no bf16; mixed precision is off"]
    notes = reports.footnotes(records)
    # a clause stays with its subject; a precision note two runs share is said once
    assert sorted(notes[2:]) == ["Precision fp16 -> fp32 on this CPU: no bf16; mixed precision is off.",
                                 f"Quality curve from the runs of 'A', 'B': {why}; no whole-run clock."]
    paths = reports.write_table(pd.DataFrame({"a": [1]}), tmp_path, "t", "c", notes=notes)
    markdown = paths["markdown"].read_text()
    assert markdown.count("no whole-run clock") == 1 and ". Quality curve from the runs of 'A', 'B'" in markdown


def test_write_table_rejects_a_path_as_name(tmp_path):
    with pytest.raises(ValueError, match="name="):
        reports.write_table(pd.DataFrame({"a": [1]}), tmp_path, "x/y", "c")


def test_reports_index_lists_each_profile_with_tables_figures_and_manifest(tmp_path):
    for profile in ("smoke", "quick"):
        runs = tmp_path / profile / "runs"
        runs.mkdir(parents=True)
        (runs / "r.json").write_text(json.dumps(make_record(profile=profile)))
    reports.write_table(pd.DataFrame({"a": [1.5]}), tmp_path / "smoke" / "tables", "table1", "a caption")
    (tmp_path / "smoke" / "figures").mkdir()
    (tmp_path / "smoke" / "figures" / "curves.png").write_bytes(b"png")
    index = reports.write_reports_index(tmp_path).read_text()
    # the quick reference first; a smoke run (a plumbing check) has its own page, linked at the end
    assert index.index("## Profile `quick`") < index.index("## Profile `smoke`: a plumbing check")
    assert "[smoke/README.md](smoke/README.md)" in index and "a caption" not in index
    smoke = (tmp_path / "smoke" / "README.md").read_text()
    assert smoke.startswith("# Profile `smoke`") and "a caption" in smoke and "(./figures/curves.png)" in smoke
    assert "** — Quality vs training time (evaluation excluded, each run's own clock): per configuration the mean" in smoke
    assert STANDIN in index and "deadbeef" in index and "Test CPU" in index


# ------------------------------------------------------------------ figures
def test_figures_title_the_data_source_and_are_saved(tmp_path):
    records = paired_records()
    for make in (reports_figures.quality_curves, reports_figures.memory_breakdown_bars,
                 reports_figures.noise_trajectory):
        fig = make(records, "cifar10")
        titles = [ax.get_title() for ax in fig.axes] + [fig._suptitle.get_text() if fig._suptitle else ""]
        assert any("NOT CIFAR-10" in t.replace("\n", " ") for t in titles), make.__name__
        assert reports_figures.save_figure(fig, tmp_path, make.__name__).stat().st_size > 1000


def test_the_noise_trajectory_tells_each_seed_apart():
    records = [make_record(config="optimized", seed=s) for s in range(3)]
    fig = reports_figures.noise_trajectory(records, "cifar10")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "optimized, seed 0", "optimized, seed 1", "optimized, seed 2"]
    assert len({line.get_linestyle() for line in fig.axes[0].get_lines()}) == 3


def test_a_curve_without_its_own_clock_is_placed_by_its_timed_speed_dashed():
    """A checkpointed run whose curve came from its un-checkpointed twin has no clock: drawn
    dashed at samples ÷ its interleaved-timed samples/s (median of windows); without timing it
    is left out and named."""
    timed = make_record(config="optimized", timing=(40.0, 50.0, 60.0))
    untimed = make_record(config="+checkpointing")
    for record in (timed, untimed):
        record["history"] = [dict(h, time_s=None) for h in record["history"]]
        record["quality_from"] = "optimized without checkpointing"
    fig = reports_figures.quality_curves([make_record(), timed, untimed], "cifar10")
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["optimized"].get_xdata()) == [h["samples"] / 50.0 for h in timed["history"]]
    assert lines["optimized"].get_linestyle() == "--" and lines["baseline"].get_linestyle() == "-"
    assert "+checkpointing" not in lines
    notes = " ".join(text.get_text() for text in ax.texts)
    assert "dashed: optimized" in notes and "+checkpointing = optimized without checkpointing" in notes


def test_memory_breakdown_frame_means_each_category_over_seeds():
    records = [make_record(seed=0, breakdown={"activations": 100.0}), make_record(seed=1, breakdown={"activations": 300.0})]
    frame = reports_figures.memory_breakdown_frame(records, "cifar10")
    assert frame.loc["baseline", "activations"] == 200.0


def test_resolve_reports_dir_is_relative_to_the_notebooks_folder(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path)
    assert reports.resolve_reports_dir("../reports") == (tmp_path / "reports").resolve()  # from the repo root
    monkeypatch.chdir(tmp_path / "notebooks")
    assert reports.resolve_reports_dir("../reports") == (tmp_path / "reports").resolve()
    assert reports.resolve_reports_dir(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    # "reports" typed in the repo root, where notebooks/reports does not exist: the one beside notebooks/
    monkeypatch.chdir(tmp_path)
    assert reports.resolve_reports_dir("reports") == (tmp_path / "notebooks" / "reports").resolve()  # none yet
    (tmp_path / "reports").mkdir()
    assert reports.resolve_reports_dir("reports") == (tmp_path / "reports").resolve()


def test_index_says_which_runs_ran_on_releases_other_than_the_pins():
    from trainopt_core.reporting.index import describe_manifest

    pinned, other, older = make_record(seed=0), make_record(seed=1), make_record(seed=2)
    pinned["manifest"]["releases_off_pins"] = {}
    other["manifest"]["releases_off_pins"] = {"pandas": "9.0"}
    key = "Pinned releases (constraints.txt)"
    assert describe_manifest([pinned])[key] == "every installed package at its pin"
    assert describe_manifest([pinned, other])[key] == "installed at other releases: pandas 9.0"
    assert describe_manifest([older])[key] == "not recorded"  # a record from before the field
    assert describe_manifest([pinned, older])[key] == "every installed package at its pin (1 of 2 runs recorded it)"


def test_hardware_line_names_gpus_of_cuda_runs_and_the_cpu_otherwise():
    from trainopt_core.reporting.index import describe_hardware

    gpu = dict(device="cuda", hardware=dict(cpu_model="Some CPU", gpus=[dict(name="NVIDIA H100", driver="550")] * 2))
    assert describe_hardware(gpu) == "GPU 2x NVIDIA H100 (driver 550)"
    assert describe_hardware(dict(gpu, device="cpu")) == "CPU Some CPU"
    assert describe_hardware({}) == ""


def test_table_cells_are_readable_numbers_and_bytes_show_in_mib():
    assert reports.format_number(51389440.0) == "51,389,440"
    assert reports.format_number(13.0913) == "13.09"
    assert reports.format_number(0.000123) == "0.0001"
    assert reports.format_number(math.nan) == "—"
    shown = reports.format_bytes_frame(pd.DataFrame({"category": ["activations"], "baseline": [2.0 * 2**20],
                                                     "optimized vs baseline": [-0.25]}))
    assert shown.iloc[0].tolist() == ["activations", "2.000 MiB", "-25.0%"]


def test_analysis_tables_read_with_units_full_headers_and_no_index():
    from trainopt_core.reporting.index import readable_frame

    raw = pd.DataFrame({"phase": ["early", "late"], "samples_from": [0.0, 5571.4], "baseline_s": [17.5012, None],
                        "speedup": [0.806, 1.2], "share_of_time_saved": [0.4641, 0.5359], "self_time_ms": [594.83, 0.38],
                        "median_b_simple": [247.1, 767.8]})
    shown = readable_frame(raw)
    assert list(shown.columns) == ["phase", "samples from", "baseline (s)", "speedup (×)", "share of time saved (%)",
                                   "self time (ms)", "median B_simple"]
    assert shown.iloc[0].tolist() == ["early", "0", "17.5", "0.81×", "46.4 %", "594.8", "247.1"]
    assert shown.iloc[1]["baseline (s)"] == "—" and shown.iloc[1]["samples from"] == "5,571"
    markdown = reports.markdown_table(shown)
    assert markdown.splitlines()[0].startswith("| phase | samples from |")  # no index column


def test_curves_draw_each_configurations_seed_mean_with_a_band_and_its_seeds_thin():
    records = []
    for seed, shift in ((0, 0.0), (1, 0.02), (2, 0.04)):
        record = make_record(seed=seed)
        record["history"] = [dict(h, quality=h["quality"] + shift) for h in record["history"]]
        records.append(record)
    fig = reports_figures.quality_curves(records, "cifar10")
    (ax,) = fig.axes
    mean = next(line for line in ax.get_lines() if line.get_label() == "baseline")
    expected = [100 * (h["quality"] + 0.02) for h in records[0]["history"]]
    assert list(mean.get_ydata()) == pytest.approx(expected)
    thin = [line for line in ax.get_lines() if line.get_label().startswith("_") and line.get_linewidth() < 1]
    assert len(thin) == 3 and len(ax.collections) == 1  # three seeds beneath, one band
    assert "mean of 3 seeds" in ax.get_legend().get_title().get_text()


def test_scaling_figure_draws_each_measured_efficiency_with_its_interval():
    rows = [dict(world_size=1, config="baseline", throughput=100.0, efficiency=1.0, modelled=False),
            dict(world_size=2, config="baseline", throughput=160.0, efficiency=0.8, modelled=False,
                 efficiency_ci=(0.6, 1.0))]
    fig = reports_figures.scaling_plot(reports.scaling_table(rows))
    bars = [c for c in fig.axes[1].containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    (segment,) = bars[0].lines[2][0].get_segments()
    assert [tuple(point) for point in segment] == [(2.0, pytest.approx(0.6)), (2.0, pytest.approx(1.0))]


def test_a_smoke_table_says_plumbing_check_where_a_verdict_would_stand(tmp_path, capsys):
    from trainopt_core.reporting.notebook import publish_table, report_paths
    from trainopt_core.reporting.summary import PLUMBING

    records = [make_record(profile="smoke"), make_record(config="optimized", profile="smoke")]
    shown = pd.DataFrame({"Metric": ["Throughput", "Memory"], "Claim held?": ["not held", "no claim"]})
    publish_table(shown, report_paths(tmp_path, "smoke"), "table1", "Table I", records, display=shown)
    markdown = (tmp_path / "smoke" / "tables" / "table1.md").read_text()
    assert PLUMBING in markdown and "not held" not in markdown and "no claim" in markdown
    assert "| Metric | Claim held? |" in markdown  # an all-empty column would be dropped; this one is not
    quick = [dict(r, profile="quick") for r in records]
    publish_table(shown, report_paths(tmp_path, "quick"), "table1", "Table I", quick, display=shown)
    assert "not held" in (tmp_path / "quick" / "tables" / "table1.md").read_text()


def test_a_published_table_drops_the_columns_with_nothing_in_them(tmp_path):
    from trainopt_core.reporting.notebook import publish_table, report_paths

    shown = pd.DataFrame({"Metric": ["Throughput", "Memory"], "Paper baseline": ["—", "—"], "Measured": ["1", "2"]})
    publish_table(shown, report_paths(tmp_path, "quick"), "t", "T", [make_record()], display=shown)
    markdown = (tmp_path / "quick" / "tables" / "t.md").read_text()
    assert "| Metric | Measured |" in markdown and "Paper baseline" not in markdown
