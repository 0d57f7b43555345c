"""The measurements that only a CUDA GPU exercises for real: the training-step memory peak
without evaluation and under checkpointing, fp16 skipped steps, bf16 steps, TF32 peaks, the
datasheet peak behind FLOPs utilization, NVML energy and synchronized timing.

Marked `gpu` and skipped without CUDA: `pytest -m gpu tests/test_gpu.py` on a GPU machine.
"""
import time

import pytest
import torch
import torch.nn.functional as F

from trainopt_core import OptimizationConfig, measure, prepare
from trainopt_core import precision as mp
from trainopt_core.config import set_allocator_settings
from trainopt_core.measure import flops
from trainopt_core.measure.memory import PeakMemory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 2**20


@pytest.fixture
def cuda():
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return device


# ----------------------------------------------------------------------------- memory
def test_training_step_peak_excludes_a_big_evaluation_which_is_reported_as_the_evaluation_peak(cuda):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(cuda)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1024, device=cuda), torch.randint(0, 10, (64,), device=cuda)
    memory = PeakMemory(cuda)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    with memory.evaluation(), torch.no_grad():
        logits = torch.empty(512 * MiB, dtype=torch.uint8, device=cuda)  # GPT-2 evaluation's logits
        logits.fill_(1)
        del logits
    for _ in range(2):
        with memory.training_step():
            step()
    tracker = memory.track_step(model, optimizer)
    with memory.training_step(), tracker:
        step()
    memory.add_tracked(tracker)
    with memory.evaluation(), torch.no_grad():
        model(torch.randn(4096, 1024, device=cuda))

    state_bytes = 4 * 3 * sum(p.numel() for p in model.parameters())  # weights + two Adam moments
    # the step's peak holds the state, the activations and cuBLAS's workspaces (85 MiB in all on an
    # H100; the workspaces' size is the library's), never the 512 MiB that the evaluation held
    assert state_bytes < memory.peak_bytes() < 512 * MiB
    assert memory.evaluation_peak_bytes() >= 512 * MiB
    assert memory.training_steps_measured == 3 and memory.evaluations_measured == 2
    assert memory.breakdown()["optimizer_state"] > 0


def _gpt2_step_peak_bytes(cuda, checkpointed: bool) -> int:
    from trainopt_core.checkpointing import apply_activation_checkpointing
    from trainopt_core.reproduction import models

    torch.manual_seed(0)
    model = models.gpt2_model(n_layer=9, n_embd=256, n_head=4, vocab_size=1000, n_positions=512, dropout=0.0)
    model = model.to(cuda).train()
    if checkpointed:
        apply_activation_checkpointing(model, "sqrt")
    tokens = torch.randint(0, 1000, (16, 512), device=cuda)
    memory = PeakMemory(cuda)
    with memory.training_step():
        model(tokens, labels=tokens).loss.backward()
    peak = memory.peak_bytes()
    del model, tokens
    torch.cuda.empty_cache()
    return peak


def test_sqrt_checkpointing_lowers_the_cuda_training_step_peak(cuda):
    without = _gpt2_step_peak_bytes(cuda, checkpointed=False)
    checkpointed = _gpt2_step_peak_bytes(cuda, checkpointed=True)
    # 9 blocks in 3 segments keep the 3 segment inputs plus one segment's recompute, not 9 blocks'
    # activations; the weights, gradients and logits are the same in both
    assert checkpointed < 0.7 * without, (checkpointed / MiB, without / MiB)


# ----------------------------------------------------------------------------- fp16 skipped steps
def _fp16_run(cuda, poisoned_steps: int, clean_steps: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 16).to(cuda)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.01), OptimizationConfig(precision="fp16"),
                     total_samples=100_000, micro_batch_size=32)
    stepped = []
    for step in range(poisoned_steps + clean_steps):
        x, y = torch.randn(32, 256, device=cuda), torch.randn(32, 16, device=cuda)
        with engine.autocast():
            loss = F.mse_loss(model(x).float(), y)
        engine.backward(loss)
        if step < poisoned_steps:
            model.weight.grad[0, 0] = float("inf")
        stepped.append(engine.step())
    return engine, stepped


def test_fp16_skipped_steps_are_counted_from_the_gradients_on_cuda(cuda):
    engine, stepped = _fp16_run(cuda, poisoned_steps=40, clean_steps=5)
    assert stepped == [False] * 40 + [True] * 5
    assert engine.skipped_steps == 40 and engine.loss_scale == mp.MIN_LOSS_SCALE


