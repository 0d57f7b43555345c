"""plan() in a script's own terms: it starts from the script's configuration (`base=`), keeps what
it does not choose, decides on intervals (a tie keeps the script's choice), and takes a model
that returns its loss and a model-level optimizer factory."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, plan, prepare
from trainopt_core.planner.choice import choose
from trainopt_core.planner.result import Plan, against_yours


def _row(name, k, speedup, low, high, **extra):
    return {"candidate": name, "precision": "fp32", "k": k, "peak_memory_bytes": 100.0, "speedup": speedup,
            "speedup_ci_low": low, "speedup_ci_high": high, "energy_j_per_sample": None, "rejected_because": None,
            "feasible": False, **extra}


def test_a_tie_keeps_the_callers_configuration_and_a_clear_win_replaces_it():
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _row("fp32, k=4", 4, 1.10, 0.95, 1.25, yours=True),
            _row("fp32, k=2", 2, 1.20, 1.05, 1.35)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[1]["chosen"] and not rows[2].get("chosen")
    assert any(note.startswith("Kept your configuration (fp32, k=4): the lowest-cost candidate, fp32, k=2, is within "
                               "its timing noise") for note in notes)
    assert "within the timing noise" in rows[2]["rejected_because"]
    # without the mark, the same numbers choose the point estimate's best, as before
    rows = [dict(row, yours=False) for row in rows]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[2]["chosen"]
    # a candidate whose whole interval is better replaces it
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _row("fp32, k=4", 4, 1.10, 1.05, 1.15, yours=True),
            _row("fp32, k=2", 2, 1.60, 1.50, 1.70)]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[2]["chosen"] and "higher eq. 3 cost" in rows[1]["rejected_because"]


def test_the_callers_configuration_is_rejected_as_slower_only_on_its_whole_interval():
    # under load: a point estimate of 0.8x whose interval spans 0.08-4.7x
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _row("fp32, k=4", 4, 0.80, 0.08, 4.7, yours=True)]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[1]["chosen"]  # kept: the baseline is within its noise
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _row("fp32, k=4", 4, 0.80, 0.70, 0.90, yours=True)]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[0]["chosen"] and rows[1]["rejected_because"].startswith("slower than the fp32 baseline")


def test_the_choice_against_yours_is_one_ratio_with_its_interval():
    best, yours = _row("fp32, k=2", 2, 1.5, 1.2, 1.875), _row("fp32, k=4", 4, 1.2, 1.0, 1.44, yours=True)
    versus = against_yours(best, yours)
    half = math.hypot(math.log(1.875 / 1.2) / 2, math.log(1.44 / 1.0) / 2)
    assert versus["mean"] == pytest.approx(1.25)
    assert (versus["ci_low"], versus["ci_high"]) == pytest.approx((1.25 * math.exp(-half), 1.25 * math.exp(half)))
    base = _row("fp32, k=1", 1, 1.0, 1.0, 1.0)
    explained = Plan(config=OptimizationConfig(), chosen=dict(best, chosen=True), baseline=base,
                     rows=[base, yours, dict(best, chosen=True)], memory_budget_bytes=None, weights=(1.0, 0.0, 0.0),
                     planning_s=1.0).explain()
    assert (f"Against your configuration (fp32, k=4, 1.20x the fp32 baseline): 1.25x its samples/s (95 % interval "
            f"{versus['ci_low']:.2f}-{versus['ci_high']:.2f}, the two speedups' intervals combined)") in explained


class _ReturnsLoss(nn.Module):
    """A script's model: forward(x, y) returns (logits, loss); its own configure_optimizers()."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.h = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(16, 3)
        self.configured_with = None

    def forward(self, x, targets=None):
        for block in self.h:
            x = block(x)
        logits = self.head(x)
        loss = None if targets is None else nn.functional.cross_entropy(logits, targets)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate):
        self.configured_with = (weight_decay, learning_rate)
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, weight_decay=weight_decay)


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(32, 16, generator=generator), torch.randint(0, 3, (32,), generator=generator)


def test_plan_takes_a_script_as_it_is_and_keeps_what_it_does_not_choose():
    model = _ReturnsLoss()
    script = OptimizationConfig(name="script", k=4, schedule="cosine", warmup_fraction=0.1, min_lr_ratio=0.05,
                                clip_norm=1.0, zero_stage=2)
    result = plan(model, lambda m: m.configure_optimizers(weight_decay=0.1, learning_rate=1e-3), _batch(),
                  lambda m, x, y: m(x, y)[1], loss_takes_model=True, optimizer_takes_model=True, base=script,
                  windows=2, steps_per_window=1)
    yours = [row for row in result.rows if row.get("yours")]
    assert [row["candidate"] for row in yours] == ["fp32, k=4"] and yours[0]["speedup"] is not None
    assert result.rechoose(weights=(0.5, 0.5, 0.0)).base == script  # explain() goes on comparing with yours
    for config in (result.config, result.rechoose(weights=(0.5, 0.5, 0.0)).config):
        assert (config.name, config.schedule, config.warmup_fraction, config.min_lr_ratio, config.clip_norm,
                config.zero_stage) == ("script", "cosine", 0.1, 0.05, 1.0, 2)
    explained = result.explain()
    assert "(yours)" in explained
    assert result.chosen.get("yours") or "Against your configuration (fp32, k=4, " in explained
    engine = prepare(model, model.configure_optimizers(0.1, 1e-3), result.config,
                     micro_batch_size=32 // result.config.batch_splits, total_steps=10)
    assert engine.config.clip_norm == 1.0


def test_a_loss_fn_that_does_not_fit_the_model_names_loss_takes_model():
    model = _ReturnsLoss()
    with pytest.raises(TypeError, match=r"loss_takes_model=True and loss_fn=lambda model, x, y: model\(x, y\)\[1\]"):
        plan(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
             windows=1, steps_per_window=1)


def test_a_base_plan_cannot_run_says_why():
    model = _ReturnsLoss()
    factory = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    loss = lambda m, x, y: m(x, y)[1]  # noqa: E731
    with pytest.raises(ValueError, match=r"base=.*k=3.*allowed a k that divides the batch of 32"):
        plan(model, factory, _batch(), loss, loss_takes_model=True, base=OptimizationConfig(k=3), windows=1,
             steps_per_window=1)
    with pytest.raises(ValueError, match=r"adaptive=True.*allowed with adaptive_accumulation=True"):
        plan(model, factory, _batch(), loss, loss_takes_model=True,
             base=OptimizationConfig(adaptive=True, k=2, k_min=2, k_max=4))
    with pytest.raises(ValueError, match=r"base=.*allowed None or an OptimizationConfig"):
        plan(model, factory, _batch(), loss, loss_takes_model=True, base={"k": 2})
