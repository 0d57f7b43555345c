"""The reproduction's `auto` configuration: planned on the machine that runs it, the plan kept
beside the runs and in every `auto` record, reused only while it is the current plan."""
import json

import pytest

from trainopt_core.config import OptimizationConfig
from trainopt_core.reproduction import autoplan, runner
from trainopt_core.reproduction.__main__ import _parse
from trainopt_core.reproduction.profiles import get_profile
from trainopt_core.reproduction.throughput import measure_throughput

TASK = "wikitext2"  # the smoke GPT-2 plans in a few seconds


class Replanned(Exception):
    pass


@pytest.fixture(scope="module")
def planned_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports") / "smoke"
    record = runner.run(TASK, "auto", profile="smoke", seed=0, out_dir=root / "runs", data_policy="standin",
                        progress=False)
    return root, record


def test_auto_is_planned_here_and_its_record_carries_the_plan(planned_run):
    root, record = planned_run
    plan_file = root / "plans" / f"plan__{TASK}.json"
    stored = json.loads(plan_file.read_text())
    assert stored["kind"] == "plan" and stored["conditions"] == record["conditions"]
    assert record["config_name"] == "auto" and record["status"] == "complete"
    assert record["plan"]["chosen"] == stored["plan"]["chosen"] and "Chose" in record["plan"]["explanation"]
    assert record["config"] == stored["config"]
    # the baseline's training (its schedule, clipping, effective batch), computed as the plan chose
    baseline = OptimizationConfig.baseline()
    assert record["config"]["clip_norm"] == baseline.clip_norm and record["config"]["schedule"] == baseline.schedule
    assert stored["plan_rule"] == autoplan.PLAN_RULE and any(row.get("yours") for row in stored["plan"]["rows"])
    assert next(row for row in stored["plan"]["rows"] if row.get("yours"))["candidate"] == "fp32, k=1"
    chosen = autoplan.plan_of(record).config
    assert (record["config"]["precision"], record["config"]["k"]) == (chosen.precision, chosen.k)
    assert record["config"]["adaptive"] is False
    assert any("planned on this machine" in note for note in record["notes"])
    # planned for the run's length: the samples the run trained on (what a compile is spread over)
    assert stored["plan"]["run_samples"] == record["steps"][-1]["samples_consumed"]


def test_the_plan_is_reused_under_the_same_conditions_and_the_run_with_it(planned_run, monkeypatch):
    root, record = planned_run
    monkeypatch.setattr(autoplan, "plan_task", lambda *a, **k: (_ for _ in ()).throw(Replanned))
    again = runner.run(TASK, "auto", profile="smoke", seed=0, out_dir=root / "runs", data_policy="standin",
                       progress=False)
    assert again["config_hash"] == record["config_hash"] and again["metrics"]["final_quality"] == record["metrics"]["final_quality"]


@pytest.mark.parametrize("made", ["on another machine", "by another planning rule", "that fell back"])
def test_a_plan_made_under_other_conditions_is_measured_again(planned_run, monkeypatch, made):
    root, _ = planned_run
    plan_file = root / "plans" / f"plan__{TASK}.json"
    stored = json.loads(plan_file.read_text())
    if made == "on another machine":
        stored["conditions"]["hardware"] = "another machine"
    elif made == "by another planning rule":  # timed in fixed windows, without the race (rule 2)
        stored["plan_rule"] = autoplan.PLAN_RULE - 1
    else:  # its time budget timed nothing but the baseline: it compared nothing, and is not reused
        stored["plan"]["fell_back"] = True
    original = plan_file.read_text()
    plan_file.write_text(json.dumps(stored))
    monkeypatch.setattr(autoplan, "plan_task", lambda *a, **k: (_ for _ in ()).throw(Replanned))
    try:
        with pytest.raises(Replanned):
            autoplan.planned_record(TASK, get_profile(TASK, "smoke"), __import__("torch").device("cpu"),
                                    plans_dir=root / "plans", data_policy="standin")
    finally:  # the module's plan, as the other tests read it
        plan_file.write_text(original)


def test_a_new_plan_replaces_the_auto_runs_and_timing_of_the_old_one(tmp_path, planned_run):
    root, record = planned_run
    runs = tmp_path / "smoke" / "runs"
    runs.mkdir(parents=True)
    plans = tmp_path / "smoke" / "plans"
    plans.mkdir()
    stored = json.loads((root / "plans" / f"plan__{TASK}.json").read_text())
    stored["conditions"] = record["conditions"]
    (plans / f"plan__{TASK}.json").write_text(json.dumps(stored))
    first = runner.run(TASK, "auto", profile="smoke", seed=0, out_dir=runs, data_policy="standin", progress=False)
    timing = measure_throughput(TASK, ["baseline", "auto"], profile="smoke", seeds=1, out_dir=tmp_path / "smoke" / "timing",
                                data_policy="standin", progress=False)
    assert timing["results"]["auto"]["config_hash"] == first["config_hash"]
    # the plan now chooses something else (as a re-plan on a busier machine might); on a CPU without
    # bf16 the first plan may already be the fp32 baseline's settings, so the split changes too
    other = dict(stored["config"], precision="fp32", k=2 if stored["config"].get("k", 1) == 1 else 1,
                 optimizer_impl="default", memory_format="contiguous")
    stored["config"] = other
    (plans / f"plan__{TASK}.json").write_text(json.dumps(stored))
    second = runner.run(TASK, "auto", profile="smoke", seed=0, out_dir=runs, data_policy="standin", progress=False)
    assert second["config_hash"] != first["config_hash"] and second["config"]["precision"] == "fp32"
    assert [p.name for p in runs.glob(f"{TASK}__auto__*")] == [f"{TASK}__auto__smoke__{second['config_hash']}__seed0.json"]
    retimed = measure_throughput(TASK, ["baseline", "auto"], profile="smoke", seeds=1, out_dir=tmp_path / "smoke" / "timing",
                                 data_policy="standin", progress=False)
    assert retimed["results"]["auto"]["config_hash"] == second["config_hash"]


def test_auto_needs_a_plans_folder_and_the_command_line_accepts_it():
    import torch

    with pytest.raises(ValueError, match="plans_dir"):
        runner.resolve_config("auto", get_profile(TASK, "smoke"), torch.device("cpu"))
    assert _parse(["--task", TASK, "--config", "auto"]).config == "auto"
    with pytest.raises(SystemExit):
        _parse(["--task", TASK, "--config", "fastest"])