def test_fp16_collapsed_loss_scale_stops_a_cuda_run(cuda):
    with pytest.raises(RuntimeError, match="loss scale collapsed: 41 consecutive skipped steps") as raised:
        _fp16_run(cuda, poisoned_steps=200, clean_steps=0)
    assert "torch.amp.GradScaler" in str(raised.value)


# ----------------------------------------------------------------------------- bf16
def test_bf16_steps_on_cuda_compute_in_bf16_keep_fp32_weights_and_skip_nothing(cuda):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).to(cuda)
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), OptimizationConfig(precision="bf16"),
                     micro_batch_size=32, total_steps=30, warmup_steps=0)
    x, y = torch.randn(32, 256, device=cuda), torch.randn(32, 16, device=cuda)
    losses = []
    for _ in range(30):
        with engine.autocast():
            output = model(x)
            loss = F.mse_loss(output.float(), y)
        engine.backward(loss)
        assert engine.step()
        losses.append(loss.item())
    assert output.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert engine.skipped_steps == 0
    assert losses[-1] < losses[0], losses


# ----------------------------------------------------------------------------- TF32


def _has_tf32(device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def test_fp32_convolution_peak_is_tf32_while_cudnn_allows_it_and_fp32_when_both_flags_are_off(cuda, tf32_flags):
    from trainopt_core.reproduction import models

    resnet = models.resnet_cifar(layers=(1, 1, 1, 1), width=8)
    workload = flops.flops_workload(resnet)
    assert workload == "convolution"
    tf32_flags(matmul_tf32=False, conv_tf32=True)  # PyTorch's defaults
    tf32_peak, tf32_source = flops.peak_flops(cuda, "fp32", workload=workload)
    tf32_flags(matmul_tf32=False, conv_tf32=False)
    fp32_peak, fp32_source = flops.peak_flops(cuda, "fp32", workload=workload)
    name = torch.cuda.get_device_name(cuda)
    if tf32_source.startswith("datasheet:"):
        assert fp32_source.startswith("datasheet:") and "tf32" not in fp32_source.split("(")[0]
        if _has_tf32(cuda) and "no TF32" not in tf32_source:
            assert "tf32 tensor-core peak" in tf32_source and "cuDNN convolutions allow TF32" in tf32_source
            assert tf32_peak >= fp32_peak
    else:  # an unknown GPU: the matmul probe, run with TF32 as the convolutions would
        assert "TF32 on as for this convolution workload" in tf32_source, name
        assert "TF32 off as for this convolution workload" in fp32_source, name


def test_cudnn_convolutions_really_run_faster_with_tf32_allowed(cuda, tf32_flags):
    if not _has_tf32(cuda):
        pytest.skip("TF32 needs an Ampere or newer GPU")
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).to(cuda)
    x = torch.randn(64, 256, 56, 56, device=cuda)

    def seconds_per_conv() -> float:
        with torch.no_grad():
            for _ in range(3):
                conv(x)
            torch.cuda.synchronize(cuda)
            start = time.perf_counter()
            for _ in range(10):
                conv(x)
            torch.cuda.synchronize(cuda)
        return (time.perf_counter() - start) / 10

    tf32_flags(matmul_tf32=False, conv_tf32=True)
    with_tf32 = seconds_per_conv()
    tf32_flags(matmul_tf32=False, conv_tf32=False)
    without = seconds_per_conv()
    # the premise of dividing an fp32 CNN by the TF32 peak: cuDNN uses TF32 when allowed
    assert without > 1.5 * with_tf32, (without, with_tf32)


# ----------------------------------------------------------------------------- FLOPs utilization
def test_datasheet_bf16_peak_bounds_a_measured_matmul_and_its_utilization(cuda):
    peak, source = flops.measure_peak_flops(cuda, "bf16")
    if not source.startswith("datasheet:"):
        pytest.skip(f"no datasheet entry for {torch.cuda.get_device_name(cuda)}: {source}")
    measured, _ = flops.matmul_probe_flops(cuda, "bf16")
    flops_per_product = 2.0 * 8192**3  # the probe's largest product on a GPU
    utilization = flops.model_flops_utilization(flops_per_product, measured / flops_per_product, peak)
    # a large bf16 matmul reaches well over a third of the dense tensor-core peak and never exceeds it:
    # the denominator is the dense peak (not the 2x sparse one) of the GPU that ran
    assert 0.35 < utilization <= 1.02, (utilization, source)


