"""The configuration's speed options: selective checkpointing, the optimizer's foreach/fused
kernels, channels-last weights, torch.compile; and that adding them kept every older hash."""
import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from trainopt_core import prepare
from trainopt_core.checkpointing import apply_activation_checkpointing
from trainopt_core.measure.activations import saved_activation_bytes
from trainopt_core.compose import use_optimizer_impl
from trainopt_core.config import OptimizationConfig, with_precision

from test_checkpointing import CASES, _grads


def test_new_fields_at_their_defaults_keep_the_hashes_committed_records_carry():
    # hashes in reports/quick/runs/ file names, made before these fields existed
    assert OptimizationConfig.baseline().config_hash() == "e4536eadcb"
    assert with_precision(OptimizationConfig.optimized(), "bf16").config_hash() == "873a13b011"
    for path in sorted((Path(__file__).parents[1] / "reports" / "quick" / "runs").glob("*.json")):
        record = json.loads(path.read_text())
        assert OptimizationConfig.from_dict(record["config"]).config_hash() == record["config_hash"], path.name
    changed = OptimizationConfig.baseline().replace(optimizer_impl="fused")
    assert changed.config_hash() != "e4536eadcb" and changed.computation_fields()["optimizer_impl"] == "fused"


@pytest.mark.parametrize("field, value, allowed", [
    ("checkpoint_policy", "some", "one of ('full', 'selective')"),
    ("optimizer_impl", "fast", "one of ('default', 'foreach', 'fused')"),
    ("memory_format", "nhwc", "one of ('contiguous', 'channels_last')"),
    ("compile", 1, "True or False"),
])
def test_new_fields_are_validated(field, value, allowed):
    with pytest.raises(ValueError, match=f"OptimizationConfig.{field}={value!r} is invalid: allowed {allowed}".replace(
            "(", r"\(").replace(")", r"\)")):
        OptimizationConfig(**{field: value})
    with pytest.raises(ValueError, match="'full' while checkpointing is None"):
        OptimizationConfig(checkpoint_policy="selective")


@pytest.mark.parametrize("name", ["resnet50", "gpt2"])
def test_selective_checkpointing_gives_the_plain_gradients_and_keeps_between_full_and_none(name):
    torch.set_num_threads(1)
    plain, inputs, loss_of = CASES[name]()
    full, selective = copy.deepcopy(plain), copy.deepcopy(plain)
    apply_activation_checkpointing(full, segments=len(list(_blocks(full))))
    plan = apply_activation_checkpointing(selective, segments=len(list(_blocks(selective))), policy="selective")
    assert plan.policy == "selective"
    _assert_same_gradients(plain, selective, loss_of)
    full.train()
    saved = {label: saved_activation_bytes(model, *inputs) for label, model in
             (("none", plain), ("full", full), ("selective", selective))}
    assert saved["full"] < saved["selective"] < saved["none"], saved
    with pytest.raises(ValueError, match="already applied"):
        apply_activation_checkpointing(selective, segments=len(list(_blocks(selective))))


def test_selective_checkpointing_runs_with_a_checkpoint_that_lacks_respect_saved_tensors_hooks(monkeypatch):
    # torch 2.11's checkpoint: no such parameter, and unknown keywords go to the checkpointed function
    from torch.utils import checkpoint as torch_checkpoint
    from trainopt_core import checkpointing

    def checkpoint_2_11(function, *args, use_reentrant=None, preserve_rng_state=True,
                        context_fn=torch_checkpoint.noop_context_fn, determinism_check="default", debug=False, **kwargs):
        return torch_checkpoint.checkpoint(lambda *a: function(*a, **kwargs), *args, use_reentrant=use_reentrant,
                                           preserve_rng_state=preserve_rng_state, context_fn=context_fn)

    def checkpoint_2_14(function, *args, respect_saved_tensors_hooks=None, **kwargs):
        raise AssertionError("not called")

    assert checkpointing.saved_tensor_hook_options(checkpoint_2_14) == {"respect_saved_tensors_hooks": True}
    assert checkpointing.saved_tensor_hook_options(checkpoint_2_11) == {}
    monkeypatch.setattr(checkpointing, "checkpoint", checkpoint_2_11)
    torch.set_num_threads(1)
    plain, inputs, loss_of = CASES["gpt2"]()
    selective = copy.deepcopy(plain)
    apply_activation_checkpointing(selective, segments=len(list(_blocks(selective))), policy="selective")
    _assert_same_gradients(plain, selective, loss_of)


def _assert_same_gradients(plain, checkpointed, loss_of):
    for model in (plain, checkpointed):
        model.train()
        torch.manual_seed(123)
        loss_of(model).backward()
    for p_grad, c_grad in zip(_grads(plain), _grads(checkpointed)):
        torch.testing.assert_close(c_grad, p_grad)


