"""Error analysis (phases, components, eq. 21, noise, operations, activations) and the
explorer's computations. Run records here are synthetic test fixtures, not results."""
import math

import pytest
import torch
from torch import nn
from torch.profiler import record_function

from test_reports import make_record
from trainopt_core import ABLATION_LADDER, OptimizationConfig
from trainopt_core.reporting import analysis, explorer, format_bytes_frame
from trainopt_core.checkpointing import expected_saved_fraction


def with_clock(record, seconds_per_step):
    """Give a synthetic record one step per 32 samples at the given per-step durations."""
    clock, steps = 0.0, []
    for i, dt in enumerate(seconds_per_step):
        clock += dt
        steps.append(dict(record["steps"][0], step=i + 1, time_s=clock, samples_consumed=32 * (i + 1), k=4 + i % 3,
                          b_simple=float(10 * (i + 1)), effective_batch_size=32))
    record["steps"] = steps
    return record


# ------------------------------------------------------------------ phases
def with_curve(record, samples, qualities):
    record["history"] = [dict(record["history"][0], samples=s, quality=q) for s, q in zip(samples, qualities)]
    return record


def test_convergence_phases_end_at_half_and_90_percent_of_the_baseline_improvement():
    samples = list(range(0, 601, 50))
    seeds = [with_curve(make_record(config="baseline", seed=seed), samples,
                        [0.1 + 0.8 * (1 - math.exp(-s / 100)) + 0.01 * seed for s in samples]) for seed in (0, 1)]
    edges = analysis.convergence_phases(seeds, "cifar10")
    # progress(s) = (1 - e^(-s/100)) / (1 - e^-6): 50 % near s = 69, 90 % near s = 230 (linear between evaluations)
    assert edges[0] == 0 and edges[-1] == 600
    assert edges[1] == pytest.approx(100 * -math.log(1 - 0.5 * (1 - math.exp(-6))), abs=6)
    assert edges[2] == pytest.approx(100 * -math.log(1 - 0.9 * (1 - math.exp(-6))), abs=10)
    # perplexity: progress in loss (log perplexity), falling curve
    text = [with_curve(make_record(task="wikitext2", config="baseline"), samples,
                       [math.exp(2 + 6 * math.exp(-s / 100)) for s in samples])]
    text_edges = analysis.convergence_phases(text, "wikitext2")
    assert text_edges[1] == pytest.approx(edges[1], abs=6) and text_edges[2] == pytest.approx(edges[2], abs=10)
    assert analysis.convergence_phases(seeds, "wikitext2") is None  # no baseline of that task


def test_phase_speedups_split_time_saved_by_phases_of_the_baseline_curve():
    samples = [0, 48, 96, 144, 192]
    base = with_curve(with_clock(make_record(config="baseline"), [1.0] * 6), samples, [0.1, 0.3, 0.5, 0.7, 0.9])
    opt = with_clock(make_record(config="optimized"), [0.5, 0.5, 0.75, 0.75, 1.0, 1.0])
    table = analysis.phase_speedups([base, opt], "cifar10").set_index("phase")
    assert list(table.index) == ["early", "middle", "late"]
    # linear curve: phases end at 50 % and 90 % of the samples (96, 172.8)
    assert table["samples_to"].tolist() == [96, 173, 192]
    assert table["baseline_s"].tolist() == pytest.approx([3.0, 2.4, 0.6])
    assert table["optimized_s"].tolist() == pytest.approx([1.75, 2.15, 0.6])
    assert table.loc["early", "speedup"] == pytest.approx(3.0 / 1.75)
    # saved: early 1.25 s, middle 0.25 s, late 0 s
    assert table.loc["early", "share_of_time_saved"] == pytest.approx(1.25 / 1.5)
    assert table["share_of_time_saved"].sum() == pytest.approx(1.0)
    thirds = analysis.phase_speedups([base, opt], "cifar10", num_phases=2)
    assert thirds["baseline_s"].tolist() == pytest.approx([3.0, 3.0])


