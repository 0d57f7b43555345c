"""Every public field and argument refuses a value of the wrong type or range, naming the field (or
flag) and what is allowed -- one row per input: the configuration's fields, prepare()'s arguments,
the engine's k and num_items, run_all.sh's flags, and the reproduction and reporting command lines
(a check that finds nothing to check fails too)."""
import contextlib
import dataclasses
import io
import math
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.reporting import agreement, floors, render, summary
from trainopt_core.reproduction import __main__ as reproduction_cli

REPO = Path(__file__).resolve().parents[1]


class Refused(Exception):
    """A command that exited non-zero, with what it said on stderr."""


def shell(*argv):
    """A command run from the checkout, which must fail."""
    def call():
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
        if result.returncode != 0:
            raise Refused(f"exit {result.returncode}: {result.stderr}")
    return call


def command(main, *argv):
    """A command line's main() in this process, which must fail (argparse's errors included)."""
    def call():
        with contextlib.redirect_stderr(io.StringIO()) as said, contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(list(argv))
            except SystemExit as stopped:
                code = stopped.code
        if code not in (0, None):
            raise Refused(f"exit {code}: {said.getvalue()}")
    return call


def in_folder(make, then):
    """`then(folder)` on a temporary folder filled by `make(folder)`."""
    def call():
        with tempfile.TemporaryDirectory() as folder:
            make(Path(folder))
            then(Path(folder))()
    return call


def one_timing_record(folder: Path) -> None:
    shutil.copy(next(REPO.glob("reports/other_machines/**/quick/timing/throughput__cifar10.json")), folder)


def empty_tables(folder: Path) -> None:
    for side in ("a", "b"):
        (folder / side / "tables").mkdir(parents=True)


# ----------------------------------------------------------------------------- the configuration
# a value of the wrong type (or range) for every field of OptimizationConfig
WRONG = {
    "name": None, "precision": "FP16", "k": 2.5, "adaptive": "False", "k_min": True, "k_max": 8.0,
    "k_rule": None, "sigma_target": "0.1", "noise_window": 1.5, "schedule": "Cosine", "warmup_fraction": "0.1",
    "min_lr_ratio": None, "lr_scaling": 1, "base_batch_size": True, "clip_norm": math.inf, "checkpointing": 1.5,
    "checkpoint_policy": None, "zero_stage": True, "compile": "yes", "compile_mode": None, "compile_scope": "each", "optimizer_impl": True,
    "memory_format": "nhwc", "tf32": 0, "sdpa_backend": None, "expandable_segments": "True",
    "initial_loss_scale": "x", "loss_scale_growth_interval": 2000.0, "max_nonfinite_steps": 0,
}
CONFIG_ROWS = [(f"OptimizationConfig.{field}", lambda field=field, value=value: OptimizationConfig(**{field: value}),
                f"OptimizationConfig.{field}={value!r} is invalid: allowed ")
               for field, value in WRONG.items()] + [
    ("OptimizationConfig.zero_stage float", lambda: OptimizationConfig(zero_stage=1.0),
     "OptimizationConfig.zero_stage=1.0 is invalid: allowed one of (0, 1, 2)"),
    ("OptimizationConfig.min_lr_ratio range", lambda: OptimizationConfig(min_lr_ratio=-0.5),
     "OptimizationConfig.min_lr_ratio=-0.5 is invalid: allowed a number in [0, 1]"),
    # an int no float can hold is refused by its field, not by Python's OverflowError
    ("OptimizationConfig.initial_loss_scale beyond a float", lambda: OptimizationConfig(initial_loss_scale=10**400),
     "OptimizationConfig.initial_loss_scale=1000000000000000000000000000000000000000000000000000000000000000000000000"),
    ("OptimizationConfig.base_batch_size absurd", lambda: OptimizationConfig(base_batch_size=2**70),
     "OptimizationConfig.base_batch_size=1180591620717411303424 is invalid: allowed None or an integer in "
     "[1, 1,000,000,000]"),
    ("OptimizationConfig.name empty", lambda: OptimizationConfig(name=""),
     "OptimizationConfig.name='' is invalid: allowed a non-empty string"),
]


