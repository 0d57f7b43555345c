"""The traps a script adopting trainopt fell into: resume without the engine's position,
emulated precisions, units and off-by-ones, and registering a model's blocks."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import trainopt_core.measure.manifest as manifest
from trainopt_core import OptimizationConfig, prepare
from trainopt_core import precision as mp
from trainopt_core.checkpointing import checkpoint_plan
from test_adoption import _reference_lr


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def _train(model, engine, steps, *, seed=1):
    generator = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(4, 8, generator=generator), torch.randint(0, 2, (4,), generator=generator))
               for _ in range(64)]
    lrs = []
    while engine.optimizer_steps < steps:
        for _ in engine.micro_steps():
            x, y = batches[(engine.optimizer_steps * engine.k + _) % len(batches)]
            with engine.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            engine.backward(loss)
            if engine.step():
                lrs.append(engine.lr)
    return lrs


# ---------------------------------------------------------------- resume
SCHEDULE = dict(total_steps=10, warmup_steps=3, min_lr=0.01)
COSINE = OptimizationConfig(k=2, schedule="cosine", clip_norm=1.0)


def test_a_resumed_optimizer_without_the_engines_position_warns_at_the_first_step():
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **SCHEDULE)
    _train(model, engine, 4)
    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "engine": engine.state_dict()}

    def resumed(restore):
        model = _mlp()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **SCHEDULE)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        restore(engine)
        return model, engine

    model, engine = resumed(lambda engine: None)
    with pytest.warns(UserWarning, match=r"optimizer holds state .* engine starts at step 0.*engine.load_state_dict"
                                         r".*engine.start_at\(steps=iter_num\)") as caught:
        _train(model, engine, 1)
    assert [w.filename for w in caught] == [__file__]  # the caller's line
    for restore in (lambda engine: engine.load_state_dict(saved["engine"]), lambda engine: engine.start_at(steps=4)):
        model, engine = resumed(restore)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _train(model, engine, 6)
    # a fresh optimizer has no state: no warning
    model = _mlp()
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1), COSINE, micro_batch_size=4, **SCHEDULE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(model, engine, 2)


@pytest.mark.parametrize("horizon", ["steps", "samples"])
def test_a_checkpoint_saved_before_adoption_continues_on_schedule_with_start_at(horizon):
    schedule = SCHEDULE if horizon == "steps" else dict(total_samples=80, warmup_samples=24, min_lr=0.01)
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **schedule)
    whole = _train(model, engine, 10)
    whole_weights = [p.detach().clone() for p in model.parameters()]

    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **schedule)
    first = _train(model, engine, 6)
    # the script's own checkpoint: model, optimizer and its iteration number, no engine state
    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": 6}
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **schedule)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    engine.start_at(steps=saved["iter_num"])
    assert engine.samples_consumed == 6 * 8 and engine.next_lr == pytest.approx(whole[6], rel=1e-12)
    rest = _train(model, engine, 10)
    assert first + rest == whole  # every step's LR, bit for bit
    for resumed, uninterrupted in zip(model.parameters(), whole_weights):
        assert torch.equal(resumed, uninterrupted)
    with pytest.raises(ValueError, match=r"steps=-1 is invalid: allowed an integer >= 0"):
        engine.start_at(steps=-1)
    with pytest.raises(ValueError, match=r"steps=None is invalid: allowed an integer >= 0"):
        engine.start_at(steps=None)


def _pre_adoption_checkpoint(iters: int, *, scheduler: bool = False) -> dict:
    """A script's own checkpoint from before adopting trainopt: its loop sets the LR of each
    iteration by hand (or through a torch LambdaLR), steps AdamW, and saves model, optimizer and
    iter_num -- the optimizer's param groups then carry the decayed LR of its last iteration."""
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: reference_lr(it) / PEAK) if scheduler else None
    for it, (x, y) in zip(range(iters), _batches()):
        if lambda_lr is None:
            for group in optimizer.param_groups:
                group["lr"] = reference_lr(it)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if lambda_lr is not None:
            lambda_lr.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iters}