def test_a_run_without_its_own_clock_borrows_its_curve_runs_clock_scaled_by_timed_speed():
    """optimized's curve came from an un-checkpointed run, present as -checkpointing (computed by
    it): its per-step clock is that run's, times the ratio of their interleaved-timed speeds."""
    twin = with_clock(make_record(config="-checkpointing", timing=(90.0, 100.0, 110.0)), [0.5, 1.0, 1.5])
    twin["computed_as"] = "optimized without checkpointing"
    derived = with_clock(make_record(config="optimized", timing=(40.0, 50.0, 60.0)), [1.0, 1.0, 1.0])
    derived["steps"] = [dict(step, time_s=None) for step in derived["steps"]]
    derived["quality_from"] = "optimized without checkpointing"
    clocked = analysis.with_borrowed_clock(derived, [twin, derived])
    assert [s["time_s"] for s in clocked["steps"]] == pytest.approx([1.0, 3.0, 6.0])  # (0.5, 1.5, 3.0) x 100/50
    assert clocked["clock_from"] == dict(run="-checkpointing", scale=2.0)
    assert analysis.with_borrowed_clock(twin, [twin]) is twin  # has its own
    other_seed = dict(twin, seed=1)
    unchanged = analysis.with_borrowed_clock(derived, [other_seed])
    with pytest.raises(ValueError, match="own per-step clock"):
        analysis.time_at_samples(unchanged, [16])
    base = with_curve(with_clock(make_record(config="baseline"), [1.0] * 3), [0, 48, 96], [0.1, 0.5, 0.9])
    table = analysis.phase_speedups([base, twin, derived], "cifar10")
    assert table["optimized_s"].sum() == pytest.approx(6.0)


def test_time_at_samples_interpolates_the_step_clock():
    record = with_clock(make_record(), [1.0, 3.0])
    assert analysis.time_at_samples(record, [16, 48]).tolist() == pytest.approx([0.5, 2.5])


# ------------------------------------------------------------------ components and eq. 21
def contribution_records():
    return [make_record(config="baseline", throughput=100.0, peak_memory_bytes=1000),
            make_record(config="optimized", throughput=150.0, peak_memory_bytes=600),
            make_record(config="-mixed_precision", throughput=100.0, peak_memory_bytes=700),
            make_record(config="-checkpointing", throughput=165.0, peak_memory_bytes=900)]


def test_component_contributions_from_leave_one_out():
    table = analysis.component_contributions(contribution_records(), "cifar10").set_index("component")
    assert table.loc["mixed_precision", "throughput_contribution"] == pytest.approx(0.5)
    assert table.loc["checkpointing", "throughput_contribution"] == pytest.approx(150 / 165 - 1)
    assert table.loc["checkpointing", "memory_saving"] == pytest.approx(1 / 3)
    patterns = analysis.architecture_patterns(contribution_records()).set_index("task")
    assert patterns.loc["cifar10", "best_for_throughput"] == "mixed_precision"
    assert patterns.loc["cifar10", "best_for_memory"] == "checkpointing"


def test_eq21_predicts_net_speedup_from_gain_and_recompute_overhead():
    records = contribution_records()
    from_records = analysis.eq21_decomposition(records, "cifar10")
    assert from_records["throughput_gain"] == pytest.approx(1.65)
    assert from_records["recompute_overhead"] == pytest.approx(0.1)
    assert from_records["predicted_net_speedup"] == pytest.approx(from_records["measured_net_speedup"])  # identity
    direct = analysis.eq21_decomposition(records, "cifar10", recompute_overhead=0.2)
    assert direct["predicted_net_speedup"] == pytest.approx(1.65 / 1.2)
    assert direct["measured_net_speedup"] == pytest.approx(1.5)
    assert direct["paper_net_speedup"] == 1.27


def test_noise_by_phase_averages_k_and_b_simple_per_phase():
    record = with_clock(make_record(config="optimized"), [1.0] * 6)  # k = 4,5,6,4,5,6; B = 10..60
    for i, step in enumerate(record["steps"]):
        step["noise_significant"] = i >= 2
    table = analysis.noise_by_phase([record], "cifar10").set_index("phase")  # no baseline: thirds of the steps
    assert table.loc["early", "mean_k"] == pytest.approx(4.5)
    assert table.loc["late", "median_b_simple"] == pytest.approx(55.0)
    assert table.loc["early", "significant_share"] == 0 and table.loc["late", "significant_share"] == 1
    # with a baseline curve: steps by the phase of the samples they started at (0-96, 96-172.8, 172.8-192)
    base = with_curve(make_record(config="baseline"), [0, 48, 96, 144, 192], [0.1, 0.3, 0.5, 0.7, 0.9])
    table = analysis.noise_by_phase([record, base], "cifar10", configs=["optimized"]).set_index("phase")
    assert table["steps"].tolist() == [3, 3, 0]
    assert table.loc["middle", "mean_k"] == pytest.approx(5.0)


