"""What a practitioner with only torch installed does with trainopt_core (run by test_torch_only.py
in a subprocess whose imports of the reproduction's and notebooks' packages fail).

    python torch_only_target.py            every check below, in one process (+ 2 spawned ranks)
    python -m torch_only_target --ddp      one rank of a job started by the launch CLI
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn


class Blocks(nn.Module):
    """A model that is neither nn.Sequential nor a known ResNet/GPT-2: it lists its blocks."""

    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    @property
    def checkpoint_blocks(self):
        return list(self.layers)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def sequential(depth: int = 4) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), *[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(depth)],
                         nn.Linear(16, 3))


def train(model: nn.Module, config, *, steps: int, micro: int = 4, seed: int = 0, ddp: bool = False):
    """The README's loop: returns the engine and the losses."""
    import trainopt_core

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    engine = trainopt_core.prepare(model, optimizer, config, total_samples=steps * micro * 8, micro_batch_size=micro)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    while engine.optimizer_steps < steps:
        x, y = torch.randn(micro, 8, generator=generator), torch.randint(0, 3, (micro,), generator=generator)
        with engine.autocast():
            loss = F.cross_entropy(model(x), y)
        engine.backward(loss, num_items=len(y))
        engine.step()
        losses.append(float(loss.detach()))
    return engine, losses


def ddp_rank(steps: int = 3) -> list[float]:
    """One rank of a 2-process job: adaptive accumulation (k in [2, 4]) under DDP, each rank on its
    own data; returns its weights' sums, which DDP keeps equal across ranks."""
    from trainopt_core import OptimizationConfig

    torch.manual_seed(0)
    model = sequential()
    rank = torch.distributed.get_rank()
    config = OptimizationConfig(k=2, adaptive=True, k_min=2, k_max=4, clip_norm=1.0)
    train(model, config, steps=steps, seed=rank, ddp=True)
    return [float(p.detach().sum()) for p in model.parameters()]


def check_everything() -> None:
    blocked = os.environ["TRAINOPT_BLOCKED_IMPORTS"].split(",")
    for name in blocked:  # the environment really lacks them
        try:
            __import__(name)
        except ImportError:
            continue
        raise AssertionError(f"{name} was importable: the torch-only environment is not isolated")

    import trainopt_core
    from trainopt_core import OptimizationConfig, distributed, measure
    from trainopt_core.checkpointing import checkpoint_plan

    # the README's preset, in bf16 (this CPU's reduced precision), on two kinds of model
    config = OptimizationConfig.optimized().replace(precision="bf16")
    for model in (sequential(), Blocks()):
        engine, losses = train(model, config, steps=3)
        plan = checkpoint_plan(model)
        assert plan is not None and plan.num_blocks >= 4, plan
        assert all(map(torch.isfinite, map(torch.tensor, losses))), losses
        assert engine.optimizer_steps == 3 and engine.stats()["next_k_micro_batches"] in range(4, 9)
        print(f"{type(model).__name__}: {plan.num_blocks} blocks in {plan.segments} checkpointed segments, "
              f"3 steps, last loss {losses[-1]:.3f}")

    # checkpointing leaves the gradients of a checkpoint_blocks model unchanged
    torch.manual_seed(1)
    plain, checkpointed = Blocks(), Blocks()
    checkpointed.load_state_dict(plain.state_dict())
    trainopt_core.apply_activation_checkpointing(checkpointed, segments="sqrt")
    x = torch.randn(5, 8)
    for model in (plain, checkpointed):
        model(x).square().sum().backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad)

    # measurement of a step
    model = sequential()
    optimizer = torch.optim.AdamW(model.parameters())
    memory, meter = measure.PeakMemory("cpu"), measure.ThroughputMeter(warmup_steps=0)
    with memory.track_step(model, optimizer) as tracker, meter.step(16):
        F.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,))).backward()
        optimizer.step()
    memory.add_tracked(tracker)
    assert memory.peak_bytes() > 0 and meter.items_per_s() > 0

    # the notebook-safe launcher: 2 gloo ranks training under DDP end with equal weights
    sums = distributed.run_processes(ddp_rank, 2, backend="gloo", threads_per_process=1, timeout_s=120)
    assert sums[0] == sums[1], sums
    print("run_processes: 2 DDP ranks agree on the weights")

    leaked = sorted(name for name, module in sys.modules.items() if module is not None and name.split(".")[0] in blocked)
    assert not leaked, leaked
    print("ALL CHECKS PASSED")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddp", action="store_true")
    if parser.parse_args().ddp:
        from trainopt_core import distributed

        distributed.init_distributed()
        sums = torch.tensor(ddp_rank(), dtype=torch.float64)
        gathered = [torch.empty_like(sums) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(gathered, sums)  # tensors: all_gather_object needs numpy
        assert torch.equal(gathered[0], gathered[1]), gathered
        if distributed.is_main_process():
            print("launch CLI: 2 DDP ranks agree on the weights", flush=True)
        # both ranks reach teardown before either destroys the group: without it, a rank that
        # exits first can leave gloo aborting the other's teardown (seen once in CI, rank 0
        # SIGABRT "terminate called without an active exception" after the success line)
        torch.distributed.barrier()
        distributed.cleanup()
    else:
        check_everything()
