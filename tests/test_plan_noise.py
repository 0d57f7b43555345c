"""plan() decides nothing inside the timing noise: no candidate is rejected as slower on a point
estimate whose interval reaches 1x; among tied candidates (within the lowest cost's interval, or
within a margin of it) one documented rule chooses (fewer changes from the base, then lower peak
memory, then the name); the first windows it
always takes are within the time budget even when the machine slows down after the candidates were
measured; and a plan that could time nothing but the baseline says it fell back. Every timing here
is fake (tests/plan_fakes.py)."""
import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, plan
from trainopt_core.planner.choice import TIE_RULE, choose, tie_margin

from plan_fakes import slow_steps, use_fake_windows

BASELINE = {"candidate": "fp32, k=1", "precision": "fp32", "k": 1, "peak_memory_bytes": 400.0, "speedup": 1.0,
            "speedup_ci_low": 1.0, "speedup_ci_high": 1.0, "energy_j_per_sample": None, "rejected_because": None,
            "feasible": False}


def _row(name, k, speedup, low, high, peak=400.0, precision="fp32", **extra):
    return dict(BASELINE, candidate=name, k=k, precision=precision, peak_memory_bytes=peak, speedup=speedup,
                speedup_ci_low=low, speedup_ci_high=high, **extra)


def _chosen(rows):
    return next(row["candidate"] for row in rows if row.get("chosen"))


def test_a_point_estimate_below_one_inside_an_interval_reaching_one_is_not_rejected_as_slower():
    rows = [dict(BASELINE), _row("fp32, k=2", 2, 0.97, 0.90, 1.04), _row("fp32, k=4", 4, 0.80, 0.72, 0.88)]
    choose(rows, None, (1.0, 0.0, 0.0))
    by_name = {row["candidate"]: row for row in rows}
    assert by_name["fp32, k=2"]["feasible"] and not by_name["fp32, k=2"]["rejected_because"].startswith("slower")
    assert by_name["fp32, k=4"]["rejected_because"] == ("slower than the fp32 baseline (0.80x, its 95 % interval "
                                                        "0.72-0.88 below 1x)")
    assert _chosen(rows) == "fp32, k=1"


def test_tied_candidates_with_as_many_changes_are_chosen_by_lower_peak_memory():
    # k=2 the fastest by its point estimate, k=4 within its noise and lighter: the rule, not the noise, decides
    rows = [dict(BASELINE), _row("fp32, k=2", 2, 1.50, 1.40, 1.60, peak=300.0 * 2**20),
            _row("fp32, k=4", 4, 1.45, 1.36, 1.55, peak=200.0 * 2**20),
            _row("fp32, k=8", 8, 1.20, 1.15, 1.25, peak=150.0 * 2**20)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    by_name = {row["candidate"]: row for row in rows}
    assert _chosen(rows) == "fp32, k=4"
    assert by_name["fp32, k=2"]["rejected_because"] == (
        f"tied with the choice (eq. 3 costs 0.667 vs 0.690, 95 % intervals 0.625-0.714 vs 0.645-0.735): the tie rule "
        f"({TIE_RULE}) chose fp32, k=4, the same changes from the base, its peak memory 200.0 MiB vs 300.0 MiB")
    assert by_name["fp32, k=8"]["rejected_because"].startswith("higher eq. 3 cost")  # outside the tie: lighter, slower
    assert ("Tied (each within the lowest cost's timing noise): 'fp32, k=2'; 'fp32, k=4'; chosen by the tie rule"
            in " ".join(notes))
    # the same numbers, whatever order the rows come in
    again = [dict(row, chosen=False, feasible=False, rejected_because=None) for row in reversed(rows)]
    choose(again, None, (1.0, 0.0, 0.0))
    assert _chosen(again) == "fp32, k=4"


def test_a_margin_ties_point_costs_that_close_beyond_one_sittings_intervals():
    # two narrow intervals 3 % apart: apart within this sitting, tied within a 5 % margin
    rows = [dict(BASELINE), _row("fp32, k=2", 2, 1.50, 1.49, 1.51), _row("fp32, k=2, fused optimizer", 2, 1.545,
                                                                         1.535, 1.555, optimizer_impl="fused")]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert _chosen(rows) == "fp32, k=2, fused optimizer"  # no margin: the lower cost
    rows = [dict(row, chosen=False, feasible=False, rejected_because=None) for row in rows]
    notes = choose(rows, None, (1.0, 0.0, 0.0), margin=tie_margin("cpu"))
    assert _chosen(rows) == "fp32, k=2"  # tied: one change from the baseline, not two
    assert any(note.startswith("Tied (each within the lowest cost's timing noise, or within 5 % of it)") for note in notes)
    assert tie_margin("cuda:0") == 0.01 and tie_margin(None) == 0.05


def test_at_the_same_peak_the_fewer_changes_from_the_base_win_the_tie():
    rows = [dict(BASELINE), _row("fp32, k=2", 2, 1.50, 1.40, 1.60),
            _row("fp32, k=2, fused optimizer", 2, 1.52, 1.42, 1.62, optimizer_impl="fused")]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert _chosen(rows) == "fp32, k=2"  # one change from the baseline, not two


def test_the_baseline_as_yours_is_replaced_only_by_what_is_faster_beyond_the_noise_and_then_by_the_rule():
    rows = [dict(BASELINE, yours=True), _row("fp32, k=2", 2, 1.06, 0.95, 1.18),
            _row("bf16, k=1", 1, 1.90, 1.80, 2.00, peak=300.0, precision="bf16"),
            _row("bf16, k=2", 2, 1.85, 1.76, 1.95, peak=250.0, precision="bf16")]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert _chosen(rows) == "bf16, k=1"  # both bf16 wholly below the baseline, tied: the fewer changes
    assert rows[0]["rejected_because"].startswith("replaced: bf16, k=1's eq. 3 cost interval")
    rows = [dict(BASELINE, yours=True), _row("fp32, k=2", 2, 1.06, 0.95, 1.18)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    assert _chosen(rows) == "fp32, k=1"  # within the noise: a tie keeps yours
    assert any(note.startswith("Kept your configuration") for note in notes)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))