def test_memory_by_category_compares_with_the_baseline():
    records = [make_record(config="baseline", breakdown={"activations": 400.0, "parameters": 100.0}),
               make_record(config="optimized", breakdown={"activations": 100.0, "parameters": 100.0})]
    table = analysis.memory_by_category(records, "cifar10")
    assert table.loc["activations", "optimized vs baseline"] == pytest.approx(-0.75)
    assert table.loc["parameters", "optimized vs baseline"] == pytest.approx(0.0)


def test_memory_by_category_does_not_compare_against_a_category_the_baseline_lacks_at_its_peak():
    # the baseline peaks before its gradients exist (0.04 % of its peak); the optimized run holds them
    records = [make_record(config="baseline", breakdown={"activations": 2400.0, "gradients": 1.0}),
               make_record(config="optimized", breakdown={"activations": 10.0, "gradients": 143.0})]
    table = analysis.memory_by_category(records, "cifar10")
    assert math.isnan(table.loc["gradients", "optimized vs baseline"])
    assert table.loc["activations", "optimized vs baseline"] == pytest.approx(10 / 2400 - 1)
    # what it says instead: the bytes the optimized run holds more, signed, in MiB
    assert table.loc["gradients", "optimized minus baseline"] == pytest.approx(142.0)
    shown = format_bytes_frame(table.reset_index()).set_index("category")
    assert shown.loc["gradients", "optimized vs baseline"] == "—"
    assert shown.loc["gradients", "optimized minus baseline"] == f"+{142 / 2**20:,.3f} MiB"


# ------------------------------------------------------------------ operations and activations
@pytest.mark.parametrize("name, category", [
    ("aten::mkldnn_convolution", "convolution"),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", "convolution"),
    ("aten::addmm", "matmul/attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "matmul/attention"),
    ("aten::native_layer_norm_backward", "normalization"),
    ("aten::threshold_backward", "element-wise"),
    ("aten::add_", "element-wise"),
    ("c10d::allreduce_", "communication"),
    ("aten::empty", "other"),
    # names as torch 2.14's profiler reports them on a CPU: autograd nodes in CamelCase, ReLU as
    # clamp_min_, dropout's masks drawn by bernoulli_, masked softmax's checks
    ("autograd::engine::evaluate_function: NativeBatchNormBackward0", "normalization"),
    ("NativeLayerNormBackward0", "normalization"),
    ("MmBackward0", "matmul/attention"),
    ("aten::bernoulli_", "dropout"),
    ("aten::native_dropout", "dropout"),
    ("aten::clamp_min_", "element-wise"),
    ("aten::_safe_softmax", "element-wise"),
    ("aten::isneginf", "element-wise"),
    ("aten::linalg_vector_norm", "element-wise"),
    ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "element-wise"),
    ("ToCopyBackward0", "element-wise"),
    ("aten::embedding", "other"),
    ("aten::empty_strided", "other"),
])
def test_op_category(name, category):
    assert analysis.op_category(name) == category


def test_profile_training_steps_attributes_time_to_categories():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 10))
    optimizer = torch.optim.AdamW(model.parameters())

    def step():
        loss = nn.functional.cross_entropy(model(torch.randn(8, 3, 8, 8)), torch.randint(0, 10, (8,)))
        loss.backward()
        with record_function(analysis.OPTIMIZER_REGION):
            optimizer.step()
            optimizer.zero_grad()
        return 8

    table = analysis.profile_training_steps(step, steps=2).set_index("category")
    assert table["share"].sum() == pytest.approx(1.0)
    for category in ("convolution", "matmul/attention", "normalization", "optimizer"):
        assert table.loc[category, "self_time_ms"] > 0, category
    assert table.loc["communication", "self_time_ms"] == 0
    assert table.loc["optimizer", "time_per_item_ms"] == pytest.approx(table.loc["optimizer", "self_time_ms"] / 16)


