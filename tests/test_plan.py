"""plan(): candidates measured on the user's model, chosen by eq. 3 within a memory budget."""
import json
import math

import pytest
import torch
from torch import nn

from trainopt_core.planner import Plan, pareto_front, plan
from trainopt_core.planner.result import _ineligible_reasons

from plan_fakes import FakeWindows, use_fake_windows, without_time_budget


@pytest.fixture(autouse=True)
def _no_time_budget(monkeypatch):
    without_time_budget(monkeypatch)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def _batch(size=64):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(size, 64, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def _plan(**kwargs):
    return plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                windows=2, steps_per_window=1, **kwargs)


# fake timing: fp32 k=2 clearly the fastest split, the fused optimizer on it faster still (the
# choices of these tests must not depend on how busy the machine is)
CLEAR_RATES = {"fp32, k=1": [10.0, 10.2, 9.8], "fp32, k=2": [20.0, 20.4, 19.6], "fp32, k=2, fused optimizer": [30.0]}


def test_without_a_budget_the_plan_is_never_slower_than_fp32_and_leaves_the_model_alone(monkeypatch):
    fake = use_fake_windows(monkeypatch, CLEAR_RATES)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = plan(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  windows=2, steps_per_window=1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    rows = {row["candidate"]: row for row in result.rows}
    assert rows["fp32, k=1"]["speedup"] == 1.0
    assert result.chosen["candidate"] == "fp32, k=2, fused optimizer" and result.chosen["feasible"]
    assert {row["k"] for row in result.rows} == {1, 2, 4, 8}
    assert all(row["checkpointing"] is None for row in result.rows)  # memory does not count: not measured
    # the speed options were tried on the best precision x split
    assert {row["optimizer_impl"] for row in result.rows} >= {"default", "fused"}  # AdamW has fused CPU kernels
    assert all(row["memory_format"] == "contiguous" for row in result.rows)  # no convolutions
    assert not any(row["compile"] for row in result.rows)  # not tried on a CPU by default
    assert all(row["loss_rel_diff"] < 0.05 for row in result.rows)
    assert "Chose" in result.explain() and result.config.name == "auto"
    # stage 1 (2 windows), then the speed option on the best of stage 1, its first estimate beside
    # the baseline alone (2 windows); then the race: 3 rounds, after which k=2 (3 rounds shared with
    # the fused one) is slower beyond the noise and dropped; every round with the baseline, every
    # window paired with its
    assert rows["fp32, k=2, fused optimizer"]["timed_windows"] == 5 == fake.timed["fp32, k=2, fused optimizer"]
    assert rows["fp32, k=2"]["timed_windows"] == 5
    assert rows["fp32, k=1"]["timed_windows"] == fake.timed["fp32, k=1"] == 7
    assert rows["fp32, k=2"]["rejected_because"].startswith("dropped from the race after 3 shared rounds: 0.667x")
    assert any(note.startswith("Raced 3 round(s) after the first estimates (decided)") for note in result.notes)
    # where planning time went, by stage: checkpointing not tried (memory does not count)
    assert list(result.stage_s) == ["precision x split", "speed options", "race"]
    assert 0 < sum(result.stage_s.values()) <= result.planning_s
    assert "Planning took" in result.explain() and "(precision x split " in result.explain()


def test_a_budget_below_the_baseline_is_met_and_the_plan_says_the_baseline_was_ruled_out():
    # a batch large enough for activations, which splitting shrinks, to outweigh the optimizer state
    def planned(**kwargs):
        return plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(2048), nn.functional.cross_entropy,
                    ks=(1, 8), windows=2, steps_per_window=1, speed_options=False, **kwargs)

    unconstrained = planned()
    base = unconstrained.baseline["peak_memory_bytes"]
    small = min(row["peak_memory_bytes"] for row in unconstrained.rows)
    assert small < 0.7 * base
    budget = (small + base) / 2
    result = planned(memory_budget_bytes=budget)
    assert result.chosen["peak_memory_bytes"] <= budget
    assert any("rules out the fp32 baseline" in note for note in result.notes)
    assert "over the budget" in {row["candidate"]: row for row in result.rows}[
        "fp32, k=1"]["rejected_because"]


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
    with pytest.raises(ValueError, match=r"run_samples=0 is invalid: allowed None \(the run's length unknown\)"):
        _plan(run_samples=0)


def _deep_model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.LayerNorm(128)) for _ in range(9)],
                         nn.Linear(128, 10))


def _deep_plan(**kwargs):
    generator = torch.Generator().manual_seed(1)
    batch = torch.randn(256, 128, generator=generator), torch.randint(0, 10, (256,), generator=generator)
    return plan(_deep_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch, nn.functional.cross_entropy,
                ks=(1,), windows=2, steps_per_window=1, speed_options=False, **kwargs)


def test_a_budget_only_checkpointing_meets_makes_the_plan_checkpoint_and_fit():
    unconstrained = _deep_plan(weights=(1, 1, 0))  # memory counts: checkpointing measured
    plain = {row["precision"]: row["peak_memory_bytes"] for row in unconstrained.rows if row["checkpointing"] is None}
    checkpointed = min(row["peak_memory_bytes"] for row in unconstrained.rows if row["checkpointing"] is not None)
    assert checkpointed < min(plain.values())
    budget = (checkpointed + min(plain.values())) / 2
    result = _deep_plan(memory_budget_bytes=budget)
    assert result.chosen["checkpointing"] is not None and result.chosen["peak_memory_bytes"] <= budget
    assert result.config.checkpointing == result.chosen["checkpointing"]
    assert {row["checkpoint_policy"] for row in result.rows if row["peak_memory_bytes"]} >= {"full", "selective"}
    assert all("over the budget" in row["rejected_because"] for row in result.rows
               if row["checkpointing"] is None and row["precision"] == "fp32")


def _with_rows(result, change, **values):
    """`result` stored and loaded again with each of its rows replaced by change(row) (and `values`
    set): a plan whose eligibility is set by the test, not by how fast each candidate ran."""
    stored = dict(result.to_dict(), **values)
    stored["rows"] = [change(row) for row in result.rows]
    return Plan.from_dict(stored)