def _blocks(model):
    from trainopt_core.checkpointing import block_sequence
    return block_sequence(model)


def _linear_run(config, optimizer=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = optimizer(model.parameters()) if optimizer else torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine = prepare(model, optimizer, config, micro_batch_size=8)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)
        engine.backward(nn.functional.cross_entropy(model(x), y))
        engine.step()
    return model, optimizer


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_the_optimizer_impl_switches_torch_kernels_and_trains_like_the_default(impl):
    reference, _ = _linear_run(OptimizationConfig())
    model, optimizer = _linear_run(OptimizationConfig(optimizer_impl=impl))
    assert all(group[impl] is True for group in optimizer.param_groups)
    other = "fused" if impl == "foreach" else "foreach"
    assert not any(group[other] for group in optimizer.param_groups)
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_an_optimizer_without_the_kernels_is_refused():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="optimizer_impl='fused' is invalid for LBFGS"):
        use_optimizer_impl(torch.optim.LBFGS(model.parameters()), "fused")


def test_channels_last_needs_convolutions_and_converts_their_weights():
    with pytest.raises(ValueError, match="memory_format='channels_last' is invalid for a model without 4-D"):
        _linear_run(OptimizationConfig(memory_format="channels_last"))
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))
    prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(memory_format="channels_last"),
            micro_batch_size=1)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_compile_compiles_the_callers_model_object_in_place():
    model = nn.Linear(4, 4)
    prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(compile=True), micro_batch_size=1)
    assert model._compiled_call_impl is not None  # nn.Module.compile(): the first call compiles


def test_compile_scope_blocks_compiles_each_repeated_block_and_leaves_the_glue_eager():
    """Regional compilation: each transformer Block / Bottleneck compiles (they share one compiled
    code), the model around them stays eager; the hash of a configuration that does not compile
    is what it was before the field existed."""
    from trainopt_core.reproduction.models import gpt2_model

    model = gpt2_model(vocab_size=64, n_layer=2, n_embd=16, n_head=2, n_positions=8)
    config = OptimizationConfig(compile=True, compile_scope="blocks")
    prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), config, micro_batch_size=1)
    blocks = list(model.checkpoint_blocks) if hasattr(model, "checkpoint_blocks") else list(model.transformer.h)
    assert all(block._compiled_call_impl is not None for block in blocks)
    assert model._compiled_call_impl is None
    assert OptimizationConfig().config_hash() == OptimizationConfig(compile_scope="model").config_hash()
    assert config.config_hash() != OptimizationConfig(compile=True).config_hash()


def test_compile_scope_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="compile_scope='blocks' is invalid: allowed 'model' while compile is False"):
        OptimizationConfig(compile_scope="blocks")
    with pytest.raises(ValueError, match=r"compile_scope='each' is invalid: allowed one of \('model', 'blocks'\)"):
        OptimizationConfig(compile=True, compile_scope="each")
    model = nn.Linear(4, 4)  # no known repeated blocks
    with pytest.raises(ValueError, match="compile_scope='blocks' is invalid: allowed 'model' for Linear, whose "
                                         "repeated blocks are unknown"):
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                OptimizationConfig(compile=True, compile_scope="blocks"), micro_batch_size=1)
    assert model._compiled_call_impl is None


def test_plan_compiles_a_transformers_blocks_and_a_resnet_whole():
    """One block repeated (GPT-2's) compiles once for all, regionally; blocks of several shapes (a
    ResNet's stages) compile the whole model (benchmarks/bench_compile_scope.py measured both)."""
    from trainopt_core.planner.space import Candidate, repeats_one_block, speed_option_changes
    from trainopt_core.reproduction.models import gpt2_model, resnet_cifar

    gpt2 = gpt2_model(vocab_size=64, n_layer=2, n_embd=16, n_head=2, n_positions=8)
    resnet = resnet_cifar(num_classes=10, layers=(1, 1, 1, 1), width=4)
    assert repeats_one_block(gpt2) and not repeats_one_block(resnet) and not repeats_one_block(nn.Linear(2, 2))

    def compile_option(model):
        options = speed_option_changes(Candidate(), model, lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                       torch.device("cpu"), try_compile=True)
        return next(option for option in options if option.get("compile"))

    assert compile_option(gpt2) == {"compile": True, "compile_scope": "blocks"}
    assert compile_option(resnet) == {"compile": True}
    assert Candidate(compile=True, compile_scope="blocks").name == "fp32, k=1, compiled (blocks)"
    assert Candidate(compile=True, compile_scope="blocks", compile_mode="reduce-overhead").name == \
        "fp32, k=1, compiled (blocks, CUDA graphs)"
