"""What a script's own settings map to: a constant LR (`decay_lr = False`) with the step-based
arguments, a plan's split applied to its batch size and accumulation, and `num_items` when the
loop prefetches its next batch."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.planner.result import Plan

STEP_ARGUMENTS = dict(total_steps=10, warmup_steps=3, min_lr=0.01)  # what the script passes for the cosine


def _steps(model, engine, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        for _ in engine.micro_steps():
            engine.backward(model(torch.randn(2, 4)).pow(2).mean())
            engine.step()
        lrs.append(engine.lr)
    return lrs


@pytest.mark.parametrize("horizon", [STEP_ARGUMENTS, dict(total_samples=40, warmup_samples=12, min_lr=0.01)])
def test_a_constant_lr_takes_the_arguments_the_cosine_takes_as_decay_lr_false_leaves_them_unread(horizon):
    torch.manual_seed(0)
    for decay_lr in (True, False):  # one prepare() call for both, as the script's flag chooses
        model = nn.Linear(4, 2)
        config = OptimizationConfig(k=2, schedule="cosine" if decay_lr else "constant")
        engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), config, micro_batch_size=2, **horizon)
        lrs = _steps(model, engine, 12)
        if decay_lr:
            assert lrs[0] < 0.1 and min(lrs) == pytest.approx(0.01)
        else:
            assert lrs == [0.1] * 12  # no warmup, no decay: the LR given, at every step
        assert engine.done()  # the horizon still ends the run
    # min_lr above the LR is no error where nothing decays to it
    model = nn.Linear(4, 2)
    prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(), micro_batch_size=2,
            total_steps=10, warmup_steps=3, min_lr=0.5)


def _plan(config: OptimizationConfig) -> Plan:
    row = {"candidate": "chosen", "speedup": 1.0, "peak_memory_bytes": 1}
    return Plan(config=config, chosen=row, baseline=row, rows=[row], memory_budget_bytes=None,
                weights=(1.0, 0.0, 0.0), planning_s=0.0)


def test_a_plans_split_applied_to_a_scripts_batch_size_and_accumulation_keeps_its_effective_batch():
    # the script: micro-batches of 8, 4 of them per step (the 32 sequences it gave plan())
    assert _plan(OptimizationConfig(precision="bf16", k=2)).split_for(8, 4) == (16, 2)
    assert _plan(OptimizationConfig(k=8)).split_for(8, 4) == (4, 8)
    assert _plan(OptimizationConfig(k=1)).split_for(32) == (32, 1)
    # adaptive k: micro-batches of the effective batch over k_min, starting at the k goodput chose
    assert _plan(OptimizationConfig(adaptive=True, k=6, k_min=2, k_max=8)).split_for(8, 4) == (16, 6)
    with pytest.raises(ValueError, match=r"batch_size=6 is invalid: allowed one whose effective batch \(6 x 1\) the "
                                         r"plan's 4 micro-batches divide"):
        _plan(OptimizationConfig(k=4)).split_for(6)
    with pytest.raises(ValueError, match=r"accumulation_steps=0 is invalid: allowed an integer >= 1"):
        _plan(OptimizationConfig(k=4)).split_for(8, 0)


def test_a_plans_split_given_to_prepare_steps_the_scripts_effective_batch():
    batch_size, gradient_accumulation_steps = 8, 4  # the script's own names; its evaluation keeps batch_size
    micro_batch_size, k = _plan(OptimizationConfig(k=2)).split_for(batch_size, gradient_accumulation_steps)
    model = nn.Linear(4, 2)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(k=k),
                     micro_batch_size=micro_batch_size)
    for _ in engine.micro_steps():
        engine.backward(model(torch.randn(micro_batch_size, 4)).pow(2).mean())
        engine.step()
    assert engine.optimizer_steps == 1
    assert engine.stats()["last_effective_batch_samples"] == batch_size * gradient_accumulation_steps


# ---------------------------------------------------------------- num_items with a prefetched batch
def _masked_batches(count: int):
    """Token batches whose targets are padded (-100) to different lengths: unequal item counts."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for j in range(count):
        x = torch.randn(3, 5, 4, generator=generator)
        y = torch.randint(0, 2, (3, 5), generator=generator)
        y[:, 1 + j % 4:] = -100
        batches.append((x, y))
    return batches


def _prefetching_loop(model, engine, batches, *, count_before_prefetch: bool) -> None:
    """A loop that draws its next micro-batch between the forward and the backward (as nanoGPT's
    does), counting the backpropagated micro-batch's tokens before or after the draw."""
    stream = iter(batches)
    x, y = next(stream)
    for _ in engine.micro_steps():
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        n = (y != -100).sum()
        x, y = next(stream, (None, None))  # the next micro-batch, drawn while this one is in flight
        engine.backward(loss, num_items=n if count_before_prefetch else (y != -100).sum())
        engine.step()


def test_num_items_with_a_prefetched_batch_counts_the_micro_batch_being_backpropagated():
    batches = _masked_batches(4)
    reference = nn.Linear(4, 2)
    x = torch.cat([x for x, _ in batches[:3]])
    y = torch.cat([y for _, y in batches[:3]])
    nn.functional.cross_entropy(reference(x).flatten(0, 1), y.flatten(), ignore_index=-100).backward()
    for before, same in ((True, True), (False, False)):
        model = nn.Linear(4, 2)
        model.load_state_dict(reference.state_dict())
        engine = prepare(model, torch.optim.SGD(model.parameters(), lr=1.0), OptimizationConfig(k=3),
                         micro_batch_size=3)
        _prefetching_loop(model, engine, batches, count_before_prefetch=before)
        stepped = [reference_p.detach() - reference_p.grad for reference_p in reference.parameters()]
        matches = all(torch.allclose(p, expected, atol=1e-6) for p, expected in zip(model.parameters(), stepped))
        assert matches is same  # the next micro-batch's count weights the wrong loss
