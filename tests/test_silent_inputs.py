"""Inputs that were once taken silently -- training nothing, the wrong batch or a wrong LR -- or that
failed with an error naming something else, one row each: now refused with a message naming the
argument and what is allowed. And configurations that compute the same run hash alike."""
import contextlib
import io
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, plan, prepare
from trainopt_core.reporting.results import load_records
from trainopt_core.reproduction import __main__ as reproduction_cli

REPO = Path(__file__).resolve().parents[1]
COSINE = OptimizationConfig(schedule="cosine", warmup_fraction=0.05)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(8, 4)


def _engine(**arguments):
    model = _model()
    return prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3), COSINE, micro_batch_size=4, total_steps=200,
                   **arguments)


def _resumed_stateless_sgd_without_lr():
    """A plain loop's checkpoint of SGD without momentum (no per-parameter state), its LR decayed,
    loaded before prepare(): the LR it holds is the checkpoint's."""
    saved = torch.optim.SGD(_model().parameters(), lr=1e-3)
    saved.param_groups[0]["lr"] = 3.698e-4
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(saved.state_dict())
    assert not optimizer.state  # what the former guard read: nothing to see
    prepare(model, optimizer, COSINE, micro_batch_size=4, total_steps=200).start_at(steps=40)


def _set(name, value):
    def call():
        setattr(_engine(), name, value)
    return call


