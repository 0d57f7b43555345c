"""Activation checkpointing (paper §III-E, eqs. 18-20) on the paper's two block sequences."""
import copy

import pytest
import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet
from transformers import GPT2Config, GPT2LMHeadModel

import trainopt_core.checkpointing as ckpt
from trainopt_core.checkpointing import (
    apply_activation_checkpointing,
    block_sequence,
    checkpoint_plan,
    expected_saved_fraction,
    remove_activation_checkpointing,
    resolve_segments,
    segment_boundaries,
)
from trainopt_core.measure.activations import SavedTensorMeter, saved_activation_bytes


@pytest.fixture(autouse=True)
def _one_thread():
    # These models are tiny: on shared, busy cores a second intra-op thread only adds
    # spin-waiting (observed ~100x slower), so run this file single-threaded.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _cifar_resnet50():
    """ResNet-50 topology (16 bottlenecks) with the CIFAR stem; narrower inner width for speed."""
    model = ResNet(Bottleneck, [3, 4, 6, 3], num_classes=10, width_per_group=16)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def _narrow_gpt2_small():
    """GPT-2 small topology (12 blocks) at small width, dropout on."""
    config = GPT2Config(n_layer=12, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _resnet_case():
    images, labels = torch.randn(2, 3, 16, 16), torch.tensor([3, 7])
    return _cifar_resnet50(), (images,), lambda model: nn.functional.cross_entropy(model(images), labels)


def _gpt2_case():
    tokens = torch.randint(0, 512, (2, 32))
    return _narrow_gpt2_small(), (tokens,), lambda model: model(tokens, labels=tokens).loss


CASES = {"resnet50": _resnet_case, "gpt2": _gpt2_case}


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name, num_blocks", [("resnet50", 16), ("gpt2", 12)])
def test_checkpointed_gradients_equal_plain_gradients(name, num_blocks):
    plain, _, loss_of = CASES[name]()
    checkpointed = copy.deepcopy(plain)
    plan = apply_activation_checkpointing(checkpointed)
    assert (plan.num_blocks, plan.segments) == (num_blocks, 4)
    assert plan.boundaries[0][0] == 0 and plan.boundaries[-1][1] == num_blocks
    losses = []
    for model in (plain, checkpointed):
        model.train()
        torch.manual_seed(123)  # same dropout draws; checkpoint replays them in the recompute
        loss = loss_of(model)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    for p_grad, c_grad in zip(_grads(plain), _grads(checkpointed)):
        torch.testing.assert_close(c_grad, p_grad)
    # The recompute would update BatchNorm running stats a second time; they are restored.
    for p_buf, c_buf in zip(plain.buffers(), checkpointed.buffers()):
        torch.testing.assert_close(c_buf, p_buf)


def test_gpt2_dropout_is_active_so_rng_replay_is_exercised():
    model, _, loss_of = _gpt2_case()
    apply_activation_checkpointing(model)
    model.train()
    torch.manual_seed(1)
    first = loss_of(model)
    torch.manual_seed(2)
    second = loss_of(model)
    assert not torch.equal(first, second)
    assert model.config.use_cache is False


@pytest.mark.parametrize("name", ["resnet50", "gpt2"])
def test_saved_activation_bytes_drop_within_eq19_bound(name):
    plain, inputs, _ = CASES[name]()
    checkpointed = copy.deepcopy(plain)
    plan = apply_activation_checkpointing(checkpointed)
    plain.train(), checkpointed.train()
    plain_bytes = saved_activation_bytes(plain, *inputs)
    checkpointed_bytes = saved_activation_bytes(checkpointed, *inputs)
    # After forward only the S segment inputs of the blocks are held; every block saves at
    # least its own input, so this is below the eq. 19 peak (S boundaries + the largest
    # recomputed segment) over the eq. 18 total: (4 + 4)/16 for ResNet-50, (4 + 3)/12 for GPT-2.
    assert checkpointed_bytes <= plan.expected_saved_fraction * plain_bytes
    assert checkpointed_bytes < 0.5 * plain_bytes


@pytest.mark.parametrize("name", ["resnet50", "gpt2"])
def test_each_segment_holds_exactly_its_input_activation(name):
    model, inputs, _ = CASES[name]()
    model.train()
    blocks = block_sequence(model)
    input_bytes = {}
    hooks = [block.register_forward_pre_hook(
        lambda module, args, index=index: input_bytes.__setitem__(index, args[0].numel() * args[0].element_size()))
        for index, block in enumerate(blocks)]
    with torch.no_grad():
        model(*inputs)
    for hook in hooks:
        hook.remove()
    measured = {}
    for segments in (1, 2, "sqrt", len(blocks)):
        remove_activation_checkpointing(model)
        plan = apply_activation_checkpointing(model, segments)
        torch.manual_seed(0)
        measured[segments] = saved_activation_bytes(model, *inputs)
        # Eq. 19's S·M_layer term: one more segment holds one more boundary activation.
        boundary_bytes = sum(input_bytes[start] for start, _ in plan.boundaries[1:])
        assert measured[segments] - measured[1] == boundary_bytes
    assert measured[1] < measured[2] < measured["sqrt"] < measured[len(blocks)]


@pytest.mark.parametrize("name", ["resnet50", "gpt2"])
def test_eval_and_no_grad_forward_match_unwrapped_model_without_checkpoint(name, monkeypatch):
    plain, inputs, loss_of = CASES[name]()
    checkpointed = copy.deepcopy(plain)
    plan = apply_activation_checkpointing(checkpointed)
    calls = []
    real_checkpoint = ckpt.checkpoint
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: calls.append(1) or real_checkpoint(*a, **k))

    def output(model):
        result = model(*inputs)
        return result if isinstance(result, torch.Tensor) else result.logits

    plain.eval(), checkpointed.eval()
    torch.testing.assert_close(output(checkpointed), output(plain), rtol=0, atol=0)
    plain.train(), checkpointed.train()
    with torch.no_grad():
        torch.manual_seed(5)
        expected = output(plain)
        torch.manual_seed(5)
        torch.testing.assert_close(output(checkpointed), expected, rtol=0, atol=0)
    assert calls == []
    loss_of(checkpointed).backward()
    assert len(calls) == plan.segments


