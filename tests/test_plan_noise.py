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
    assert ("Tied (the timing cannot tell any from the lowest cost): 'fp32, k=2'; 'fp32, k=4'; chosen by the tie rule"
            in " ".join(notes))
    # the same numbers, whatever order the rows come in
    again = [dict(row, chosen=False, feasible=False, rejected_because=None) for row in reversed(rows)]
    choose(again, None, (1.0, 0.0, 0.0))
    assert _chosen(again) == "fp32, k=4"


def test_candidates_apart_paired_round_by_round_are_not_tied_however_close():
    """A tie is what the timing cannot tell apart: two narrow intervals 3 % apart are apart, and
    the faster is chosen; the kind's margin is what replacing the base must clear, not a tie."""
    rows = [dict(BASELINE), _row("fp32, k=2", 2, 1.50, 1.49, 1.51), _row("fp32, k=2, fused optimizer", 2, 1.545,
                                                                         1.535, 1.555, optimizer_impl="fused")]
    choose(rows, None, (1.0, 0.0, 0.0), margin=tie_margin("cpu"))
    assert _chosen(rows) == "fp32, k=2, fused optimizer"
    # paired round by round the two cannot be told apart (the fused one 1.03x [0.99, 1.07] k=2's
    # speed), though their own intervals are apart: a tie, and the rule takes the fewer changes
    pairs = {("fp32, k=2", "fp32, k=2, fused optimizer"): {"mean": 0.97, "ci_low": 0.93, "ci_high": 1.01}}
    rows = [dict(row, chosen=False, feasible=False, rejected_because=None) for row in rows]
    notes = choose(rows, None, (1.0, 0.0, 0.0), paired=lambda a, b: pairs.get((a, b)))
    assert _chosen(rows) == "fp32, k=2"
    assert any(note.startswith("Tied (the timing cannot tell any from the lowest cost, paired round by round)")
               for note in notes)
    pairs[("fp32, k=2", "fp32, k=2, fused optimizer")] = {"mean": 0.97, "ci_low": 0.95, "ci_high": 0.99}
    rows = [dict(row, chosen=False, feasible=False, rejected_because=None) for row in rows]
    choose(rows, None, (1.0, 0.0, 0.0), paired=lambda a, b: pairs.get((a, b)))
    assert _chosen(rows) == "fp32, k=2, fused optimizer"  # paired, wholly slower: apart
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


def test_the_base_is_replaced_only_beyond_the_noise_and_the_kinds_margin():
    """Apart within this sitting (a narrow interval wholly above 1x) is not enough: the same ratios
    move about 5 % between sittings of a CPU, so the base stays unless the whole interval clears
    1.05x -- the margin that makes a tie among candidates reaches the base too."""
    margin = tie_margin("cpu")
    rows = [dict(BASELINE, yours=True), _row("fp32, k=1, fused optimizer", 1, 1.03, 1.02, 1.04, optimizer_impl="fused")]
    notes = choose(rows, None, (1.0, 0.0, 0.0), margin=margin)
    assert _chosen(rows) == "fp32, k=1"
    assert rows[1]["rejected_because"].startswith("lower point cost than yours (0.971 vs 1.000) but not by more than 5 %")
    assert any(note.startswith("Kept your configuration (fp32, k=1, eq. 3 cost 1.000-1.000): no candidate's cost "
                               "interval lies wholly below it by more than 5 %") for note in notes)
    rows = [dict(BASELINE, yours=True), _row("fp32, k=1, fused optimizer", 1, 1.08, 1.06, 1.10, optimizer_impl="fused")]
    choose(rows, None, (1.0, 0.0, 0.0), margin=margin)
    assert _chosen(rows) == "fp32, k=1, fused optimizer"  # its whole interval above 1.05x
    rows = [dict(BASELINE, yours=True), _row("fp32, k=1, fused optimizer", 1, 1.03, 1.02, 1.04, optimizer_impl="fused")]
    choose(rows, None, (1.0, 0.0, 0.0))
    assert _chosen(rows) == "fp32, k=1, fused optimizer"  # no margin (a device kind's margin is the planner's to pass)


def test_against_yours_the_interval_paired_with_yours_decides_not_the_two_own_intervals():
    # yours (fp32, k=4) and a candidate each noisy against the baseline, but paired with yours round
    # by round the candidate is 1.20x [1.15, 1.25]: replaced, though their own intervals overlap
    yours = _row("fp32, k=4", 4, 1.20, 0.90, 1.60, yours=True)
    fast = _row("fp32, k=2", 2, 1.44, 1.08, 1.92, vs_yours=1.20, vs_yours_ci_low=1.15, vs_yours_ci_high=1.25)
    rows = [dict(BASELINE), yours, fast]
    choose(rows, None, (1.0, 0.0, 0.0), margin=tie_margin("cpu"))
    assert _chosen(rows) == "fp32, k=2" and yours["rejected_because"].startswith("replaced: fp32, k=2")
    rows = [dict(BASELINE), dict(yours, chosen=False, rejected_because=None),
            dict(fast, vs_yours=1.04, vs_yours_ci_low=1.02, vs_yours_ci_high=1.06, chosen=False, rejected_because=None)]
    choose(rows, None, (1.0, 0.0, 0.0), margin=tie_margin("cpu"))
    assert _chosen(rows) == "fp32, k=4"  # faster than yours in every round, but not beyond the margin


def test_the_tie_rule_in_the_docs_is_the_codes():
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "planner.md").read_text().split())
    assert f"**{TIE_RULE.replace('base,', 'base (yours, else the fp32 baseline),')}**" in text


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
    import trainopt_core.planner.search as search

    monkeypatch.setattr(search, "MIN_RACE_ROUNDS", 0)  # nothing kept for the race: every split is measured
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


def test_a_plan_that_times_nothing_but_yours_keeps_yours_never_the_baseline_in_its_place(monkeypatch, fp32_only):
    """A script's fp32, k=4 on a machine too slow for the budget: yours is timed beside the baseline
    (always), nothing else fits, and the plan keeps yours and says it fell back -- though the
    baseline measured faster on that one thin timing."""
    clock = slow_steps(monkeypatch, lambda name: 10.0)
    use_fake_windows(monkeypatch, {"fp32, k=1": [12.0, 11.0], "fp32, k=4": [10.0, 9.0]}, clock=clock,
                     step_s=lambda name: 10.0)
    generator = torch.Generator().manual_seed(1)
    batch = torch.randn(64, 32, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    script = OptimizationConfig(name="script", k=4, clip_norm=1.0)
    result = plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch, nn.functional.cross_entropy,
                  windows=3, steps_per_window=2, base=script, time_budget_s=60.0)
    rows = {row["candidate"]: row for row in result.rows}
    assert rows["fp32, k=4"]["timed_windows"] >= 2 and rows["fp32, k=2"]["speedup"] is None
    assert result.fell_back and result.chosen["candidate"] == "fp32, k=4"
    assert (result.config.k, result.config.clip_norm, result.config.name) == (4, 1.0, "script")
    assert result.notes[0].startswith("Fell back to your configuration (fp32, k=4): within the planning time budget")
    assert rows["fp32, k=1"]["rejected_because"].startswith("not chosen: the plan fell back")


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
