"""What the device offers and what it consumed: peak FLOP/s, energy, and the run manifest (SPEC §4).

Every value carries its source: a peak FLOP/s is either "datasheet: <GPU> <precision>" or
"measured: matmul probe NxN <dtype> on <device>"; energy is an NVML or RAPL counter reading or
`None` with "unavailable: <reason>" — never a guess.
"""
from __future__ import annotations

import datetime
import functools
import glob
import importlib.metadata
import math
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import torch

_PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_PRECISIONS = {dtype: name for name, dtype in _PRECISION_DTYPES.items()}

# Dense (no structured sparsity) peak FLOP/s from NVIDIA's datasheets / architecture whitepapers.
# fp32 is the CUDA-core rate (PyTorch does not use TF32 for fp32 matmuls unless asked: then "tf32");
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


def _fail(argument: str, value, allowed: str) -> None:
    raise ValueError(f"{argument}={value!r} is invalid: allowed {allowed}")


def precision_name(precision: str | torch.dtype) -> str:
    """"fp32" | "fp16" | "bf16" for a precision name or a torch dtype."""
    if isinstance(precision, torch.dtype):
        if precision not in _DTYPE_PRECISIONS:
            _fail("precision", precision, f"one of {list(_DTYPE_PRECISIONS)}")
        return _DTYPE_PRECISIONS[precision]
    if precision not in _PRECISION_DTYPES:
        _fail("precision", precision, f"one of {tuple(_PRECISION_DTYPES)} or a matching torch dtype")
    return precision


def _synchronize(device) -> None:
    """Wait for queued CUDA work, so that wall-clock readings include it."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- peak FLOP/s
def datasheet_peak_flops(device_name: str, precision: str | torch.dtype) -> tuple[float, str] | None:
    """(dense peak FLOP/s, "datasheet: <GPU> <precision>") for a known GPU name, else None."""
    precision = precision_name(precision)
    if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        precision = "tf32"  # fp32 matmuls then run on tensor cores at the TF32 rate
    for pattern, name, peaks in GPU_DATASHEET_FLOPS:
        if re.search(pattern, device_name) and precision in peaks:
            return peaks[precision], f"datasheet: {name} {precision} dense"
    return None


def matmul_probe_flops(device: torch.device | str, precision: str | torch.dtype, *,
                       max_size: int | None = None, min_time_s: float | None = None) -> tuple[float, str]:
    """Measured peak matmul FLOP/s: the best of several timed runs of NxN products.

    N doubles from 512 until one product takes >= 50 ms (or reaches `max_size`: 2048 on CPU,
    8192 on GPU); then products run for about `min_time_s` (CPU 1 s, GPU 0.5 s) in 3 timed
    chunks, and the fastest chunk gives the peak (on a shared machine the others are slowed
    by other processes).
    """
    device = torch.device(device)
    dtype = _PRECISION_DTYPES[precision_name(precision)]
    max_size = max_size or (8192 if device.type == "cuda" else 2048)
    min_time_s = min_time_s if min_time_s is not None else (0.5 if device.type == "cuda" else 1.0)
    if not (isinstance(max_size, int) and max_size >= 1):
        _fail("max_size", max_size, "an integer >= 1")
    if not (min_time_s > 0 and math.isfinite(min_time_s)):
        _fail("min_time_s", min_time_s, "a finite number of seconds > 0")

    def timed(a, b, repeats: int) -> float:
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        _synchronize(device)
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
    chunks = 3
    repeats = max(1, int(min_time_s / chunks / max(one_s, 1e-6)))
    best_s = min(timed(a, b, repeats) for _ in range(chunks))
    flops_per_s = 2.0 * size**3 * repeats / best_s
    return flops_per_s, (f"measured: matmul probe {size}x{size} {dtype} on {device} "
                         f"(best of {chunks} runs of {repeats} products)")


@functools.lru_cache(maxsize=None)
def _cached_peak(device_key: str, precision: str, prefer_datasheet: bool) -> tuple[float, str]:
    device = torch.device(device_key)
    if device.type == "cuda" and prefer_datasheet:
        found = datasheet_peak_flops(torch.cuda.get_device_name(device), precision)
        if found is not None:
            return found
    return matmul_probe_flops(device, precision)


def measure_peak_flops(device: torch.device | str, precision: str | torch.dtype = "fp32", *,
                       prefer_datasheet: bool = True) -> tuple[float, str]:
    """Peak FLOP/s of `device` in `precision` and its source (denominator of FLOPs utilization).

    A known GPU gets its datasheet value ("datasheet: ..."); any other device, or
    `prefer_datasheet=False`, gets the matmul probe ("measured: ..."). Cached per process, so
    every run in one session divides by the same peak.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _cached_peak(str(device), precision_name(precision), prefer_datasheet)


peak_flops = measure_peak_flops


# ----------------------------------------------------------------------------- energy
def _rapl_domains(root: str) -> list[Path]:
    # Package domains only (intel-rapl:N): their sub-domains (core, uncore, dram under :N:M)
    # are parts of or beside the package, and summing them would count energy twice.
    return sorted(Path(p) for p in glob.glob(os.path.join(root, "intel-rapl:*")) if re.fullmatch(r"intel-rapl:\d+", Path(p).name))