def test_state_dict_keys_parameters_and_deepcopy_are_preserved():
    model = _cifar_resnet50()
    keys, params = list(model.state_dict()), list(model.parameters())
    apply_activation_checkpointing(model)
    assert list(model.state_dict()) == keys
    assert list(model.parameters()) == params
    model.load_state_dict(_cifar_resnet50().state_dict())
    clone = copy.deepcopy(model)
    assert checkpoint_plan(clone) == checkpoint_plan(model)
    head = block_sequence(clone)[0]
    clone_ids = {id(m) for m in clone.modules()}
    assert all(id(block) in clone_ids for block in head.forward.blocks)
    remove_activation_checkpointing(model)
    assert checkpoint_plan(model) is None and "forward" not in block_sequence(model)[0].__dict__


def test_applying_twice_is_idempotent_for_same_segments_and_rejects_other_counts():
    model, _, _ = _gpt2_case()
    plan = apply_activation_checkpointing(model, "sqrt")
    assert apply_activation_checkpointing(model, 4) is plan
    with pytest.raises(ValueError, match="segments=6.*already applied with 4"):
        apply_activation_checkpointing(model, 6)
    with pytest.raises(ValueError, match="already applied"):
        apply_activation_checkpointing(model.transformer, 4)


@pytest.mark.parametrize("segments", [0, 17, "cube", True, 2.0])
def test_invalid_segments_raise_value_error_naming_the_value(segments):
    with pytest.raises(ValueError, match=f"segments={segments!r} is invalid.*\\[1, 16\\]"):
        apply_activation_checkpointing(_cifar_resnet50(), segments)


def test_unknown_model_raises_value_error_naming_supported_types_and_hook():
    with pytest.raises(ValueError, match="Linear has no known block sequence.*supported.*checkpoint_blocks"):
        apply_activation_checkpointing(nn.Linear(4, 4))