def test_activation_bytes_are_attributed_to_the_module_type_that_saved_them():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    counts = analysis.activation_bytes_by_module_type(model, lambda: model(x).sum())
    # Linear saves its input (4x8 fp32); ReLU saves its output (4x16), which the second Linear
    # saves again (counted once); weights are parameters and are not counted.
    assert counts == {"ReLU": 4 * 16 * 4, "Linear": 4 * 8 * 4}


# ------------------------------------------------------------------ explorer
def test_predict_memory_follows_eqs_8_17_19():
    model = explorer.MemoryModel(num_parameters=1000, activation_bytes_per_sample=100.0, num_blocks=16)
    plain = explorer.predict_memory_bytes(model, effective_batch_size=32)
    assert plain == dict(parameters=4000, gradients=4000, optimizer_state=8000, activations=3200, total=19200)
    optimized = explorer.predict_memory_bytes(model, effective_batch_size=32, k=4, precision="bf16", segments="sqrt")
    assert optimized["parameters"] == 2000 and optimized["gradients"] == 2000
    assert optimized["activations"] == pytest.approx(800 * expected_saved_fraction(16, "sqrt"))
    with pytest.raises(ValueError, match="k=0"):
        explorer.predict_memory_bytes(model, effective_batch_size=32, k=0)


def test_memory_model_calibrates_on_a_baseline_record():
    record = make_record(breakdown={"activations": 800.0})
    record["profile_settings"] = {"model": {"layers": [1, 1, 1, 1], "width": 4}}
    model = explorer.memory_model_from_record(record)
    assert model.activation_bytes_per_sample == 100.0 and model.num_blocks == 4


def test_config_from_components_reproduces_the_presets():
    full = explorer.config_from_components(explorer.EXPLORER_COMPONENTS, k=6, adaptive=True, precision="fp16")
    assert full.replace(name="optimized") == OptimizationConfig.optimized()
    accumulation = explorer.config_from_components({"accumulation"}, k=4, adaptive=False)
    assert accumulation.replace(name="+accumulation") == ABLATION_LADDER[1]
    # adaptive k without the LR schedule keeps the LR unscaled, as the "-lr_schedule" runs did
    no_schedule = explorer.config_from_components(set(explorer.EXPLORER_COMPONENTS) - {"lr_schedule"}, k=6,
                                                  adaptive=True, precision="fp16")
    assert no_schedule.replace(name="-lr_schedule") == OptimizationConfig.preset("-lr_schedule")
    with pytest.raises(ValueError, match="components"):
        explorer.config_from_components({"turbo"})


def test_explore_matches_a_bf16_run_to_a_fp16_choice_and_shows_both_columns():
    base = make_record(config="baseline", breakdown={"activations": 800.0})
    base["profile_settings"] = {"model": {"layers": [1, 1, 1, 1], "width": 4}}
    base["config"] = OptimizationConfig.baseline().to_dict()
    opt = make_record(config="optimized", throughput=1234.0)
    opt["config"] = OptimizationConfig.optimized().replace(precision="bf16").to_dict()
    choice = explorer.config_from_components(explorer.EXPLORER_COMPONENTS, precision="fp16")
    assert explorer.find_measured([base, opt], "cifar10", choice) == [opt]
    table = explorer.explore([base, opt], "cifar10", choice).set_index("quantity")
    assert table.loc["throughput (img/s)", "measured"] == 1234.0
    assert table.loc["memory: activations", "predicted"] == pytest.approx(
        100.0 * 8 / 4 * expected_saved_fraction(4, "sqrt"))
    assert not math.isnan(table.loc["memory: total", "measured"])
    shown = explorer.format_explore(table.reset_index()).set_index("quantity")
    assert shown.loc["throughput (img/s)", "measured"] == "1,234" and shown.loc["memory: total", "measured"].endswith(" MiB")
    assert shown.loc["final quality (test accuracy, %)", "measured"] == "50"  # 0.5 accuracy, shown in %
    assert explorer.explorer_app([base, opt]) is not None  # the widget panel builds headless


