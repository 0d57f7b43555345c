"""The measurement layer every table uses (SPEC §4), one module per quantity.

- `timing`: `Timer`, `elapsed_s`, `ThroughputMeter` (items/s after warm-up), `time_to_target`.
- `memory`: `PeakMemory` (CUDA allocator peak, or on CPU the live-tensor `MemoryTracker` with a
  breakdown into parameters, gradients, optimizer state, activations and temporaries).
- `flops`: peak FLOP/s (datasheet or matmul probe, with its source) and `flops_utilization`.
- `energy`: `EnergyMeter` (NVML / RAPL counters, or None with the reason).
- `costs`: eq. 3's cost and `cheapest_config` under a memory budget.
- `manifest`: `run_manifest`, the hardware and software a measurement was made on.
"""
from .costs import cheapest_config, cost
from .energy import EnergyMeter
from .flops import (
    GPU_DATASHEET_FLOPS, datasheet_peak_flops, flops_utilization, matmul_probe_flops, measure_peak_flops,
    peak_flops, precision_name,
)
from .manifest import run_manifest
from .memory import CATEGORIES as MEMORY_CATEGORIES
from .memory import MemoryTracker, PeakMemory
from .timing import ThroughputMeter, Timer, elapsed_s, synchronize, time_to_target

__all__ = [
    "GPU_DATASHEET_FLOPS", "MEMORY_CATEGORIES", "EnergyMeter", "MemoryTracker", "PeakMemory",
    "ThroughputMeter", "Timer", "cheapest_config", "cost", "datasheet_peak_flops", "elapsed_s",
    "flops_utilization", "matmul_probe_flops", "measure_peak_flops", "peak_flops", "precision_name",
    "run_manifest", "synchronize", "time_to_target",
]