class EnergyMeter:
    """Energy used between start and stop, from a hardware counter, or None with the reason.

        with EnergyMeter(device) as meter: train()
        meter.energy_j, meter.energy_source

    CUDA: NVML's total-energy counter of the device (`nvmlDeviceGetTotalEnergyConsumption`, mJ;
    needs `nvidia-ml-py`). CPU: RAPL package counters under `/sys/class/powercap` (µJ; wraps at
    `max_energy_range_uj`, handled once per domain; needs read permission). Both count the
    whole device or socket, other processes included.
    """

    def __init__(self, device: torch.device | str = "cpu", *, rapl_root: str = "/sys/class/powercap"):
        self.device = torch.device(device)
        self.rapl_root = rapl_root
        self.energy_j: float | None = None
        self.energy_source: str = "unavailable: not measured yet"
        self._read = None
        self._start = None

    # each reader returns (read() -> list of counter values in joules, wrap ranges in joules, source)
    def _nvml_reader(self):
        try:
            import pynvml
        except ImportError:
            return None, "unavailable: NVML needs the nvidia-ml-py package (import pynvml failed)"
        try:
            pynvml.nvmlInit()
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            try:  # NVML numbers devices without CUDA_VISIBLE_DEVICES: find ours by PCI address
                props = torch.cuda.get_device_properties(index)
                bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            except (AttributeError, TypeError, ValueError, pynvml.NVMLError):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as error:
            return None, f"unavailable: NVML total energy counter ({error})"
        name = torch.cuda.get_device_name(index)
        return (lambda: [pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3], [None],
                f"nvml: total energy counter of {name}"), None

    def _rapl_reader(self):
        domains = _rapl_domains(self.rapl_root)
        if not domains:
            return None, f"unavailable: no RAPL package domains under {self.rapl_root}"
        try:
            ranges = [int((d / "max_energy_range_uj").read_text()) / 1e6 for d in domains]
            names = [(d / "name").read_text().strip() if (d / "name").exists() else d.name for d in domains]
            for d in domains:
                int((d / "energy_uj").read_text())
        except PermissionError:
            return None, f"unavailable: RAPL counters under {self.rapl_root} are not readable (permission denied)"
        except (OSError, ValueError) as error:
            return None, f"unavailable: RAPL counters unreadable ({error})"
        return (lambda: [int((d / "energy_uj").read_text()) / 1e6 for d in domains], ranges,
                f"rapl: {'+'.join(names)} (CPU package counters)"), None

    def start(self) -> "EnergyMeter":
        reader, reason = self._nvml_reader() if self.device.type == "cuda" else self._rapl_reader()
        self.energy_j = None
        if reader is None:
            self._read, self.energy_source = None, reason
            return self
        self._read, self._ranges, self._source = reader
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._start = self._read()
        self.energy_source = "unavailable: meter not stopped"
        return self

    def stop(self) -> tuple[float | None, str]:
        """(energy in joules or None, source) since `start`."""
        if self._read is None:
            return None, self.energy_source
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = self._read()
        total = 0.0
        for begin, finish, wrap in zip(self._start, end, self._ranges):
            delta = finish - begin
            if delta < 0 and wrap:  # the counter wrapped around once
                delta += wrap
            total += delta
        self.energy_j, self.energy_source = total, self._source
        return self.energy_j, self.energy_source

    def __enter__(self) -> "EnergyMeter":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()


# ----------------------------------------------------------------------------- manifest
def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _ram_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _git_state() -> dict:
    checkout = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=checkout,
                                capture_output=True, text=True, timeout=30)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpus() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    driver = None
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # no NVML: ask nvidia-smi, else leave it unknown
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            driver = out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
        except (OSError, subprocess.SubprocessError):
            driver = None
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({"name": props.name, "memory_bytes": int(props.total_memory), "driver": driver,
                     "capability": f"{props.major}.{props.minor}"})
    return gpus


def run_manifest(profile: str | None = None, device: torch.device | str | None = None, **fields) -> dict:
    """Hardware, library versions, git commit and UTC date of this run (no host name).

    git: the commit of this package's checkout (`git rev-parse HEAD`) and whether tracked files
    differ from it (`dirty`; untracked files are ignored); both None outside a git checkout.

    `profile`, `device` and any further keyword fields (seed, data source, config...) are
    recorded as given, so the caller's run record keeps them beside the environment.
    """
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "profile": profile,
        "device": None if device is None else str(device),
        "hardware": {
            "cpu_model": _cpu_model(),
            "cpu_logical_cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "ram_bytes": _ram_bytes(),
            "machine": platform.machine(),
            "os": platform.platform(terse=True),
            "gpus": _gpus(),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        "libraries": {
            "python": platform.python_version(),
            **{name: _version(name) for name in ("torch", "torchvision", "transformers", "deepspeed", "numpy")},
        },
        "git": _git_state(),
        **fields,
    }
