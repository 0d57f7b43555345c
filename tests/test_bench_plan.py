"""benchmarks/bench_plan.py: a plan that fails (a budget nothing fits, a GPU out of memory while
the candidates are timed together) is reported and the others go on; a run stopped part-way
keeps what it finished, and --resume continues it."""
import json
from pathlib import Path

import pytest
import torch

from conftest import load_script
from trainopt_core.config import OptimizationConfig
from trainopt_core.planner.result import Plan


def _bench_plan():
    return load_script("benchmarks/bench_plan.py")


def _result(rows=(), budget=None):
    baseline = {"candidate": "fp32, k=1", "peak_memory_bytes": 1000, "checkpointing": None}
    return Plan(config=OptimizationConfig.baseline(), chosen=baseline, baseline=baseline,
                rows=[baseline, *[{"candidate": f"c{i}", **row} for i, row in enumerate(rows)]],
                memory_budget_bytes=budget, weights=(1.0, 0.0, 0.0), planning_s=1.0)


def test_a_failing_plan_is_reported_and_the_other_plans_go_on(monkeypatch, capsys):
    bench = _bench_plan()
    weighted_rows = [{"peak_memory_bytes": 800, "checkpointing": None},
                     {"peak_memory_bytes": 400, "checkpointing": "sqrt"}]

    limits = []

    def plan_task(bundle, prof, device, progress=False, memory_budget_bytes=None, weights=None,
                  planning_memory_bytes=None):
        limits.append(planning_memory_bytes)
        if memory_budget_bytes == 500:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.14 GiB")
        if memory_budget_bytes == 600:  # halfway between the smallest checkpointed and plain peaks
            raise ValueError("memory_budget_bytes=600 is invalid: allowed a budget some candidate fits")
        return _result(weighted_rows if weights else ())

    monkeypatch.setattr(bench, "plan_task", plan_task)
    plans, failed = bench._plans(None, None, torch.device("cpu"), progress=False, planning_memory_bytes=2**30)
    assert list(plans) == ["auto", "(time, memory) weighted"]
    assert limits == [2**30] * 4  # --planning-memory-mib reaches every plan
    assert failed["auto, 50 % budget"].startswith("OutOfMemoryError: CUDA out of memory")
    assert failed["auto, checkpoint-only budget"].startswith("ValueError: memory_budget_bytes=600")
    assert "plan auto, 50 % budget: FAILED OutOfMemoryError" in capsys.readouterr().out


def _plan_task_stopped_at(stop_label_budget, calls):
    """A plan_task that records what it planned and is killed (KeyboardInterrupt stands for a
    time limit) when asked for `stop_label_budget`."""
    weighted_rows = [{"peak_memory_bytes": 800, "checkpointing": None},
                     {"peak_memory_bytes": 400, "checkpointing": 4}]

    def plan_task(bundle, prof, device, progress=False, memory_budget_bytes=None, weights=None,
                  planning_memory_bytes=None):
        calls.append((memory_budget_bytes, weights))
        if (memory_budget_bytes, weights) == stop_label_budget:
            raise KeyboardInterrupt
        return _result(weighted_rows if weights else (), memory_budget_bytes)
    return plan_task


SETTINGS = {"profile": "paper", "device": "cuda", "hardware": {"gpus": ["H100"]}, "torch": "2.11",
            "planning_memory_bytes": None, "windows": 6, "steps_per_window": 3, "git_commit": "abc"}


def test_a_run_stopped_in_a_plan_keeps_the_finished_plans_and_resume_plans_only_the_rest(monkeypatch, tmp_path):
    bench = _bench_plan()
    path = str(tmp_path / "bench.json")
    calls = []
    monkeypatch.setattr(bench, "plan_task", _plan_task_stopped_at((None, (1.0, 1.0, 0.0)), calls))
    record = bench.BenchRecord(path, SETTINGS, {}, resume=False)
    with pytest.raises(KeyboardInterrupt):  # killed in the third plan, the weighted one
        bench._plans(None, None, torch.device("cpu"), False, kept=record.unfinished("wikitext2"), save=record.save)
    on_disk = json.loads(Path(path).read_text())
    assert sorted(on_disk["unfinished"]["wikitext2"]["plans"]) == ["auto", "auto, 50 % budget"]
    assert not (tmp_path / "bench.partial.json").exists()  # written whole, then renamed

    calls.clear()
    monkeypatch.setattr(bench, "plan_task", _plan_task_stopped_at(None, calls))
    resumed = bench.BenchRecord(path, SETTINGS, {}, resume=True)
    plans, failed = bench._plans(None, None, torch.device("cpu"), False, kept=resumed.unfinished("wikitext2"),
                                 save=resumed.save)
    assert calls == [(None, (1.0, 1.0, 0.0)), (600.0, None)]  # the weighted plan, then the checkpoint-only one
    assert list(plans) == ["auto", "auto, 50 % budget", "(time, memory) weighted", "auto, checkpoint-only budget"]
    assert plans["auto, 50 % budget"].memory_budget_bytes == 500  # the earlier process's plan, read back
    assert resumed.data["processes"] == 2 and not failed

    resumed.finish("wikitext2", {"task": "wikitext2"})
    again = bench.BenchRecord(path, SETTINGS, {}, resume=True)
    assert again.finished("wikitext2") == {"task": "wikitext2"} and again.data["unfinished"] == {}


