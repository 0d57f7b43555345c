"""Engine state for exact resumption, and non-finite steps in bf16/fp32 (skipped, counted, stopped)."""
import io
import math
import textwrap

import pytest
import torch
import torch.nn.functional as F

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.accumulation import GradientNoiseMonitor
from trainopt_core.precision import NonFiniteTrainingError

ADAPTIVE = OptimizationConfig(
    precision="bf16", k=3, adaptive=True, k_min=2, k_max=4, noise_window=4, schedule="cosine",
    warmup_fraction=0.1, lr_scaling=True, clip_norm=1.0,
)


def build(config, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    engine = prepare(model, optimizer, config, total_samples=4_000, micro_batch_size=8)
    return model, optimizer, engine


def batch(index):
    """Micro-batch `index` of a fixed, reproducible stream."""
    g = torch.Generator().manual_seed(1000 + index)
    x = torch.randn(8, 8, generator=g)
    return x, (x[:, :4].argmax(1) + (torch.rand(8, generator=g) < 0.2).long()) % 4


def train(model, engine, steps, start_micro=0, poison=(), poison_value=math.nan):
    """`steps` optimizer steps; returns (history per step, next micro-batch index)."""
    history, micro = [], start_micro
    for _ in range(steps):
        before = engine.optimizer_steps
        while engine.optimizer_steps == before:
            x, y = batch(micro)
            with engine.autocast():
                loss = F.cross_entropy(model(x), y)
            if engine.optimizer_steps in poison:
                loss = loss * poison_value
            engine.backward(loss, num_items=len(y))
            engine.step()
            micro += 1
        history.append((loss.item(), engine.lr, engine.k, engine.k_reason, engine.b_simple, engine.samples_consumed))
    return history, micro


def roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("config", [ADAPTIVE, ADAPTIVE.replace(precision="fp32", adaptive=False, k=2, k_min=1, k_max=1)],
                         ids=["adaptive-bf16", "fixed-fp32"])
def test_a_resumed_loop_continues_bit_identically(config):
    model, _, engine = build(config)
    torch.manual_seed(7)
    reference, _ = train(model, engine, 30)
    reference_weights = [p.detach().clone() for p in model.parameters()]

    model, optimizer, engine = build(config)
    torch.manual_seed(7)
    first, micro = train(model, engine, 12)
    saved = roundtrip({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                       "engine": engine.state_dict(), "rng": torch.get_rng_state()})
    engine.close()
    del model, optimizer, engine

    model, optimizer, engine = build(config, seed=123)  # different initial weights: all must come from the checkpoint
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    engine.load_state_dict(saved["engine"])
    torch.set_rng_state(saved["rng"])
    assert engine.optimizer_steps == 12 and engine.lr == first[-1][1]
    second, _ = train(model, engine, 18, start_micro=micro)
    assert first + second == reference
    for resumed, uninterrupted in zip(model.parameters(), reference_weights):
        assert torch.equal(resumed, uninterrupted)
    if config.adaptive:
        assert len({h[2] for h in reference}) > 1, "k should move in this run, or the test checks little"


def test_fp16_loss_scaler_state_is_part_of_the_engine_state():
    config = OptimizationConfig(precision="fp16", k=2, initial_loss_scale=2.0**20, loss_scale_growth_interval=3)
    with pytest.warns(UserWarning, match="fp16 autocast on CPU"):
        model, _, engine = build(config)
    train(model, engine, 5)
    state = roundtrip(engine.state_dict())
    with pytest.warns(UserWarning, match="fp16 autocast on CPU"):
        _, _, fresh = build(config)
    fresh.load_state_dict(state)
    assert fresh.scaler.state_dict() == engine.scaler.state_dict()
    assert fresh.loss_scale == engine.loss_scale and fresh.skipped_steps == engine.skipped_steps


def test_state_dict_only_between_steps_and_only_into_the_same_configuration():
    model, _, engine = build(ADAPTIVE)
    x, y = batch(0)
    with engine.autocast():
        engine.backward(F.cross_entropy(model(x), y), num_items=8)
    with pytest.raises(RuntimeError, match="1 of 3 micro-batches"):
        engine.state_dict()
    engine.step()
    train(model, engine, 1, start_micro=1)
    state = engine.state_dict()
    _, _, other = build(ADAPTIVE.replace(k_max=5))
    with pytest.raises(ValueError, match="k_max=4 there, 5 here"):
        other.load_state_dict(state)
    _, _, renamed = build(ADAPTIVE.replace(name="mine", max_nonfinite_steps=9))  # name and guards may differ
    renamed.load_state_dict(state)
    with pytest.raises(ValueError, match="format"):
        renamed.load_state_dict({"k": 3})


def test_noise_monitor_window_roundtrips():
    param = torch.nn.Parameter(torch.zeros(3))
    monitor = GradientNoiseMonitor([param], window=3)
    for step in range(5):
        for j in range(2):
            monitor.begin_micro_batch("cpu", 1.0, 4)
            (param * torch.tensor([1.0 + j, step, -j])).sum().backward()
        monitor.finish_step(float(step + 1), monitor.micro_norms())
    state = roundtrip(monitor.state_dict())
    copy = GradientNoiseMonitor([torch.nn.Parameter(torch.zeros(3))], window=3)
    copy.load_state_dict(state)
    # repr: a single step's interval half-width is nan, which == would call different
    assert repr((copy.pooled, copy.last, list(copy._recent))) == repr((monitor.pooled, monitor.last, list(monitor._recent)))
    with pytest.raises(ValueError, match="window"):
        GradientNoiseMonitor([param], window=4).load_state_dict(state)


# ----------------------------------------------------------------------------- non-finite steps
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_non_finite_step_is_skipped_and_counted(precision, value):
    config = OptimizationConfig(precision=precision, k=2)
    model, _, engine = build(config)
    train(model, engine, 3)
    weights = [p.detach().clone() for p in model.parameters()]
    state = engine.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    history, _ = train(model, engine, 1, poison={3}, poison_value=value)
    assert engine.skipped_steps == 1 and engine.consecutive_skipped_steps == 1 and engine.optimizer_steps == 4
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights)), "inf/nan reached the weights"
    assert torch.equal(engine.optimizer.state_dict()["state"][0]["exp_avg"], state)
    assert not math.isfinite(engine.last_grad_norm)
    train(model, engine, 2)  # recovers: finite again, the run goes on
    assert engine.consecutive_skipped_steps == 0 and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_consecutive_non_finite_steps_stop_the_run_naming_step_value_and_cause(precision):
    model, _, engine = build(OptimizationConfig(precision=precision, k=2, max_nonfinite_steps=3))
    train(model, engine, 2)
    train(model, engine, 2, poison={2, 3})
    assert engine.skipped_steps == 2
    with pytest.raises(NonFiniteTrainingError) as caught:
        train(model, engine, 1, poison={4})
    message = str(caught.value)
    assert "optimizer step 5" in message and "gradient norm nan" in message and precision in message
    assert "max_nonfinite_steps=3" in message and "learning rate" in message
    assert engine.skipped_steps == 3


