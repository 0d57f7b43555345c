"""Bad input gets a ValueError that names the field and what is allowed -- not a bare TypeError, a
torch traceback from deep inside, the blame put on another field, or silence."""
import math

import pytest
import torch
from torch import nn

import trainopt_core
from trainopt_core import OptimizationConfig, prepare
from trainopt_core.reporting.results import load_records


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _plan(**kwargs):
    model = _model()
    batch = (torch.randn(8, 8), torch.randint(0, 4, (8,)))
    return trainopt_core.plan(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch, nn.functional.cross_entropy,
                              windows=1, steps_per_window=1, **kwargs)


@pytest.mark.parametrize("field, value", [("memory_budget_bytes", "1GB"), ("memory_budget_bytes", True),
                                          ("memory_budget_bytes", math.nan), ("planning_memory_bytes", "big")])
def test_plan_names_a_budget_that_is_no_number(field, value):
    with pytest.raises(ValueError, match=f"{field}=.* is invalid: allowed None .* or a number of bytes > 0"):
        _plan(**{field: value})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_plan_on_a_device_this_machine_lacks_says_so():
    with pytest.raises(ValueError, match="device='cuda' is invalid: allowed a device this machine has"):
        _plan(device="cuda")


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True])
def test_prepare_names_a_bad_world_size(world_size):
    model = _model()
    with pytest.raises(ValueError, match=r"world_size=.* is invalid: allowed None \(torch.distributed's\) or an "
                                         r"integer >= 1"):
        prepare(model, torch.optim.AdamW(model.parameters()), OptimizationConfig(), micro_batch_size=4,
                world_size=world_size)


@pytest.mark.parametrize("keyword, value, message", [
    ("num_samples", -4, "num_samples=-4 is invalid: allowed None .* or an integer >= 1"),
    ("num_samples", 2.5, "num_samples=2.5 is invalid: allowed None .* or an integer >= 1"),
    ("num_items", math.inf, "num_items=inf is invalid: allowed a finite number > 0"),
    ("num_items", math.nan, "num_items=nan is invalid: allowed a finite number > 0"),
])
def test_backward_names_a_bad_count(keyword, value, message):
    model = _model()
    engine = prepare(model, torch.optim.AdamW(model.parameters()), OptimizationConfig(), micro_batch_size=4)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
    with pytest.raises(ValueError, match=message):
        engine.backward(loss, **{keyword: value})


def test_an_item_count_tensor_that_is_not_finite_is_named_at_the_step():
    model = _model()
    engine = prepare(model, torch.optim.AdamW(model.parameters()), OptimizationConfig(), micro_batch_size=4)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
    engine.backward(loss, num_items=torch.tensor(math.inf))
    with pytest.raises(ValueError, match="num_items summed to inf over the effective batch: allowed a finite number > 0"):
        engine.step()


@pytest.mark.parametrize("field", ["k", "k_min", "k_max", "noise_window"])
def test_a_boolean_is_no_count_of_micro_batches(field):
    with pytest.raises(ValueError, match=f"OptimizationConfig.{field}=True is invalid: allowed an integer >= 1"):
        OptimizationConfig(**{field: True})


def test_load_records_names_a_reports_folder_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="reports_dir=.*nonexistent.* is invalid: allowed an existing folder"):
        load_records(tmp_path / "nonexistent", "quick")
    assert load_records(tmp_path, "quick") == []  # a folder with no runs yet is no mistake


@pytest.mark.parametrize("device, message", [("tpu", "--device 'tpu' is invalid: allowed cpu, cuda or cuda:N"),
                                             ("gpu0", "--device 'gpu0' is invalid: allowed cpu, cuda or cuda:N")]
                         + ([] if torch.cuda.is_available() else
                            [("cuda", "--device 'cuda' is invalid here: no CUDA GPU")]))
def test_the_run_command_line_names_a_device_it_cannot_use(device, message, capsys):
    from trainopt_core.reproduction.__main__ import _parse

    with pytest.raises(SystemExit):
        _parse(["--task", "cifar10", "--config", "baseline", "--device", device])
    assert message in capsys.readouterr().err


