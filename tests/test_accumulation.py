"""Variance-aware accumulation: hooked micro-batch norms, eq. 7, B_simple and eq. 6."""
import copy
import math

import pytest
import torch

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.accumulation import GradientNoiseMonitor, NoiseEstimate, choose_k, estimate_noise


def test_hooked_micro_batch_norms_equal_explicit_per_micro_batch_gradients():
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    twin = copy.deepcopy(model)  # the explicit per-micro-batch gradients, on an unhooked copy
    monitor = GradientNoiseMonitor(list(model.parameters()))
    explicit = []
    for j in range(3):
        x = torch.randn(4, 5)
        grads = torch.autograd.grad(twin(x).pow(2).mean(), list(twin.parameters()))
        explicit.append(sum(g.pow(2).sum() for g in grads).item())
        loss = model(x).pow(2).mean()
        monitor.begin_micro_batch(torch.device("cpu"), grad_to_mean=0.5, items=4)
        (2.0 * loss).backward()  # the hooked gradient is 2x the mean gradient
    hooked = [sq for sq, _ in monitor.micro_norms()]
    assert hooked == pytest.approx(explicit, rel=1e-5)
    monitor.remove()


def test_eq7_sample_variance_and_unbiased_grad_norm_on_known_vectors():
    g = torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, 4.0], [-2.0, 2.0]])
    mean = g.mean(0)
    expected_sigma_sq = ((g - mean) ** 2).sum(1).sum().item() / 3
    est = estimate_noise(g.pow(2).sum(1).tolist(), [8] * 4, mean.pow(2).sum().item())
    assert est.sigma_sq == pytest.approx(expected_sigma_sq)
    assert est.grad_sq == pytest.approx(mean.pow(2).sum().item() - expected_sigma_sq / 4)
    assert est.b_simple == pytest.approx(8 * est.sigma_sq / est.grad_sq)
    with pytest.raises(ValueError, match=">= 2 micro-batch"):
        estimate_noise([1.0], [8], 1.0)


def test_eq6_chooses_k_and_clips_to_range():
    est = NoiseEstimate(sigma_sq=9.0, grad_sq=1.0, micro_batch_size=4, num_micro_batches=4)
    assert choose_k(est, sigma_target=1.5, mode="absolute", k_min=1, k_max=16) == 4  # ceil(9/2.25)
    assert choose_k(est, sigma_target=1.0, mode="absolute", k_min=1, k_max=8) == 8  # ceil(9) clipped
    assert choose_k(est, sigma_target=10.0, mode="absolute", k_min=2, k_max=8) == 2  # raised to k_min
    # relative: k = ceil(B_simple / (sigma_target^2 b)) = ceil(36 / (4 * 4))
    assert choose_k(est, sigma_target=2.0, mode="relative", k_min=1, k_max=16) == 3
    assert choose_k(NoiseEstimate(1.0, -0.1, 4, 4), sigma_target=1.0, mode="relative", k_min=2, k_max=8) == 8


def test_linear_regression_noise_estimates_match_analytic_values():
    """Per-sample gradient of ½(w·x - y)² at fixed w, with x ~ N(0, I_d), y = w*·x + ε, ε ~ N(0, s²):
    G = w - w* = Δ, tr Σ = |Δ|²(d+1) + s² d, so σ²(b) = tr Σ / b and B_simple = tr Σ / |Δ|²."""
    torch.manual_seed(0)
    d, s, b, k = 10, 1.0, 16, 8
    w_star = torch.randn(d)
    delta = torch.randn(d)
    delta = delta / delta.norm()  # |Δ|² = 1
    model = torch.nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + delta)[None])
    trace = (d + 1) * 1.0 + s**2 * d
    analytic_sigma_sq, analytic_b_simple = trace / b, trace / 1.0

    # lr = 0 keeps w fixed; ema close to 1 averages the per-step estimates
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    target_sq = analytic_sigma_sq / 4.5  # eq. 6 then asks for ceil(4.5) = 5
    cfg = OptimizationConfig(k=k, adaptive=True, k_min=2, k_max=k, ema=0.995,
                             sigma_target=math.sqrt(target_sq), sigma_target_mode="absolute")
    engine = prepare(model, opt, cfg, total_samples=10**9, micro_batch_size=b)
    engine.k = k  # keep k fixed while estimating
    for step in range(1500):
        for _ in range(k):
            x = torch.randn(b, d)
            y = x @ w_star + s * torch.randn(b)
            loss = 0.5 * (model(x).squeeze(1) - y).pow(2).mean()
            engine.backward(loss)
            engine.step()
        engine.k = k
    noise = engine.noise
    assert noise.sigma_sq == pytest.approx(analytic_sigma_sq, rel=0.10)
    assert noise.grad_sq == pytest.approx(1.0, rel=0.10)
    assert noise.b_simple == pytest.approx(analytic_b_simple, rel=0.10)
    assert choose_k(noise, sigma_target=cfg.sigma_target, mode="absolute", k_min=2, k_max=8) == 5


def test_adaptive_engine_changes_k_only_at_boundaries_and_skips_nonfinite_micro_batches():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = OptimizationConfig(k=2, adaptive=True, k_min=2, k_max=6, sigma_target=0.5, sigma_target_mode="relative")
    engine = prepare(model, opt, cfg, total_samples=10**6, micro_batch_size=4)
    ks = []
    for micro in range(60):
        k_before = engine.k
        x = torch.randn(4, 4)
        loss = (model(x) - 3 * torch.randn(4, 1)).pow(2).mean()  # very noisy targets
        engine.backward(loss)
        if engine.step():
            ks.append(engine.k)
        else:
            assert engine.k == k_before  # never mid-step
    assert engine.noise is not None and max(ks) > 2  # high noise pushed k up
    assert all(2 <= k <= 6 for k in ks)
    # a non-finite micro-batch norm is dropped, not averaged in
    est_before = engine.monitor.smoothed
    engine.monitor.finish_step(1.0, [(float("inf"), 4), (1.0, 4)])
    assert engine.monitor.smoothed is est_before
