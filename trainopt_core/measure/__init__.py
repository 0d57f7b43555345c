"""The measurement layer every table uses (SPEC §4), one module per quantity.

- `timing`: `Timer`, `elapsed_s`, `ThroughputMeter` (items/s after warm-up), `time_to_target`,
  `interleaved_windows` (workloads timed in turn, A, B, A, B ..., in one process).
- `stats`: mean ± 95 % CI (`summarize`), ratios of paired measurements (`paired_ratio`).
- `memory`: `PeakMemory`, a run's peak per training step (CUDA allocator peak, or on CPU the
  tracked steps') and its evaluations' apart.
- `tracker`: the live-tensor `MemoryTracker`, one step's peak with a breakdown into parameters,
  gradients, optimizer state, activations, temporaries and DDP's buckets.
- `activations`: bytes autograd saves for backward (`saved_activation_bytes`, `SavedTensorMeter`):
  eq. 18's activations, and what checkpointing leaves of them.
- `flops`: peak FLOP/s (datasheet or matmul probe, TF32 detected per workload, with its source)
  and `model_flops_utilization` (recompute excluded).
- `energy`: `EnergyMeter` (NVML / RAPL counters, or None with the reason).
- `costs`: eq. 3's cost and `cheapest_config` under a memory budget.
- `manifest`: `run_manifest`, the hardware and software a measurement was made on, and
  `hardware_fingerprint` (what must match for two timings to be compared), `cpu_isa` and
  `cpu_computes_bf16_natively` (whether bf16 autocast runs on bf16 instructions or emulated).
"""
from .costs import cheapest_config, cost
from .energy import EnergyMeter
from .flops import (
    GPU_DATASHEET_FLOPS, datasheet_peak_flops, flops_utilization, flops_workload, matmul_probe_flops,
    measure_peak_flops, model_flops_utilization, peak_flops, precision_name, tf32_enabled,
)
from .manifest import cpu_computes_bf16_natively, cpu_isa, hardware_fingerprint, run_manifest
from .memory import PeakMemory
from .stats import paired_ratio, product_ratio, summarize, t_quantile_975
from .timing import ThroughputMeter, Timer, elapsed_s, interleaved_windows, synchronize, time_to_target
from .tracker import CATEGORIES as MEMORY_CATEGORIES
from .tracker import MemoryTracker

__all__ = [
    "GPU_DATASHEET_FLOPS", "MEMORY_CATEGORIES", "EnergyMeter", "MemoryTracker", "PeakMemory",
    "ThroughputMeter", "Timer", "cheapest_config", "cost", "cpu_computes_bf16_natively", "cpu_isa", "datasheet_peak_flops", "elapsed_s",
    "flops_utilization", "flops_workload", "hardware_fingerprint", "interleaved_windows", "matmul_probe_flops", "measure_peak_flops", "model_flops_utilization", "paired_ratio",
    "peak_flops", "precision_name", "product_ratio", "run_manifest", "summarize", "synchronize",
    "t_quantile_975", "tf32_enabled", "time_to_target",
]
