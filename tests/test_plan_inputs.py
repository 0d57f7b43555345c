"""Every plan() argument is checked for its type and range before anything is built: a bad value
gets a ValueError naming the argument, the value and what is allowed. One row per case:
(id, the arguments given to plan() over a valid call, a substring the message must contain)."""
import math

import pytest
import torch
from torch import nn

from trainopt_core import OptimizationConfig, plan


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


X, Y = torch.randn(8, 8), torch.randint(0, 4, (8,))

ROWS = [
    # flags: True or False, nothing truthy in their place
    ("try_compile_str", dict(try_compile="no"), "try_compile='no' is invalid: allowed None (on CUDA only), True or False"),
    ("try_compile_int", dict(try_compile=1), "try_compile=1 is invalid"),
    ("speed_options_str", dict(speed_options="False"), "speed_options='False' is invalid: allowed True or False"),
    ("speed_options_none", dict(speed_options=None), "speed_options=None is invalid"),
    ("progress_int", dict(progress=1), "progress=1 is invalid: allowed True or False"),
    ("adaptive_accumulation_str", dict(adaptive_accumulation="yes"), "adaptive_accumulation='yes' is invalid"),
    ("loss_takes_model_int", dict(loss_takes_model=0), "loss_takes_model=0 is invalid"),
    ("optimizer_takes_model_str", dict(optimizer_takes_model="no"), "optimizer_takes_model='no' is invalid"),
    # splits: None or a sequence of integers >= 1 that divide the batch
    ("ks_str", dict(ks="124"), "ks='124' is invalid: allowed None"),
    ("ks_int", dict(ks=4), "ks=4 is invalid"),
    ("ks_empty", dict(ks=()), "ks=() is invalid"),
    ("ks_zero", dict(ks=(1, 0)), "ks=(1, 0) is invalid: allowed None (the powers of two up to 8 that divide the batch)"),
    ("ks_float", dict(ks=(2.0,)), "ks=(2.0,) is invalid"),
    ("ks_bool", dict(ks=(True,)), "ks=(True,) is invalid"),
    ("ks_not_dividing", dict(ks=(3,)), "ks=(3,) is invalid: allowed integers >= 1 dividing the batch size 8"),
    ("k_max_one", dict(k_max=1), "k_max=1 is invalid: allowed an integer >= 2"),
    ("k_max_float", dict(k_max=2.5), "k_max=2.5 is invalid"),
    ("k_max_bool", dict(k_max=True), "k_max=True is invalid"),
    # counts
    ("windows_zero", dict(windows=0), "windows=0 is invalid: allowed None (sized to the device) or an integer >= 1"),
    ("windows_float", dict(windows=1.5), "windows=1.5 is invalid"),
    ("windows_bool", dict(windows=True), "windows=True is invalid"),
    ("steps_per_window_negative", dict(steps_per_window=-1), "steps_per_window=-1 is invalid"),
    ("run_samples_zero", dict(run_samples=0), "run_samples=0 is invalid: allowed None (the run's length unknown)"),
    ("run_samples_float", dict(run_samples=10.0), "run_samples=10.0 is invalid"),
    ("run_samples_bool", dict(run_samples=True), "run_samples=True is invalid"),
    # amounts: numbers > 0
    ("memory_budget_str", dict(memory_budget_bytes="1GB"), "memory_budget_bytes='1GB' is invalid: allowed None (no budget)"),
    ("memory_budget_bool", dict(memory_budget_bytes=True), "memory_budget_bytes=True is invalid"),
    ("memory_budget_nan", dict(memory_budget_bytes=math.nan), "memory_budget_bytes=nan is invalid"),
    ("memory_budget_zero", dict(memory_budget_bytes=0), "memory_budget_bytes=0 is invalid"),
    ("planning_memory_str", dict(planning_memory_bytes="big"), "planning_memory_bytes='big' is invalid"),
    ("planning_memory_inf", dict(planning_memory_bytes=math.inf), "planning_memory_bytes=inf is invalid"),
    ("time_budget_zero", dict(time_budget_s=0), "time_budget_s=0 is invalid: allowed None (no limit) or a number of "
                                                "seconds > 0"),
    ("time_budget_negative", dict(time_budget_s=-5.0), "time_budget_s=-5.0 is invalid"),
    ("time_budget_str", dict(time_budget_s="60"), "time_budget_s='60' is invalid"),
    ("time_budget_bool", dict(time_budget_s=True), "time_budget_s=True is invalid"),
    ("time_budget_inf", dict(time_budget_s=math.inf), "time_budget_s=inf is invalid"),
    # eq. 3's weights: three finite numbers >= 0, time + memory > 0
    ("weights_two", dict(weights=(1.0, 0.0)), "weights=(1.0, 0.0) is invalid: allowed three finite numbers >= 0"),
    ("weights_str", dict(weights="abc"), "weights='abc' is invalid"),
    ("weights_number", dict(weights=5), "weights=5 is invalid"),
    ("weights_bool", dict(weights=(True, 0, 0)), "weights=(True, 0, 0) is invalid"),
    ("weights_negative", dict(weights=(-1.0, 0.0, 0.0)), "weights=(-1.0, 0.0, 0.0) is invalid"),
    ("weights_energy_only", dict(weights=(0.0, 0.0, 1.0)), "with time + memory > 0"),
    ("weights_nan", dict(weights=(math.nan, 0.0, 0.0)), "weights=(nan, 0.0, 0.0) is invalid"),
    # the caller's configuration
    ("base_dict", dict(base={"k": 2}), "base='dict' is invalid: allowed None or an OptimizationConfig"),
    ("base_adaptive", dict(base=OptimizationConfig(adaptive=True, k=2, k_min=2, k_max=4)),
     "allowed with adaptive_accumulation=True"),
    # what is planned on
    ("device_name", dict(device="gpu"), "device='gpu' is invalid: allowed None (the model's), a torch.device or a "
                                        "device name"),
    ("device_int", dict(device=3), "device=3 is invalid"),
    ("model_str", dict(model="net"), "model='str' is invalid: allowed a torch.nn.Module"),
    ("model_without_parameters", dict(model=nn.ReLU()), "model='ReLU' is invalid: allowed a module with parameters"),
    ("optimizer_factory_str", dict(optimizer_factory="adamw"), "optimizer_factory='str' is invalid: allowed a callable"),
    ("loss_fn_none", dict(loss_fn=None), "loss_fn='NoneType' is invalid: allowed a callable"),
    ("batch_tensor", dict(batch=X), "batch='Tensor' is invalid: allowed a sequence (inputs..., targets) of tensors"),
    ("batch_inputs_only", dict(batch=(X,)), "batch='tuple' is invalid"),
    ("batch_empty", dict(batch=()), "batch='tuple' is invalid"),
    ("batch_not_tensors", dict(batch=("x", "y")), "batch='tuple' is invalid"),
    ("batch_scalar", dict(batch=(torch.tensor(1.0), torch.tensor(2))), "batch='tuple' is invalid"),
    ("batch_sizes_differ", dict(batch=(X, Y[:4])), "batch=[(8, 8), (4,)] is invalid: allowed tensors with the same "
                                                   "first dimension"),
    ("batch_adaptive_too_small", dict(batch=(X[:4], Y[:4]), adaptive_accumulation=True),
     "with adaptive_accumulation, >= 6 samples in all"),
]
if not torch.cuda.is_available():
    ROWS.append(("device_missing", dict(device="cuda"), "device='cuda' is invalid: allowed a device this machine has"))


def _plan(**given):
    arguments = dict(model=_model(), optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch=(X, Y),
                     loss_fn=nn.functional.cross_entropy, windows=1, steps_per_window=1, time_budget_s=None)
    return plan(**{**arguments, **given})


@pytest.mark.parametrize("given, expected", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_a_bad_plan_argument_is_refused_naming_it(given, expected):
    with pytest.raises(ValueError) as refused:
        _plan(**given)
    assert expected in str(refused.value)


def test_the_valid_call_the_rows_change_plans():
    assert _plan(ks=(1, 2), speed_options=False).chosen["feasible"]