def test_explorer_finds_a_mixed_precision_run_that_a_cpu_without_bf16_ran_in_fp32():
    from trainopt_core.reproduction.runner import REDUCED_PRECISION_OFF

    plain = make_record(config="+accumulation")
    plain["config"] = ABLATION_LADDER[1].to_dict()
    mixed = make_record(config="+mixed_precision")
    mixed["config"] = ABLATION_LADDER[2].replace(precision="fp32").to_dict()  # as resolved on that CPU
    mixed["notes"] = [f"{REDUCED_PRECISION_OFF} on this CPU (AVX2): it has no bf16 instructions"]
    on = explorer.config_from_components({"accumulation", "mixed_precision"}, k=4, adaptive=False, precision="fp16")
    off = explorer.config_from_components({"accumulation"}, k=4, adaptive=False)
    assert explorer.find_measured([plain, mixed], "cifar10", on) == [mixed]
    # fp32 selected: both ran fp32 with the same settings, so both computed what fp32 computes
    assert explorer.find_measured([plain, mixed], "cifar10", off) == [plain, mixed]
    fp32 = explorer.config_from_components({"accumulation", "mixed_precision"}, k=4, adaptive=False, precision="fp32")
    assert explorer.find_measured([plain, mixed], "cifar10", fp32) == [plain, mixed]
    # reduced precision selected where only fp32 ran: no autocast ran, and the reasons say so
    why = explorer._why("memory: parameters", 1.0, 2.0, on, ran_fp32=True)
    assert why.startswith("eq. 17 predicts fp16; these runs ran fp32") and "FP32 weights, as eq. 8 assumes" in why
    assert "autocast keeps" not in why


def test_the_explorer_defaults_to_the_precision_the_optimized_runs_ran_fp32_included():
    fp32 = make_record(config="optimized")
    fp32["config"] = OptimizationConfig.optimized().replace(precision="fp32").to_dict()  # a CPU without bf16
    bf16 = make_record(config="optimized", precision="bf16")
    bf16["config"] = OptimizationConfig.optimized().replace(precision="bf16").to_dict()
    assert explorer.precision_that_ran([fp32], "cifar10") == "fp32"  # not eq. 17's fp16, which never ran
    assert explorer.precision_that_ran([fp32, bf16], "cifar10") == "bf16"
    assert explorer.precision_that_ran([make_record(config="baseline")], "cifar10") == "fp16"  # the paper's


def test_explore_says_why_each_measurement_differs_from_the_prediction():
    base = make_record(config="baseline", breakdown={"parameters": 4000.0, "gradients": 10.0, "optimizer_state": 8000.0,
                                                     "activations": 800.0, "temporaries": 50.0})
    base["profile_settings"] = {"model": {"layers": [1, 1, 1, 1], "width": 4}}
    base["config"] = OptimizationConfig.baseline().to_dict()
    opt = make_record(config="optimized", precision="bf16", breakdown={
        "parameters": 4000.0, "gradients": 4000.0, "optimizer_state": 8000.0, "activations": 30.0, "temporaries": 500.0})
    opt["config"] = OptimizationConfig.optimized().replace(precision="bf16").to_dict()
    records = [base, opt]
    assert explorer.precision_that_ran(records, "cifar10") == "bf16"
    optimized = explorer.explore(records, "cifar10", explorer.config_from_components(
        explorer.EXPLORER_COMPONENTS, precision="bf16")).set_index("quantity")["why they differ"]
    assert "FP32 weights the optimizer updates" in optimized["memory: parameters"]
    assert "FP32 under autocast" in optimized["memory: gradients"]
    assert "recomputed in backward holds its activations as temporaries" in optimized["memory: activations"]
    assert "recomputed segment" in optimized["memory: temporaries"]
    baseline = explorer.explore(records, "cifar10", OptimizationConfig.baseline()).set_index("quantity")["why they differ"]
    assert "before most gradients exist" in baseline["memory: gradients"]  # 10 bytes against 4000 predicted
    assert all(baseline.loc[[q for q in baseline.index if q.startswith("memory")]])  # every memory row explained
    summary = explorer.runs_summary(records)
    assert list(summary["configuration"]) == ["baseline", "optimized"] and "NOT CIFAR-10" in summary["data"][0]
    assert summary["peak memory"][0].endswith(" MiB") and summary["final quality"][0] == "50 % accuracy"