# ----------------------------------------------------------------------------- prepare() and the engine
def _model():
    torch.manual_seed(0)
    return nn.Linear(8, 4)


def _prepare(config=None, **arguments):
    model = arguments.pop("model", None) or _model()
    optimizer = arguments.pop("optimizer", None) or torch.optim.SGD(model.parameters(), lr=0.1)
    return prepare(model, optimizer, config or OptimizationConfig(),
                   **{"micro_batch_size": 4, "device": "cpu", **arguments})


def _set_k(value):
    _prepare().k = value


def _backward(**arguments):
    engine = _prepare()
    engine.backward(nn.functional.mse_loss(engine.model(torch.randn(4, 8)), torch.zeros(4, 4)), **arguments)


def _backward_and_step(**arguments):
    engine = _prepare()
    engine.backward(nn.functional.mse_loss(engine.model(torch.randn(4, 8)), torch.zeros(4, 4)), **arguments)
    engine.step()


NO_DEVICE = "cuda:99" if torch.cuda.is_available() else "cuda"  # a device this machine lacks
PREPARE_ROWS = [
    ("prepare device", lambda: _prepare(device=NO_DEVICE),
     f"device={NO_DEVICE!r} is invalid: allowed None (the model's device) or a device this machine has: 'cpu'"),
    ("prepare device with precision auto", lambda: _prepare(OptimizationConfig(precision="auto"), device=NO_DEVICE),
     f"device={NO_DEVICE!r} is invalid"),
    ("prepare device type", lambda: _prepare(device=0), "device=0 is invalid"),
    ("prepare model", lambda: _prepare(model="resnet", optimizer=torch.optim.SGD(_model().parameters(), lr=0.1)),
     "model='resnet' is invalid: allowed a torch.nn.Module"),
    ("prepare optimizer", lambda: _prepare(optimizer="adamw"), "optimizer='adamw' is invalid: allowed a torch.optim"),
    ("prepare micro_batch_size", lambda: _prepare(micro_batch_size=True),
     "micro_batch_size=True is invalid: allowed an integer >= 1"),
    ("prepare checkpoint_model", lambda: _prepare(checkpoint_model="blocks"), "checkpoint_model='blocks' is invalid"),
    ("prepare min_lr", lambda: _prepare(OptimizationConfig(schedule="cosine"), total_steps=10, min_lr="0.01"),
     "min_lr='0.01' is invalid: allowed None"),
    ("engine k zero", lambda: _set_k(0), "k=0 is invalid: allowed an integer >= 1"),
    ("engine k fraction", lambda: _set_k(2.5), "k=2.5 is invalid: allowed an integer >= 1"),
    ("backward num_items text", lambda: _backward(num_items="2"), "num_items='2' is invalid: allowed a finite number > 0"),
    ("backward num_items bool", lambda: _backward(num_items=True), "num_items=True is invalid"),
    # a tensor count is read once per optimizer step (no sync per micro-batch): refused at the step
    ("backward num_items nan tensor, at the step", lambda: _backward_and_step(num_items=torch.tensor(float("nan"))),
     "num_items summed to nan over the effective batch: allowed a finite number > 0"),
    ("backward num_items zero tensor, at the step", lambda: _backward_and_step(num_items=torch.tensor(0)),
     "num_items summed to 0.0 over the effective batch"),
]


# ----------------------------------------------------------------------------- command lines
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


