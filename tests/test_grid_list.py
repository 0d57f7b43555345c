"""`python -m trainopt_core.reproduction list`: the reproduction's grid of runs as one command per
run, for a job array of any scheduler; each command writes its record where the notebooks reuse it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainopt_core.reproduction.__main__ import grid_commands
from trainopt_core.reproduction.profiles import table_configs

REPO = Path(__file__).resolve().parents[1]


def _cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "trainopt_core.reproduction", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, **kwargs)


def test_the_grid_is_every_task_configuration_and_seed_auto_first():
    commands = grid_commands("paper", 3)
    assert len(commands) == 2 * len(table_configs()) * 3 == 78
    assert commands[0].endswith("--task cifar10 --config auto --profile paper --seed 0 --out reports/paper/runs "
                                "--data-policy auto --no-progress")
    assert all("--config auto" in c for c in commands[:3]) and "--config baseline --profile paper --seed 0" in commands[3]
    assert len(set(commands)) == len(commands)


def test_list_refuses_an_unknown_configuration_and_no_seeds():
    result = _cli("list", "--configs", "turbo")
    assert result.returncode == 2 and "--configs: unknown configuration 'turbo'" in result.stderr
    result = _cli("list", "--seeds", "0")
    assert result.returncode == 2 and "--seeds 0 is invalid: allowed an integer >= 1" in result.stderr


@pytest.mark.slow
def test_a_listed_command_writes_the_record_the_notebooks_reuse(tmp_path):
    out = tmp_path / "runs"
    listed = _cli("list", "--profile", "smoke", "--seeds", "1", "--tasks", "cifar10", "--configs", "baseline",
                  "--data-policy", "standin", "--out", str(out))
    assert listed.returncode == 0, listed.stderr
    (command,) = listed.stdout.splitlines()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    (path,) = out.glob("cifar10__baseline__smoke__*__seed0.json")
    record = json.loads(path.read_text())
    assert record["status"] == "complete" and "NOT CIFAR-10" in record["data_source"]