def _legend(result) -> list[str]:
    legend = result.pareto_figure().axes[0].get_legend()
    return [text.get_text() for text in legend.get_texts()]


def test_rechoose_applies_other_weights_to_the_same_measurements_and_a_plan_survives_json():
    result = _deep_plan(weights=(1, 1, 0))
    memory_only = result.rechoose(weights=(0, 1, 0))
    measured = [row for row in memory_only.rows if row["feasible"] or row.get("chosen")]
    assert memory_only.chosen["peak_memory_bytes"] == min(row["peak_memory_bytes"] for row in measured)
    assert result.rechoose().chosen["candidate"] == result.chosen["candidate"]
    again = Plan.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.config == result.config and again.rows == result.rows and again.stage_s == result.stage_s
    assert "checkpointing" in result.stage_s  # memory counts (w2 > 0): the stage ran
    older = result.to_dict()
    del older["stage_s"]  # a plan stored before stage timings were kept
    assert Plan.from_dict(older).stage_s == {}
    figure = result.pareto_figure(data="stand-in: test (NOT CIFAR-10)")
    ax = figure.axes[0]
    assert ax.get_xlabel().startswith("peak memory") and "NOT CIFAR-10" in ax.get_title()
    # the legend names the markers drawn, and only those; which candidates are eligible is set
    # here, not left to how fast each ran in this sitting
    drawn = [r for r in result.rows if r.get("speedup") and r["peak_memory_bytes"] is not None]
    assert ("with checkpointing" in _legend(result)) == any(r["checkpointing"] is not None for r in drawn)
    eligible = dict(feasible=True, rejected_because=None)
    assert not any(t.startswith("not eligible") for t in _legend(_with_rows(result, lambda row: dict(row, **eligible))))
    slower = _with_rows(result, lambda row: dict(row, **eligible) if row is result.chosen or row["checkpointing"] is None
                        else dict(row, feasible=False, rejected_because="slower than the fp32 baseline (0.90x)"))
    assert [t for t in _legend(slower) if t.startswith("not eligible")] \
        == ["not eligible: slower than the fp32 baseline (see the table)"]
    assert "eligible candidate" in _legend(slower)  # no budget, so none is said
    budget = max(r["peak_memory_bytes"] for r in drawn if r is not result.chosen) - 1
    over = _with_rows(result, lambda row: dict(row, **eligible) if row is result.chosen
                      or (row["peak_memory_bytes"] or 0) <= budget
                      else dict(row, feasible=False, rejected_because="over the budget: peak 9 MiB"),
                      memory_budget_bytes=budget)
    assert [t for t in _legend(over) if t.startswith("not eligible")] \
        == ["not eligible: over the memory budget (see the table)"]
    assert "eligible candidate, within the memory budget" in _legend(over)
    assert _ineligible_reasons(["slower than the fp32 baseline (0.93x)", "over the budget: peak 9 MiB",
                                "slower than the fp32 baseline (0.72x)", "out of memory: even timed alone", None]) \
        == "slower than the fp32 baseline, over the memory budget, failed"


def test_the_explorers_budget_line_names_the_choice_or_says_that_no_measured_candidate_fits():
    from trainopt_core.reporting import plans as planning

    result = _deep_plan(weights=(1, 1, 0))
    smallest = min(row["peak_memory_bytes"] for row in result.rows if row["peak_memory_bytes"] is not None)
    fits = smallest / result.baseline["peak_memory_bytes"] * 1.01
    assert planning.choice_under_budget(result, fits) == result.rechoose(memory_budget_bytes=fits * result.baseline[
        "peak_memory_bytes"]).chosen["candidate"]
    none = planning.choice_under_budget(result, fits / 2)
    assert none.startswith("none of the measured candidates fits (the smallest peak, ") and "plan() with" in none


def test_pareto_front_keeps_what_nothing_beats_on_both_time_and_memory():
    rows = [{"candidate": name, "peak_memory_bytes": memory, "speedup": speedup}
            for name, memory, speedup in (("a", 100, 1.0), ("b", 50, 0.8), ("c", 60, 0.7), ("d", 120, 1.5),
                                          ("e", 120, 1.2))]
    assert [row["candidate"] for row in pareto_front(rows)] == ["b", "a", "d"]


def test_dropout_and_batch_statistics_are_not_mistaken_for_a_quality_loss():
    # in training mode each micro-batch has its own BatchNorm statistics and dropout masks differ
    # between candidates: the probe loss is taken in eval mode, where only the numerics differ
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    result = plan(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  ks=(1, 2, 4), windows=2, steps_per_window=1, speed_options=False)
    for row in result.rows:
        if row["precision"] == "fp32":
            assert row["loss_rel_diff"] < 1e-5 and not (row["rejected_because"] or "").startswith("quality"), row


def test_with_adaptive_accumulation_the_plan_splits_at_least_in_two_and_chooses_k_by_goodput(monkeypatch):
    use_fake_windows(monkeypatch, CLEAR_RATES)  # k = 2 chosen, whatever the machine's load
    result = _plan(adaptive_accumulation=True, k_max=6)
    assert result.chosen["k"] == 2
    config, good = result.config, result.goodput
    assert config.adaptive and config.k_min == result.chosen["k"] >= 2 and config.k_max == 6
    assert config.k == good["k"] == max(good["rows"], key=lambda row: row["goodput"])["k"]
    assert [row["k"] for row in good["rows"]] == list(range(config.k_min, 7))
    assert good["micro_batch_size"] == 64 / config.k_min and good["micro_s"] > 0 and good["optimizer_s"] > 0
    assert good["noise_scale"]["micro_batches"] == 16 and good["noise_scale"]["ci_low"] > 0
    assert result.rows[0]["candidate"] == "fp32, k=1" and "planned with k >= 2" in result.rows[0]["rejected_because"]
    assert "Adaptive accumulation: gradient noise scale B_simple" in result.explain()
    config.validate_for_run(device="cpu")
    again = Plan.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.goodput["k"] == good["k"] and again.rechoose().config == config
    assert result.goodput_figure().axes[0].get_xlabel().startswith("k (micro-batches")
    with pytest.raises(ValueError, match="adaptive_accumulation=True"):
        _plan(ks=(1, 2)).goodput_figure()
    with pytest.raises(ValueError, match="k_max=1 is invalid"):
        _plan(adaptive_accumulation=True, k_max=1)
    with pytest.raises(ValueError, match=r"ks=\(1,\) is invalid: allowed at least one k >= 2"):
        _plan(adaptive_accumulation=True, ks=(1,))