def test_explorer_controls_are_bounded_by_the_model_and_default_to_what_ran():
    base = make_record(config="baseline", breakdown={"activations": 8e8})
    base["profile_settings"] = {"model": {"layers": [3, 4, 6, 3], "width": 4}}
    base["config"] = OptimizationConfig.baseline().to_dict()
    gpt = make_record(task="wikitext2", config="optimized", precision="bf16")
    gpt["profile_settings"] = {"model": {"n_layer": 4}}
    gpt["config"] = OptimizationConfig.optimized().replace(precision="bf16").to_dict()
    app = explorer.explorer_app([base, gpt], tasks=("wikitext2", "cifar10"))
    (task, _), (_, _, precision), (segments, _) = (box.children for box in app.children[0].children)
    assert precision.value == "bf16"
    assert (segments.min, segments.max, segments.value) == (1, 4, 2)  # GPT-2: L = 4, ⌈√4⌉ = 2
    task.value = "cifar10"
    assert (segments.max, segments.value) == (16, 4)  # ResNet (3, 4, 6, 3): L = 16


def test_explorer_panel_redraws_its_prediction_when_a_control_changes(capsys):
    base = make_record(config="baseline", breakdown={"activations": 8e8})
    base["profile_settings"] = {"model": {"layers": [1, 1, 1, 1], "width": 4}}
    base["config"] = OptimizationConfig.baseline().to_dict()
    app = explorer.explorer_app([base], tasks=("cifar10",))
    (task, components), (k, adaptive, precision), _ = (box.children for box in app.children[0].children)
    capsys.readouterr()  # outside a kernel the panel's output goes to stdout
    components.value = ("accumulation",)
    adaptive.value = False
    k.value = 2
    with_k2 = capsys.readouterr().out.split("memory: activations")[-1].split("\n")[0]
    k.value = 8
    with_k8 = capsys.readouterr().out.split("memory: activations")[-1].split("\n")[0]
    # eq. 8: activations shrink with the micro-batch (effective batch / k)
    assert with_k2 and with_k8 and with_k2 != with_k8


def test_op_profile_and_recompute_overhead_are_kept_and_shown_again_under_the_same_conditions(tmp_path):
    import json

    first = analysis.profile_operations("wikitext2", "baseline", profile="smoke", steps=1, warmup_steps=0,
                                        out_dir=tmp_path)
    kept = tmp_path / "op_profile__wikitext2__baseline.json"
    record = json.loads(kept.read_text())
    assert record["kind"] == "op_profile" and record["manifest"]["hardware"] and record["conditions"]["hardware"]
    again = analysis.profile_operations("wikitext2", "baseline", profile="smoke", steps=1, warmup_steps=0,
                                        out_dir=tmp_path)
    assert again.equals(first)  # the kept timing, not a new draw of the noise
    record["conditions"]["hardware"]["cpu_model"] = "another CPU"
    kept.write_text(json.dumps(record))
    remeasured = analysis.profile_operations("wikitext2", "baseline", profile="smoke", steps=1, warmup_steps=0,
                                             out_dir=tmp_path)
    assert list(remeasured.columns) == list(first.columns)
    assert json.loads(kept.read_text())["conditions"]["hardware"]["cpu_model"] != "another CPU"

    overhead = analysis.measure_recompute_overhead("wikitext2", profile="smoke", repeats=1, out_dir=tmp_path)
    assert analysis.measure_recompute_overhead("wikitext2", profile="smoke", repeats=1, out_dir=tmp_path) == overhead
    other = analysis.measure_recompute_overhead("wikitext2", profile="smoke", repeats=2, out_dir=tmp_path)
    assert other["repeats"] == 2  # other settings: measured again


