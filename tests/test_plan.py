"""plan(): candidates measured on the user's model, chosen by eq. 3 within a memory budget."""
import pytest
import torch
from torch import nn

from trainopt_core.plan import plan


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def _batch(size=64):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(size, 64, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def _plan(**kwargs):
    return plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                windows=2, steps_per_window=1, **kwargs)


def test_without_a_budget_the_plan_is_never_slower_than_fp32_and_leaves_the_model_alone():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = plan(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  windows=2, steps_per_window=1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    rows = {row["candidate"]: row for row in result.rows}
    assert rows["fp32, k=1, no checkpointing"]["speedup"] == 1.0
    assert result.chosen["speedup"] >= 1.0 and result.chosen["feasible"]
    assert {row["k"] for row in result.rows} == {1, 2, 4, 8}
    assert all(row["checkpointing"] is None for row in result.rows)  # memory does not count: not measured
    assert all(row["loss_rel_diff"] < 0.05 for row in result.rows)
    assert "Chose" in result.explain() and result.config.name == "auto"


def test_a_budget_below_the_baseline_is_met_and_the_plan_says_the_baseline_was_ruled_out():
    unconstrained = _plan(ks=(1, 8))
    base = unconstrained.baseline["peak_memory_bytes"]
    small = min(row["peak_memory_bytes"] for row in unconstrained.rows)
    assert small < base
    budget = (small + base) / 2
    result = _plan(ks=(1, 8), memory_budget_bytes=budget)
    assert result.chosen["peak_memory_bytes"] <= budget
    assert any("rules out the fp32 baseline" in note for note in result.notes)
    assert "over the budget" in {row["candidate"]: row for row in result.rows}[
        "fp32, k=1, no checkpointing"]["rejected_because"]


def test_a_budget_nothing_meets_is_refused_naming_the_smallest_peak():
    with pytest.raises(ValueError, match="memory_budget_bytes=1000 is invalid: allowed a budget some candidate fits"):
        _plan(ks=(1, 2), memory_budget_bytes=1000)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"ks=\(3,\) is invalid"):
        _plan(ks=(3,))
    with pytest.raises(ValueError, match="same first dimension"):
        plan(_model(), lambda ps: torch.optim.SGD(ps, lr=0.1), (torch.randn(8, 64), torch.randint(0, 10, (4,))),
             nn.functional.cross_entropy)
    with pytest.raises(ValueError, match="memory_budget_bytes=0 is invalid"):
        _plan(memory_budget_bytes=0)
