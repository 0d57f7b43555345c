"""The GPU levers of plan() and the configuration (TF32, CUDA graphs, the fewest micro-batches
that fit, compiling only where the run can earn it back), checked where they can be without a
GPU: not offered on a CPU, refused with the field named, and their logic run on fakes."""
import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, prepare
from trainopt_core import precision as mp
from trainopt_core.config import tf32_supported
from trainopt_core.planner import COMPILE_FLOOR_S, plan
from trainopt_core.planner import space
from trainopt_core.planner.search import loss_tolerance
from trainopt_core.planner.space import Candidate, fewest_splits_that_fit

from plan_fakes import without_time_budget

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_time_budget(monkeypatch):
    without_time_budget(monkeypatch)  # which candidates are measured must not depend on the machine's load


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))


def _batch(size=32):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(size, 32, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def _optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)


# ----------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("fields, message", [
    (dict(compile_mode="max"), "OptimizationConfig.compile_mode='max' is invalid: allowed one of ('default', "
                               "'reduce-overhead')"),
    (dict(compile_mode="reduce-overhead"), "'default' while compile is False"),
    (dict(tf32=1), "OptimizationConfig.tf32=1 is invalid: allowed True or False"),
])
def test_the_gpu_fields_are_validated(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OptimizationConfig(**fields)


def test_the_gpu_fields_at_their_defaults_keep_every_hash():
    assert OptimizationConfig.baseline().config_hash() == "e4536eadcb"
    assert "tf32" not in OptimizationConfig.baseline().computation_fields()
    assert OptimizationConfig(tf32=True).config_hash() != "e4536eadcb"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
@pytest.mark.parametrize("fields, field", [(dict(tf32=True), "tf32"),
                                           (dict(compile=True, compile_mode="reduce-overhead"), "compile_mode")])
def test_a_gpu_lever_on_a_cpu_is_refused_naming_the_field(fields, field):
    model = _model()
    with pytest.raises(ValueError, match=f"OptimizationConfig.{field}=.* is invalid: allowed .* on cpu"):
        prepare(model, _optimizer(model.parameters()), OptimizationConfig(**fields), micro_batch_size=8, device="cpu")


def test_tf32_is_allowed_inside_and_put_back_after():
    cudnn_before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        assert torch.get_float32_matmul_precision() == "highest"
        with mp.tf32_allowed():
            assert torch.get_float32_matmul_precision() == "high"
            assert torch.backends.cudnn.allow_tf32
            # the older and newer flags agree inside: reading either is no error
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32
        with pytest.raises(KeyError), mp.tf32_allowed():  # put back when the block raises, too
            raise KeyError
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_before


def test_tf32_autocast_enters_both_and_leaves_both():
    with mp.autocast(CPU, "bf16", tf32=True):
        assert torch.is_autocast_enabled("cpu") and torch.get_float32_matmul_precision() == "high"
    assert not torch.is_autocast_enabled("cpu") and torch.get_float32_matmul_precision() == "highest"
    with mp.autocast(CPU, "fp32", tf32=True):
        assert not torch.is_autocast_enabled("cpu") and torch.get_float32_matmul_precision() == "high"


NEWER_TF32_FLAGS = ("", "cudnn", "mkldnn", "cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv",
                    "mkldnn.rnn")  # torch.backends.<this>.fp32_precision, torch >= 2.9


def _backends(path: str):
    node = torch.backends
    for part in filter(None, path.split(".")):
        node = getattr(node, part)
    return node


def _tf32_flag_readings() -> dict:
    """Every TF32 flag of torch, older and newer, as read now (a read that raises: its error's type)."""
    readers = {"get_float32_matmul_precision": torch.get_float32_matmul_precision,
               "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
               "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32}
    readers.update({f"{path or 'backends'}.fp32_precision": (lambda path=path: _backends(path).fp32_precision)
                    for path in NEWER_TF32_FLAGS})
    readings = {}
    for name, read in readers.items():
        try:
            readings[name] = read()
        except (RuntimeError, AttributeError) as error:
            readings[name] = type(error).__name__
    return readings


@pytest.fixture
def tf32_flags_put_back():
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    per_op = [path for path in NEWER_TF32_FLAGS if "." in path] if NEWER_API else []
    newer = {path: _backends(path).fp32_precision for path in per_op}
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn
    for path, value in newer.items():
        _backends(path).fp32_precision = value


NEWER_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")
NEWER_ONLY = pytest.mark.skipif(not NEWER_API, reason="torch < 2.9 has only the older flags")
SET_BEFORE = {
    "torch's defaults": lambda: None,
    "cudnn.allow_tf32 = False": lambda: setattr(torch.backends.cudnn, "allow_tf32", False),
    "set_float32_matmul_precision('medium')": lambda: torch.set_float32_matmul_precision("medium"),
    # the newer flags set apart: reading the older ones is then an error
    "cuda.matmul.fp32_precision = 'ieee'": lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "ieee"),
    "cudnn.conv.fp32_precision = 'ieee'": lambda: setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee"),
}


@pytest.mark.parametrize("before", [*list(SET_BEFORE)[:3], *(pytest.param(name, marks=NEWER_ONLY)
                                                             for name in list(SET_BEFORE)[3:])])
def test_tf32_allowed_puts_back_exactly_every_flag_it_changed(before, tf32_flags_put_back):
    from trainopt_core.measure.flops import tf32_enabled

    SET_BEFORE[before]()
    readings = _tf32_flag_readings()
    with mp.tf32_allowed():
        assert tf32_enabled("matmul")[0] and tf32_enabled("convolution")[0]
    assert _tf32_flag_readings() == readings  # e.g. cuda.matmul.fp32_precision 'none' stays 'none', not 'ieee'


# ----------------------------------------------------------------------------- the search space
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU's candidates")
def test_on_a_cpu_neither_tf32_nor_cuda_graphs_is_offered():
    assert not tf32_supported(CPU)
    assert all(not tf32 for _, tf32 in space.precisions(CPU))
    options = space.speed_option_changes(Candidate(), _model(), _optimizer, CPU, try_compile=True)
    assert {"compile": True} in options
    assert not any(option.get("compile_mode") == "reduce-overhead" for option in options)


def test_on_a_tf32_gpu_stage_one_has_an_fp32_tf32_candidate(monkeypatch):
    monkeypatch.setattr(space, "tf32_supported", lambda device: True)
    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ("bf16", "fp16"))
    cuda = torch.device("cuda")
    assert space.precisions(cuda) == [("fp32", False), ("fp32", True), ("bf16", False), ("fp16", False)]
    names = [c.name for c in space.precision_splits(64, cuda, [1])]
    assert names == ["fp32, k=1", "fp32 TF32, k=1", "bf16, k=1", "fp16, k=1"]
    assert Candidate(tf32=True).config().tf32
    # TF32 keeps a 10-bit mantissa in its products: held to fp16's tolerance, not fp32's
    assert loss_tolerance(Candidate(tf32=True)) == loss_tolerance(Candidate("fp16")) > loss_tolerance(Candidate())


