"""Dropping the components into someone else's training script: what a practitioner writes works."""
import warnings

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.checkpointing import block_sequence, checkpoint_plan


def _tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=64, n_positions=16))


class _OwnModel(nn.Module):
    """A model trainopt knows nothing about: blocks in a ModuleList its forward loops over."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_the_optimized_preset_runs_on_an_unknown_model_without_checkpointing_and_says_how_to_turn_it_on():
    model = _OwnModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.warns(UserWarning, match=r"checkpointing is off.*_OwnModel.*checkpoint_blocks") as caught:
        engine = prepare(model, optimizer, OptimizationConfig.optimized().replace(precision="auto"),
                         total_samples=64, micro_batch_size=4)
    relevant = [w for w in caught if "checkpointing is off" in str(w.message)]
    assert len(relevant) == 1 and relevant[0].filename == __file__  # points at the caller's line
    assert engine.config.checkpointing is None and checkpoint_plan(model) is None
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    for _ in range(engine.k):
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        engine.backward(loss)
        engine.step()
    assert engine.optimizer_steps == 1

    # the way the warning names turns it on
    model.checkpoint_blocks = model.layers
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                         OptimizationConfig.optimized().replace(precision="auto", zero_stage=0),
                         total_samples=64, micro_batch_size=4)
    assert engine.config.checkpointing == "sqrt" and checkpoint_plan(model).num_blocks == 4


def test_checkpoint_blocks_set_to_a_module_list_keeps_the_state_dict_and_old_checkpoints_load(tmp_path):
    model = _tiny_gpt2()
    keys = list(model.state_dict())
    torch.save(model.state_dict(), tmp_path / "before_adoption.pt")

    model.checkpoint_blocks = model.transformer.h  # nn.Module registers it: 4 blocks twice, for now
    assert len(model.state_dict()) > len(keys)
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                     OptimizationConfig(precision="fp32", checkpointing="sqrt"), total_samples=64, micro_batch_size=2)
    assert list(model.state_dict()) == keys  # the alias is gone from the state_dict
    assert block_sequence(model) == tuple(model.transformer.h) and checkpoint_plan(model).segments == 2
    model.load_state_dict(torch.load(tmp_path / "before_adoption.pt", weights_only=True))  # strict
    tokens = torch.randint(0, 64, (2, 16))
    engine.backward(model(tokens, labels=tokens).loss)
    engine.step()
    assert engine.optimizer_steps == 1


def test_a_checkpoint_blocks_module_list_that_owns_its_blocks_stays_registered():
    class Owner(nn.Module):
        def __init__(self):
            super().__init__()
            self.checkpoint_blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

        def forward(self, x):
            for block in self.checkpoint_blocks:
                x = block(x)
            return x

    model = Owner()
    keys = list(model.state_dict())
    prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(checkpointing=2),
            total_samples=8, micro_batch_size=2)
    assert list(model.state_dict()) == keys and len(keys) == 8 and checkpoint_plan(model).segments == 2


def test_num_items_as_a_tensor_is_not_read_per_micro_batch_and_weights_exactly_like_a_number(monkeypatch):
    """A loss averaged over `mask.sum()` tokens: handing the tensor over must not make the engine
    wait for the device every micro-batch (`float()` of a CUDA tensor does); it is read once, at
    the step. Same update as with Python numbers, unequal micro-batches included."""
    reads = {"in backward": 0}
    inside = {"backward": False}
    for name in ("item", "tolist", "__float__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            if inside["backward"]:
                reads["in backward"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    final = {}
    for kind in ("number", "tensor"):
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                         OptimizationConfig(k=3, adaptive=True, k_min=2, k_max=4), total_samples=400, micro_batch_size=4)
        generator = torch.Generator().manual_seed(1)
        for _ in range(4):
            for items in (4, 2, 3)[:engine.k]:
                x = torch.randn(items, 8, generator=generator)
                y = torch.randint(0, 2, (items,), generator=generator)
                loss = nn.functional.cross_entropy(model(x), y)
                inside["backward"] = kind == "tensor"
                engine.backward(loss, num_items=torch.tensor(items) if kind == "tensor" else items)
                inside["backward"] = False
                engine.step()
        final[kind] = [p.detach().clone() for p in model.parameters()] + [engine.samples_consumed, engine.k]
    assert reads["in backward"] == 0
    for number, tensor in zip(final["number"], final["tensor"]):
        assert torch.equal(torch.as_tensor(number), torch.as_tensor(tensor))


def test_library_warnings_point_at_the_callers_line():
    model = nn.Linear(4, 2)
    with pytest.warns(UserWarning, match="fp16 autocast on CPU") as caught:
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(precision="fp16"),
                total_samples=8, micro_batch_size=2)
    assert [w.filename for w in caught if "fp16 autocast" in str(w.message)] == [__file__]


def _reference_lr(it, *, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """The per-iteration "linear warmup, then cosine to min_lr" many training scripts carry."""
    import math

    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


@pytest.mark.parametrize("warmup, horizon, iterations", [(10, 60, 70), (0, 25, 25), (3, 4, 9)])
def test_a_schedule_stated_in_optimizer_steps_matches_the_per_iteration_reference(warmup, horizon, iterations):
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
    engine = prepare(model, optimizer, OptimizationConfig(k=2, schedule="cosine", warmup_fraction=0.0),
                     total_steps=horizon, warmup_steps=warmup, min_lr=6e-5, micro_batch_size=3)
    used = []
    for it in range(iterations):
        for _ in engine.micro_steps():
            engine.backward(model(torch.randn(3, 4)).pow(2).mean())
            engine.step()
        used.append(engine.lr)  # the LR the step just taken used
    expected = [_reference_lr(it, learning_rate=6e-4, warmup_iters=warmup, lr_decay_iters=horizon, min_lr=6e-5)
                for it in range(iterations)]
    assert used == pytest.approx(expected, rel=1e-12, abs=0)
    assert engine.done() is (iterations >= horizon)


def test_schedule_arguments_are_checked_naming_value_and_allowed():
    model = nn.Linear(4, 2)

    def make(**kwargs):
        return prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(schedule="cosine"),
                       micro_batch_size=2, **kwargs)

    with pytest.raises(ValueError, match="exactly one of them"):
        make()
    with pytest.raises(ValueError, match="exactly one of them"):
        make(total_samples=100, total_steps=10)
    with pytest.raises(ValueError, match=r"warmup_steps=10 is invalid: allowed an integer in \[0, total_steps\)"):
        make(total_steps=10, warmup_steps=10)
    with pytest.raises(ValueError, match=r"min_lr=0.5 is invalid: allowed an LR in \[0, base LR = 0.1\]"):
        make(total_steps=10, min_lr=0.5)
    with pytest.raises(ValueError, match="warmup_steps=3 is invalid with total_samples: allowed warmup_samples"):
        make(total_samples=100, warmup_steps=3)
    with pytest.raises(ValueError, match="warmup_samples=30 is invalid with total_steps: allowed warmup_steps"):
        make(total_steps=10, warmup_samples=30)
    with pytest.raises(ValueError, match=r"warmup_samples=100 is invalid: allowed an integer in \[0, total_samples\)"):
        make(total_samples=100, warmup_samples=100)


def test_stopping_and_evaluation_helpers_stay_in_samples_when_k_changes():
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.05), OptimizationConfig(k=3),
                     total_samples=600, micro_batch_size=4)
    evaluations, boundaries = [], [0]
    while not engine.done():
        for i in engine.micro_steps():
            x = torch.randn(4, 8)
            loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            engine.backward(loss, num_items=4)
            engine.step()
            if i == 0:
                assert not engine.every(samples=100)  # mid-way through an effective batch
        boundaries.append(engine.samples_consumed)
        engine.k = 2 + engine.optimizer_steps % 5  # as adaptive k would, at the boundary: 2..6
        if engine.every(samples=100):
            evaluations.append((boundaries[-2], boundaries[-1]))
    assert engine.samples_consumed >= 600 and boundaries[-2] < 600
    assert len({b - a for a, b in zip(boundaries, boundaries[1:])}) == 5  # steps of 8..24 samples
    # one evaluation per 100 samples crossed, on the step that crossed it
    assert len(evaluations) == engine.samples_consumed // 100
    assert all(before // 100 < after // 100 for before, after in evaluations)
    with pytest.raises(RuntimeError, match="micro_steps\\(\\) after 1 of"):
        engine.backward(model(torch.randn(4, 8)).sum())
        engine.micro_steps()


def test_a_constant_lr_needs_no_horizon():
    model = nn.Linear(4, 2)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(k=2), micro_batch_size=2)
    for _ in range(3):
        for _ in engine.micro_steps():
            engine.backward(model(torch.randn(2, 4)).pow(2).mean())
            engine.step()
    assert engine.lr == 0.1 and engine.optimizer_steps == 3 and not engine.done()
    with pytest.raises(ValueError, match="neither only with OptimizationConfig.schedule='constant'"):
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(schedule="cosine"),
                micro_batch_size=2)