def test_max_nonfinite_steps_is_validated_and_not_part_of_the_hash():
    with pytest.raises(ValueError, match="max_nonfinite_steps=0 is invalid"):
        OptimizationConfig(max_nonfinite_steps=0)
    assert OptimizationConfig(max_nonfinite_steps=10).config_hash() == OptimizationConfig().config_hash()


DEEPSPEED_RESUME_SCRIPT = textwrap.dedent("""
    import sys, warnings, torch, torch.nn.functional as F
    from trainopt_core import OptimizationConfig, prepare
    directory, mode = sys.argv[1], sys.argv[2]
    config = OptimizationConfig(k=3, adaptive=True, k_min=2, k_max=4, noise_window=4, zero_stage=2,
                                schedule="cosine", warmup_fraction=0.1, clip_norm=1.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=3e-3), config, total_samples=4000,
                     micro_batch_size=8, backend="deepspeed")
    def batch(i):
        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(8, 8, generator=g)
        return x, x[:, :4].argmax(1)
    micro, log = 0, []
    if mode == "resume":
        micro = engine.load_checkpoint(directory)["micro"]
    if mode == "deepspeed_only":  # DeepSpeed's own API: the engine's position is not restored
        engine.ds_engine.load_checkpoint(directory)
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        while engine.optimizer_steps < (8 if mode in ("first", "deepspeed_only") else 20):
            x, y = batch(micro)
            loss = F.cross_entropy(engine.model(x), y)
            engine.backward(loss, num_items=8)
            if engine.step():
                log.append((engine.optimizer_steps, round(loss.item(), 12), engine.lr, engine.k))
            micro += 1
    for warning in caught:
        if "starts at step 0" in str(warning.message):
            print("warned", str(warning.message).replace(chr(10), " "))
    if mode == "first":
        engine.save_checkpoint(directory, client_state={"micro": micro})
    for entry in log:
        print("step", *entry)
    print("weights", float(sum(p.double().sum() for p in engine.module.parameters())))
    engine.close()
""")


@pytest.mark.slow
def test_deepspeed_engine_resumes_through_its_checkpoint_api(tmp_path, run_deepspeed_script):
    def run(mode, directory):
        stdout = run_deepspeed_script(DEEPSPEED_RESUME_SCRIPT, directory, mode)
        return [line for line in stdout.splitlines() if line.startswith(("step", "weights", "warned"))]

    uninterrupted = run("all", tmp_path / "unused")
    first = run("first", tmp_path / "ckpt")
    resumed = run("resume", tmp_path / "ckpt")
    assert first[:-1] + resumed == uninterrupted  # and no warning in any of them
    # resumed through DeepSpeed's own load_checkpoint: the engine says its schedule restarts, once
    warned = [line for line in run("deepspeed_only", tmp_path / "ckpt") if line.startswith("warned")]
    assert len(warned) == 1 and "DeepSpeed was resumed (its step count " in warned[0]
    assert "engine.load_checkpoint(directory)" in warned[0]


DEEPSPEED_NONFINITE_SCRIPT = textwrap.dedent("""
    import math, torch, torch.nn.functional as F
    from trainopt_core import OptimizationConfig, prepare
    from trainopt_core.precision import NonFiniteTrainingError
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), OptimizationConfig(k=2),
                     total_samples=400, micro_batch_size=4, backend="deepspeed")
    x, y = torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    try:
        for step in range(4):
            for _ in range(2):
                loss = F.cross_entropy(engine.model(x), y)
                engine.backward(loss * (math.nan if step == 2 else 1.0), num_items=4)
                engine.step()
    except NonFiniteTrainingError as error:
        print("stopped:", error)
    print("steps", engine.optimizer_steps, "finite", all(bool(torch.isfinite(p).all()) for p in engine.module.parameters()))
    engine.close()
""")


@pytest.mark.slow
def test_deepspeed_fp32_stops_before_a_non_finite_step_reaches_the_weights(run_deepspeed_script):
    stdout = run_deepspeed_script(DEEPSPEED_NONFINITE_SCRIPT)
    assert "stopped: non-finite loss at optimizer step 3 in fp32 (DeepSpeed ZeRO-0)" in stdout
    assert "steps 2 finite True" in stdout
