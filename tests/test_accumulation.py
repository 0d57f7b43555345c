"""Variance-aware accumulation: hooked micro-batch norms, eq. 7, B_simple and eq. 6."""
import copy
import math

import pytest
import torch

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.accumulation import (
    MIN_POOLED_STEPS,
    GradientNoiseMonitor,
    NoiseEstimate,
    calibrate_sigma_target,
    choose_k,
    estimate_noise,
    gather_noise_inputs,
    next_k,
    pool_estimates,
)
from trainopt_core.noise_scale import goodput, noise_scale_from_norms, probe_noise_scale


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
    assert choose_k(est, sigma_target=1.5, rule="variance", k_min=1, k_max=16) == 4  # ceil(9/2.25)
    assert choose_k(est, sigma_target=1.0, rule="variance", k_min=1, k_max=8) == 8  # ceil(9) clipped
    assert choose_k(est, sigma_target=10.0, rule="variance", k_min=2, k_max=8) == 2  # raised to k_min
    # noise scale: k = ceil(B_simple / (sigma_target^2 b)) = ceil(36 / (4 * 4))
    assert choose_k(est, sigma_target=2.0, rule="noise_scale", k_min=1, k_max=16) == 3
    # |G|² not positive: the noise-scale reading is undefined, never silently k_max
    with pytest.raises(ValueError, match="positive target variance"):
        choose_k(NoiseEstimate(1.0, -0.1, 4, 4), sigma_target=1.0, rule="noise_scale", k_min=2, k_max=8)
    with pytest.raises(ValueError, match="rule='eq6'"):
        choose_k(est, sigma_target=1.0, rule="eq6", k_min=2, k_max=8)


def test_next_k_holds_until_the_estimate_can_move_k_then_calibrates_once_and_follows_eq6():
    rule_args = dict(k_min=2, k_max=16)
    few = NoiseEstimate(9.0, 1.0, 4, 4, steps=MIN_POOLED_STEPS - 1, grad_sq_half_width=0.1)
    noisy = NoiseEstimate(9.0, 1.0, 4, 4, steps=MIN_POOLED_STEPS, grad_sq_half_width=2.0)  # |G|² interval reaches 0
    clear = NoiseEstimate(9.0, 1.0, 4, 4, steps=MIN_POOLED_STEPS, grad_sq_half_width=0.5)
    assert next_k(None, k=4, sigma_target=None, rule="variance", **rule_args) == (
        4, None, f"held: fewer than {MIN_POOLED_STEPS} steps pooled")
    assert next_k(few, k=4, sigma_target=1.0, rule="variance", **rule_args)[::2] == (
        4, f"held: fewer than {MIN_POOLED_STEPS} steps pooled")
    assert next_k(noisy, k=4, sigma_target=None, rule="noise_scale", **rule_args) == (
        4, None, "held: |G|² not significant")
    # the variance reading needs σ² only: it acts on the same estimate, calibrated to keep k there
    k, target, why = next_k(noisy, k=4, sigma_target=None, rule="variance", **rule_args)
    assert (k, why) == (4, "eq. 6") and target == pytest.approx(calibrate_sigma_target(noisy, rule="variance", k=4))
    # a configured target is kept, and eq. 6 decides with it
    assert next_k(clear, k=4, sigma_target=1.5, rule="variance", **rule_args) == (4, 1.5, "eq. 6")
    assert next_k(clear, k=4, sigma_target=1.0, rule="variance", **rule_args) == (9, 1.0, "eq. 6")
    assert next_k(clear, k=4, sigma_target=2.0, rule="noise_scale", **rule_args) == (3, 2.0, "eq. 6")


def test_gather_noise_inputs_on_one_process_returns_them_as_they_are():
    micro = [(1.0, 4.0), (2.0, 3.0)]
    assert gather_noise_inputs(5.0, micro, world_size=1, device=torch.device("cpu")) == (5.0, micro)


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

    # lr = 0 keeps w fixed; a window of every step pools all per-step estimates
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    target_sq = analytic_sigma_sq / 4.5  # eq. 6 then asks for ceil(4.5) = 5
    cfg = OptimizationConfig(k=k, adaptive=True, k_min=2, k_max=k, noise_window=1500,
                             sigma_target=math.sqrt(target_sq), k_rule="variance")
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
    assert noise.steps == 1500 and noise.significant
    assert choose_k(noise, sigma_target=cfg.sigma_target, rule="variance", k_min=2, k_max=8) == 5


def test_adaptive_engine_changes_k_only_at_boundaries_and_skips_nonfinite_micro_batches():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = OptimizationConfig(k=2, adaptive=True, k_min=2, k_max=6, sigma_target=0.5, k_rule="noise_scale")
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
    assert engine.noise is not None and engine.noise.steps == cfg.noise_window
    assert all(2 <= k <= 6 for k in ks)
    # a non-finite micro-batch norm is dropped, not averaged in
    est_before = engine.monitor.pooled
    engine.monitor.finish_step(1.0, [(float("inf"), 4), (1.0, 4)])
    assert engine.monitor.pooled is est_before