def test_gpt2_padding_mask_reaches_every_block_of_a_segment():
    model = _narrow_gpt2_small().transformer
    # Plain side without a KV cache too: the cache copies k/v contiguous, which changes float
    # rounding in attention and would hide whether the two runs compute the same thing.
    model.config.use_cache = False
    checkpointed = copy.deepcopy(model)
    apply_activation_checkpointing(checkpointed)
    tokens = torch.randint(0, 512, (2, 16))
    mask = torch.ones_like(tokens)
    mask[0, :5] = 0
    grads = []
    for body in (model, checkpointed):
        body.train()
        torch.manual_seed(4)
        body(tokens, attention_mask=mask).last_hidden_state.square().sum().backward()
        grads.append(_grads(body))
    for expected, got in zip(*grads):
        torch.testing.assert_close(got, expected)
    unmasked = copy.deepcopy(checkpointed)
    unmasked.zero_grad(set_to_none=True)
    torch.manual_seed(4)
    unmasked(tokens).last_hidden_state.square().sum().backward()
    assert not torch.allclose(_grads(unmasked)[0], grads[1][0])


def test_gpt2_training_forward_with_kv_cache_is_refused():
    model, inputs, _ = _gpt2_case()
    apply_activation_checkpointing(model)
    model.train()
    with pytest.raises(RuntimeError, match="use_cache"):
        model(*inputs, use_cache=True)


class _TupleBlock(nn.Module):
    """A block with an extra argument that returns a tuple, as older transformers blocks do."""

    def __init__(self, width):
        super().__init__()
        self.linear, self.drop = nn.Linear(width, width), nn.Dropout(0.2)

    def forward(self, hidden, scale, *, shift):
        return (self.drop(torch.tanh(self.linear(hidden))) * scale + shift,)


class _HookedModel(nn.Module):
    def __init__(self, width=8, depth=5):
        super().__init__()
        self.checkpoint_blocks = nn.ModuleList(_TupleBlock(width) for _ in range(depth))

    def forward(self, hidden, scale):
        for block in self.checkpoint_blocks:
            output = block(hidden, scale, shift=0.1)
            assert isinstance(output, tuple) and len(output) == 1
            hidden = output[0]
        return hidden.sum()


@pytest.mark.parametrize("make", [_HookedModel, lambda: nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.Tanh())
                                                                           for _ in range(5)))])
def test_generic_block_hooks_give_plain_gradients(make):
    plain = make().train()
    checkpointed = copy.deepcopy(plain)
    plan = apply_activation_checkpointing(checkpointed)
    assert plan.adapter in ("checkpoint_blocks", "sequential")
    assert plan.segment_sizes == (2, 2, 1)
    hidden = torch.randn(3, 8, requires_grad=True)
    grads = []
    for model in (plain, checkpointed):
        torch.manual_seed(9)
        args = (hidden, torch.tensor(1.5)) if isinstance(model, _HookedModel) else (hidden,)
        out = model(*args)
        grads.append(torch.autograd.grad(out.sum(), [hidden, *model.parameters()]))
    for expected, got in zip(*grads):
        torch.testing.assert_close(got, expected)


def test_segment_partition_and_expected_saved_fraction():
    assert [resolve_segments(n) for n in (1, 12, 16, 17)] == [1, 4, 4, 5]
    assert segment_boundaries(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))
    assert expected_saved_fraction(16) == pytest.approx((4 + 4) / 16)
    assert expected_saved_fraction(12) == pytest.approx((4 + 3) / 12)
    assert expected_saved_fraction(100) == pytest.approx(2 / 10)  # ~2/√L (eq. 19)
    assert expected_saved_fraction(12, 12, boundary_fraction=0.0) == pytest.approx(1 / 12)
    with pytest.raises(ValueError, match="boundary_fraction=1.5"):
        expected_saved_fraction(12, boundary_fraction=1.5)


def test_meter_counts_each_activation_storage_once_and_skips_parameters():
    layer = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    with SavedTensorMeter(layer) as meter:
        hidden = x * 2  # saves nothing tensor-valued besides the scalar
        y = layer(hidden)  # saves `hidden` (and the weight, a parameter)
        z = (y * y).sum()  # saves `y` twice, one storage
    assert meter.activation_bytes == hidden.nbytes + y.nbytes
    assert meter.num_storages == 2
    del z