def test_goodput_grows_k_only_where_the_optimizer_step_is_worth_spreading():
    from trainopt_core.planner.adaptive import goodput_choice

    chosen = {"k": 2, "candidate": "fp32, k=2", "seconds_per_sample": 0.001}
    noise = {"b_simple": 1000.0, "ci_low": 300.0, "ci_high": math.inf}
    # b = 32: k* = sqrt(1000 * 0.05 / (32 * 0.01)) = 12.5, past k_max
    costly = goodput_choice(chosen, noise, optimizer_s=0.05, micro_s=0.01, batch_size=64, k_max=8)
    assert costly["k"] == 8 and costly["closed_form_k"] == pytest.approx(12.5, rel=1e-3)
    cheap = goodput_choice(chosen, noise, optimizer_s=1e-4, micro_s=0.01, batch_size=64, k_max=8)
    assert cheap["k"] == 2 and cheap["k_at_interval"] == [2, 8]  # an unbounded noise scale: every sample counts fully
    # without a measured micro-batch time it comes from the row: 0.001 s/sample * 64 - 1e-4, over k = 2
    derived = goodput_choice(chosen, noise, optimizer_s=1e-4, micro_s=None, batch_size=64, k_max=8)
    assert derived["micro_s"] == pytest.approx((0.064 - 1e-4) / 2)


def _timed_row(name, k, speedup, low, high, peak=100.0):
    return {"candidate": name, "precision": "fp32", "k": k, "peak_memory_bytes": peak, "speedup": speedup,
            "speedup_ci_low": low, "speedup_ci_high": high, "energy_j_per_sample": None, "rejected_because": None,
            "feasible": False}