def _plan(**kwargs):
    generator = torch.Generator().manual_seed(1)
    batch = torch.randn(64, 32, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    return plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch, nn.functional.cross_entropy,
                windows=3, steps_per_window=2, base=OptimizationConfig.baseline(), **kwargs)


@pytest.fixture
def fp32_only(monkeypatch):
    import trainopt_core.planner.space as space

    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ())  # the same candidates on every CPU


def test_first_windows_that_no_longer_fit_are_left_out_when_the_machine_slows_down(monkeypatch, fp32_only):
    """Measured at 1 s a step, timed at 1.5 s (a load that arrived in between): the windows every
    candidate must have for an interval would overrun the budget; those that do not fit are left
    out, named, and planning ends within its budget + 10 %."""
    clock = slow_steps(monkeypatch, lambda name: 1.0)
    use_fake_windows(monkeypatch, {"fp32, k=1": [10.0], "fp32, k=2": [20.0, 20.5, 19.5], "fp32, k=4": [18.0]},
                     clock=clock, step_s=lambda name: 1.5)
    started = clock.now
    result = _plan(time_budget_s=30.0, speed_options=False)
    assert clock.now - started <= 1.1 * 30.0
    rows = {row["candidate"]: row for row in result.rows}
    left_out = [name for name, row in rows.items() if (row["rejected_because"] or "").startswith("not timed")]
    assert left_out and all(rows[name]["speedup"] is None for name in left_out)
    assert rows["fp32, k=2"]["timed_windows"] >= 2  # the base's first split, measured and timed first
    note = next(note for note in result.notes if note.startswith("Planning time budget 30 s"))
    assert "not timed: " + repr(left_out[0]) in note


def test_a_plan_that_times_nothing_but_the_baseline_says_it_fell_back(monkeypatch, fp32_only):
    clock = slow_steps(monkeypatch, lambda name: 10.0)
    use_fake_windows(monkeypatch, {}, clock=clock, step_s=lambda name: 10.0)
    result = _plan(time_budget_s=25.0)
    assert result.fell_back and result.chosen["candidate"] == "fp32, k=1"
    assert result.notes[0].startswith("Fell back to the fp32 baseline: within the planning time budget nothing else")
    assert result.to_dict()["fell_back"] is True


def test_a_plan_whose_measured_candidates_all_lose_their_first_windows_still_chooses_the_baseline(monkeypatch,
                                                                                                fp32_only):
    """The baseline measured fast, the next candidate slow (the load rose): its first windows no
    longer fit, nothing is timed beside the baseline, and the plan chooses it, saying so (a busy
    sitting once raised 'no candidate fits' here)."""
    clock = slow_steps(monkeypatch, lambda name: 0.5 if name == "fp32, k=1" else 6.0)
    use_fake_windows(monkeypatch, {}, clock=clock, step_s=lambda name: 6.0)
    result = _plan(time_budget_s=30.0)
    assert result.fell_back and result.chosen["candidate"] == "fp32, k=1"
    assert any((row["rejected_because"] or "").startswith("not timed") for row in result.rows)