def _backward(loss_of, **arguments):
    def call():
        engine = _engine()
        loss = loss_of(engine.model(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
        engine.backward(loss, **arguments)
    return call


def _plan(batch, loss_fn):
    def call():
        plan(_model(), lambda parameters: torch.optim.SGD(parameters, lr=0.1), batch, loss_fn, time_budget_s=5)
    return call


def _nan_batch():
    inputs = torch.randn(8, 8)
    inputs[0, 0] = float("nan")
    return inputs, torch.randint(0, 4, (8,))


def _cli(main, *argv):
    def call():
        with contextlib.redirect_stderr(io.StringIO()) as said, contextlib.redirect_stdout(io.StringIO()):
            try:
                main(list(argv))
            except SystemExit as stopped:
                if stopped.code not in (0, None):
                    raise ValueError(said.getvalue()) from None
    return call


def _run_all(*argv):
    def call():
        result = subprocess.run([str(REPO / "run_all.sh"), *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
        if result.returncode != 0:
            raise ValueError(result.stderr)
    return call


RUN = ("--task", "cifar10", "--config", "baseline")
ROWS = [
    ("start_at after a stateless optimizer loaded before prepare", _resumed_stateless_sgd_without_lr,
     "lr=None is invalid: allowed the LR the optimizer was built with"),
    ("prepare with another model's optimizer",
     lambda: prepare(_model(), torch.optim.SGD(nn.Linear(8, 4).parameters(), lr=0.1), COSINE, micro_batch_size=4,
                     total_steps=10),
     "optimizer=SGD(<2 parameters, 2 of them not the model's>) is invalid: allowed an optimizer over the model's own"),
    ("prepare world_size 2 without a process group", lambda: _engine(world_size=2),
     "world_size=2 is invalid: allowed None (torch.distributed's), 1, or the size of the initialized process group "
     "(no process group is initialized here"),
    ("plan on a batch holding NaN", _plan(_nan_batch(), nn.functional.cross_entropy),
     "batch=<the probe batch> is invalid: the fp32 baseline's loss on it at the initial weights is nan"),
    ("plan with a per-sample loss_fn",
     _plan((torch.randn(8, 8), torch.randint(0, 4, (8,))),
           lambda out, target: nn.functional.cross_entropy(out, target, reduction="none")),
     "loss_fn returned <a tensor of shape (8,)> on a micro-batch: allowed a tensor of one element"),
    ("backward of a per-sample loss",
     _backward(lambda out, target: nn.functional.cross_entropy(out, target, reduction="none")),
     "loss=<a tensor of shape (4,)> is invalid: allowed a tensor of one element"),
    ("backward num_items of two elements", _backward(nn.functional.cross_entropy, num_items=torch.tensor([1., 2.])),
     "num_items=<a torch.float32 tensor of shape (2,)> is invalid: allowed a finite number > 0"),
    ("done total_steps text", lambda: _engine().done(total_steps="200"),
     "total_steps='200' is invalid: allowed None (prepare()'s horizon) or an integer >= 0, at most 2**53"),
    ("engine k past the largest count", _set("k", 10**18), "k=1000000000000000000 is invalid: allowed an integer >= 1"),
    ("start_at steps past the largest count", lambda: _engine().start_at(steps=10**30),
     "steps=1000000000000000000000000000000 is invalid: allowed an integer >= 0, at most 2**53"),
    ("prepare total_samples past the largest count",
     lambda: (model := _model()) and prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), COSINE,
                                             micro_batch_size=4, total_samples=2**60),
     "total_samples=1152921504606846976 is invalid: allowed None or an integer >= 1, at most 2**53"),
    ("constant schedule with a warmup", lambda: OptimizationConfig(warmup_fraction=0.5),
     "OptimizationConfig.warmup_fraction=0.5 is invalid: allowed 0 with schedule 'constant'"),
    ("load_records of a misspelt profile", lambda: load_records(REPO / "reports", "quik"),
     "profile='quik' is invalid: allowed one of ('smoke', 'quick', 'paper', 'gpu')"),
    ("reproduction --seed past 32 bits", _cli(reproduction_cli._parse, *RUN, "--seed", "99999999999999999999"),
     "--seed 99999999999999999999 is invalid: allowed an integer >= 0, at most 4294967295"),
    ("reproduction --out ''", _cli(reproduction_cli._parse, *RUN, "--out", ""), "--out '' is invalid: allowed a folder"),
    ("reproduction list --seeds past 32 bits", _cli(reproduction_cli._list, "--seeds", "99999999999999999999"),
     "--seeds 99999999999999999999 is invalid: allowed an integer >= 1"),
    ("reproduction list --out ''", _cli(reproduction_cli._list, "--out", ""), "--out '' is invalid"),
    ("run_all.sh --seeds past 32 bits", _run_all("--seeds", "99999999999999999999"),
     "--seeds '99999999999999999999' is invalid: allowed an integer from 1 to 1000"),
]


@pytest.mark.parametrize("call, expected", [pytest.param(call, expected, id=name) for name, call, expected in ROWS])
def test_an_input_once_taken_silently_is_refused_naming_it(call, expected):
    with pytest.raises(ValueError) as refused:
        call()
    assert expected in str(refused.value)


@pytest.mark.parametrize("unread", [
    dict(k_min=4, k_max=8), dict(k_rule="variance", sigma_target=0.5, noise_window=3),  # a fixed k reads no k range
    dict(min_lr_ratio=0.3),  # a constant schedule decays to nothing
    dict(initial_loss_scale=2.0**10, loss_scale_growth_interval=50),  # fp32 scales no loss
])
def test_fields_a_configuration_never_reads_leave_its_hash_alone(unread):
    assert OptimizationConfig(**unread).config_hash() == OptimizationConfig().config_hash()


@pytest.mark.parametrize("read", [
    dict(adaptive=True, k=4, k_min=4, k_max=8), dict(schedule="cosine", min_lr_ratio=0.3),
    dict(precision="fp16", initial_loss_scale=2.0**10)])
def test_the_same_fields_where_they_act_change_it(read):
    bare = {key: value for key, value in read.items() if key in ("adaptive", "k", "schedule", "precision")}
    if "k_min" in read:
        bare.update(k=4, k_min=4, k_max=4)
    assert OptimizationConfig(**read).config_hash() != OptimizationConfig(**bare).config_hash()


def test_start_at_stays_exact_where_the_optimizer_was_loaded_after_prepare():
    """The recommended order: prepare() records the LR the optimizer was built with, a checkpoint
    loaded afterwards (its param groups replaced) does not change it."""
    saved = torch.optim.SGD(_model().parameters(), lr=1e-3)
    saved.param_groups[0]["lr"] = 3.698e-4
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine = prepare(model, optimizer, COSINE, micro_batch_size=4, total_steps=200)
    optimizer.load_state_dict(saved.state_dict())
    engine.start_at(steps=40)
    reference = _engine()
    reference.start_at(steps=40, lr=1e-3)
    assert engine.next_lr == pytest.approx(reference.next_lr) and engine.next_lr > 4e-4
