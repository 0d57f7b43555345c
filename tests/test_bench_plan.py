"""benchmarks/bench_plan.py: a plan that fails (a budget nothing fits, a GPU out of memory while
the candidates are timed together) is reported and the others go on."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_plan.py"


def _bench_plan():
    spec = importlib.util.spec_from_file_location("bench_plan", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(rows=()):
    return SimpleNamespace(baseline={"peak_memory_bytes": 1000}, rows=list(rows))


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
