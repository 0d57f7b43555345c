"""The engine's accumulation, schedule, clipping and loss scaling, pinned against references."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.schedule import LRSchedule


def mlp(dtype=torch.float64):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)


def one_step_reference(model, x, y, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    return model


def engine_step(model, chunks, config, lr=0.1, micro_batch_size=4):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    engine = prepare(model, opt, config, total_samples=10_000, micro_batch_size=micro_batch_size)
    stepped = []
    for x, y in chunks:
        with engine.autocast():
            loss = F.cross_entropy(model(x), y)
        engine.backward(loss, num_items=len(y))
        stepped.append(engine.step())
    return model, stepped


def assert_same_parameters(a, b, tol=1e-12):
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=tol)


def test_k_micro_batches_equal_one_big_batch():
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randint(0, 3, (16,))
    ref = one_step_reference(mlp(), x, y)
    chunks = list(zip(x.split(4), y.split(4)))
    acc, stepped = engine_step(mlp(), chunks, OptimizationConfig(k=4))
    assert stepped == [False, False, False, True]
    assert_same_parameters(acc, ref)


def test_unequal_micro_batches_weight_by_items_not_by_micro_batch():
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randint(0, 3, (16,))
    ref = one_step_reference(mlp(), x, y)
    sizes = [3, 7, 2, 4]
    chunks = list(zip(x.split(sizes), y.split(sizes)))
    acc, _ = engine_step(mlp(), chunks, OptimizationConfig(k=4))
    assert_same_parameters(acc, ref)
    # a mean of per-micro-batch means is a different gradient: the test would catch it
    naive = mlp()
    opt = torch.optim.SGD(naive.parameters(), lr=0.1)
    for cx, cy in chunks:
        (F.cross_entropy(naive(cx), cy) / 4).backward()
    opt.step()
    assert max((p - q).abs().max() for p, q in zip(naive.parameters(), ref.parameters())) > 1e-6


def test_token_count_weighting_matches_one_batch_mean_over_real_tokens():
    torch.manual_seed(3)
    vocab, seq = 11, 8
    emb = torch.nn.Sequential(torch.nn.Embedding(vocab, 12), torch.nn.Linear(12, vocab)).double()
    tokens = torch.randint(0, vocab, (6, seq))
    mask = torch.ones(6, seq, dtype=torch.bool)
    for row, pad in enumerate([0, 3, 5, 1, 7, 2]):  # different padding per sequence
        if pad:
            mask[row, -pad:] = False
    targets = tokens.masked_fill(~mask, -100)

    def lm_loss(model, t, tgt):
        logits = model(t)
        return F.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1), ignore_index=-100)

    ref = copy.deepcopy(emb)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    lm_loss(ref, tokens, targets).backward()
    opt.step()

    acc = copy.deepcopy(emb)
    opt = torch.optim.SGD(acc.parameters(), lr=0.5)
    engine = prepare(acc, opt, OptimizationConfig(k=3), total_samples=1000, micro_batch_size=2)
    for t, tgt in zip(tokens.split(2), targets.split(2)):
        loss = lm_loss(acc, t, tgt)
        engine.backward(loss, num_items=int((tgt != -100).sum()))
        engine.step()
    assert engine.optimizer_steps == 1
    assert_same_parameters(acc, ref)


def eq10(s, total, warmup_frac, r):
    """Eq. 10 written out independently, in samples."""
    warm = warmup_frac * total
    if s <= warm:
        return s / warm
    return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))


@pytest.mark.parametrize("s", [0, 50, 100, 101, 1000, 1050, 2000])
def test_schedule_matches_eq10_at_chosen_points(s):
    sched = LRSchedule(total_samples=2000, kind="cosine", warmup_fraction=0.05, min_lr_ratio=0.1)
    assert sched.shape(s) == pytest.approx(eq10(s, 2000, 0.05, 0.1), rel=1e-12)
    assert sched.shape(100) == pytest.approx(1.0) and sched.shape(2000) == pytest.approx(0.1)
    assert sched.shape(1050) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine


def test_lr_follows_samples_and_effective_batch_when_k_changes():
    model = mlp(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    cfg = OptimizationConfig(k=2, schedule="cosine", warmup_fraction=0.1, min_lr_ratio=0.1, lr_scaling=True, base_batch_size=8)
    total = 400
    engine = prepare(model, opt, cfg, total_samples=total, micro_batch_size=4)
    consumed = 0
    seen = []
    for step in range(12):
        if step == 5:
            engine.k = 6  # as adaptive accumulation would, at a step boundary
        k = engine.k
        for _ in range(k):
            x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
            engine.backward(F.cross_entropy(model(x), y), num_items=4)
            engine.step()
        consumed += 4 * k
        expected = 0.2 * eq10(consumed, total, 0.1, 0.1) * (4 * k / 8)  # eqs. 10 and 11
        assert engine.lr == pytest.approx(expected, rel=1e-12)
        assert engine.effective_batch_size == 4 * k and engine.samples_consumed == consumed
        seen.append(engine.lr)
    assert max(seen) > 0.2  # linear scaling took the LR above η_base once B_eff = 24 > 8


def fp16_setup(clip_norm, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    # 2^8: large enough that clipping scaled gradients would be caught, small enough not to overflow
    cfg = OptimizationConfig(precision="fp16", clip_norm=clip_norm, initial_loss_scale=2.0**8)
    with pytest.warns(UserWarning, match="slow"):
        engine = prepare(model, opt, cfg, total_samples=100, micro_batch_size=16)
    return model, engine


def run_one_step(model, engine):
    torch.manual_seed(42)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    before = [p.detach().clone() for p in model.parameters()]
    with engine.autocast():
        loss = F.mse_loss(model(x).float(), y)
    engine.backward(loss)
    assert engine.step()
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])


def test_clipping_acts_on_unscaled_gradients():
    model, engine = fp16_setup(clip_norm=None)
    unclipped = run_one_step(model, engine)  # SGD lr=1: update == gradient
    true_norm = unclipped.norm().item()
    assert engine.loss_scale == 2.0**8 and engine.skipped_steps == 0
    # threshold above the true norm but far below the scaled norm: nothing may be clipped
    model, engine = fp16_setup(clip_norm=true_norm * 1.5)
    torch.testing.assert_close(run_one_step(model, engine), unclipped)
    # threshold below the true norm: the update's norm is exactly the threshold (eq. 12)
    model, engine = fp16_setup(clip_norm=true_norm / 3)
    update = run_one_step(model, engine)
    assert update.norm().item() == pytest.approx(true_norm / 3, rel=1e-4)
    assert engine.last_grad_norm == pytest.approx(true_norm, rel=1e-4)


def test_fp16_inf_gradients_skip_backoff_and_grow_like_gradscaler():
    inject = {2, 3, 9}  # steps whose gradients get an inf
    growth_interval = 3

    def poison(step, model):
        if step in inject:
            model.weight.grad[0, 0] = float("inf")

    # reference: a hand-written GradScaler loop
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=growth_interval)
    ref_scales, ref_weights = [], []
    for step in range(14):
        torch.manual_seed(100 + step)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(ref(x).float(), y)
        scaler.scale(loss).backward()
        poison(step, ref)
        scaler.step(ref_opt)
        scaler.update()
        ref_opt.zero_grad()
        ref_scales.append(scaler.get_scale())
        ref_weights.append(ref.weight.detach().clone())

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = OptimizationConfig(precision="fp16", loss_scale_growth_interval=growth_interval, initial_loss_scale=2.0**8)
    with pytest.warns(UserWarning):
        engine = prepare(model, opt, cfg, total_samples=1000, micro_batch_size=16)
    scales, stepped = [], []
    for step in range(14):
        torch.manual_seed(100 + step)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        with engine.autocast():
            loss = F.mse_loss(model(x).float(), y)
        engine.backward(loss)
        poison(step, model)
        before = model.weight.detach().clone()
        stepped.append(engine.step())
        if not stepped[-1]:
            assert torch.equal(before, model.weight)  # a skipped step leaves the weights alone
        scales.append(engine.loss_scale)
        torch.testing.assert_close(model.weight, ref_weights[step])
    assert scales == ref_scales
    assert [s for s, ok in enumerate(stepped) if not ok] == sorted(inject)
    assert engine.skipped_steps == len(inject)
    assert max(scales) > scales[3]  # it grew again after the clean interval


def test_bf16_autocast_runs_matmuls_in_bf16_with_fp32_master_weights():
    model = torch.nn.Linear(8, 4)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(precision="bf16"),
                     total_samples=100, micro_batch_size=2)
    with engine.autocast():
        out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16
    engine.backward(out.float().pow(2).mean())
    engine.step()
    assert model.weight.dtype == torch.float32 and engine.scaler is None


def test_ddp_sync_skipped_until_boundary():
    class FakeDDP(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.require_backward_grad_sync = True

        def forward(self, x):
            return self.module(x)

    model = FakeDDP(torch.nn.Linear(4, 1))
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(k=3),
                     total_samples=100, micro_batch_size=2, world_size=1)
    flags = []
    for _ in range(6):
        with engine.autocast():
            flags.append(model.require_backward_grad_sync)
            loss = model(torch.randn(2, 4)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    assert flags == [False, False, True, False, False, True]


def test_bad_loop_arguments_raise():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        prepare(model, opt, OptimizationConfig(), total_samples=10, micro_batch_size=0)
    with pytest.raises(ValueError, match="total_samples=-1"):
        prepare(model, opt, OptimizationConfig(), total_samples=-1, micro_batch_size=2)
    with pytest.raises(ValueError, match="config="):
        prepare(model, opt, {"precision": "fp16"}, total_samples=10, micro_batch_size=2)
    engine = prepare(model, opt, OptimizationConfig(), total_samples=10, micro_batch_size=2)
    with pytest.raises(ValueError, match="num_items=0"):
        engine.backward(model(torch.randn(2, 2)).sum(), num_items=0)
