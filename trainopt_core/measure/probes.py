"""Machine-state probes: what the machine itself could do while configurations were timed.

Interleaved timing cancels a change of the machine's state only when the change slows every
configuration alike. On a shared machine it need not: a neighbour contending for the memory
system slows a configuration with a large working set more than one whose micro-batches fit in
the cache, so a ratio of two configurations moves with the machine's state. Two probes, timed as
workloads in the same interleaved rounds as the configurations, record that state beside them:

- `MemoryCopyProbe`: bytes per second of copying a buffer much larger than the last-level cache
  (what a streaming, memory-bound kernel gets);
- `MatmulProbe`: FLOP/s of a matmul whose operands fit in the cache (what compute gets).

A probe is a workload in the sense of `timing.interleaved_windows`: calling it runs one "step"
and returns the items it processed (bytes, or FLOPs), so items/s is its rate.
"""
from __future__ import annotations

import torch

from .._errors import fail as _fail

# Sizes per device type: the copy well beyond a CPU's last-level cache (tens of MiB) or a GPU's
# L2; the matmul inside a CPU core's L2 share, or large enough to fill a GPU.
COPY_MIB = {"cpu": 128, "cuda": 512}
MATMUL_SIZE = {"cpu": 256, "cuda": 4096}
REPEATS_PER_STEP = 4


def _device(device) -> torch.device:
    return torch.device(device if device is not None else "cpu")


class MemoryCopyProbe:
    """`REPEATS_PER_STEP` copies of a `copy_mib` MiB fp32 buffer a step; items are bytes moved
    (each copy reads and writes the buffer once)."""

    name = "memory_copy"
    unit = "bytes/s"

    def __init__(self, device=None, copy_mib: int | None = None):
        device = _device(device)
        copy_mib = COPY_MIB.get(device.type, 128) if copy_mib is None else copy_mib
        if isinstance(copy_mib, bool) or not isinstance(copy_mib, int) or copy_mib < 1:
            _fail("copy_mib", copy_mib, "an integer >= 1 (MiB)")
        self.copy_mib = copy_mib
        elements = copy_mib * 2**20 // 4
        self._source = torch.ones(elements, dtype=torch.float32, device=device)
        self._target = torch.empty_like(self._source)

    def __call__(self) -> float:
        for _ in range(REPEATS_PER_STEP):
            self._target.copy_(self._source)
        return float(REPEATS_PER_STEP * 2 * self._source.numel() * self._source.element_size())

    def describe(self) -> str:
        return f"copy of a {self.copy_mib} MiB fp32 buffer (bytes read + written per second)"


class MatmulProbe:
    """`REPEATS_PER_STEP` fp32 products of two `size` x `size` matrices a step; items are FLOPs
    (2·size³ a product). TF32 follows torch's current setting, as the workloads' matmuls do."""

    name = "matmul"
    unit = "FLOP/s"

    def __init__(self, device=None, size: int | None = None):
        device = _device(device)
        size = MATMUL_SIZE.get(device.type, 256) if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            _fail("size", size, "an integer >= 1")
        self.size = size
        generator = torch.Generator().manual_seed(0)
        self._a = torch.randn(size, size, generator=generator).to(device)
        self._b = torch.randn(size, size, generator=generator).to(device)
        self._out = torch.empty(size, size, device=device)

    def __call__(self) -> float:
        for _ in range(REPEATS_PER_STEP):
            torch.mm(self._a, self._b, out=self._out)
        return float(REPEATS_PER_STEP * 2 * self.size**3)

    def describe(self) -> str:
        return f"fp32 matmul {self.size}x{self.size} (FLOP/s)"


def machine_probes(device=None) -> dict:
    """The probes to time beside the configurations on `device`: {name: probe}."""
    probes = (MemoryCopyProbe(device), MatmulProbe(device))
    return {probe.name: probe for probe in probes}


__all__ = ["COPY_MIB", "MATMUL_SIZE", "MatmulProbe", "MemoryCopyProbe", "machine_probes"]
