"""A non-finite loss whose gradients are finite (a bad regularizer term: `loss + inf`) is not a
normal step: the torch engine skips it, counts it and stops after max_nonfinite_steps in a row,
in every precision -- as it does for non-finite gradients."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.precision import NonFiniteTrainingError


def _setup(precision):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                     OptimizationConfig(precision=precision, max_nonfinite_steps=2), micro_batch_size=4, device="cpu")
    return model, engine


def _step(model, engine, bad: bool) -> bool:
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    with engine.autocast():
        loss = F.cross_entropy(model(x), y)
    if bad:
        loss = loss + torch.tensor(math.inf)  # its gradient is the loss's own: finite
    engine.backward(loss, num_items=4)
    return engine.step()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_non_finite_loss_with_finite_gradients_is_skipped_counted_and_stops_the_run(precision):
    model, engine = _setup(precision)
    assert _step(model, engine, bad=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not _step(model, engine, bad=True)
    assert engine.skipped_steps == 1 and engine.optimizer_steps == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the weights untouched
    assert _step(model, engine, bad=False)  # a finite step in between resets the count
    assert not _step(model, engine, bad=True)
    with pytest.raises(NonFiniteTrainingError, match="non-finite loss at optimizer step 5"):
        _step(model, engine, bad=True)  # the second in a row: max_nonfinite_steps=2
    assert engine.skipped_steps == 3



DEEPSPEED_NONFINITE_LOSS_SCRIPT = """
import math, torch, torch.nn.functional as F
from trainopt_core import OptimizationConfig, prepare
from trainopt_core.precision import NonFiniteTrainingError
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                 OptimizationConfig(precision="fp32", max_nonfinite_steps=2), micro_batch_size=4, backend="deepspeed")
for bad in (False, True):
    with engine.autocast():
        loss = F.cross_entropy(engine.model(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine.backward(loss + torch.tensor(math.inf) if bad else loss)  # its gradients stay finite
    print("gradients finite:", all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()))
    try:
        print("stepped:", engine.step())
    except NonFiniteTrainingError as error:
        print("stopped:", error)
        print("weights kept:", all(torch.equal(before[k], v) for k, v in model.state_dict().items()))
engine.close()
"""


@pytest.mark.slow
def test_deepspeed_stops_on_a_non_finite_loss_saying_so(run_deepspeed_script):
    out = run_deepspeed_script(DEEPSPEED_NONFINITE_LOSS_SCRIPT)
    assert "stepped: True" in out and "gradients finite: True\nstopped:" in out
    stop = next(line for line in out.splitlines() if line.startswith("stopped:"))
    assert "non-finite loss at optimizer step 2 in fp32 (DeepSpeed ZeRO-0): stopped before its optimizer step" in stop
    assert "non-finite gradients" not in stop and "max_nonfinite_steps=" not in stop
    assert "weights kept: True" in out
