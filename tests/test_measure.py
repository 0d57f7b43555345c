import importlib.metadata
import json
import math
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainopt_core import measure
from trainopt_core.measure.memory import PeakMemory
from trainopt_core.measure.tracker import MemoryTracker


# ----------------------------------------------------------------------------- time-to-target
TIMES = [0.0, 10.0, 20.0, 30.0]


def test_time_to_target_interpolates_between_the_bracketing_evaluations():
    accuracy = [0.1, 0.5, 0.8, 0.9]
    assert measure.time_to_target(TIMES, accuracy, 0.7) == pytest.approx(10 + 10 * (0.2 / 0.3))


def test_time_to_target_returns_the_evaluation_time_on_an_exact_hit():
    assert measure.time_to_target(TIMES, [0.1, 0.5, 0.8, 0.9], 0.8) == 20.0


def test_time_to_target_is_none_when_never_reached():
    assert measure.time_to_target(TIMES, [0.1, 0.5, 0.8, 0.9], 0.95) is None


def test_time_to_target_for_perplexity_crosses_downwards():
    perplexity = [900.0, 300.0, 100.0, 50.0]
    assert measure.time_to_target(TIMES, perplexity, 200.0, higher_is_better=False) == pytest.approx(15.0)
    assert measure.time_to_target(TIMES, perplexity, 10.0, higher_is_better=False) is None


def test_time_to_target_met_at_the_first_evaluation_and_skips_diverged_values():
    assert measure.time_to_target([5.0, 10.0], [0.9, 0.95], 0.5) == 5.0
    assert measure.time_to_target(TIMES, [float("nan"), float("nan"), 0.9, 0.95], 0.5) == 20.0


def test_time_to_target_rejects_mismatched_histories():
    with pytest.raises(ValueError, match="history_quality"):
        measure.time_to_target([0.0, 1.0], [0.5], 0.4)
    with pytest.raises(ValueError, match="history_times_s"):
        measure.time_to_target([2.0, 1.0], [0.1, 0.5], 0.4)


# ----------------------------------------------------------------------------- throughput
class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_throughput_excludes_warmup_steps_and_time_outside_steps():
    clock = FakeClock()
    meter = measure.ThroughputMeter(warmup_steps=2, clock=clock)
    for duration_s in (5.0, 4.0, 1.0, 1.0, 2.0):
        with meter.step(num_items=32):
            clock.now += duration_s
        clock.now += 50.0  # evaluation between steps: never counted
    assert meter.items_per_s() == pytest.approx(3 * 32 / 4.0)
    assert meter.training_time_s == pytest.approx(13.0)
    assert meter.steps == 5 and meter.training_items == 5 * 32


def test_throughput_is_none_until_a_step_past_warmup():
    meter = measure.ThroughputMeter(warmup_steps=1)
    meter.add_step(10, 1.0)
    assert meter.items_per_s() is None
    meter.add_step(10, 0.5)
    assert meter.items_per_s() == pytest.approx(20.0)


def test_timer_measures_with_the_injected_clock():
    clock = FakeClock()
    with measure.Timer(clock=clock) as timer:
        clock.now += 2.5
    assert timer.elapsed_s == 2.5
    assert measure.elapsed_s(clock.now - 1.0, "cpu", clock=clock) == 1.0


# ----------------------------------------------------------------------------- memory
def _mlp_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def _mlp():
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    return model, torch.optim.AdamW(model.parameters()), torch.randn(64, 256), torch.randint(0, 10, (64,))


def test_memory_tracker_matches_the_analytic_count_for_an_mlp_with_adamw():
    model, optimizer, x, y = _mlp()
    _mlp_step(model, optimizer, x, y)  # creates the optimizer state
    with MemoryTracker(model, optimizer) as tracker:
        _mlp_step(model, optimizer, x, y)
    numel = sum(p.numel() for p in model.parameters())
    params_bytes = 4 * numel
    state_bytes = 2 * 4 * numel + 4 * len(list(model.parameters()))  # exp_avg, exp_avg_sq + fp32 step counters
    at_peak = tracker.breakdown_at_peak
    assert at_peak["parameters"] == params_bytes
    assert at_peak["gradients"] == params_bytes
    assert at_peak["optimizer_state"] == state_bytes
    assert tracker.source == "cpu_live_tensor_tracker"
    assert tracker.peak_bytes == tracker.tracked_peak_bytes == sum(at_peak.values())
    assert tracker.peak_bytes >= params_bytes * 2 + state_bytes
    # Autograd saves the input (first matmul), the ReLU output (ReLU's backward and the second
    # matmul), the log-softmax output and the targets (cross-entropy); nll_loss adds a 4-byte scalar.
    saved_bytes = x.numel() * 4 + 64 * 512 * 4 + 64 * 10 * 4 + y.numel() * 8
    assert tracker.max_bytes_by_category["activations"] == pytest.approx(saved_bytes, abs=16)


