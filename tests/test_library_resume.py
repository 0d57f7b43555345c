"""The library's resume recipe (engine.state_dict's docstring) continues a loop with dropout
bit-identically: model, optimizer, engine, random generators and the loop's data position."""
import io

import torch
import torch.nn.functional as F
from torch import nn

import trainopt_core


def _build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = trainopt_core.OptimizationConfig.optimized().replace(precision="fp32", checkpointing=None, zero_stage=0)
    engine = trainopt_core.prepare(model, optimizer, config, total_samples=640, micro_batch_size=8)
    return model, optimizer, engine


def _data():
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator))
            for _ in range(200)]


def _train(model, engine, data, start, steps):
    """`steps` optimizer steps from batch `start`; returns the next batch's index."""
    index = start
    for _ in range(steps):
        for _ in engine.micro_steps():
            x, y = data[index]
            index += 1
            with engine.autocast():
                loss = F.cross_entropy(model(x), y)
            engine.backward(loss, num_items=len(y))
            engine.step()
    return index


def test_a_loop_with_dropout_resumes_bit_identically_with_the_documented_state():
    data = _data()
    model, optimizer, engine = _build()
    drawn = _train(model, engine, data, 0, 3)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "engine": engine.state_dict(),
                "rng": trainopt_core.rng_state(), "batches_drawn": drawn}, buffer)
    _train(model, engine, data, drawn, 3)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    assert _equal(reference, _resumed(buffer, with_generators=True))
    # without the generators the dropout masks differ, and so does the model
    assert not _equal(reference, _resumed(buffer, with_generators=False))


def _resumed(buffer, *, with_generators: bool) -> dict:
    """The saved loop rebuilt and restored as documented (generators or not), 3 steps further."""
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    model, optimizer, engine = _build()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    engine.load_state_dict(state["engine"])
    if with_generators:
        trainopt_core.set_rng_state(state["rng"])
    _train(model, engine, _data(), state["batches_drawn"], 3)
    return model.state_dict()


def _equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)
