"""plan() in a script's own terms: it starts from the script's configuration (`base=`), keeps what
it does not choose, decides on intervals (replaced by the best candidate whose interval lies wholly
below its own, else a tie keeps it), and takes a model that returns its loss and a model-level
optimizer factory. The choices here are made on fake timings (tests/plan_fakes.py)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, plan, prepare
from trainopt_core.planner.choice import choose, measured_part, tied_with
from trainopt_core.planner.result import Plan, against_yours

from plan_fakes import use_fake_windows, without_time_budget


@pytest.fixture(autouse=True)
def _no_time_budget(monkeypatch):
    without_time_budget(monkeypatch)


def _row(name, k, speedup, low, high, **extra):
    return {"candidate": name, "precision": "fp32", "k": k, "peak_memory_bytes": 100.0, "speedup": speedup,
            "speedup_ci_low": low, "speedup_ci_high": high, "energy_j_per_sample": None, "rejected_because": None,
            "feasible": False, **extra}


def _costed(name, k, cost, low, high, **extra):
    """A row whose eq. 3 cost (time only: 1 / speedup) is `cost`, its interval `low`-`high`."""
    return _row(name, k, 1 / cost, 1 / high, 1 / low, **extra)


def _issue_case(**yours):
    """A script's fp32 k=4 among bf16 candidates whose cost intervals lie wholly below its own, and
    a fused-optimizer candidate of the lowest point cost whose wide interval (3 windows) overlaps it."""
    return [_row("fp32, k=1", 1, 1.0, 1.0, 1.0),
            _costed("fp32, k=4", 4, 0.871, 0.802, 0.946, yours=True, **yours),
            _costed("bf16, k=4", 4, 0.655, 0.618, 0.695), _costed("bf16, k=1", 1, 0.686, 0.641, 0.733),
            _costed("bf16, k=4, fused optimizer", 4, 0.611, 0.381, 0.981)]


def test_yours_is_replaced_by_the_best_candidate_whose_interval_lies_wholly_below_it():
    rows = _issue_case()
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    by_name = {row["candidate"]: row for row in rows}
    # the fused candidate has the lowest point cost, but its interval reaches into yours: it cannot
    # replace yours, and it no longer keeps yours either
    assert by_name["bf16, k=4"]["chosen"] and not by_name["fp32, k=4"].get("chosen")
    assert by_name["fp32, k=4"]["rejected_because"] == ("replaced: bf16, k=4's eq. 3 cost interval 0.618-0.695 lies "
                                                        "wholly below yours (0.802-0.946)")
    assert by_name["bf16, k=4, fused optimizer"]["rejected_because"] == (
        "lower point cost than the choice (0.611 vs 0.655) but its interval 0.381-0.981 is not wholly below yours "
        "(0.802-0.946), as the choice's is: within your configuration's timing noise")
    # bf16, k=1 is within each other's noise with the choice: the tie rule chose (here by changes from yours)
    assert by_name["bf16, k=1"]["rejected_because"] == (
        "tied with the choice (eq. 3 costs 0.686 vs 0.655, 95 % intervals 0.641-0.733 vs 0.618-0.695): the tie rule "
        "(fewer changes from the base, then lower peak memory, then the name) chose bf16, k=4, 0 vs 1 changes from the "
        "base")
    assert not any(note.startswith("Kept your configuration") for note in notes)


def test_a_higher_cost_shows_higher_in_its_digits_however_close():
    """A committed H200 plan said "higher eq. 3 cost (0.315 vs 0.315)": the costs are printed at the
    fewest significant digits (3 or more) at which they differ."""
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _costed("bf16, k=1", 1, 0.31478, 0.314, 0.317),
            _costed("bf16, k=1, fused optimizer", 1, 0.31512, 0.313, 0.318), _costed("bf16, k=4", 4, 0.4, 0.39, 0.41)]
    choose(rows, None, (1.0, 0.0, 0.0))
    by_name = {row["candidate"]: row for row in rows}
    assert by_name["bf16, k=1"]["chosen"]
    assert "(eq. 3 costs 0.3151 vs 0.3148, " in by_name["bf16, k=1, fused optimizer"]["rejected_because"]
    assert by_name["bf16, k=4"]["rejected_because"] == "higher eq. 3 cost (0.400 vs 0.315)"


def test_a_tie_among_the_candidates_not_worse_than_yours_keeps_yours_and_says_so_truly():
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _costed("fp32, k=4", 4, 0.871, 0.802, 0.946, yours=True),
            _costed("bf16, k=4", 4, 0.800, 0.700, 0.900), _costed("bf16, k=4, fused optimizer", 4, 0.611, 0.381, 0.981),
            _costed("bf16, k=8", 8, 0.990, 0.960, 1.000)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    by_name = {row["candidate"]: row for row in rows}
    assert by_name["fp32, k=4"]["chosen"]
    # a lower cost is never called a higher one
    assert by_name["bf16, k=4, fused optimizer"]["rejected_because"] == (
        "lower point cost than yours (0.611 vs 0.871) but within its timing noise: intervals 0.381-0.981 vs "
        "0.802-0.946 overlap; a tie keeps yours")
    assert by_name["bf16, k=4"]["rejected_because"].startswith("lower point cost than yours (0.800 vs 0.871)")
    assert by_name["bf16, k=8"]["rejected_because"].startswith("higher eq. 3 cost (0.990 vs 0.871)")
    (kept,) = [note for note in notes if note.startswith("Kept your configuration")]
    assert kept == ("Kept your configuration (fp32, k=4, eq. 3 cost 0.802-0.946): no candidate's cost interval lies "
                    "wholly below it; bf16, k=4, fused optimizer (0.381-0.981); bf16, k=4 (0.700-0.900) have a lower "
                    "point cost within its timing noise, and a tie keeps yours.")
    # without the mark, the lowest point cost's wide interval (0.381-0.981) ties every candidate whose
    # point cost lies inside it, and the tie rule chooses among them (these rows differ only by name)
    rows = [measured_part(dict(row, yours=False)) for row in rows]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert [row["candidate"] for row in rows if row.get("chosen")] == ["bf16, k=4"]


def test_every_reason_a_candidate_lost_is_true_of_its_numbers():
    for rows in (_issue_case(), [dict(row, yours=row["candidate"] == "bf16, k=1") for row in _issue_case()]):
        choose(rows, None, (1.0, 0.0, 0.0))
        chosen = next(row for row in rows if row.get("chosen"))
        for row in rows:
            reason = row["rejected_because"] or ""
            if row is chosen or not row["feasible"]:
                continue
            if row.get("yours"):  # replaced only by a candidate wholly below it
                assert reason.startswith("replaced") and chosen["cost_ci_high"] < row["cost_ci_low"], reason
                continue
            if reason.startswith("tied with the choice"):  # a tie, decided by the tie rule
                assert tied_with(row, min((r for r in rows if r["feasible"]), key=lambda r: r["cost"])) or \
                    tied_with(chosen, row), (row["candidate"], reason)
                continue
            assert reason.startswith("higher") == (row["cost"] > chosen["cost"]), (row["candidate"], reason)
            assert reason.startswith("lower") == (row["cost"] < chosen["cost"]), (row["candidate"], reason)


def test_the_callers_configuration_is_rejected_as_slower_only_on_its_whole_interval():
    # under load: a point estimate of 0.8x whose interval spans 0.08-4.7x
    rows = [_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _row("fp32, k=4", 4, 0.80, 0.08, 4.7, yours=True)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[1]["chosen"]  # kept: the baseline is within its noise
    # and said as such: no memory budget forced it
    assert not any("budget forces" in note for note in notes)
    assert any(note.startswith("The chosen configuration runs at 0.80x the fp32 baseline's speed by its point estimate")
               for note in notes)
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


def test_a_plan_with_fake_timing_replaces_a_slower_base_and_races_a_noisy_candidate_on(monkeypatch):
    """The case the rule was made for, timed by fakes (no choice here depends on the machine): a
    script's fp32 k=4 at about 1.15x the baseline, bf16 k=4 and k=1 at about 1.5x with narrow
    intervals, and the fused optimizer on bf16 k=4 of the highest point speed but so noisy that its
    interval reaches into yours: the race times it on, and it replaces nothing."""
    import trainopt_core.planner.space as space

    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ("bf16",))
    fake = use_fake_windows(monkeypatch, {"fp32, k=1": [10.0], "fp32, k=4": [11.0, 12.5, 11.0, 12.0, 11.5, 12.8],
                                          "bf16, k=4": [15.0, 15.6, 15.3], "bf16, k=1": [14.2, 15.0, 14.5],
                                          "bf16, k=4, fused optimizer": [26.0, 10.2, 16.0]})
    model = _ReturnsLoss()
    script = OptimizationConfig(name="script", precision="fp32", k=4, schedule="cosine", clip_norm=1.0)
    result = plan(model, lambda m: m.configure_optimizers(weight_decay=0.1, learning_rate=1e-3), _batch(),
                  lambda m, x, y: m(x, y)[1], loss_takes_model=True, optimizer_takes_model=True, base=script,
                  windows=3, steps_per_window=1)
    rows = {row["candidate"]: row for row in result.rows}
    fused, yours = rows["bf16, k=4, fused optimizer"], rows["fp32, k=4"]
    # the fused candidate, never slower beyond the noise, stayed in the race to its end
    assert fake.timed["bf16, k=4, fused optimizer"] == fused["timed_windows"] >= 6
    assert fused["cost_ci_low"] <= yours["cost_ci_high"] and fused["cost"] < rows["bf16, k=4"]["cost"]
    # replaced beyond the noise and the CPU's 5 % margin, paired with yours round by round
    assert result.chosen["candidate"] == "bf16, k=4" and result.chosen["cost_vs_yours_high"] * 1.05 < yours["cost"]
    assert (result.config.precision, result.config.k, result.config.schedule, result.config.clip_norm) == (
        "bf16", 4, "cosine", 1.0)
    assert yours["rejected_because"].startswith("replaced: bf16, k=4's eq. 3 cost interval")
    # over the race's rounds it is faster than yours beyond the noise too, but within the margin of
    # the lowest cost it ties with bf16 k=4, which the tie rule prefers: one change from yours, not two
    assert fused["rejected_because"].startswith("tied with the choice") and "1 vs 2 changes" in fused["rejected_because"]
    assert "race" in result.stage_s
    assert "Against your configuration (fp32, k=4, " in result.explain()