def test_a_candidate_that_loses_only_within_the_timing_noise_is_said_to():
    from trainopt_core.planner.choice import choose

    rows = [_timed_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _timed_row("fp32, k=2", 2, 1.30, 1.20, 1.40),
            _timed_row("fp32, k=4", 4, 1.25, 1.15, 1.35), _timed_row("fp32, k=8", 8, 1.10, 1.05, 1.12)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    by_name = {row["candidate"]: row for row in rows}
    assert by_name["fp32, k=2"]["chosen"]
    assert by_name["fp32, k=2"]["cost_ci_low"] == pytest.approx(1 / 1.40)
    assert by_name["fp32, k=2"]["cost_ci_high"] == pytest.approx(1 / 1.20)
    # k=4's cost interval [0.741, 0.870] holds k=2's point (0.769) and k=2's [0.714, 0.833] holds k=4's
    # (0.800): a tie, which the tie rule decides (the same peak memory and one change each: by name);
    # k=8's [0.893, 0.952] and the baseline's [1, 1] do not overlap k=2's
    assert by_name["fp32, k=4"]["rejected_because"] == (
        "tied with the choice (eq. 3 costs 0.800 vs 0.769, 95 % intervals 0.741-0.870 vs 0.714-0.833): the tie rule "
        "(fewer changes from the base, then lower peak memory, then the name) chose fp32, k=2, the same changes from "
        "the base and peak memory: by name")
    assert "noise" not in by_name["fp32, k=8"]["rejected_because"] and "noise" not in by_name["fp32, k=1"]["rejected_because"]
    assert notes == ["Within the timing noise of the choice (eq. 3 cost intervals overlap): 'fp32, k=4'; a plan made "
                     "again may choose one of them where its timing moves them into or out of the choice's tie.",
                     "Tied (the timing cannot tell any from the lowest cost): 'fp32, k=2'; 'fp32, k=4'; chosen by the tie "
                     "rule (fewer changes from the base, then lower peak memory, then the name): 'fp32, k=2'."]
    # a candidate whose interval reaches 1x is tied with the baseline itself: the rule keeps the baseline
    rows = [_timed_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _timed_row("fp32, k=2", 2, 1.26, 0.90, 1.57)]
    notes = choose(rows, None, (1.0, 0.0, 0.0))
    assert rows[0]["chosen"] and rows[1]["rejected_because"].startswith("tied with the choice")
    assert rows[1]["rejected_because"].endswith("chose fp32, k=1, 0 vs 1 changes from the base")
    assert "'fp32, k=2'" in notes[0] and "chosen by the tie rule" in notes[-1]


def test_a_compiled_candidate_is_judged_over_the_run_its_compile_time_spread_over_its_samples():
    from trainopt_core.planner.choice import choose

    def rows():  # the baseline at 1 ms per sample; compiling wins 1.5x per step but takes 40 s to compile
        made = [_timed_row("fp32, k=1", 1, 1.0, 1.0, 1.0), _timed_row("fp32, k=2", 2, 1.2, 1.15, 1.25),
                dict(_timed_row("fp32, k=2, compiled", 2, 1.5, 1.4, 1.6), compile_s=40.0)]
        made[0]["seconds_per_sample"] = 1e-3
        return made

    def chosen(made):
        return next(row["candidate"] for row in made if row.get("chosen"))

    unknown = rows()  # the run's length unknown: per-step speed alone, as before
    choose(unknown, None, (1.0, 0.0, 0.0))
    assert chosen(unknown) == "fp32, k=2, compiled" and unknown[2].get("speedup_over_run") is None

    short = rows()  # 1,000 samples: 40 ms of compiling per sample against 0.67 ms of computing
    choose(short, None, (1.0, 0.0, 0.0), run_samples=1_000)
    assert chosen(short) == "fp32, k=2"
    assert short[2]["speedup_over_run"] == pytest.approx(1e-3 / (1e-3 / 1.5 + 40.0 / 1_000))
    assert short[2]["rejected_because"] == ("slower than the fp32 baseline over the run (0.02x: 1.50x per step, but "
                                            "compiling took 40.0 s, spread over 1,000 samples)")

    # 165,000 samples: 1.10x over the run, faster than the baseline but not than the uncompiled 1.2x
    middle = rows()
    choose(middle, None, (1.0, 0.0, 0.0), run_samples=165_000)
    assert middle[2]["speedup_over_run"] == pytest.approx(1.10, abs=1e-3)
    assert chosen(middle) == "fp32, k=2" and middle[2]["cost"] == pytest.approx(1 / 1.10, abs=1e-3)
    assert middle[2]["feasible"] and middle[2]["rejected_because"].startswith("higher eq. 3 cost")

    long = rows()  # 100 million samples: the compile time is nothing
    notes = choose(long, None, (1.0, 0.0, 0.0), run_samples=100_000_000)
    assert chosen(long) == "fp32, k=2, compiled"
    assert notes[-1].startswith("The choice compiles: 1.50x the baseline per step, 1.50x over the run's "
                                "100,000,000 samples, where compiling took 40.0 s")

    # the run compiles from the cache the plan filled: 0.5 s, not 40 s, and at 165,000 samples
    # compiling now repays (1.49x over the run against the uncompiled 1.2x)
    warm = rows()
    warm[2]["run_compile_s"] = 0.5
    notes = choose(warm, None, (1.0, 0.0, 0.0), run_samples=165_000)
    assert chosen(warm) == "fp32, k=2, compiled"
    assert warm[2]["speedup_over_run"] == pytest.approx(1e-3 / (1e-3 / 1.5 + 0.5 / 165_000))
    assert ("where compiling takes the run 0.5 s (from the compile cache the plan filled; 40.0 s cold)"
            in notes[-1])


def test_a_compiling_candidate_records_its_compile_time_and_a_short_run_does_not_pay_for_it(monkeypatch):
    import trainopt_core.planner.stages as stages

    monkeypatch.setattr(stages, "COMPILE_FLOOR_S", 0.0)  # compiled even for a run this short
    # samples/s as a small model's on a CPU: a compile's seconds outweigh 64 samples' steps
    use_fake_windows(monkeypatch, {"fp32, k=1": [1e4], "fp32, k=1, fused optimizer": [2e4, 2.05e4, 1.95e4],
                                   "fp32, k=1, fused optimizer, compiled": [3e4, 3.1e4, 2.9e4]})
    result = _plan(ks=(1,), try_compile=True, run_samples=64)
    # only the finalist, the best eager candidate, is compiled
    (compiled,) = [row for row in result.rows if row["compile"]]
    assert compiled["candidate"] == "fp32, k=1, fused optimizer, compiled"
    assert compiled["compile_s"] > 0 and result.compile_s == pytest.approx(compiled["compile_s"])
    assert all(row["compile_s"] is None for row in result.rows if not row["compile"])
    # one step's worth of samples cannot earn back a compilation
    assert not compiled.get("chosen") and "over the run" in compiled["rejected_because"]
    assert result.run_samples == 64
    again = Plan.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.run_samples == 64 and again.rechoose().chosen["candidate"] == result.chosen["candidate"]
    assert "over the run" in next(row for row in again.rechoose().rows if row["compile"])["rejected_because"]
    from trainopt_core.reporting.plans import format_plan_table

    table = format_plan_table(result)
    cell = table.loc[table["Candidate"].str.contains("compiled"), "vs fp32 baseline (95% interval)"].item()
    # what the run pays: the compiling step again from the compile cache the plan filled (a
    # second plan in this process may find the first's cache: no claim which is faster here)
    assert compiled["run_compile_s"] > 0
    assert (f"× over the run (compiling {compiled['compile_s']:.1f} s; the run's, from the plan's cache, "
            f"{compiled['run_compile_s']:.1f} s)") in cell


class _ConstantPowerMeter:
    """An energy counter reading a constant 50 W: energy = 50 J/s × the wall time measured."""

    def __init__(self, device="cpu"):
        self.energy_j, self.energy_source = None, "fake: 50 W constant"

    def start(self):
        import time

        self._start = time.perf_counter()
        return self

    def stop(self):
        import time

        self.energy_j = 50.0 * (time.perf_counter() - self._start)
        return self.energy_j, self.energy_source

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def test_where_a_counter_is_readable_energy_per_sample_is_measured_and_weighed(monkeypatch):
    import trainopt_core.planner.search as search
    import trainopt_core.planner.timing as timing

    monkeypatch.setattr(search, "EnergyMeter", _ConstantPowerMeter)  # the counter's probe
    monkeypatch.setattr(timing, "EnergyMeter", _ConstantPowerMeter)  # the candidates' energy
    result = _plan(ks=(1, 2, 4), speed_options=False, weights=(1e-9, 0, 1))  # time must weigh something
    measured = [row for row in result.rows if row["speedup"] is not None]
    assert result.energy_source == "fake: 50 W constant" and "Energy: fake" in result.explain()
    assert all(row["energy_j_per_sample"] > 0 for row in measured)
    assert not any("Energy weight" in note for note in result.notes)
    # energy alone decides: the chosen row has the lowest eq. 3 cost, i.e. the least energy per sample,
    # unless the least is tied with it (its energy measured on the machine's clock), which the tie rule decides
    feasible = [row for row in measured if row["feasible"]]
    least = min(feasible, key=lambda row: row["energy_j_per_sample"])
    assert least is result.chosen or least["candidate"] == result.chosen["candidate"] or \
        least["rejected_because"].startswith("tied with the choice"), least["rejected_because"]


def test_without_a_counter_an_energy_weight_is_dropped_and_said():
    result = _plan(ks=(1, 2), speed_options=False, weights=(1, 0, 1))
    if result.energy_source is None:  # no readable RAPL/NVML counter on this machine
        assert any(note.startswith("Energy weight 1.0 not used") for note in result.notes)
        assert all(row["energy_j_per_sample"] is None for row in result.rows)


def _held_bytes_of_one_copy():
    """What one candidate's copy holds between steps: weights and AdamW state (gradients freed)."""
    from trainopt_core.measure.tracker import state_bytes

    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _batch()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return state_bytes(model, optimizer)


def test_where_device_memory_is_short_candidates_are_timed_in_groups_each_with_the_baseline(monkeypatch):
    import weakref

    import trainopt_core.planner.search as search

    unlimited = _plan(ks=(1, 2, 4))  # one group per round, nothing released
    assert not any(note.startswith("Timed in groups") for note in unlimited.notes)
    # room for one copy's step (the baseline's is the largest) and one more copy, not for three
    held = _held_bytes_of_one_copy()
    capacity = unlimited.baseline["peak_memory_bytes"] + 1.25 * held
    assert 3 * held + 0.5 * unlimited.baseline["peak_memory_bytes"] > capacity

    live, most = weakref.WeakSet(), [0]

    class CountedTrial(search.Trial):
        def __init__(self, *args, **kwargs):
            import gc

            gc.collect()
            live.add(self)
            most[0] = max(most[0], len(live))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(search, "Trial", CountedTrial)
    result = _plan(ks=(1, 2, 4), planning_memory_bytes=capacity)
    assert most[0] == 2
    rows = {row["candidate"]: row for row in result.rows}
    stage1 = [name for name in rows if name.count(",") == 1]
    assert len(stage1) >= 3 and all(rows[name]["timed_windows"] >= 2 for name in stage1)
    # the baseline is timed in every group, each other candidate in one group per round: the
    # baseline has more windows than any of them (comparing with the unlimited plan's count
    # depended on whether the timing noise gave a near-ties round in one plan and not the other)
    others = [rows[name]["timed_windows"] for name in stage1 if name != "fp32, k=1"]
    assert rows["fp32, k=1"]["timed_windows"] > max(others)
    note = next(note for note in result.notes if note.startswith("Timed in groups that fit"))
    assert "built again after being released for room" in note
    assert result.chosen["feasible"] and result.chosen["speedup"] >= 1.0
    with pytest.raises(ValueError, match="planning_memory_bytes=0 is invalid"):
        _plan(planning_memory_bytes=0)


def test_where_no_candidate_fits_beside_the_baseline_each_is_timed_alone_none_rejected_for_memory(monkeypatch):
    """The 80 GB GPU's case rehearsed on the CPU: room for any one copy's step, not for the
    baseline's copy beside another's. Every candidate is timed, its windows paired with baseline
    windows timed alone around it, and no two copies are resident at once."""
    import weakref

    import trainopt_core.planner.search as search

    unlimited = _plan(ks=(1, 2, 4), speed_options=False)
    held = _held_bytes_of_one_copy()
    capacity = unlimited.baseline["peak_memory_bytes"] + 0.5 * held  # each alone fits; two copies do not
    assert all(row["peak_memory_bytes"] <= capacity for row in unlimited.rows)
    live, most = weakref.WeakSet(), [0]

    class CountedTrial(search.Trial):
        def __init__(self, *args, **kwargs):
            import gc

            gc.collect()
            live.add(self)
            most[0] = max(most[0], len(live))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(search, "Trial", CountedTrial)
    result = _plan(ks=(1, 2, 4), planning_memory_bytes=capacity)
    assert most[0] == 1
    rows = {row["candidate"]: row for row in result.rows}
    assert all(row["timed_windows"] >= 2 and row["speedup"] is not None for row in rows.values())
    assert not any((row["rejected_because"] or "").startswith("out of memory") for row in rows.values())
    assert all(row["paired_with"].startswith("timed alone") for name, row in rows.items() if name != "fp32, k=1")
    (note,) = [note for note in result.notes if note.startswith("Timed alone")]
    assert f"not fitting in {capacity / 2**20:,.0f} MiB together" in note


def test_memory_resident_before_a_candidate_counts_neither_in_its_peak_nor_in_the_memory_model(monkeypatch):
    # on CUDA the allocator's peak includes what was resident before (the user's model, other
    # copies): the measured peak subtracts it, and the memory model must too, or it over-predicts
    # every candidate by that much and prunes ones that fit
    import trainopt_core.planner.search as search
    import trainopt_core.planner.space as space

    resident = 64 * 2**20

    class DeviceWideTracker(search.MemoryTracker):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            self.peak_bytes += resident

    # fp32 only: with bf16 too, which checkpointed twins are measured follows the timings' front
    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ())
    plain = _deep_plan(weights=(1, 1, 0))
    monkeypatch.setattr(search, "MemoryTracker", DeviceWideTracker)
    monkeypatch.setattr(search, "resident_bytes", lambda device: resident)
    shifted = _deep_plan(weights=(1, 1, 0))
    after_by_name = {row["candidate"]: row for row in shifted.rows}
    measured = [row for row in plain.rows if row["peak_memory_bytes"] is not None]
    assert len(measured) >= 3 and all(row["candidate"] in after_by_name for row in measured)
    for before in measured:
        after = after_by_name[before["candidate"]]
        assert after["peak_memory_bytes"] == before["peak_memory_bytes"]
        assert after["predicted_memory_bytes"] == pytest.approx(before["predicted_memory_bytes"])
    baseline = shifted.rows[0]
    assert baseline["predicted_memory_bytes"] == pytest.approx(baseline["peak_memory_bytes"])


