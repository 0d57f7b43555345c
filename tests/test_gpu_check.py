"""scripts/gpu_check.py, the one command a GPU session runs: its arguments, and its plumbing on
the CPU (smoke sizes, the GPU tests skipped), so that a GPU session spends its time measuring."""
import json

import pytest
import torch

from conftest import load_script


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("scripts/gpu_check.py")


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu"], "--device cpu is allowed with --profile smoke only"),
    (["--device", "cpu", "--profile", "smoke", "--tasks", "cifar100"], "--tasks: 'cifar100' is invalid"),
    (["--device", "cpu", "--profile", "smoke", "--steps", "0"], "--steps=0 is invalid"),
])
def test_bad_arguments_name_the_value_and_what_is_allowed(gpu_check, capsys, argv, message):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--out", "unused", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_without_cuda_it_stops_and_says_how_to_run_the_plumbing(gpu_check, capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--out", "unused"])
    assert "no CUDA GPU here" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cpu_smoke_run_writes_every_result_file(gpu_check, tmp_path):
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--device", "cpu", "--profile", "smoke", "--steps", "3",
                           "--tasks", "cifar10", "--no-tests"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["environment.json", "gpu_runs.json", "gpu_runs.md"]
    results = json.loads((out / "gpu_runs.json").read_text())
    assert [(r["config_name"], r["status"], r["metrics"]["optimizer_steps"]) for r in results["runs"]] == [
        ("baseline", "truncated", 3), ("optimized", "truncated", 3)]
    assert results["recompute_overhead"]["cifar10"]["segments"] >= 1
    table = (out / "gpu_runs.md").read_text()
    assert table.count("| cifar10 |") == 2 and "img/s" in table and "- cifar10: " in table
    assert json.loads((out / "environment.json").read_text())["profile"] == "smoke"
