"""Measurement defects found in review, each pinned down on CPU: the training-step memory peak
without evaluation, DeepSpeed ZeRO buckets sized to the model, fp16 skipped steps counted from
the gradients (and a collapsed loss scale stopping the run), TF32 peaks for convolutions, and
GPT-2's FLOPs per item counting the items throughput counts."""
import math
import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from trainopt_core import OptimizationConfig, prepare
from trainopt_core import precision as mp
from trainopt_core.distributed import deepspeed_config
from trainopt_core.distributed.ds_config import (
    DEEPSPEED_DEFAULT_BUCKET_ELEMENTS,
    MIN_BUCKET_ELEMENTS,
    zero_bucket_sizes,
)
from trainopt_core.measure import flops
from trainopt_core.measure.memory import PeakMemory
from trainopt_core.measure.tracker import MemoryTracker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- 1. memory phases
class FakeAllocator:
    """The CUDA caching allocator's peak statistics, for exercising PeakMemory without a GPU."""

    def __init__(self):
        self.current = 1000  # model and optimizer state
        self.peak = self.current
        self.resets = 0

    def allocate(self, nbytes):
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def free(self, nbytes):
        self.current -= nbytes

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self._reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.peak + 10)

    def _reset(self, device=None):
        self.resets += 1
        self.peak = self.current


def test_cuda_training_peak_excludes_evaluation_which_is_reported_apart(monkeypatch):
    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    memory = PeakMemory("cuda")
    with memory.evaluation():          # evaluation before training: logits of a long sequence
        allocator.allocate(50_000)
        allocator.free(50_000)
    for activations in (300, 700, 500):
        with memory.training_step():
            allocator.allocate(activations)
            allocator.free(activations)
    with memory.evaluation():
        allocator.allocate(40_000)
        allocator.free(40_000)
    assert memory.peak_bytes() == 1000 + 700
    assert memory.evaluation_peak_bytes() == 1000 + 50_000
    assert memory.peak_reserved_bytes() == 1000 + 700 + 10
    assert memory.training_steps_measured == 3 and memory.evaluations_measured == 2
    assert memory.source == memory.evaluation_source == "cuda_max_memory_allocated"


def test_cuda_tracked_step_counts_itself_not_the_evaluation_before_it(monkeypatch):
    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    memory = PeakMemory("cuda")
    assert memory.peak_bytes() is None and memory.evaluation_peak_bytes() is None
    with memory.evaluation():
        allocator.allocate(50_000)
        allocator.free(50_000)
    tracker = memory.track_step()  # entered inside the phase (the runner's order) ...
    with memory.training_step(), tracker:
        allocator.allocate(200)
        allocator.free(200)
    memory.add_tracked(tracker)
    assert memory.peak_bytes() == 1200 and tracker.peak_bytes == 1200
    other = memory.track_step()    # ... or around it, without a phase at all
    with memory.evaluation():
        allocator.allocate(60_000)
        allocator.free(60_000)
    with other:
        allocator.allocate(900)
        allocator.free(900)
    memory.add_tracked(other)
    assert other.cuda_peak_before_bytes == 61_000  # the evaluation: seen, and left out
    assert memory.peak_bytes() == 1900
    assert memory.evaluation_peak_bytes() == 61_000


def test_cpu_phases_keep_the_tracker_peak_and_have_no_evaluation_peak():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    memory = PeakMemory("cpu")
    with memory.evaluation(), torch.no_grad():
        big = torch.ones(4_000_000)  # 16 MB: far above the step
        del big
    tracker = memory.track_step(model, optimizer)
    with memory.training_step(), tracker:
        F.cross_entropy(model(torch.randn(8, 64)), torch.zeros(8, dtype=torch.long)).backward()
        optimizer.step()
    memory.add_tracked(tracker)
    assert memory.peak_bytes() == tracker.peak_bytes < 4_000_000
    assert memory.evaluation_peak_bytes() is None and memory.evaluation_source is None
    assert memory.breakdown() == tracker.breakdown_at_peak


def test_memory_phases_do_not_nest():
    memory = PeakMemory("cpu")
    with memory.training_step(), pytest.raises(
            RuntimeError, match=r"evaluation\(\) entered inside PeakMemory.training_step\(\)"), memory.evaluation():
        pass
    with memory.evaluation():  # the failed entry left no phase open
        pass


def test_tracker_alone_still_measures_a_step_on_cpu():
    with MemoryTracker() as tracker:
        a = torch.ones(1000)
        del a
    memory = PeakMemory("cpu")
    memory.add_tracked(tracker)
    assert memory.peak_bytes() == 4000