RUN_ALL = str(REPO / "run_all.sh")
COMMAND_ROWS = [
    ("run_all.sh --reports-dir ''", shell(RUN_ALL, "--reports-dir", ""), "--reports-dir '' is invalid: allowed a folder"),
    ("run_all.sh --sections twice", shell(RUN_ALL, "--sections", "01,01"), "--sections '01,01' is invalid: '01' twice"),
    ("run_all.sh --sections empty item", shell(RUN_ALL, "--sections", "01,,02"), "--sections '01,,02' is invalid"),
    ("run_all.sh --tasks twice", shell(RUN_ALL, "--tasks", "wikitext2,wikitext2"), "--tasks 'wikitext2,wikitext2' is invalid"),
    ("run_all.sh flag twice", shell(RUN_ALL, "--seeds", "1", "--seeds=2"), "--seeds is given twice: allowed once"),
    ("run_all.sh --seeds past any integer", shell(RUN_ALL, "--seeds", "99999999999999999999"),
     "--seeds '99999999999999999999' is invalid: allowed an integer from 1 to 1000"),
    ("run_all.sh --seeds past the maximum", shell(RUN_ALL, "--seeds", "1001"), "--seeds '1001' is invalid: allowed an integer from 1 to 1000"),
    ("run_all.sh --ray-address ''", shell(RUN_ALL, "--executor", "ray", "--ray-address", ""),
     "--ray-address '' is invalid: allowed auto, HOST:PORT"),
    ("run_all.sh --ray-address unreachable", shell(RUN_ALL, "--executor", "ray", "--ray-address", f"127.0.0.1:{_free_port()}"),
     "--ray-address '127.0.0.1:"),
    ("reproduction --seed", command(reproduction_cli._parse, "--task", "cifar10", "--config", "baseline", "--seed", "-1"),
     "--seed -1 is invalid: allowed an integer >= 0"),
    ("reproduction --out", command(reproduction_cli._parse, "--task", "cifar10", "--config", "baseline", "--out",
                                   str(REPO / "README.md")),
     "--out '" + str(REPO / "README.md") + "' is invalid: it is a file, not a folder"),
    ("floors --check without records", in_folder(lambda folder: None, lambda folder: command(floors.main, str(folder), "--check")),
     "no timing records (throughput__<task>.json) under"),
    ("floors --check of one session", in_folder(one_timing_record, lambda folder: command(floors.main, str(folder), "--check")),
     "floors --check: nothing to check: 1 timing record(s)"),
    ("floors without records", in_folder(lambda folder: None, lambda folder: command(floors.main, str(folder))),
     "nothing to estimate the floors from"),
    ("floors --fresh without --check", command(floors.main, str(REPO / "reports"), "--fresh", str(REPO / "reports")),
     "--fresh is for --check"),
    ("floors --docs without --check", command(floors.main, str(REPO / "reports"), "--docs", str(REPO / "README.md")),
     "--docs is for --check without --fresh"),
    ("agreement with nothing to compare",
     in_folder(empty_tables, lambda folder: command(agreement.main, str(folder / "a"), str(folder / "b"))),
     "exit 2: agreement: nothing compared"),
    ("summary --profile", command(summary.main, str(REPO / "reports"), "--profile", "huge"),
     "argument --profile: invalid choice: 'huge'"),
    ("summary of an empty profile", in_folder(empty_tables, lambda folder: command(summary.main, str(folder / "a"))),
     "is invalid: allowed a reports folder holding <profile>/tables/ with the tables of a reproduction"),
    ("summary of a file", command(summary.main, str(REPO / "README.md")),
     "reports_dir='" + str(REPO / "README.md" / "quick" / "tables") + "' is invalid: allowed a reports folder"),
    ("render of an empty profile", in_folder(empty_tables, lambda folder: command(render.main, str(folder / "a"))),
     "--profile 'quick' is invalid for"),
    ("render of a file", command(render.main, str(REPO / "README.md")), "reports '" + str(REPO / "README.md")
     + "' is invalid: a file"),
    ("reproduction --data-dir ''", command(reproduction_cli._parse, "--task", "cifar10", "--config", "baseline",
                                           "--data-dir", ""),
     "--data-dir '' is invalid: allowed a folder (empty would read the data from the current one"),
]

ROWS = CONFIG_ROWS + PREPARE_ROWS + COMMAND_ROWS


@pytest.mark.parametrize("call, expected", [pytest.param(call, expected, id=name) for name, call, expected in ROWS])
def test_a_bad_input_is_refused_naming_it_and_what_is_allowed(call, expected):
    with pytest.raises((ValueError, Refused)) as refused:
        call()
    assert expected in str(refused.value)


def test_every_field_of_the_configuration_has_a_row():
    assert set(WRONG) == {field.name for field in dataclasses.fields(OptimizationConfig)}