def test_on_a_gpu_the_compiled_option_is_cuda_graphs_alone_and_named(monkeypatch):
    monkeypatch.setattr(torch.utils._foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cpu", "cuda"])
    # the probe parameter the options are read from is built on the device: a CPU stands in for it
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: real_zeros(*a, **k))
    options = space.speed_option_changes(Candidate("bf16"), _model(), _optimizer, torch.device("cuda"), True)
    compiled = [o for o in options if o.get("compile")]
    # alone: a default-mode copy beside it shared dynamo's cache with it (an H200, torch 2.11)
    assert compiled == [{"compile": True, "compile_mode": "reduce-overhead"}]
    graphs = Candidate("bf16").replace(**compiled[0])
    assert graphs.name == "bf16, k=1, compiled (CUDA graphs)"
    assert graphs.config().compile_mode == "reduce-overhead"


def test_the_fewest_micro_batches_that_fit_come_first_and_a_precision_splits_only_until_it_fits():
    measured = []
    first = [Candidate("fp32", 1), Candidate("bf16", 1)]

    def does_not_fit(c):  # fp32 fits from k=4 on, bf16 at once
        return c.precision == "fp32" and c.k < 4

    stage1 = fewest_splits_that_fit(first, [1, 2, 4, 8], measured.extend, does_not_fit)
    assert [c.name for c in stage1] == ["fp32, k=1", "bf16, k=1", "fp32, k=2", "fp32, k=4"]
    assert measured == stage1  # each measured once, in that order
    # everything fits at once: nothing split
    assert fewest_splits_that_fit(first, [1, 2, 4, 8], lambda cs: None, lambda c: False) == first