def test_hooked_norms_of_float64_parameters_are_summed_in_float64():
    torch.manual_seed(2)
    model = torch.nn.Linear(64, 64).double()
    monitor = GradientNoiseMonitor(list(model.parameters()))
    x = torch.randn(8, 64, dtype=torch.float64)
    monitor.begin_micro_batch(torch.device("cpu"), grad_to_mean=1.0, items=8)
    model(x).pow(2).mean().backward()
    [(hooked, items)] = monitor.micro_norms()
    explicit = sum(p.grad.pow(2).sum() for p in model.parameters()).item()
    assert items == 8 and hooked == pytest.approx(explicit, rel=1e-12)  # float32 would give ~1e-7
    monitor.remove()


def test_pooled_estimate_is_the_mean_with_a_t_interval_and_significance_needs_it_above_zero():
    steps = [NoiseEstimate(sigma_sq=s, grad_sq=g, micro_batch_size=4, num_micro_batches=4)
             for s, g in ((8.0, 2.0), (10.0, 2.5), (12.0, 3.0))]
    pooled = pool_estimates(steps)
    assert (pooled.sigma_sq, pooled.grad_sq, pooled.steps) == (10.0, 2.5, 3)
    assert pooled.grad_sq_half_width == pytest.approx(4.303 * 0.5 / math.sqrt(3))  # t(0.975, 2) s/√n
    assert pooled.significant and pooled.b_simple == pytest.approx(4 * 10.0 / 2.5)
    noisy = pool_estimates([NoiseEstimate(10.0, g, 4, 4) for g in (3.0, -2.0, 1.0)])
    assert noisy.grad_sq > 0 and not noisy.significant  # positive mean, interval reaches below 0
    assert not pool_estimates(steps[:MIN_POOLED_STEPS - 1]).significant  # too few steps for an interval
    with pytest.raises(ValueError, match="significant"):
        calibrate_sigma_target(noisy, rule="noise_scale", k=4)


@pytest.mark.parametrize("rule", ["noise_scale", "variance"])
def test_calibration_reproduces_the_starting_k_where_it_is_made(rule):
    estimate = pool_estimates([NoiseEstimate(9.0 + i, 1.0 + 0.1 * i, 4, 4) for i in range(4)])
    sigma_target = calibrate_sigma_target(estimate, rule=rule, k=5)
    assert choose_k(estimate, sigma_target=sigma_target, rule=rule, k_min=2, k_max=16) == 5


def linear_regression_k_trajectory(rule, k_start, *, delta_norms, steps_per_delta=30, seed=0):
    """Adaptive k while w approaches w* (|Δ| shrinks): for ½(w·x - y)², x ~ N(0, I), noise s,
    tr Σ = |Δ|²(d+1) + s²d falls (σ² falls) while B_simple = tr Σ / |Δ|² grows."""
    torch.manual_seed(seed)
    d, s, b = 10, 1.0, 8
    w_star = torch.randn(d)
    direction = torch.randn(d)
    direction = direction / direction.norm()
    model = torch.nn.Linear(d, 1, bias=False)
    cfg = OptimizationConfig(k=k_start, adaptive=True, k_min=2, k_max=8, noise_window=8, k_rule=rule)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.0), cfg, total_samples=10**9, micro_batch_size=b)
    ks, reasons, b_simple = [], [], []
    for delta_norm in delta_norms:
        with torch.no_grad():
            model.weight.copy_((w_star + delta_norm * direction)[None])
        for _ in range(steps_per_delta):
            while True:
                x = torch.randn(b, d)
                y = x @ w_star + s * torch.randn(b)
                engine.backward(0.5 * (model(x).squeeze(1) - y).pow(2).mean())
                if engine.step():
                    break
            stats = engine.stats()
            ks.append(stats["next_k_micro_batches"])
            reasons.append(stats["k_reason"])
            b_simple.append(stats["b_simple_items"])
    engine.close()
    return ks, reasons, b_simple, engine.sigma_target


def test_noise_scale_rule_grows_k_as_the_gradient_signal_shrinks():
    ks, reasons, b_simple, sigma_target = linear_regression_k_trajectory("noise_scale", 2, delta_norms=[3.0, 1.0, 0.4])
    assert sigma_target is not None  # calibrated at the first significant estimate
    assert ks[:MIN_POOLED_STEPS - 1] == [2] * (MIN_POOLED_STEPS - 1)  # held until an interval exists
    assert reasons[0].startswith("held")
    assert ks[-1] == 8 and max(ks[:20]) <= 3  # B_simple grew ~6x (12 -> 74): k rose from 2 to k_max
    assert all(v is not None for v in b_simple) and b_simple[-1] > 3 * b_simple[5]