# ----------------------------------------------------------------------------- 2. DeepSpeed buckets
def test_zero_buckets_are_sized_to_the_model_between_a_floor_and_deepspeeds_default():
    assert zero_bucket_sizes(4_000_000) == {"reduce_bucket_size": 4_000_000, "allgather_bucket_size": 4_000_000}
    assert zero_bucket_sizes(10)["reduce_bucket_size"] == MIN_BUCKET_ELEMENTS
    assert zero_bucket_sizes(10**10)["allgather_bucket_size"] == DEEPSPEED_DEFAULT_BUCKET_ELEMENTS == 500_000_000
    with pytest.raises(ValueError, match="num_parameters=-1"):
        zero_bucket_sizes(-1)


def test_deepspeed_config_buckets_hold_no_more_than_the_parameters_of_a_small_model():
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 10))
    n = sum(p.numel() for p in model.parameters())
    ds = deepspeed_config(OptimizationConfig(zero_stage=2), micro_batch_size=8, k=1, num_parameters=n)
    zero = ds["zero_optimization"]
    assert zero["stage"] == 2
    assert MIN_BUCKET_ELEMENTS <= zero["reduce_bucket_size"] <= n and zero["allgather_bucket_size"] <= n
    assert zero["reduce_bucket_size"] < DEEPSPEED_DEFAULT_BUCKET_ELEMENTS
    stage0 = deepspeed_config(OptimizationConfig(zero_stage=0), micro_batch_size=8, k=1, num_parameters=n)
    assert stage0["zero_optimization"] == {"stage": 0}  # no ZeRO buckets to size


DEEPSPEED_BUCKET_SCRIPT = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from trainopt_core import OptimizationConfig, prepare
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 10))
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01), OptimizationConfig(zero_stage=2),
                     total_samples=100, micro_batch_size=2, backend="deepspeed")
    engine.backward(F.cross_entropy(engine.model(torch.randn(2, 512)), torch.zeros(2, dtype=torch.long)))
    engine.step()
    optimizer = engine.ds_engine.optimizer
    print("recorded:", engine.zero_bucket_sizes["reduce_bucket_size"], engine.zero_bucket_sizes["allgather_bucket_size"])
    print("deepspeed:", engine.ds_engine.zero_reduce_bucket_size(), engine.ds_engine.zero_allgather_bucket_size(),
          int(optimizer.reduce_bucket_size))
    engine.close()