def test_the_memory_model_credits_checkpointing_every_block_with_what_it_saves():
    # eq. 19 with β = 1 (a block's input as large as all it saves) predicts that checkpointing
    # every block saves nothing; the block inputs measured on the baseline's step give β, and the
    # prediction, meant to prune, stays below what the step measures
    result = _deep_plan(weights=(1, 1, 0))
    rows = [row for row in result.rows if row["peak_memory_bytes"] is not None]
    plain = {row["precision"]: row for row in rows if row["checkpointing"] is None}
    blocks = max(row["checkpointing"] or 0 for row in rows)  # the Sequential's 10 children
    assert blocks == 10
    every_block = [row for row in rows if row["checkpointing"] == blocks and row["checkpoint_policy"] == "full"]
    assert every_block
    for row in every_block:
        twin = plain[row["precision"]]
        assert row["predicted_memory_bytes"] < twin["predicted_memory_bytes"]
        assert row["predicted_memory_bytes"] <= row["peak_memory_bytes"]


def test_the_memory_model_counts_the_recomputed_segments_input_once():
    from trainopt_core.planner.memory_model import predict
    from trainopt_core.planner.space import Candidate

    # 10 blocks of 100 saved bytes per sample, each block's input 40 of them (β = 0.4)
    calibration = {"fixed_bytes": 0.0, "activation_bytes_per_sample": 1000.0, "temporary_bytes_per_sample": 0.0,
                   "num_blocks": 10, "boundary_fraction": 0.4}
    # every block: the 10 boundaries (400) and the recomputed block (100), whose input is a boundary
    assert predict(calibration, Candidate(checkpointing=10), 1) == pytest.approx(400 + 100 - 40)
    # 4 segments of 3, 3, 2, 2 blocks: 4 boundaries (160) and the largest segment (300) less its input
    assert predict(calibration, Candidate(checkpointing=4), 1) == pytest.approx(160 + 300 - 40)
    assert predict(calibration, Candidate(), 1) == 1000.0  # no checkpointing: every activation