def test_variance_rule_lowers_k_as_the_gradient_variance_falls():
    ks, _, _, sigma_target = linear_regression_k_trajectory("variance", 8, delta_norms=[3.0, 1.0, 0.4])
    assert sigma_target is not None
    assert min(ks[:20]) >= 7 and ks[-1] <= 3  # σ² fell ~9x (109 -> 12): k fell from k_max to ~k_min


def test_pure_noise_gradient_holds_k_and_says_so():
    """At w = w* the true gradient is 0: the estimate is rarely significant, and k changes only
    on a step where eq. 6 acted -- never clamped to k_max because |G|² came out negative."""
    ks, reasons, _, _ = linear_regression_k_trajectory("noise_scale", 3, delta_norms=[0.0], steps_per_delta=120)
    held = sum(r.startswith("held") for r in reasons)
    assert held >= 0.9 * len(reasons)
    assert reasons[0] == f"held: fewer than {MIN_POOLED_STEPS} steps pooled" and ks[0] == 3
    assert "held: |G|² not significant" in reasons[MIN_POOLED_STEPS:]
    assert all(k == previous for previous, k, r in zip(ks, ks[1:], reasons[1:]) if r.startswith("held"))


def _gaussian_gradients(generator, grad_norm, m=16, b=8, d=2000):
    """m micro-batch mean gradients G + noise with tr(Σ) = d per sample: B_simple = d / |G|²."""
    direction = torch.randn(d, dtype=torch.float64, generator=generator)
    true_gradient = direction / direction.norm() * grad_norm
    g = true_gradient + torch.randn(m, d, dtype=torch.float64, generator=generator) / math.sqrt(b)
    total = g.sum(0)
    return (g * g).sum(1).tolist(), (g @ total).tolist(), float(total @ total), [float(b)] * m


def test_one_batch_noise_scale_recovers_a_known_noise_scale_and_its_interval_covers_it():
    generator = torch.Generator().manual_seed(0)
    for grad_norm in (3.0, 1.0):
        truth = 2000 / grad_norm**2
        probes = [noise_scale_from_norms(*_gaussian_gradients(generator, grad_norm)) for _ in range(200)]
        estimates = sorted(p.b_simple for p in probes)
        assert estimates[100] == pytest.approx(truth, rel=0.1)
        coverage = sum(p.ci_low <= truth <= p.ci_high for p in probes) / len(probes)
        assert coverage >= 0.9
    # pure noise: the interval of |G|² reaches zero, so the noise scale is bounded below only
    pure = [noise_scale_from_norms(*_gaussian_gradients(generator, 0.0)) for _ in range(50)]
    assert sum(not p.significant for p in pure) >= 45
    assert all(p.ci_low > 0 for p in pure)


def test_noise_scale_probe_replays_dropout_and_equals_stored_micro_batch_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Dropout(0.3), torch.nn.Linear(20, 3))
    model.eval()
    x, y = torch.randn(48, 10), torch.randint(0, 3, (48,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = probe_noise_scale(model, (x, y), torch.nn.functional.cross_entropy, micro_batches=12, seed=3)
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    stored = []
    model.train()
    for index, (xs, ys) in enumerate(zip(x.chunk(12), y.chunk(12))):
        model.zero_grad()
        with torch.random.fork_rng():
            torch.manual_seed(3 * 100_003 + index)
            torch.nn.functional.cross_entropy(model(xs), ys).backward()
        stored.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    g = torch.stack(stored)
    total = g.sum(0)
    direct = noise_scale_from_norms((g * g).sum(1).tolist(), (g @ total).tolist(), float(total @ total), [4.0] * 12)
    assert probe.b_simple == pytest.approx(direct.b_simple, rel=1e-5)
    assert probe.ci_low == pytest.approx(direct.ci_low, rel=1e-5)
    assert probe.micro_batches == 12 and probe.micro_batch_size == 4.0
    with pytest.raises(ValueError, match="micro_batches"):
        probe_noise_scale(model, (x[:2], y[:2]), torch.nn.functional.cross_entropy)


def test_goodput_peaks_at_the_closed_form_k():
    # B_simple 200, b 8, t_micro 1, t_optimizer 4: k* = sqrt(200 * 4 / 8) = 10
    values = {k: goodput(k, micro_batch_size=8, micro_s=1.0, optimizer_s=4.0, b_simple=200.0, reference_batch=16)["goodput"]
              for k in range(1, 30)}
    assert max(values, key=values.get) == 10
    free_optimizer = {k: goodput(k, micro_batch_size=8, micro_s=1.0, optimizer_s=0.0, b_simple=200.0,
                                 reference_batch=16)["goodput"] for k in range(1, 30)}
    assert max(free_optimizer, key=free_optimizer.get) == 1  # no step cost to spread: the smallest batch wins
    unbounded = goodput(4, micro_batch_size=8, micro_s=1.0, optimizer_s=4.0, b_simple=math.inf, reference_batch=16)
    assert unbounded["statistical_efficiency"] == 1.0