PEAK = 0.1


def reference_lr(it: int) -> float:
    return _reference_lr(it, learning_rate=PEAK, warmup_iters=3, lr_decay_iters=10, min_lr=0.01)


def _batches():
    generator = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=generator), torch.randint(0, 2, (4,), generator=generator)) for _ in range(20)]


def _adopted_with_the_optimizer_loaded_first(saved: dict):
    """The resumed script as such scripts are written: the optimizer built with the peak LR, its
    state loaded, and only then prepare()."""
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    engine = prepare(model, optimizer, COSINE.replace(k=1), micro_batch_size=4, **SCHEDULE)
    return model, optimizer, engine


def test_a_checkpoint_saved_before_adoption_resumes_at_the_schedules_lr_not_the_decayed_one_it_carries():
    saved = _pre_adoption_checkpoint(6)
    assert saved["optimizer"]["param_groups"][0]["lr"] == reference_lr(5) < PEAK  # decayed, no 'initial_lr'
    model, optimizer, engine = _adopted_with_the_optimizer_loaded_first(saved)
    # the LR it was built with is lost: no guess, an error naming what to pass
    with pytest.raises(ValueError, match=r"lr=None is invalid: allowed the LR the optimizer was built with, e\.g\. "
                                         r"engine\.start_at\(steps=iter_num, lr=learning_rate\).*loaded before prepare"):
        engine.start_at(steps=saved["iter_num"])
    engine.start_at(steps=saved["iter_num"], lr=PEAK)
    assert engine.next_lr == pytest.approx(reference_lr(6), rel=1e-12)
    used = _train(model, engine, 10)  # every later step on the script's own schedule
    assert used == pytest.approx([reference_lr(it) for it in range(6, 10)], rel=1e-12)
    assert optimizer.param_groups[0]["initial_lr"] == PEAK  # a checkpoint of the optimizer now carries it
    with pytest.raises(ValueError, match=r"lr=-1.0 is invalid: allowed a finite LR > 0"):
        engine.start_at(steps=6, lr=-1.0)
    # placed by neither: the first step's warning names lr= too
    model, _, engine = _adopted_with_the_optimizer_loaded_first(saved)
    with pytest.warns(UserWarning, match=r"engine\.start_at\(steps=iter_num, lr=learning_rate\) with the LR the "
                                         r"optimizer was built with"):
        _train(model, engine, 1)


def test_a_checkpoint_whose_optimizer_a_torch_scheduler_drove_resumes_without_naming_the_lr():
    saved = _pre_adoption_checkpoint(6, scheduler=True)
    assert saved["optimizer"]["param_groups"][0]["initial_lr"] == PEAK  # what torch's schedulers leave
    model, _, engine = _adopted_with_the_optimizer_loaded_first(saved)
    engine.start_at(steps=saved["iter_num"])
    assert _train(model, engine, 10) == pytest.approx([reference_lr(it) for it in range(6, 10)], rel=1e-12)


def test_the_engines_own_restore_sets_the_schedules_lr_whatever_lr_the_loaded_optimizer_carries():
    model = _mlp()
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=PEAK), COSINE, micro_batch_size=4, **SCHEDULE)
    whole = _train(model, engine, 8)
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK)
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **SCHEDULE)
    _train(model, engine, 4)
    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "engine": engine.state_dict()}
    for group in saved["optimizer"]["param_groups"]:  # as a hand-edited or foreign optimizer state might be
        group.pop("initial_lr")
        group["lr"] = 0.05
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, **SCHEDULE)
    engine.load_state_dict(saved["engine"])
    assert engine.base_lrs == [PEAK] and engine.lr == whole[3]
    assert _train(model, engine, 8) == whole[4:]  # min_lr's fraction of the peak too, bit for bit