def test_split_timing_starts_with_the_group_whose_copies_are_still_built(monkeypatch):
    from trainopt_core.planner.budget import TimeBudget
    from trainopt_core.planner.search import Search
    from trainopt_core.planner.space import Candidate

    baseline, a, b, c, d = Candidate(), Candidate(k=2), Candidate(k=4), Candidate(precision="bf16"), \
        Candidate(precision="bf16", k=2)
    search = Search.__new__(Search)  # the bookkeeping only: no model is built or timed
    search.capacity_bytes, search.progress, search.rebuilt, search.split_rounds = 100, False, 0, 0
    search.device = torch.device("cpu")
    search.held_bytes = dict.fromkeys((baseline, a, b, c, d), 20)
    search.step_bytes = {baseline: 40, a: 10, b: 10, c: 10, d: 10}
    search.trials = {c: "copy", d: "copy"}  # measured last: the baseline, a and b were released for room
    search.windows_timed, search.rows = {}, {}
    search.time_budget = TimeBudget(None)
    search._built = lambda candidate: ("copy", 0.0)
    order = []

    def time_group(group):
        search._ensure(group)
        assert sum(search.held_bytes[x] for x in search.trials) + max(search.step_bytes[x] for x in group) <= 100
        order.append(group)

    search._time_group = time_group
    search.time([a, b, c, d])
    assert order == [[baseline, c, d], [baseline, a, b]]  # groups of three fit in 100 bytes
    assert search.rebuilt == 3  # the baseline, a, b (timing a and b first would build five)
    assert search.split_rounds == 1


def _out_of_memory_when(monkeypatch, too_much):
    """The planner's timing runs out of memory when `too_much(names of the steps timed together)`;
    what it times otherwise is CLEAR_RATES' fake windows, so that no near tie, timed again, adds
    groups of its own on a busy machine."""
    import trainopt_core.planner.timing as search

    real = FakeWindows(CLEAR_RATES)
    groups = []

    def windows(steps, **kwargs):
        groups.append(sorted(steps))
        if too_much(set(steps)):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.14 GiB")
        return real(steps, **kwargs)

    monkeypatch.setattr(search, "interleaved_windows", windows)
    return groups


def test_a_timing_group_that_runs_out_of_memory_is_timed_again_in_halves_each_with_the_baseline(monkeypatch):
    import trainopt_core.planner.space as space

    # the same candidates on every CPU kind: fp32 only (an AVX2-only CPU has no bf16 candidates, so
    # k in (1, 2, 4) alone made no group of more than three there), four splits
    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ())
    groups = _out_of_memory_when(monkeypatch, lambda names: len(names) > 3)
    result = _plan(ks=(1, 2, 4, 8))
    rows = {row["candidate"]: row for row in result.rows}
    assert all(row["timed_windows"] >= 2 and not (row["rejected_because"] or "").startswith("out of memory")
               for row in rows.values())
    timed = [group for group in groups if len(group) <= 3]
    assert all("fp32, k=1" in group for group in timed)  # every speedup paired with the baseline's windows
    note = next(note for note in result.notes if note.startswith("Timed in groups that fit,"))
    assert "halved after running out of memory" in note
    assert result.chosen["feasible"] and result.chosen["speedup"] >= 1.0


def test_a_candidate_out_of_memory_beside_the_baseline_is_timed_alone_between_baseline_windows(monkeypatch):
    # it fits the device alone: no other copy resident must not reject it (an 80 GB GPU's GPT-2 plans)
    groups = _out_of_memory_when(monkeypatch, lambda names: {"fp32, k=1", "fp32, k=4"} <= names)
    result = _plan(ks=(1, 2, 4))
    rows = {row["candidate"]: row for row in result.rows}
    assert not (rows["fp32, k=4"]["rejected_because"] or "").startswith("out of memory")
    assert rows["fp32, k=4"]["timed_windows"] >= 2 and rows["fp32, k=4"]["speedup"] is not None
    assert rows["fp32, k=4"]["paired_with"].startswith("timed alone, each window paired with the geometric mean")
    assert rows["fp32, k=2"]["paired_with"] == "interleaved with the baseline's windows"
    # its windows (one round each) timed alone, with the baseline's timed alone before and after them
    alone = [i for i, group in enumerate(groups) if group == ["fp32, k=4"]]
    assert len(alone) == 2 and alone[1] == alone[0] + 1
    assert groups[alone[0] - 1] == groups[alone[1] + 1] == ["fp32, k=1"]
    (note,) = [note for note in result.notes if note.startswith("Timed alone")]
    assert "fp32, k=4" in note and "geometric mean" in note