def test_memory_tracker_classifies_state_created_by_the_first_step_as_optimizer_state():
    model, optimizer, x, y = _mlp()
    with MemoryTracker(model, optimizer) as tracker:
        _mlp_step(model, optimizer, x, y)
    numel = sum(p.numel() for p in model.parameters())
    # the peak is inside the first step, after the moments exist (step counters are built
    # from Python numbers, which the tracker sees only at the end)
    assert tracker.breakdown_at_peak["optimizer_state"] >= 2 * 4 * numel
    assert tracker.breakdown_at_peak["gradients"] == 4 * numel


def test_memory_tracker_counts_frees_and_shares_views():
    with MemoryTracker() as tracker:
        a = torch.ones(1000)          # 4000 bytes
        view = a.view(10, 100)[::2]   # a view: no new memory
        b = a * 2                     # 4000 more
        del b                         # freed
        c = view + 1                  # 5 x 100 x 4 = 2000
        live_at_end = tracker.current_bytes
    assert live_at_end == 4000 + 2000
    assert tracker.peak_bytes == 8000
    del a, c


def test_memory_tracker_releases_activations_after_backward():
    model, optimizer, x, y = _mlp()
    _mlp_step(model, optimizer, x, y)
    with MemoryTracker(model, optimizer) as tracker:
        loss = _mlp_step(model, optimizer, x, y)
        end_bytes = tracker.current_bytes
    numel = sum(p.numel() for p in model.parameters())
    persistent = 4 * numel * 4 + 4 * len(list(model.parameters()))  # params, grads, two moments, steps
    # only the batch (saved for backward, still held by the test) and the scalar loss remain
    assert end_bytes == persistent + x.numel() * 4 + y.numel() * 8 + loss.numel() * 4


def test_checkpointing_reduces_the_activations_the_tracker_sees():
    from torch.utils.checkpoint import checkpoint

    blocks = nn.ModuleList([nn.Sequential(nn.Linear(128, 128), nn.Tanh()) for _ in range(4)])
    x = torch.randn(32, 128)

    def saved_activation_bytes(use_checkpoint: bool) -> int:
        with MemoryTracker(blocks) as tracker:
            h = x
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
            h.sum().backward()
        blocks.zero_grad(set_to_none=True)
        return tracker.max_bytes_by_category["activations"]

    plain, checkpointed = saved_activation_bytes(False), saved_activation_bytes(True)
    row_bytes = 32 * 128 * 4
    assert plain == row_bytes * (1 + 4)    # input and each Tanh output (Tanh saves its result)
    assert checkpointed == row_bytes * 4   # only each checkpointed block's input is kept


