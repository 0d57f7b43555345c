"""Model FLOPs utilization (SPEC §4): analytic training FLOPs per item × throughput ÷ the device's peak.

"Model" FLOPs utilization (MFU, PaLM, Chowdhery et al. 2022, App. B): the numerator counts the
FLOPs the model needs to train on an item (forward + backward, 3× the forward), never the
forward pass that activation checkpointing recomputes. Checkpointed runs therefore do more work
than the numerator says; counting it too would be hardware FLOPs utilization (HFU), which this
library does not report.

The peak carries its source: "datasheet: <GPU> <precision> dense" for a known GPU, or
"measured: matmul probe NxN <dtype> on <device>" for anything else. fp32 on a GPU runs on
TF32 tensor cores when PyTorch allows it for the workload's dominant operation (matmuls:
`torch.backends.cuda.matmul` -- off by default; cuDNN convolutions: `torch.backends.cudnn` -- on
by default), and is then divided by the TF32 peak; the source says which and why.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import time
from pathlib import Path

import torch

from .timing import synchronize
from .._errors import fail as _fail

_PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_PRECISIONS = {dtype: name for name, dtype in _PRECISION_DTYPES.items()}

# Dense (no structured sparsity) peak FLOP/s from NVIDIA's datasheets / architecture whitepapers.
# fp32 is the CUDA-core rate; "tf32" the tensor-core rate fp32 ops get when PyTorch lets them use
# TF32 (cuDNN convolutions by default, matmuls only when asked: see `tf32_enabled`);
# fp16/bf16 are tensor-core rates with FP32 accumulation, which is what PyTorch's matmuls use.
# Patterns are tried in order (H100 variants before the generic name; A10G is not an A10).
GPU_DATASHEET_FLOPS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"H200 NVL", "NVIDIA H200 NVL", {"fp32": 60e12, "tf32": 418e12, "fp16": 835e12, "bf16": 835e12}),
    (r"H200", "NVIDIA H200 SXM", {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12}),
    (r"H100 NVL", "NVIDIA H100 NVL", {"fp32": 60e12, "tf32": 418e12, "fp16": 835e12, "bf16": 835e12}),
    (r"H100 PCIe", "NVIDIA H100 PCIe", {"fp32": 51e12, "tf32": 378e12, "fp16": 756e12, "bf16": 756e12}),
    (r"H100.*(SXM|HBM3)", "NVIDIA H100 SXM", {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12}),
    (r"A100", "NVIDIA A100", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12}),
    (r"RTX 3090", "NVIDIA GeForce RTX 3090", {"fp32": 35.6e12, "tf32": 35.6e12, "fp16": 71e12, "bf16": 71e12}),
    (r"RTX 4090", "NVIDIA GeForce RTX 4090", {"fp32": 82.6e12, "tf32": 82.6e12, "fp16": 165.2e12, "bf16": 165.2e12}),
    (r"RTX A6000", "NVIDIA RTX A6000", {"fp32": 38.7e12, "tf32": 77.4e12, "fp16": 154.8e12, "bf16": 154.8e12}),
    (r"V100.*SXM", "NVIDIA V100 SXM2", {"fp32": 15.7e12, "fp16": 125e12}),
    (r"V100", "NVIDIA V100 PCIe", {"fp32": 14e12, "fp16": 112e12}),
    (r"L40S", "NVIDIA L40S", {"fp32": 91.6e12, "tf32": 183e12, "fp16": 362e12, "bf16": 362e12}),
    (r"\bL4\b", "NVIDIA L4", {"fp32": 30.3e12, "tf32": 60e12, "fp16": 121e12, "bf16": 121e12}),
    (r"\bA10\b", "NVIDIA A10", {"fp32": 31.2e12, "tf32": 62.5e12, "fp16": 125e12, "bf16": 125e12}),
    (r"\bT4\b", "NVIDIA T4", {"fp32": 8.1e12, "fp16": 65e12}),
)


def precision_name(precision: str | torch.dtype) -> str:
    """"fp32" | "fp16" | "bf16" for a precision name or a torch dtype."""
    if isinstance(precision, torch.dtype):
        if precision not in _DTYPE_PRECISIONS:
            _fail("precision", precision, f"one of {list(_DTYPE_PRECISIONS)}")
        return _DTYPE_PRECISIONS[precision]
    if precision not in _PRECISION_DTYPES:
        _fail("precision", precision, f"one of {tuple(_PRECISION_DTYPES)} or a matching torch dtype")
    return precision


# ----------------------------------------------------------------------------- TF32
WORKLOADS = ("matmul", "convolution")


def flops_workload(model: torch.nn.Module) -> str:
    """"convolution" for a model with convolution layers (a CNN: its FLOPs are convolutions),
    else "matmul" (MLPs, transformers; GPT-2's `Conv1D` is a matmul, not a convolution)."""
    conv = torch.nn.modules.conv._ConvNd
    return "convolution" if any(isinstance(m, conv) for m in model.modules()) else "matmul"


def _resolved_fp32_precision(*settings) -> str:
    # torch >= 2.9: "none" at one level inherits the level above (operator -> backend ->
    # torch.backends.fp32_precision); "none" all the way up is IEEE fp32.
    for setting in settings:
        value = getattr(setting, "fp32_precision", "none")
        if value != "none":
            return value
    return "ieee"


def tf32_enabled(workload: str = "matmul") -> tuple[bool, str]:
    """Whether fp32 `workload` ops on a CUDA GPU may run on TF32 tensor cores, and the flag that says so.

    "matmul": cuBLAS matmuls (`torch.backends.cuda.matmul.fp32_precision`, or before torch 2.9
    `torch.backends.cuda.matmul.allow_tf32` / `torch.set_float32_matmul_precision`; off by
    default). "convolution": cuDNN convolutions (`torch.backends.cudnn.conv.fp32_precision`, or
    `torch.backends.cudnn.allow_tf32`; on by default).
    """
    if workload not in WORKLOADS:
        _fail("workload", workload, f"one of {WORKLOADS}")
    backends = torch.backends
    if workload == "convolution":
        conv = getattr(backends.cudnn, "conv", None)
        if conv is not None and hasattr(conv, "fp32_precision"):
            on = _resolved_fp32_precision(conv, backends.cudnn, backends) == "tf32"
            flag = "torch.backends.cudnn.conv.fp32_precision"
        else:
            on, flag = bool(backends.cudnn.allow_tf32), "torch.backends.cudnn.allow_tf32"
        return on, f"cuDNN convolutions {'allow' if on else 'do not allow'} TF32 ({flag})"
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        on = _resolved_fp32_precision(backends.cuda.matmul, backends.cudnn, backends) == "tf32"
        flag = "torch.backends.cuda.matmul.fp32_precision"
    else:
        on, flag = bool(backends.cuda.matmul.allow_tf32), "torch.backends.cuda.matmul.allow_tf32"
    return on, f"matmuls {'allow' if on else 'do not allow'} TF32 ({flag})"


# ----------------------------------------------------------------------------- peak FLOP/s
def datasheet_peak_flops(device_name: str, precision: str | torch.dtype, *,
                         workload: str = "matmul") -> tuple[float, str] | None:
    """(dense peak FLOP/s, source) for a known GPU name, else None.

    fp16/bf16: the tensor-core peak, source "datasheet: <GPU> <precision> dense". fp32: the TF32
    tensor-core peak when `tf32_enabled(workload)` (source "datasheet: <GPU> tf32 dense: tf32
    tensor-core peak for an fp32 run (cuDNN convolutions allow TF32 (...))"), else the CUDA-core
    fp32 peak (source "... fp32 dense (... do not allow TF32 ...)"); a GPU without TF32 (V100,
    T4) gets its fp32 peak.
    """
    precision = precision_name(precision)
    note = ""
    if precision == "fp32":
        tf32, why = tf32_enabled(workload)
        note = f" ({why})"
        if tf32:
            precision = "tf32"
            note = f": tf32 tensor-core peak for an fp32 run ({why})"
    for pattern, name, peaks in GPU_DATASHEET_FLOPS:
        if re.search(pattern, device_name):
            if precision == "tf32" and "tf32" not in peaks and "fp32" in peaks:
                return peaks["fp32"], f"datasheet: {name} fp32 dense (no TF32 tensor cores on this GPU)"
            if precision in peaks:
                return peaks[precision], f"datasheet: {name} {precision} dense{note}"
    return None


def matmul_probe_flops(device: torch.device | str, precision: str | torch.dtype, *,
                       max_size: int | None = None, min_time_s: float | None = None) -> tuple[float, str]:
    """Measured peak matmul FLOP/s of NxN products on this process's threads.

    N doubles from 512 until one product takes >= 50 ms (or reaches `max_size`: 2048 on CPU,
    8192 on GPU); then products run for about `min_time_s` (CPU 2.5 s, GPU 0.5 s) in timed
    chunks. On a GPU the fastest of 3 chunks gives the peak. On a CPU, whose clock and caches
    settle after a while and whose sittings must agree (the same kind of machine, the same MFU
    denominator), the products first run warm for `min_time_s` / 3, then the median of 7 chunks
    gives it: one fast or slow chunk does not move it.
    """
    device = torch.device(device)
    dtype = _PRECISION_DTYPES[precision_name(precision)]
    max_size = max_size or (8192 if device.type == "cuda" else 2048)
    min_time_s = min_time_s if min_time_s is not None else (0.5 if device.type == "cuda" else 2.5)
    if not (isinstance(max_size, int) and max_size >= 1):
        _fail("max_size", max_size, "an integer >= 1")
    if not (min_time_s > 0 and math.isfinite(min_time_s)):
        _fail("min_time_s", min_time_s, "a finite number of seconds > 0")

    def timed(a, b, repeats: int) -> float:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        synchronize(device)
        return time.perf_counter() - start

    generator = torch.Generator(device="cpu").manual_seed(0)
    size = min(512, max_size)
    while True:
        a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
        b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
        timed(a, b, 1)  # warm-up (kernel selection, thread pool)
        one_s = min(timed(a, b, 1) for _ in range(3))
        if one_s >= 0.05 or size >= max_size:
            break
        size = min(2 * size, max_size)
    cpu = device.type == "cpu"
    load = _others_load() if cpu else ""
    chunks = 7 if cpu else 3
    repeats = max(1, int(min_time_s / chunks / max(one_s, 1e-6)))
    if cpu:
        timed(a, b, max(1, int(min_time_s / 3 / max(one_s, 1e-6))))  # warm: the clock and caches settle
    times = sorted(timed(a, b, repeats) for _ in range(chunks))
    chunk_s = times[chunks // 2] if cpu else times[0]
    flops_per_s = 2.0 * size**3 * repeats / chunk_s
    threads = f", {torch.get_num_threads()} threads" if cpu else ""
    which = f"median of {chunks} runs of {repeats} products after a warm-up" if cpu else \
        f"best of {chunks} runs of {repeats} products"
    return flops_per_s, f"measured: matmul probe {size}x{size} {dtype} on {device}{threads} ({which}){load}"


# other processes' busy cores from which a CPU probe's peak is said to be loaded: an MFU against it is
# not comparable (in five fresh processes under load the probe read 6.3-19.1 GFLOP/s where the idle
# part gives ~200, so the same run's MFU would read 10-30x too high)
LOADED_CORES = 0.5


def _others_load() -> str:
    """The load beside a CPU probe, in words for its source: the cores the machine's other processes
    kept busy as it began (and, where that is `LOADED_CORES` or more, that an MFU against it is not
    comparable); "" where the system's CPU times cannot be read."""
    from ..planner.contention import others_busy_cores

    busy = others_busy_cores()
    if busy is None:
        return ""
    said = f"; other processes kept {busy:.1f} of {os.cpu_count()} cores busy as it began"
    if busy >= LOADED_CORES:
        said += ": probed under load, so an MFU against this peak is not comparable with a quiet machine's"
    return said


@contextlib.contextmanager
def _matmul_tf32(enabled: bool):
    """The matmul probe's products run with TF32 on exactly when the workload's ops would."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = before
    else:
        before = matmul.allow_tf32
        matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32 = before


# The CPU's "datasheet": per kind of CPU (instruction set, vendor, family and model) and thread
# count, the median of the matmul probe in fresh processes on a quiet machine, measured and written
# by scripts/calibrate_cpu_peak.py with its runs, commit and date. One probe inside a process moves
# 4-9 % with what the process ran before it (205.6-217.7 GFLOP/s in two sittings' run records on
# one kind), where 8 fresh processes agree within 2 %: a committed median keeps every sitting of a
# kind on one MFU denominator. A kind or thread count not in the file is probed in the process.
CPU_PEAKS_FILE = Path(__file__).with_name("cpu_peaks.json")


def cpu_kind() -> str:
    """This CPU's kind as the peaks file and the between-session floors name it ("AVX512+bf16, AMD family 26 model 2")."""
    from .manifest import cpu_kind as kind_of, hardware_fingerprint

    return kind_of(hardware_fingerprint("cpu"))


def committed_cpu_peak(precision: str, kind: str | None = None, threads: int | None = None) -> tuple[float, str] | None:
    """The committed peak of this kind of CPU at this thread count (`CPU_PEAKS_FILE`), or None."""
    try:
        peaks = json.loads(CPU_PEAKS_FILE.read_text())["peaks"]
    except (OSError, ValueError, KeyError):
        return None
    kind, threads = kind or cpu_kind(), threads or torch.get_num_threads()
    entry = peaks.get(kind, {}).get(str(threads), {}).get(precision)
    if not entry:
        return None
    return entry["flops_per_s"], (f"committed: median of {len(entry['runs'])} fresh processes' matmul probes on {kind}, "
                                  f"{threads} threads ({entry['commit']}, {entry['date']}; {CPU_PEAKS_FILE.name})")


@functools.cache
def _cached_peak(device_key: str, precision: str, prefer_datasheet: bool, workload: str,
                 tf32: bool) -> tuple[float, str]:
    device = torch.device(device_key)
    if device.type != "cuda":
        committed = committed_cpu_peak(precision) if prefer_datasheet and device.type == "cpu" else None
        return committed or matmul_probe_flops(device, precision)
    if prefer_datasheet:
        found = datasheet_peak_flops(torch.cuda.get_device_name(device), precision, workload=workload)
        if found is not None:
            return found
    if precision != "fp32":
        return matmul_probe_flops(device, precision)
    with _matmul_tf32(tf32):
        flops_per_s, source = matmul_probe_flops(device, precision)
    return flops_per_s, f"{source}, TF32 {'on' if tf32 else 'off'} as for this {workload} workload"


def measure_peak_flops(device: torch.device | str, precision: str | torch.dtype = "fp32", *,
                       workload: str = "matmul", prefer_datasheet: bool = True) -> tuple[float, str]:
    """Peak FLOP/s of `device` in `precision` and its source (denominator of model FLOPs utilization).

    `workload` is the operation that dominates the model's FLOPs: "matmul" (transformers, MLPs)
    or "convolution" (CNNs; `flops_workload(model)` tells which). On a CUDA GPU it decides, for
    fp32, whether the TF32 peak applies (`tf32_enabled`): cuDNN lets convolutions use TF32 by
    default, so an fp32 ResNet on an Ampere/Hopper GPU runs at the TF32 rate, while matmuls
    stay fp32 unless asked. A known GPU gets its datasheet value ("datasheet: ..."); any other
    device, or `prefer_datasheet=False`, gets the matmul probe ("measured: ...", on a GPU in
    fp32 run with TF32 on or off as the workload's ops). Cached per process and per TF32
    setting, so every run in one session divides by the same peak.
    """
    device = torch.device(device)
    precision = precision_name(precision)
    if workload not in WORKLOADS:
        _fail("workload", workload, f"one of {WORKLOADS}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tf32 = device.type == "cuda" and precision == "fp32" and tf32_enabled(workload)[0]
    return _cached_peak(str(device), precision, prefer_datasheet, workload, tf32)


peak_flops = measure_peak_flops


# ----------------------------------------------------------------------------- model FLOPs utilization
def model_flops_utilization(flops_per_item: float, items_per_s: float | None, peak_flops_per_s: float) -> float | None:
    """Model FLOPs utilization: analytic training FLOPs per item x items/s / peak FLOP/s.

    `flops_per_item` is the model's training FLOPs per item (forward + backward), without the
    forward recomputed by activation checkpointing; `items_per_s` must count the same items
    (a GPT-2 item is a predicted token: see `trainopt_core.reproduction.tasks`). The run
    records store it under the key `flops_utilization`.
    """
    if not (flops_per_item > 0 and math.isfinite(flops_per_item)):
        _fail("flops_per_item", flops_per_item, "a finite number > 0")
    if not (peak_flops_per_s > 0 and math.isfinite(peak_flops_per_s)):
        _fail("peak_flops_per_s", peak_flops_per_s, "a finite number > 0")
    if items_per_s is None:
        return None
    if items_per_s < 0:
        _fail("items_per_s", items_per_s, "None or a number >= 0")
    return flops_per_item * items_per_s / peak_flops_per_s


flops_utilization = model_flops_utilization  # the record key's name