# ---------------------------------------------------------------- precision
@pytest.mark.parametrize("native", [True, False])
def test_precision_auto_takes_what_the_cpu_computes_natively_and_says_so_once(native, monkeypatch, capsys):
    monkeypatch.setattr(manifest, "cpu_computes_bf16_natively", lambda: native)
    monkeypatch.setattr(mp, "_announced", set())
    expected = "bf16" if native else "fp32"
    for _ in range(2):
        model = _mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(precision="auto"),
                             micro_batch_size=4)
        assert engine.config.precision == expected
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and f"precision='auto' -> '{expected}' on cpu" in said[0]
    assert ("no bf16 instructions" in said[0]) == (not native)


@pytest.mark.parametrize("native", [True, False])
def test_an_explicit_precision_slower_than_another_on_this_cpu_warns_naming_the_faster_one(native, monkeypatch):
    monkeypatch.setattr(manifest, "cpu_computes_bf16_natively", lambda: native)
    faster = "bf16" if native else "fp32"
    model = _mlp()
    with pytest.warns(UserWarning, match=rf"fp16 autocast on CPU runs but is slow.*{faster} is faster") as caught:
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(precision="fp16"),
                micro_batch_size=4)
    assert [w.filename for w in caught] == [__file__]
    if native:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(precision="bf16"),
                    micro_batch_size=4)
    else:
        with pytest.warns(UserWarning, match=r"bf16 autocast on this CPU .* is emulated.*precision='fp32'"):
            prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(precision="bf16"),
                    micro_batch_size=4)


def test_precision_auto_on_a_cuda_device_without_native_bf16_takes_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert mp.choose_precision("cuda")[0] == "fp16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert mp.choose_precision("cuda") == ("bf16", "Tesla T4 computes bf16 natively")


# ---------------------------------------------------------------- units and off-by-ones
def test_clip_norm_zero_means_no_clipping_as_scripts_write_it():
    off = OptimizationConfig(clip_norm=0.0)
    assert off.clip_norm is None and OptimizationConfig(clip_norm=0).clip_norm is None
    assert off.config_hash() == OptimizationConfig().config_hash()


def test_one_schedule_vocabulary_warmup_and_min_lr_in_samples_as_in_steps():
    model = _mlp()
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(schedule="cosine"),
                     micro_batch_size=4, total_samples=100, warmup_samples=20, min_lr=0.02)
    lrs = _train(model, engine, 25)
    for step, lr in enumerate(lrs):  # the samples consumed once the step is taken
        s = 4 * (step + 1)
        expected = 0.1 * s / 20 if s <= 20 else 0.02 + 0.08 * 0.5 * (1 + math.cos(math.pi * (s - 20) / 80))
        assert lr == pytest.approx(expected, rel=1e-12)


def test_lr_is_the_last_steps_and_next_lr_the_next_one_a_per_iteration_loop_logs():
    model = _mlp()
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), COSINE, micro_batch_size=4, **SCHEDULE)
    for _ in range(5):
        logged = engine.next_lr  # what `lr = get_lr(iter_num)` gives before the step
        _train(model, engine, engine.optimizer_steps + 1)
        assert engine.lr == logged and engine.stats()["last_lr"] == logged
        assert engine.stats()["next_lr"] == engine.next_lr


def test_an_iteration_based_loop_to_max_iters_inclusive_stops_on_done_of_max_iters_plus_one():
    max_iters = 7
    model = _mlp()
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(), micro_batch_size=4)
    iterations = 0
    while not engine.done(total_steps=max_iters + 1):  # the script's `while iter_num <= max_iters`
        _train(model, engine, engine.optimizer_steps + 1)
        iterations += 1
    assert iterations == max_iters + 1 == len(range(0, max_iters + 1))


# ---------------------------------------------------------------- blocks
class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return self.head(x)