def test_a_candidate_out_of_memory_even_alone_is_rejected_and_the_plan_goes_on(monkeypatch):
    _out_of_memory_when(monkeypatch, lambda names: "fp32, k=4" in names)
    result = _plan(ks=(1, 2, 4))
    rows = {row["candidate"]: row for row in result.rows}
    assert rows["fp32, k=4"]["rejected_because"] == "out of memory: even timed alone, no other copy resident"
    assert rows["fp32, k=4"]["speedup"] is None and not rows["fp32, k=4"]["feasible"]
    assert rows["fp32, k=2"]["timed_windows"] >= 2
    assert result.chosen["candidate"] != "fp32, k=4" and result.chosen["feasible"]


def test_the_baseline_running_out_of_memory_alone_is_raised(monkeypatch):
    _out_of_memory_when(monkeypatch, lambda names: True)
    with pytest.raises(torch.OutOfMemoryError):
        _plan(ks=(1, 2))


def test_the_race_drops_what_is_slower_beyond_the_noise_and_races_near_ties_to_its_end(monkeypatch):
    # k=2 and k=4 in fp32 near each other, both noisy; k=8 slower; bf16 slower than the baseline
    use_fake_windows(monkeypatch, {"fp32, k=1": [10.0], "fp32, k=2": [20.0, 13.0, 16.0],
                                   "fp32, k=4": [19.0, 14.0, 15.0], "fp32, k=8": [12.0, 11.0, 11.5]}, default=[5.0])
    result = plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  windows=3, steps_per_window=1, speed_options=False, time_budget_s=None)
    rows = {row["candidate"]: row for row in result.rows}
    # k=8 is dropped once its ratio to the best, paired over the rounds both ran, is wholly below 1
    # (after 4: the first estimate's 3 and one round of the race); k=2 and k=4, never apart, are raced
    # until each has RACE_MAX_ROUNDS windows, with the baseline in every round; the tie rule then chooses
    from trainopt_core.planner.stages import RACE_MAX_ROUNDS

    assert [rows[name]["timed_windows"] for name in ("fp32, k=1", "fp32, k=2", "fp32, k=4", "fp32, k=8")] == [
        RACE_MAX_ROUNDS, RACE_MAX_ROUNDS, RACE_MAX_ROUNDS, 4]
    assert rows["fp32, k=8"]["rejected_because"].startswith("dropped from the race after 4 shared rounds")
    assert rows["fp32, k=4"]["rejected_because"].startswith("tied with the choice")
    assert all(row["timed_windows"] == 3 for name, row in rows.items() if name.startswith("bf16"))
    assert result.chosen["candidate"] == "fp32, k=2"
    assert any(note.startswith(f"Raced {RACE_MAX_ROUNDS - 3} round(s) after the first estimates (every survivor had "
                               f"{RACE_MAX_ROUNDS} windows); dropped as slower beyond the noise: fp32, k=8 (after 4)")
               for note in result.notes)


def test_a_race_pairs_its_rounds_so_that_a_drift_common_to_both_cancels(monkeypatch):
    """The machine slows down and speeds up again every other round (load coming and going): each
    candidate's own interval is wide, its ratio to the other in the same round is not. Paired
    round by round, k=2 (1.2x k=4 in every round) wins, and k=4 is dropped after 3 shared rounds."""
    use_fake_windows(monkeypatch, {"fp32, k=1": [10.0, 4.0], "fp32, k=2": [24.0, 9.6], "fp32, k=4": [20.0, 8.0]},
                     default=[2.0])
    result = plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  windows=2, steps_per_window=1, speed_options=False, ks=(1, 2, 4), time_budget_s=None)
    rows = {row["candidate"]: row for row in result.rows}
    own = [1.0 / r for r in (20.0, 8.0, 20.0)]  # k=4's seconds per sample swing 2.5x from round to round
    assert max(own) / min(own) == pytest.approx(2.5)
    assert rows["fp32, k=4"]["rejected_because"].startswith("dropped from the race after 3 shared rounds: 0.833x")
    assert result.chosen["candidate"] == "fp32, k=2"


def test_a_clear_best_is_not_timed_again(monkeypatch):
    use_fake_windows(monkeypatch, {"fp32, k=1": [10.0, 10.1, 9.9], "fp32, k=2": [20.0, 20.2, 19.8]})
    result = plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  windows=3, steps_per_window=1, speed_options=False)
    assert all(row["timed_windows"] == 3 for row in result.rows)
    assert result.chosen["candidate"] == "fp32, k=2"


def test_bench_compile_pairs_each_compiled_candidate_with_its_eager_twin():
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = importlib.import_module("bench_compile")

    def row(name, compile_, sps, impl="default", **extra):
        return {"candidate": name, "precision": "bf16", "k": 1, "checkpointing": None, "checkpoint_policy": "full",
                "optimizer_impl": impl, "memory_format": "contiguous", "zero_stage": 0, "compile": compile_,
                "seconds_per_sample": sps, "speedup": 1e-3 / sps, "speedup_ci_low": 0.9e-3 / sps,
                "speedup_ci_high": 1.1e-3 / sps, "compile_s": 2.0 if compile_ else None,
                "speedup_over_run": 0.5 if compile_ else None, **extra}
    plan = {"rows": [row("bf16, k=1", False, 5e-4), row("bf16, k=1, fused", False, 4e-4, impl="fused"),
                     row("bf16, k=1, compiled", True, 4e-4, chosen=True),
                     row("bf16, k=1, fused, compiled", True, 5e-4, impl="fused")]}
    first, second = bench.compiled_rows(plan)
    assert first["twin"] == "bf16, k=1" and first["chosen"]
    assert first["pays_after_samples"] == pytest.approx(2.0 / 1e-4)  # 2 s over 0.1 ms saved per sample
    assert second["twin"] == "bf16, k=1, fused" and second["pays_after_samples"] is None  # slower: never pays