def test_memory_tracker_agrees_with_the_cpu_allocators_own_count():
    """An outside check of the tracker: the profiler's record of every allocation the c10 CPU
    allocator makes (profile_memory), live bytes at their maximum within the same step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        model, optimizer, x, y = _mlp()  # built while profiled: the allocator's count includes them
        _mlp_step(model, optimizer, x, y)
        with torch.profiler.record_function("tracked step"), MemoryTracker(model, optimizer) as tracker:
            _mlp_step(model, optimizer, x, y)
    reading = measure.memory.cpu_allocator_reading(prof, "tracked step")
    assert reading["at_start_bytes"] == measure.tracker.state_bytes(model, optimizer) + x.numel() * 4 + y.numel() * 8
    allocator_peak = reading["peak_bytes"]
    assert tracker.peak_bytes == pytest.approx(allocator_peak, rel=0.01)


def _ddp_tracked_steps(steps: int) -> list[dict]:
    """On each process: an MLP under DDP, `steps` steps each tracked (run by `run_processes`)."""
    from trainopt_core.measure.tracker import ddp_bucket_bytes

    torch.manual_seed(0)
    model, optimizer, x, y = _mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters())
    result = []
    for _ in range(steps):
        rebuilt_before = ddp._has_rebuilt_buckets
        with MemoryTracker(ddp, optimizer) as tracker:
            _mlp_step(ddp, optimizer, x, y)
        result.append(dict(peak=tracker.peak_bytes, breakdown=tracker.breakdown_at_peak, rebuilt_before=rebuilt_before,
                           rebuilt_after=ddp._has_rebuilt_buckets, buckets=ddp_bucket_bytes(ddp)))
    with MemoryTracker(model, optimizer) as plain:  # the module itself: no buckets of its own
        _mlp_step(model, optimizer, x, y)
    result.append(dict(peak=plain.peak_bytes, breakdown=plain.breakdown_at_peak))
    return result


@pytest.mark.distributed
def test_memory_tracker_counts_ddps_gradient_buckets_before_and_after_ddp_rebuilds_them():
    from trainopt_core.distributed import run_processes

    *steps, plain = run_processes(_ddp_tracked_steps, 2, args=(3,), backend="gloo", threads_per_process=1,
                                  timeout_s=120)[0]
    numel = sum(p.numel() for p in _mlp()[0].parameters())
    # DDP rebuilds its buckets at the second step's forward (the order of the first backward)
    assert [(s["rebuilt_before"], s["rebuilt_after"]) for s in steps] == [(False, False), (False, True), (True, True)]
    for step in steps:  # one flat copy of every gradient, neither lost nor counted twice by the rebuild
        assert step["buckets"] == 4 * numel == step["breakdown"]["communication_buffers"]
        assert step["breakdown"]["temporaries"] == steps[-1]["breakdown"]["temporaries"]
    assert steps[1]["peak"] == steps[2]["peak"]
    assert "communication_buffers" not in plain["breakdown"]  # as records made before the category had it
    assert steps[2]["peak"] - plain["peak"] == 4 * numel


def test_peak_memory_on_cpu_reports_the_tracked_step_and_its_breakdown():
    model, optimizer, x, y = _mlp()
    memory = PeakMemory("cpu")
    assert memory.peak_bytes() is None and memory.source == "cpu_live_tensor_tracker"
    with memory.track_step(model, optimizer) as tracker:
        _mlp_step(model, optimizer, x, y)
    memory.add_tracked(tracker)
    assert memory.peak_bytes() == tracker.peak_bytes > 0
    assert memory.breakdown() == tracker.breakdown_at_peak
    assert memory.peak_reserved_bytes() is None


# ----------------------------------------------------------------------------- energy
def test_energy_is_none_with_a_reason_when_no_rapl_counters(tmp_path):
    meter = measure.EnergyMeter("cpu", rapl_root=str(tmp_path))
    with meter:
        pass
    assert meter.energy_j is None
    assert meter.energy_source.startswith("unavailable:") and "RAPL" in meter.energy_source


def test_energy_on_cuda_without_nvml_is_none_with_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now fails
    energy_j, source = measure.EnergyMeter("cuda").start().stop()
    assert energy_j is None and source.startswith("unavailable:") and "nvidia-ml-py" in source


def _write_rapl(root, energy_uj):
    domain = root / "intel-rapl:0"
    domain.mkdir(exist_ok=True)
    (domain / "name").write_text("package-0\n")
    (domain / "max_energy_range_uj").write_text("1000000000\n")
    (domain / "energy_uj").write_text(f"{energy_uj}\n")
    sub = root / "intel-rapl:0:0"  # a sub-domain (core): part of the package, never added
    sub.mkdir(exist_ok=True)
    (sub / "name").write_text("core\n")
    (sub / "max_energy_range_uj").write_text("1000000000\n")
    (sub / "energy_uj").write_text("5\n")


def test_rapl_energy_reads_package_counters_and_handles_wraparound(tmp_path):
    _write_rapl(tmp_path, 999_000_000)  # 1 J below the wrap point
    meter = measure.EnergyMeter("cpu", rapl_root=str(tmp_path)).start()
    _write_rapl(tmp_path, 2_000_000)    # wrapped, then 2 J more
    energy_j, source = meter.stop()
    assert energy_j == pytest.approx(3.0)
    assert source.startswith("rapl:") and "package-0" in source and "core" not in source


# ----------------------------------------------------------------------------- FLOPs
def test_matmul_probe_returns_a_positive_rate_quickly():
    start = time.perf_counter()
    flops_per_s, source = measure.matmul_probe_flops("cpu", "fp32", max_size=256, min_time_s=0.05)
    assert flops_per_s > 1e6
    assert source.startswith("measured: matmul probe 256x256 torch.float32")
    assert time.perf_counter() - start < 5.0


def test_datasheet_peaks_for_known_gpus_and_none_for_unknown():
    flops, source = measure.datasheet_peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert flops == 989.4e12 and source == "datasheet: NVIDIA H100 SXM bf16 dense"
    assert measure.datasheet_peak_flops("NVIDIA GeForce RTX 3090", torch.float16)[0] == 71e12
    assert measure.datasheet_peak_flops("NVIDIA A100-SXM4-40GB", "fp32")[0] == 19.5e12
    assert measure.datasheet_peak_flops("NVIDIA A10G", "bf16") is None   # not an A10
    assert measure.datasheet_peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 on V100
    with pytest.raises(ValueError, match="precision"):
        measure.datasheet_peak_flops("NVIDIA L4", "int8")


def test_flops_utilization_is_achieved_over_peak():
    assert measure.flops_utilization(6e9, 1000.0, 12e12) == pytest.approx(0.5)
    assert measure.flops_utilization(6e9, None, 12e12) is None
    with pytest.raises(ValueError, match="peak_flops_per_s"):
        measure.flops_utilization(6e9, 10.0, 0.0)


# ----------------------------------------------------------------------------- manifest
def test_run_manifest_records_hardware_versions_and_git_but_no_host_name():
    manifest = measure.run_manifest(profile="smoke", device="cpu", seed=3)
    assert manifest["profile"] == "smoke" and manifest["seed"] == 3
    assert manifest["hardware"]["cpu_logical_cores"] >= 1
    assert manifest["libraries"]["torch"] == importlib.metadata.version("torch")
    assert set(manifest["git"]) == {"commit", "dirty"}
    assert manifest["date_utc"].endswith("+00:00")
    text = json.dumps(manifest)
    assert "hostname" not in text
    host = socket.gethostname()
    if len(host) > 4:
        assert host not in text


def test_manifest_dirty_flag_ignores_the_reports_being_rewritten(tmp_path):
    from trainopt_core.measure.manifest import OUTPUT_DIR, _git_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / OUTPUT_DIR).mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / OUTPUT_DIR / "table.md").write_text("| a |\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    assert _git_state(tmp_path)["dirty"] is False
    (tmp_path / OUTPUT_DIR / "table.md").write_text("| b |\n")  # a reproduction writing its tables
    assert _git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    state = _git_state(tmp_path)
    assert state["dirty"] is True and len(state["commit"]) == 40


# ----------------------------------------------------------------------------- cost (eq. 3)
BASELINE = {"time_to_target_s": 100.0, "peak_memory_bytes": 1000, "energy_j": 50.0}


def test_cost_of_the_baseline_is_one_and_lower_resources_cost_less():
    assert measure.cost(100.0, 1000, 50.0, baseline=BASELINE)["cost"] == pytest.approx(1.0)
    result = measure.cost(50.0, 500, 25.0, baseline=BASELINE, weights=(2, 1, 1))
    assert result["cost"] == pytest.approx(0.5)
    assert result["energy_included"] and result["note"] is None


def test_cost_drops_energy_and_renormalizes_weights_without_a_reading():
    result = measure.cost(50.0, 1000, None, baseline=BASELINE, weights=(1, 1, 2))
    assert not result["energy_included"]
    assert result["weights"] == {"time": 0.5, "memory": 0.5, "energy": 0.0}
    assert result["cost"] == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    assert "energy term dropped" in result["note"]


def test_cheapest_config_respects_quality_and_memory_budget():
    records = [
        {"config_name": "baseline", "metrics": {**BASELINE, "final_quality": 0.86}},
        {"config_name": "fast_but_bad", "metrics": {"time_to_target_s": 10.0, "peak_memory_bytes": 100, "energy_j": 5.0, "final_quality": 0.70}},
        {"config_name": "big", "metrics": {"time_to_target_s": 20.0, "peak_memory_bytes": 1500, "energy_j": 10.0, "final_quality": 0.86}},
        {"config_name": "good", "metrics": {"time_to_target_s": 60.0, "peak_memory_bytes": 800, "energy_j": 40.0, "final_quality": 0.85}},
    ]
    quality_ok = lambda r: r["metrics"]["final_quality"] >= 0.85  # noqa: E731
    # costs (equal weights): good (0.6 + 0.8 + 0.8) / 3, big (0.2 + 1.5 + 0.2) / 3, baseline 1
    best = measure.cheapest_config(records, quality_ok, memory_budget_bytes=1200)
    assert best["record"]["config_name"] == "good"
    assert [name for name, _ in best["ranking"]] == ["good", "baseline"]
    assert measure.cheapest_config(records, quality_ok, memory_budget_bytes=5000)["record"]["config_name"] == "big"
    assert measure.cheapest_config(records, quality_ok, memory_budget_bytes=10) is None


def test_cheapest_config_leaves_energy_out_unless_every_record_has_it():
    records = [
        {"name": "baseline", **BASELINE},
        {"name": "frugal", "time_to_target_s": 100.0, "peak_memory_bytes": 1000, "energy_j": None},
    ]
    best = measure.cheapest_config(records, lambda r: True)
    assert not best["cost"]["energy_included"]
    assert math.isclose(best["cost"]["cost"], 1.0)


def test_state_bytes_counts_weights_gradients_and_optimizer_state_once_each():
    from trainopt_core.measure.tracker import state_bytes

    model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert state_bytes(model, optimizer) == parameters + buffers  # no gradients or state yet
    F.cross_entropy(model(torch.randn(8, 32)), torch.randint(0, 4, (8,))).backward()
    assert state_bytes(model, optimizer) == 2 * parameters + buffers
    optimizer.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    assert state_bytes(model, optimizer) == 4 * parameters + buffers + steps  # exp_avg, exp_avg_sq
    optimizer.zero_grad(set_to_none=True)
    assert state_bytes(model, optimizer) == 3 * parameters + buffers + steps
    tied = nn.Linear(16, 16, bias=False)
    twice = nn.ModuleList([tied, tied])  # a shared module's storage is counted once
    assert state_bytes(twice) == 16 * 16 * 4


def test_manifest_lists_installed_releases_that_differ_from_the_pins(tmp_path):
    from trainopt_core.measure.manifest import _releases_off_pins

    assert _releases_off_pins(tmp_path) is None  # no constraints.txt: installed from a wheel
    installed = importlib.metadata.version("torch")
    (tmp_path / "constraints.txt").write_text(
        "# the releases the tests passed with\n"
        "torch==0.0.1\n"                                        # installed at another release
        f"psutil=={importlib.metadata.version('psutil')}\n"     # at its pin
        "no-such-package-here==1.0  # not installed: not listed\n")
    assert _releases_off_pins(tmp_path) == {"torch": installed}
    # this checkout's own pins: a dict either way (empty where the environment is the pinned one)
    assert isinstance(measure.run_manifest()["releases_off_pins"], dict)


def test_a_cpu_of_a_committed_kind_divides_by_its_committed_median(monkeypatch, tmp_path):
    """The CPU's MFU denominator: the committed median of fresh processes' probes for its kind and
    thread count (scripts/calibrate_cpu_peak.py), else the probe in the process."""
    from trainopt_core.measure import flops

    peaks = tmp_path / "cpu_peaks.json"
    peaks.write_text(json.dumps({"peaks": {"AVX9, ACME family 1 model 2": {"3": {"fp32": {
        "flops_per_s": 2.0e11, "runs": [1.9e11, 2.0e11, 2.1e11], "commit": "abc1234", "date": "2026-11-28"}}}}}))
    monkeypatch.setattr(flops, "CPU_PEAKS_FILE", peaks)
    monkeypatch.setattr(flops, "cpu_kind", lambda: "AVX9, ACME family 1 model 2")
    monkeypatch.setattr(flops.torch, "get_num_threads", lambda: 3)
    flops._cached_peak.cache_clear()
    try:
        value, source = measure.measure_peak_flops("cpu", "fp32")
        assert value == 2.0e11
        assert source == ("committed: median of 3 fresh processes' matmul probes on AVX9, ACME family 1 model 2, "
                          "3 threads (abc1234, 2026-11-28; cpu_peaks.json)")
        # another precision, thread count or kind: probed here
        monkeypatch.setattr(flops, "matmul_probe_flops", lambda device, precision: (1.0, "measured: probe"))
        assert measure.measure_peak_flops("cpu", "bf16") == (1.0, "measured: probe")
        assert measure.measure_peak_flops("cpu", "fp32", prefer_datasheet=False) == (1.0, "measured: probe")
        assert flops.committed_cpu_peak("fp32", threads=2) is None
        assert flops.committed_cpu_peak("fp32", kind="AVX2, ACME family 9 model 9") is None
        monkeypatch.setattr(flops, "CPU_PEAKS_FILE", tmp_path / "missing.json")
        assert flops.committed_cpu_peak("fp32") is None
    finally:
        flops._cached_peak.cache_clear()


def test_the_committed_cpu_peaks_are_the_medians_of_their_runs():
    import statistics

    from trainopt_core.measure.flops import CPU_PEAKS_FILE

    peaks = json.loads(CPU_PEAKS_FILE.read_text())["peaks"]
    assert peaks
    for kind, by_threads in peaks.items():
        for threads, by_precision in by_threads.items():
            for precision, entry in by_precision.items():
                assert len(entry["runs"]) >= 3 and entry["flops_per_s"] == statistics.median(entry["runs"]), kind
                assert max(entry["runs"]) / min(entry["runs"]) < 1.10, (kind, threads, precision)