# ----------------------------------------------------------------------------- energy
def test_nvml_energy_of_a_short_gpu_workload_is_positive(cuda):
    pytest.importorskip("pynvml")
    a = torch.randn(4096, 4096, device=cuda)
    with measure.EnergyMeter(cuda) as meter:
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize(cuda)
    if meter.energy_j is None and "NVML total energy counter" in meter.energy_source:
        pytest.skip(f"this GPU has no NVML energy counter: {meter.energy_source}")
    assert meter.energy_source.startswith("nvml: total energy counter of ")
    assert meter.energy_j > 0


# ----------------------------------------------------------------------------- timing
def test_timer_includes_queued_cuda_work(cuda, tf32_flags):
    tf32_flags(matmul_tf32=False, conv_tf32=True)  # slow fp32 matmuls: a long queue
    a = torch.randn(8192, 8192, device=cuda)
    a @ a
    torch.cuda.synchronize(cuda)
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with measure.Timer(cuda) as timer:
        launch_start = time.perf_counter()
        start_event.record()
        for _ in range(20):
            a @ a
        end_event.record()
        launch_s = time.perf_counter() - launch_start  # what an unsynchronized clock would read
    torch.cuda.synchronize(cuda)
    gpu_s = start_event.elapsed_time(end_event) / 1e3
    assert timer.elapsed_s >= gpu_s * 0.999
    assert launch_s < 0.5 * gpu_s  # the work was queued: without the synchronize it would be missed


def test_the_allocator_only_tracker_reads_the_same_peak_without_a_breakdown(cuda):
    from trainopt_core.measure.tracker import MemoryTracker

    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(cuda)
    x = torch.randn(512, 1024, device=cuda)
    model(x).square().mean().backward()  # gradients allocated: both steps start from the same state
    peaks = {}
    for breakdown in (True, False):
        with MemoryTracker(model, device=cuda, breakdown=breakdown) as tracker:
            model(x).square().mean().backward()
        peaks[breakdown] = tracker.peak_bytes
        assert bool(tracker.breakdown_at_peak) == breakdown
    assert peaks[False] == pytest.approx(peaks[True], rel=0.05)


def _segment_of(snapshot: dict, address: int) -> dict:
    return next(segment for segment in snapshot["segments"]
                if segment["address"] <= address < segment["address"] + segment["total_size"])


def test_expandable_segments_are_applied_and_keep_what_the_allocator_reserves_near_what_it_hands_out(cuda):
    """prepare() with expandable_segments=True turns the caching allocator's setting on for the
    process: every segment the allocator creates after it is expandable (its snapshot says so),
    and growing allocations, each freed before the next, grow that segment in place, so what the
    process reserves beyond what it held before grows with the allocated peak, not with the sum of
    the sizes. Segments made earlier in the process (other tests' tensors still alive) may serve
    some of the allocations: only new segments and growth are asserted. What the default allocator
    reserves for the same allocations is the GPU's and driver's (4,200 MiB on an H200, 572 MiB on
    an H100, for 520 MiB allocated): not asserted. The setting is process-wide: put back after."""
    model = torch.nn.Linear(8, 8).to(cuda)
    if _segment_of(torch.cuda.memory._snapshot(), model.weight.data_ptr())["is_expandable"]:
        pytest.skip("expandable segments are already on in this process (PYTORCH_CUDA_ALLOC_CONF)")
    try:
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(expandable_segments=True),
                micro_batch_size=2, device=cuda)
        segments = torch.cuda.memory._snapshot()["segments"]
        old = {segment["address"] for segment in segments}
        # sizes above the largest free block of the older segments, so that the allocations need a new segment
        free = max((block["size"] for segment in segments for block in segment["blocks"]
                    if block["state"] == "inactive"), default=0)
        base = -(-free // MiB)
        allocated_before, reserved_before = torch.cuda.memory_allocated(cuda), torch.cuda.memory_reserved(cuda)
        torch.cuda.reset_peak_memory_stats(cuda)
        for mib in range(20, 420, 20):
            block = torch.empty((base + mib) * MiB, dtype=torch.uint8, device=cuda)
            del block
        grown = torch.cuda.max_memory_reserved(cuda) - reserved_before
        peak = torch.cuda.max_memory_allocated(cuda) - allocated_before
        new = [segment for segment in torch.cuda.memory._snapshot()["segments"] if segment["address"] not in old]
    finally:
        torch.cuda.empty_cache()
        set_allocator_settings("expandable_segments:False")
    assert new and all(segment["is_expandable"] for segment in new), new
    assert peak >= 400 * MiB
    assert grown < 1.25 * peak, (grown / MiB, peak / MiB)