""")


@pytest.mark.slow
def test_deepspeed_engine_uses_and_records_the_model_sized_buckets(run_deepspeed_script):
    stdout = run_deepspeed_script(DEEPSPEED_BUCKET_SCRIPT)
    n = 512 * 512 + 512 + 512 * 10 + 10
    assert f"recorded: {n} {n}" in stdout
    assert f"deepspeed: {n} {n} {n}" in stdout


# ----------------------------------------------------------------------------- 3. fp16 skipped steps
def fp16_engine(initial_loss_scale=2.0**16):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = OptimizationConfig(precision="fp16", initial_loss_scale=initial_loss_scale, loss_scale_growth_interval=1000)
    with pytest.warns(UserWarning, match="fp16 autocast on CPU"):
        engine = prepare(model, optimizer, config, total_samples=100_000, micro_batch_size=16)
    return model, engine


def train_steps(model, engine, poisoned_steps: int, clean_steps: int) -> list[bool]:
    stepped = []
    for step in range(poisoned_steps + clean_steps):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        with engine.autocast():
            loss = F.mse_loss(model(x).float(), y)
        engine.backward(loss)
        if step < poisoned_steps:
            model.weight.grad[0, 0] = float("nan") if step % 2 else float("inf")
        stepped.append(engine.step())
    return stepped


def test_fp16_counts_every_step_with_non_finite_gradients_as_skipped():
    model, engine = fp16_engine()
    stepped = train_steps(model, engine, poisoned_steps=40, clean_steps=5)
    assert stepped == [False] * 40 + [True] * 5
    assert engine.skipped_steps == 40 and engine.optimizer_steps == 45
    assert engine.loss_scale == 2.0**16 / 2**40 == mp.MIN_LOSS_SCALE  # at the floor, not below it
    assert engine.consecutive_skipped_steps == 0


def test_fp16_collapsed_loss_scale_stops_the_run_with_the_count_and_the_scale():
    model, engine = fp16_engine()
    with pytest.raises(RuntimeError) as raised:
        train_steps(model, engine, poisoned_steps=200, clean_steps=0)
    # 2^16 halved 41 times is 2^-25, the first scale below the 2^-24 floor
    message = str(raised.value)
    assert "fp16 loss scale collapsed: 41 consecutive skipped steps" in message
    assert repr(2.0**-25) in message and repr(mp.MIN_LOSS_SCALE) in message and "bf16" in message
    assert engine.skipped_steps == engine.optimizer_steps == 41


def test_skips_are_counted_from_the_gradients_even_when_the_scale_does_not_move(monkeypatch):
    # A scale stuck at one value (as one underflowed to 0 is): inferring skips from the scale
    # backing off would count none of these.
    model, engine = fp16_engine(initial_loss_scale=2.0**8)  # low enough for clean steps not to overflow
    update = engine.scaler.update
    monkeypatch.setattr(engine.scaler, "update", lambda new_scale=None: update(new_scale=2.0**8))
    stepped = train_steps(model, engine, poisoned_steps=7, clean_steps=3)
    assert stepped == [False] * 7 + [True] * 3
    assert engine.skipped_steps == 7 and engine.loss_scale == 2.0**8


def test_skips_are_counted_after_an_earlier_clean_stretch_too():
    model, engine = fp16_engine(initial_loss_scale=2.0**4)
    stepped = train_steps(model, engine, poisoned_steps=0, clean_steps=3)
    stepped += train_steps(model, engine, poisoned_steps=20, clean_steps=2)
    assert stepped == [True] * 3 + [False] * 20 + [True] * 2
    assert engine.skipped_steps == 20


def test_gradients_non_finite_matches_gradscalers_found_inf_test():
    finite_but_huge = [torch.full((4,), 1e30)]  # the norm overflows, the gradients do not
    assert not mp.gradients_non_finite(torch.linalg.vector_norm(finite_but_huge[0]), finite_but_huge)
    assert mp.gradients_non_finite(float("nan"), [torch.tensor([1.0, float("nan")])])
    assert not mp.gradients_non_finite(torch.tensor(3.0), [torch.tensor([3.0])])


@pytest.mark.parametrize("scale", [0.0, float("inf"), float("nan")])
def test_zero_or_non_finite_loss_scale_is_a_collapse(scale):
    with pytest.raises(RuntimeError, match="loss scale collapsed: 0 consecutive skipped steps"):
        mp.check_loss_scale(scale, consecutive_skips=0)
    mp.check_loss_scale(2.0**-30, consecutive_skips=0)  # below the floor without a skip: a user's choice


# ----------------------------------------------------------------------------- 4. TF32 peaks
H100 = "NVIDIA H100 80GB HBM3"


def test_fp32_convolution_model_gets_the_tf32_peak_while_cudnn_allows_tf32(tf32_flags):
    tf32_flags(matmul_tf32=False, conv_tf32=True)  # PyTorch's defaults
    peak, source = flops.datasheet_peak_flops(H100, "fp32", workload="convolution")
    assert peak == 494.7e12
    assert "tf32 tensor-core peak" in source and "cuDNN convolutions allow TF32" in source
    peak, source = flops.datasheet_peak_flops(H100, "fp32", workload="matmul")
    assert peak == 67e12 and "matmuls do not allow TF32" in source
    tf32_flags(matmul_tf32=False, conv_tf32=False)
    peak, source = flops.datasheet_peak_flops(H100, "fp32", workload="convolution")
    assert peak == 67e12 and source.startswith("datasheet: NVIDIA H100 SXM fp32 dense (cuDNN convolutions do not")


def test_fp32_matmul_model_gets_the_tf32_peak_when_matmuls_allow_it(tf32_flags):
    tf32_flags(matmul_tf32=True, conv_tf32=False)
    peak, source = flops.datasheet_peak_flops(H100, "fp32", workload="matmul")
    assert peak == 494.7e12 and "tf32 tensor-core peak" in source and "matmuls allow TF32" in source
    assert flops.datasheet_peak_flops(H100, "fp32", workload="convolution")[0] == 67e12
    # a GPU without TF32 tensor cores keeps its fp32 peak, and says why
    peak, source = flops.datasheet_peak_flops("Tesla V100-SXM2-16GB", "fp32", workload="matmul")
    assert peak == 15.7e12 and "no TF32" in source
    # reduced precisions are unaffected by the TF32 flags
    assert flops.datasheet_peak_flops(H100, "bf16", workload="convolution") == (989.4e12, "datasheet: NVIDIA H100 SXM bf16 dense")


def test_peak_flops_on_a_gpu_follows_the_workload_and_the_current_flags(tf32_flags, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: H100)
    flops._cached_peak.cache_clear()
    try:
        tf32_flags(matmul_tf32=False, conv_tf32=True)
        peak, source = flops.peak_flops(torch.device("cuda", 0), "fp32", workload="convolution")
        assert peak == 494.7e12 and "cuDNN convolutions allow TF32" in source
        assert flops.peak_flops(torch.device("cuda", 0), "fp32")[0] == 67e12  # workload="matmul"
        tf32_flags(matmul_tf32=False, conv_tf32=False)  # cached per flag setting, not stale
        assert flops.peak_flops(torch.device("cuda", 0), "fp32", workload="convolution")[0] == 67e12
        with pytest.raises(ValueError, match="workload='attention'"):
            flops.peak_flops(torch.device("cuda", 0), "fp32", workload="attention")
    finally:
        flops._cached_peak.cache_clear()


def test_tf32_flag_inheritance_of_the_new_torch_api(tf32_flags):
    backends = torch.backends
    if not hasattr(backends.cuda.matmul, "fp32_precision"):
        pytest.skip("torch < 2.9 has only the allow_tf32 flags")
    tf32_flags(matmul_tf32=False, conv_tf32=False)
    saved = backends.cuda.matmul.fp32_precision, backends.cudnn.fp32_precision
    try:
        backends.cuda.matmul.fp32_precision = "none"  # inherits the cuDNN/CUDA backend setting
        backends.cudnn.fp32_precision = "tf32"
        assert flops.tf32_enabled("matmul")[0]
        backends.cudnn.fp32_precision = "none"      # ... and then the global one: IEEE by default
        assert not flops.tf32_enabled("matmul")[0]
    finally:
        backends.cuda.matmul.fp32_precision, backends.cudnn.fp32_precision = saved


def test_flops_workload_tells_convolution_models_from_transformers():
    from trainopt_core.reproduction import models

    assert flops.flops_workload(models.resnet_cifar(layers=(1, 1, 1, 1), width=8)) == "convolution"
    gpt2 = models.gpt2_model(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8)
    assert flops.flops_workload(gpt2) == "matmul"  # HF Conv1D is a matmul


# ----------------------------------------------------------------------------- 5. GPT-2 items
def test_gpt2_flops_per_item_times_items_is_the_flops_of_the_batch():
    from trainopt_core.reproduction import models, tasks
    from trainopt_core.reproduction.profiles import get_profile

    with pytest.warns(UserWarning, match="STAND-IN"):
        task = tasks.build_task(get_profile("wikitext2", "smoke"), data_policy="standin", data_dir=None,
                                device=torch.device("cpu"), seed=0)
    assert task.flops_workload == "matmul"
    x, y = next(task.train_batches(3))
    batch, seq_len = x.shape
    _, num_items = task.loss(task.model, x, y)
    assert num_items == batch * (seq_len - 1)  # throughput's items: predicted tokens
    batch_flops = batch * seq_len * models.training_flops_per_token(task.model, seq_len)  # every position runs
    assert num_items * task.training_flops_per_item == pytest.approx(batch_flops, rel=1e-12)


def test_gpt2_flops_per_predicted_token_agree_with_counted_training_flops():
    from trainopt_core.reproduction import models, tasks

    # short sequences make the (T - 1) / T difference large: 12.5% at T = 8
    model = models.gpt2_model(n_layer=2, n_embd=64, n_head=2, vocab_size=64, n_positions=8)
    x = torch.randint(0, 64, (4, 8))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=x, labels=x).loss.backward()
    counted = counter.get_total_flops()  # forward + backward matmuls (bias and layer-norm adds not counted)
    analytic = tasks.predicted_tokens(x) * tasks.gpt2_training_flops_per_predicted_token(model, 8)
    assert analytic == pytest.approx(counted, rel=0.03)
    per_processed_token = tasks.predicted_tokens(x) * models.training_flops_per_token(model, 8)
    assert abs(per_processed_token / counted - 1) > 0.08  # the old mismatch would fail here
    with pytest.raises(ValueError, match="seq_len=1"):
        tasks.gpt2_training_flops_per_predicted_token(model, 1)


def test_model_flops_utilization_is_the_record_keys_function():
    assert flops.flops_utilization is flops.model_flops_utilization
    assert flops.model_flops_utilization(6e9, 1000.0, 12e12) == pytest.approx(0.5)
    assert math.isclose(flops.model_flops_utilization(1.0, 0.0, 1.0), 0.0)
    assert "model FLOPs utilization" in flops.__doc__.replace("Model", "model")