def test_resume_refuses_a_file_made_on_other_code(tmp_path):
    bench = _bench_plan()
    path = str(tmp_path / "bench.json")
    bench.BenchRecord(path, SETTINGS, {}).save()
    with pytest.raises(SystemExit, match="git_commit was 'abc' there and is 'def' now"):
        bench.BenchRecord(path, {**SETTINGS, "git_commit": "def"}, {}, resume=True)
    assert bench.BenchRecord(path, {**SETTINGS, "git_commit": "def"}, {}).data["tasks"] == []  # without --resume: anew


def test_main_resumes_after_the_finished_tasks(monkeypatch, tmp_path, capsys):
    bench = _bench_plan()
    path = str(tmp_path / "bench.json")
    benched = []

    def bench_task(task, *args, record=None):
        benched.append(task)
        if task == "wikitext2" and len(benched) == 2:
            raise KeyboardInterrupt  # the time limit, in the second task
        return {"task": task}

    argv = ["--profile", "smoke", "--device", "cpu", "--json", path]
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv, bench=bench_task)
    assert [t["task"] for t in json.loads(Path(path).read_text())["tasks"]] == ["cifar10"]
    assert bench.main(argv + ["--resume"], bench=bench_task) == 0
    assert benched == ["cifar10", "wikitext2", "wikitext2"]
    on_disk = json.loads(Path(path).read_text())
    assert [t["task"] for t in on_disk["tasks"]] == ["cifar10", "wikitext2"] and on_disk["processes"] == 2
    assert "cifar10: finished by the earlier process" in capsys.readouterr().out


def test_the_regret_benchmark_pairs_the_best_with_the_choice_in_the_truths_rounds():
    # the truth's best by its point estimate against a choice it cannot be told from: the regret's
    # paired interval reaches 1; a lever kept from is a miss, its interval wholly above 1
    bench = load_script("benchmarks/bench_plan_regret.py")
    base = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1]
    truth = {"task": "t", "threads": 1, "rounds": 6, "steps_per_window": 1, "candidates": {
        "fp32, k=1": {"mean": 1.0, "ci_low": 1.0, "ci_high": 1.0, "rates": base},
        "fp32, k=2": {"mean": 1.03, "ci_low": 0.95, "ci_high": 1.11, "rates": [10.9, 10.0, 10.2, 10.1, 10.6, 10.3]},
        "fp32, k=1, channels_last": {"mean": 1.2, "ci_low": 1.1, "ci_high": 1.3, "rates": [r * 1.2 for r in base]}}}
    plan = {"task": "t", "threads_planned": 1, "chosen": "fp32, k=2", "planning_s": 50.0, "budget_s": 60}
    truths = {("t", 1): truth}
    judged = bench.judged(plan, truths)
    assert judged["best"] == "fp32, k=1, channels_last" and not judged["miss"] and not judged["loss"]
    low, high = judged["regret_ci"]
    assert low < judged["regret"] < high and low > 1.0
    kept = bench.judged(dict(plan, chosen="fp32, k=1"), truths)
    assert kept["miss"] and kept["regret_ci"][0] == pytest.approx(1.2) and kept["regret"] == pytest.approx(1.2)
    chose_best = bench.judged(dict(plan, chosen="fp32, k=1, channels_last"), truths)
    assert chose_best["regret"] == 1.0 and chose_best["regret_ci"] is None
    lines = bench.report(truths, [dict(plan, **judged, condition="quiet", repeat=0)], 1, plans_from="`x.json` (commit y)")
    assert "The plans: `x.json` (commit y); the truth measured again now, by the line above." in lines
    assert any(f"| {judged['regret']:.3f} [{low:.3f}, {high:.3f}] |" in line for line in lines)