def test_op_profile_puts_the_gpt2_dropout_masks_in_their_own_category_and_remeasures_under_other_rules(tmp_path):
    import json

    frame = analysis.profile_operations("wikitext2", "baseline", profile="smoke", steps=1, warmup_steps=0,
                                        out_dir=tmp_path)
    times = frame.set_index("category")["self_time_ms"]
    assert list(frame["category"]) == list(analysis.OP_CATEGORIES)
    assert times["dropout"] > 0  # GPT-2 trains with dropout 0.1: bernoulli_ draws its masks
    kept = tmp_path / "op_profile__wikitext2__baseline.json"
    record = json.loads(kept.read_text())
    record["settings"]["category_rules"] = [["other", ".*"]]
    record["result"] = [dict(row, self_time_ms=-1.0) for row in record["result"]]
    kept.write_text(json.dumps(record))
    again = analysis.profile_operations("wikitext2", "baseline", profile="smoke", steps=1, warmup_steps=0,
                                        out_dir=tmp_path)
    assert (again["self_time_ms"] >= 0).all()  # categorized under other rules: measured again, not shown


def test_op_profile_of_a_configuration_object_is_kept_under_its_name(tmp_path):
    config = OptimizationConfig.baseline().replace(name="my baseline", optimizer_impl="foreach")
    frame = analysis.profile_operations("wikitext2", config, profile="smoke", steps=1, warmup_steps=0, out_dir=tmp_path)
    assert (tmp_path / "op_profile__wikitext2__my_baseline.json").exists()
    assert set(frame["config"]) == {"my baseline"}


def test_the_explorers_default_view_draws_a_curve_for_its_runs_from_the_tables_timing(capsys):
    """The default selection is the optimized configuration: its curve is its un-checkpointed
    twin's, placed by the interleaved timing windows the tables use (before, only the target line
    was drawn); with no match the nearest measured configuration and what differs are named."""
    from unittest import mock

    base = make_record(config="baseline", breakdown={"activations": 8e8})
    base["profile_settings"] = {"model": {"layers": [1, 1, 1, 1], "width": 4}}
    base["config"] = OptimizationConfig.baseline().to_dict()
    opt = make_record(config="optimized", precision="bf16", timing=(40.0, 50.0, 60.0))
    opt["config"] = OptimizationConfig.optimized().replace(precision="bf16").to_dict()
    opt["history"] = [dict(h, time_s=None) for h in opt["history"]]
    drawn = []
    with mock.patch("trainopt_core.reporting.figures.figure_image", lambda fig: drawn.append(fig)), \
            mock.patch("IPython.display.display", lambda *a, **k: None):
        explorer.show_default_view([base, opt], tasks=("cifar10",))
    (fig,) = drawn
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "optimized" in labels
    explorer.show_view([base, opt], "cifar10", explorer.config_from_components({"accumulation"}, k=4, adaptive=False))
    out = capsys.readouterr().out
    assert "none with these settings; the nearest measured is 'baseline', which differs in k: 1 measured, 4 selected" \
        in out


def test_a_run_that_asked_for_reduced_precision_but_ran_fp32_matches_fp32_and_a_precision_that_differs_is_said():
    from trainopt_core.reproduction.runner import REDUCED_PRECISION_OFF

    opt = make_record(config="optimized", precision="fp32")
    opt["config"] = OptimizationConfig.optimized().replace(precision="fp32").to_dict()
    opt["notes"] = [f"{REDUCED_PRECISION_OFF}: this CPU has no bf16 instructions"]
    # fp32 selected: the run that asked for reduced precision and ran fp32 is a match, nothing differs
    fp32 = OptimizationConfig.optimized().replace(precision="fp32")
    assert explorer.nearest_measured([opt], "cifar10", fp32) == ("optimized", [])
    assert explorer.find_measured([opt], "cifar10", fp32) == [opt]
    # bf16 selected beside an fp32 run that asked for nothing: the precision differs, as measured
    plain = make_record(config="-mixed_precision", precision="fp32")
    plain["config"] = OptimizationConfig.optimized().replace(name="-mixed_precision", precision="fp32").to_dict()
    bf16 = OptimizationConfig.optimized().replace(precision="bf16")
    assert explorer.nearest_measured([plain], "cifar10", bf16) == (
        "-mixed_precision", ["precision: 'fp32' measured, 'bf16' selected"])