def test_checkpoint_blocks_as_a_plain_list_adds_no_second_owner_wherever_the_line_goes():
    model = _Blocks()
    keys = list(model.state_dict())
    model.checkpoint_blocks = list(model.h)  # the form the docs and the warning give
    assert list(model.state_dict()) == keys and sum(1 for _ in model.parameters()) == 10
    prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(checkpointing="sqrt"),
            micro_batch_size=4)
    assert list(model.state_dict()) == keys and checkpoint_plan(model) is not None


# ---------------------------------------------------------------- adaptive k's rule
def test_the_critical_batch_rule_grows_k_only_while_the_effective_batch_is_below_the_noise_scale():
    from trainopt_core.accumulation import NoiseEstimate, next_k

    def estimate(b_simple, b=512.0):  # significant: |G|² = 1 with a narrow interval, σ² = B_simple / b
        return NoiseEstimate(sigma_sq=b_simple / b, grad_sq=1.0, micro_batch_size=b, num_micro_batches=4, steps=8,
                             grad_sq_half_width=0.1)

    for b_simple, expected in ((40.0, 2), (1_500.0, 3), (3_000.0, 6), (1e6, 8)):
        k, target, why = next_k(estimate(b_simple), k=4, sigma_target=None, rule="critical_batch", k_min=2, k_max=8)
        assert (k, target, why) == (expected, 1.0, "eq. 6"), b_simple  # k·b just covers B_simple; never calibrated
    # the calibrated reading keeps k = 4 at the first estimate wherever the noise scale is
    assert next_k(estimate(40.0), k=4, sigma_target=None, rule="noise_scale", k_min=2, k_max=8)[0] == 4
    # the default; a fixed-k configuration never reads its rule and keeps the hash its records were made under
    assert OptimizationConfig(adaptive=True, k=2, k_min=2, k_max=8).k_rule == "critical_batch"
    assert OptimizationConfig(k=4).config_hash() == OptimizationConfig(k=4, k_rule="noise_scale").config_hash()
    adaptive = OptimizationConfig(adaptive=True, k=2, k_min=2, k_max=8)
    assert adaptive.config_hash() != adaptive.replace(k_rule="noise_scale").config_hash()
    assert OptimizationConfig.baseline().config_hash() == "e4536eadcb"  # the reference records' name


def test_with_adaptive_k_the_lr_follows_the_batch_by_default_from_the_batch_it_starts_with():
    # the default: on with adaptive k, off with a fixed k (where it hashes as the False it replaced)
    adaptive = OptimizationConfig(adaptive=True, k=4, k_min=2, k_max=8)
    assert adaptive.lr_scaling is None and adaptive.scales_lr and adaptive.lr_batch_splits == 4
    assert not OptimizationConfig(k=4).scales_lr
    assert OptimizationConfig(k=4).config_hash() == OptimizationConfig(k=4, lr_scaling=False).config_hash()
    # scaled from k_min's batch when set (the optimized preset's eq. 11): another computation
    assert adaptive.replace(lr_scaling=True).lr_batch_splits == 2
    assert len({adaptive.config_hash(), adaptive.replace(lr_scaling=True).config_hash(),
                adaptive.replace(lr_scaling=False).config_hash()}) == 3
    with pytest.raises(ValueError, match="lr_scaling='yes' is invalid"):
        OptimizationConfig(lr_scaling="yes")

    def first_lr(config):
        model = _mlp()
        engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), config, micro_batch_size=4,
                         total_samples=4_000)
        return engine.next_lr

    assert first_lr(adaptive) == pytest.approx(0.1)  # the LR given is the starting batch's
    assert first_lr(adaptive.replace(lr_scaling=True)) == pytest.approx(0.2)  # 4 micro-batches over k_min's 2
    assert first_lr(adaptive.replace(lr_scaling=False)) == pytest.approx(0.1)
    # and it follows k as k moves: k = 8 doubles it
    model = _mlp()
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), adaptive, micro_batch_size=4,
                     total_samples=4_000)
    assert engine.schedule.batch_factor(8 * 4) == pytest.approx(2.0)
    assert engine.schedule.batch_factor(2 * 4) == pytest.approx(0.5)