class _BlockMLP(nn.Module):
    """Six 256-wide blocks with a known block sequence (checkpointing can split them)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(6))
        self.head = nn.Linear(256, 10)

    @property
    def checkpoint_blocks(self):
        return list(self.blocks)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_when_nothing_fits_the_checkpointed_twins_expected_smallest_are_measured_first(monkeypatch):
    import trainopt_core.planner.space as space
    from trainopt_core.planner.search import Search
    from trainopt_core.planner.space import Candidate

    monkeypatch.setattr(space, "native_reduced_precisions", lambda device: ())  # fp32 on every CPU kind
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(512, 256, generator=generator), torch.randint(0, 10, (512,), generator=generator))

    def optimizer(parameters):
        return torch.optim.AdamW(parameters, lr=1e-3)

    # what k=8 with 3 checkpointed segments needs, measured as the planner measures it
    search = Search(_BlockMLP(), optimizer, batch, nn.functional.cross_entropy, torch.device("cpu"), None, 1, 1,
                    False, False)
    fits = Candidate("fp32", 8, checkpointing=3)
    search.measure_memory([Candidate(), fits])
    budget = search.rows[fits]["peak_memory_bytes"] * 1.01
    result = plan(_BlockMLP(), optimizer, batch, nn.functional.cross_entropy, memory_budget_bytes=budget, windows=1,
                  steps_per_window=1, speed_options=False)
    # the k=1/2/4 twins, fastest first, used to take every measured slot and the plan gave up
    assert result.chosen["peak_memory_bytes"] <= budget and result.chosen["k"] == 8
    assert result.chosen["checkpointing"] is not None
    # a budget nothing fits names the candidates never tried
    with pytest.raises(ValueError, match=r"the smallest measured peak was .*; not tried \(at most 6 checkpointed "
                                         r"candidates are measured\): fp32, k=\d, checkpointing"):
        plan(_BlockMLP(), optimizer, batch, nn.functional.cross_entropy, memory_budget_bytes=budget * 0.97,
             windows=1, steps_per_window=1, speed_options=False)


def test_a_speedup_is_the_statistic_its_interval_is_about_even_for_bimodal_windows(monkeypatch):
    baseline = "fp32, k=1"
    # the baseline steady; every other candidate either as fast or 1.8x
    use_fake_windows(monkeypatch, {baseline: [1.0]}, default=[1.0] * 11 + [1.8] * 9)
    result = plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  ks=(1, 2), windows=20, steps_per_window=1, speed_options=False)
    timed = [row for row in result.rows if row["candidate"] != baseline and row["speedup"] is not None]
    assert timed
    for row in timed:  # the median of these windows (1.0) lies below the mean's interval
        assert row["speedup_ci_low"] <= row["speedup"] <= row["speedup_ci_high"], row
        assert row["speedup"] == pytest.approx(math.exp(9 * math.log(1.8) / 20))


@pytest.mark.parametrize("step_s, given, expected", [
    (0.027, (None, None), (5, 10)),   # ResNet-50 on an H200: short steps, more of them and more windows
    (0.65, (None, None), (3, 2)),     # GPT-2 124M fp32: windows of two steps already last over a second
    (0.0005, (None, None), (5, 20)),  # capped
    (0.0, (None, None), (5, 20)),     # a clock too coarse to see the step
    (0.027, (4, None), (4, 10)),      # a value the caller gave is kept
    (0.027, (None, 3), (5, 3)),
])
def test_the_default_timing_on_cuda_is_sized_to_the_baseline_step(step_s, given, expected):
    from trainopt_core.planner.search import sized_timing

    assert sized_timing(step_s, *given) == expected


@pytest.mark.parametrize("step_s, expected", [
    (0.3, (2, 1)),      # the quick ResNet on a 2-core CPU: one step a window, two windows a first estimate
    (0.1, (2, 1)),
    (0.03, (2, 4)),     # short steps: as many as fill 0.1 s
    (0.0, (2, 20)),     # capped
])
def test_off_cuda_windows_are_one_step_where_a_step_takes_a_tenth_of_a_second(step_s, expected):
    from trainopt_core.planner.search import sized_timing

    assert sized_timing(step_s, None, None, "cpu") == expected


def test_a_timing_left_to_the_device_is_sized_once_from_the_baseline_and_said():
    result = plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
                  ks=(1, 2), speed_options=False, time_budget_s=None)
    (note,) = [n for n in result.notes if n.startswith("Timing: ")]
    windows, steps = (int(word) for word in note.split()[1:5:3])
    # off CUDA: a first estimate of 2 windows, each of as many steps as fill 0.1 s (this small MLP's
    # step is far under it: up to the cap of 20; one step where a step takes 0.1 s or more)
    assert windows == 2 and 1 <= steps <= 20
    assert "sized to the fp32 baseline's" in note and "then raced" in note
    with pytest.raises(ValueError, match=r"steps_per_window=0 is invalid: allowed None \(sized to the device\)"):
        plan(_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3), _batch(), nn.functional.cross_entropy,
             steps_per_window=0)


def test_a_short_budget_races_the_current_choice_and_sets_aside_the_rest_saying_so():
    from types import SimpleNamespace

    from trainopt_core.planner import budget as clock
    from trainopt_core.planner.space import Candidate
    from trainopt_core.planner.stages import _focus

    base, k2, k4, k8 = Candidate(), Candidate(k=2), Candidate(k=4), Candidate(k=8)
    rows = {c: {"timed_windows": 5, "rejected_because": None} for c in (base, k2, k4, k8)}
    budget = clock.TimeBudget(10.0)
    budget.started = clock.now()  # 10 s left; a round costs 1 s per candidate: 4 rounds fit beside one
    search = SimpleNamespace(rows=rows, time_budget=budget, round_s=lambda names: 1.0 * len(names))
    # k=2 the lowest cost by its point estimate, k=4 the tie rule's choice among those tied with it
    feasible = {base: {"cost": 1.0}, k2: {"cost": 0.70}, k4: {"cost": 0.72, "chosen": True}, k8: {"cost": 0.90}}
    _focus(SimpleNamespace(search=search), feasible, [base, k2, k4, k8], [base])
    assert rows[k4]["rejected_because"] is None and rows[base]["rejected_because"] is None
    for dropped in (k2, k8):
        assert rows[dropped]["rejected_because"].startswith(
            "dropped from the race after 5 windows to give the budget's last rounds to the current choice and the "
            "lowest-cost others (fp32, k=4)")
    assert budget.left_out == {"set aside to race 1": ["fp32, k=2", "fp32, k=8"]}