# ----------------------------------------------------------------------------- compiling
def test_a_run_shorter_than_a_compile_is_not_offered_compiling():
    result = plan(_model(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2, steps_per_window=1,
                  try_compile=True, run_samples=64)
    assert not any(row["compile"] for row in result.rows)
    note = next(n for n in result.notes if n.startswith("torch.compile not tried: the whole run"))
    assert "64 samples" in note and f"{COMPILE_FLOOR_S:.0f} s" in note


def test_a_candidate_whose_compiling_fails_is_rejected_and_the_plan_goes_on(monkeypatch):
    class CompileError(Exception):  # torch.compile's own errors are no RuntimeErrors
        pass

    def failing_compile(self, *args, **kwargs):
        def broken(*a, **k):
            raise CompileError("backend failed")
        self.forward = broken

    monkeypatch.setattr(nn.Module, "compile", failing_compile)
    result = plan(_model(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2, steps_per_window=1,
                  try_compile=True)
    compiled = [row for row in result.rows if row["compile"]]
    assert len(compiled) == 1 and compiled[0]["peak_memory_bytes"] is None
    assert compiled[0]["rejected_because"].startswith("failed: compiling: CompileError: backend failed")
    assert not result.config.compile


def test_a_compiled_candidate_that_compiled_nothing_in_a_mode_not_compiled_before_is_rejected(monkeypatch):
    # dynamo's cache can hand a new compiled copy another mode's compiled code (seen on an H200):
    # no new graph compiled for it means it was not measured as itself
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: None)
    result = plan(_model(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2, steps_per_window=1,
                  try_compile=True)
    compiled = next(row for row in result.rows if row["compile"])
    assert compiled["rejected_because"].startswith("failed: compiling: dynamo compiled no graph for it")


def test_the_precision_check_says_it_compares_losses_at_the_initial_weights(monkeypatch):
    # a forward pass that bf16 computes wrongly (logits shifted to 100,000, where bf16 spaces values 512 apart)
    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ("bf16",))

    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(32, 10)
            nn.init.normal_(self.linear.weight, std=2.0)

        def forward(self, x):
            return (self.linear(x) + 1e5) - 1e5

    result = plan(Shifted(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2,
                  steps_per_window=1, speed_options=False)
    bf16 = next(row for row in result.rows if row["precision"] == "bf16")
    assert bf16["rejected_because"].startswith("quality: the probe batch's loss at the initial weights differs from "
                                               "fp32's by")


def test_a_cuda_graphs_config_is_named_so_and_no_other():
    assert OptimizationConfig(compile=True, compile_mode="reduce-overhead").cuda_graphs
    assert not OptimizationConfig(compile=True).cuda_graphs
    assert not OptimizationConfig.baseline().cuda_graphs


def test_the_allocator_only_tracker_is_refused_off_cuda():
    from trainopt_core.measure.tracker import MemoryTracker

    with pytest.raises(ValueError, match="breakdown=False on cpu: allowed on CUDA only"):
        MemoryTracker(_model(), device="cpu", breakdown=False)


def test_the_planner_tracks_a_cuda_graphs_candidate_without_the_breakdown(monkeypatch):
    # the breakdown's dispatch mode, active for one step, left an H200's CUDA graphs replaying at
    # eager speed in the timing after it: a CUDA-graphs candidate's step is read from the allocator.
    # Here (a CPU) a compiled candidate stands in for one, and the tracker records what was asked.
    from trainopt_core.measure.tracker import MemoryTracker
    from trainopt_core.planner import search

    asked = []

    def recording_tracker(model, optimizer, device, *, breakdown=True):
        asked.append(breakdown)
        return MemoryTracker(model, optimizer, device)  # a CPU has only the breakdown

    monkeypatch.setattr(OptimizationConfig, "cuda_graphs", property(lambda self: self.compile))
    monkeypatch.setattr(search, "MemoryTracker", recording_tracker)
    result = plan(_model(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2, steps_per_window=1,
                  try_compile=True)
    compiled = [row for row in result.rows if row["compile"] and row["peak_memory_bytes"] is not None]
    assert compiled, "no compiled candidate was measured"
    assert asked.count(False) == len(compiled) and asked.count(True) == len(asked) - len(compiled)


# ----------------------------------------------------------------------------- attention kernels
class _Attention(nn.Module):
    """One self-attention layer through torch's scaled_dot_product_attention, then a classifier.
    With `needs_flash`, its call runs only where the flash kernel may: an attention call no
    forced kernel can take, as flash cannot take a model's explicit mask."""

    def __init__(self, needs_flash: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.head, self.needs_flash = nn.Linear(32, 96), nn.Linear(32, 10), needs_flash

    def forward(self, x):
        q, k, v = self.qkv(x.view(len(x), 4, 8).repeat(1, 1, 4)).view(len(x), 4, 3, 32).unbind(2)
        if self.needs_flash and not torch.backends.cuda.flash_sdp_enabled():
            raise RuntimeError("No available kernel. Aborting execution.")
        return self.head(nn.functional.scaled_dot_product_attention(q, k, v).mean(1))


@pytest.mark.parametrize("fields, message", [
    (dict(sdpa_backend="fast"), "OptimizationConfig.sdpa_backend='fast' is invalid: allowed one of ('auto', 'flash', "
                                "'efficient', 'cudnn', 'math')"),
    (dict(sdpa_backend="flash"), "'auto', 'efficient' or 'math' with precision 'fp32'"),
])
def test_the_attention_kernel_is_validated(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OptimizationConfig(**fields)


def test_the_attention_kernel_at_its_default_keeps_every_hash():
    assert "sdpa_backend" not in OptimizationConfig.baseline().computation_fields()
    assert OptimizationConfig(sdpa_backend="math").config_hash() != OptimizationConfig().config_hash()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_a_cuda_attention_kernel_on_a_cpu_is_refused_naming_the_field():
    model = _Attention()
    with pytest.raises(ValueError, match=r"OptimizationConfig.sdpa_backend='efficient' is invalid: allowed 'auto' or "
                                         r"'math' on cpu"):
        prepare(model, _optimizer(model.parameters()), OptimizationConfig(sdpa_backend="efficient"),
                micro_batch_size=8, device="cpu")


def test_the_engine_forces_the_kernel_in_the_forward_and_the_backward_and_puts_it_back():
    seen = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(("backward", torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
            return grad

    model = _Attention()
    engine = prepare(model, _optimizer(model.parameters()), OptimizationConfig(sdpa_backend="math"),
                     micro_batch_size=8, device="cpu")
    x, y = _batch(8)
    with engine.autocast():
        loss = nn.functional.cross_entropy(Spy.apply(model(x)), y)
    engine.backward(loss)
    assert engine.step()
    assert seen == [("forward", False, True), ("backward", False, True)]
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()  # put back


def test_calls_sdpa_sees_a_model_that_calls_it_and_not_one_that_does_not():
    x = _batch(4)[0]
    assert space.calls_sdpa(lambda: _Attention()(x))
    assert not space.calls_sdpa(lambda: _model()(x))


def test_attention_kernels_are_offered_on_a_gpu_by_precision_and_nowhere_else(monkeypatch):
    assert space.attention_kernels(Candidate("bf16"), CPU) == ()
    assert not any("sdpa_backend" in option for option in
                   space.speed_option_changes(Candidate(), _Attention(), _optimizer, CPU, False, uses_sdpa=True))
    cuda = torch.device("cuda")
    assert space.attention_kernels(Candidate("bf16"), cuda) == ("flash", "cudnn")
    assert space.attention_kernels(Candidate("fp16"), cuda) == ("flash", "cudnn")
    assert space.attention_kernels(Candidate(), cuda) == ("efficient",)
    monkeypatch.setattr(torch.utils._foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cpu", "cuda"])
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: real_zeros(*a, **k))
    options = space.speed_option_changes(Candidate("bf16"), _Attention(), _optimizer, cuda, False, uses_sdpa=True)
    assert [o for o in options if "sdpa_backend" in o] == [{"sdpa_backend": "flash"}, {"sdpa_backend": "cudnn"}]
    assert not any("sdpa_backend" in o for o in
                   space.speed_option_changes(Candidate("bf16"), _model(), _optimizer, cuda, False, uses_sdpa=False))
    assert Candidate("bf16", sdpa_backend="cudnn").name == "bf16, k=1, cudnn attention"
    assert Candidate("bf16", sdpa_backend="cudnn").config().sdpa_backend == "cudnn"


@pytest.fixture
def math_kernel_offered(monkeypatch):
    """The planner's attention-kernel lever on this CPU: 'math' stands in for a GPU's kernels."""
    import trainopt_core.planner.stages as stages

    def offered(best, device):
        return ("math",)

    monkeypatch.setattr(space, "attention_kernels", offered)
    monkeypatch.setattr(stages, "attention_kernels", offered)


def test_plan_times_a_forced_attention_kernel_only_for_a_model_that_calls_sdpa(math_kernel_offered, monkeypatch):
    # fp32 only, on every CPU kind: with bf16 also offered, which precision the kernel is tried on
    # would follow this sitting's timings
    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ())
    result = plan(_Attention(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2,
                  steps_per_window=1)
    # the kernel alone on the best; with another option that helped (the fused optimizer, if its
    # timing said so) it is tried again in their combination
    forced = {row["candidate"]: row for row in result.rows if row["sdpa_backend"] == "math"}
    assert "fp32, k=1, math attention" in forced
    assert set(forced) <= {"fp32, k=1, math attention", "fp32, k=1, fused optimizer, math attention"}
    alone = forced["fp32, k=1, math attention"]
    assert alone["speedup"] is not None and alone["speedup_ci_low"] is not None
    result = plan(_model(), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2, steps_per_window=1)
    assert not any(row["sdpa_backend"] != "auto" for row in result.rows)


def test_an_attention_kernel_that_cannot_run_the_model_is_rejected_and_the_plan_goes_on(math_kernel_offered):
    result = plan(_Attention(needs_flash=True), _optimizer, _batch(), nn.functional.cross_entropy, ks=[1], windows=2,
                  steps_per_window=1)
    forced = next(row for row in result.rows if row["sdpa_backend"] == "math")
    assert forced["peak_memory_bytes"] is None
    assert forced["rejected_because"].startswith("failed: math attention does not run this model's attention: "
                                                 "No available kernel")
    assert result.config.sdpa_backend == "auto"


# ----------------------------------------------------------------------------- expandable segments
def test_expandable_segments_are_validated_and_at_their_default_keep_every_hash():
    with pytest.raises(ValueError, match=r"OptimizationConfig.expandable_segments=1 is invalid: allowed True or False"):
        OptimizationConfig(expandable_segments=1)
    assert "expandable_segments" not in OptimizationConfig.baseline().computation_fields()
    assert OptimizationConfig.baseline().config_hash() == "e4536eadcb"
    assert OptimizationConfig(expandable_segments=True).config_hash() != "e4536eadcb"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_expandable_segments_on_a_cpu_are_refused_naming_the_field_before_anything_is_set(monkeypatch):
    from trainopt_core import config as config_module

    calls = []
    monkeypatch.setattr(config_module, "set_allocator_settings", calls.append)
    model = _model()
    with pytest.raises(ValueError, match=r"OptimizationConfig.expandable_segments=True is invalid: allowed False "
                                         r"on cpu \(expandable segments are a setting of CUDA's caching allocator"):
        prepare(model, _optimizer(model.parameters()), OptimizationConfig(expandable_segments=True),
                micro_batch_size=8, device="cpu")
    assert calls == []


def test_expandable_segments_release_the_cache_then_set_the_allocator(monkeypatch):
    from trainopt_core import config as config_module

    calls = []
    monkeypatch.setattr(config_module, "expandable_segments_supported", lambda device: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(config_module, "set_allocator_settings", calls.append)
    config_module.use_expandable_segments("cuda")
    assert calls == ["empty_cache", "expandable_segments:True"]


def _plan_with_budget(budget):
    model = _model()
    return plan(model, _optimizer, _batch(), nn.functional.cross_entropy, device="cpu", ks=(1,),
                memory_budget_bytes=budget, speed_options=False, windows=1, steps_per_window=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU's plan")
def test_on_a_cpu_expandable_segments_are_not_offered():
    result = _plan_with_budget(2**30)
    assert result.config.expandable_segments is False
    assert not any("xpandable" in note for note in result.notes)


@pytest.mark.parametrize("budget", [2**30, None])
def test_where_supported_the_plan_turns_expandable_segments_on_with_a_budget_and_says_so(monkeypatch, budget):
    monkeypatch.setattr(space, "expandable_segments_supported", lambda device: True)
    result = _plan_with_budget(budget)
    assert result.config.expandable_segments is (budget is not None)
    (note,) = [note for note in result.notes if "xpandable" in note]
    assert note.startswith("Expandable segments on" if budget else "Expandable segments left off (no memory budget)")
    assert "61 %" in note and "3-8 %" in note
    # chosen again under the other budget, as plan() would
    again = result.rechoose(memory_budget_bytes=None if budget else 2**30)
    assert again.config.expandable_segments is (budget is None)
    assert any(note.startswith("Expandable segments " + ("left off" if budget else "on")) for note in again.notes)
    assert again.device == "cpu" and again.world_size == result.world_size
