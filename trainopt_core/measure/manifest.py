"""The run manifest (SPEC §4): hardware, library versions, git commit and date of a run."""
from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch


def _cpu_model() -> str | None:
    return _cpuinfo().get("model name") or platform.processor() or None


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo, keys lower-cased (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip() and fields:
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return fields


def _cpu_id() -> str | None:
    """The CPU's family, model and stepping (x86 /proc/cpuinfo), else the processor string: a
    virtual machine may name several generations alike ("AMD EPYC")."""
    info = _cpuinfo()
    parts = [(label, info.get(key)) for label, key in (("family", "cpu family"), ("model", "model"),
                                                        ("stepping", "stepping"))]
    if all(value for _, value in parts):
        return " ".join(f"{label} {value}" for label, value in parts)
    return platform.processor() or None


_VENDORS = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}


def cpu_family_model(hardware: dict | None) -> str:
    """The CPU's vendor, family and model as a manifest's hardware block names them ("AMD family 26
    model 2"): what, beside the instruction set, predicts how a timing moves between sessions (two
    virtual machines both called "AMD EPYC" with AVX2 ran 0.54-0.60x apart). Read from
    ``cpu_family_model`` where the manifest records it, else from ``cpu_id`` ("family 26 model 2
    stepping 1") with the vendor taken from the model string; "unknown" where neither says."""
    hardware = hardware or {}
    if hardware.get("cpu_family_model"):
        return hardware["cpu_family_model"]
    words = str(hardware.get("cpu_id") or "").split()
    fields = dict(zip(words[::2], words[1::2]))
    if "family" not in fields or "model" not in fields:
        return "unknown"
    model = str(hardware.get("cpu_model") or "")
    vendor = _VENDORS.get(hardware.get("cpu_vendor"), next((v for v in _VENDORS.values() if v in model), ""))
    return " ".join(part for part in (vendor, f"family {fields['family']} model {fields['model']}") if part)


def _torch_cpu_has(probe: str) -> bool:
    check = getattr(torch.cpu, probe, None)  # private probes: absent from some torch builds
    return bool(check is not None and check())


def _cpu_capability() -> str:
    cpu = getattr(torch.backends, "cpu", None)
    return cpu.get_cpu_capability() if cpu is not None else "unknown"


def cpu_computes_bf16_natively() -> bool:
    """Whether this CPU has bf16 instructions (AVX-512 BF16 or AMX): without them bf16 autocast
    is emulated and runs several times slower than fp32."""
    return (_torch_cpu_has("_is_avx512_bf16_supported") or _torch_cpu_has("_is_amx_tile_supported")
            or "AVX512_BF16" in _cpu_capability())


def cpu_kind(hardware: dict) -> str:
    """A CPU's kind from a manifest's hardware block: its instruction set, vendor, family and model
    ("AVX512+bf16, AMD family 26 model 2"), what the between-session floors and the committed CPU
    peaks are kept by."""
    family = cpu_family_model(hardware)
    return f"{hardware['cpu_isa']}, {'family unknown' if family == 'unknown' else family}"


def cpu_isa() -> str:
    """The vector instruction set torch's CPU kernels dispatch to ("AVX2", "AVX512", ...), with
    "+bf16" where the CPU computes bf16 natively and "+amx" where it has AMX tiles."""
    extras = ["bf16"] * cpu_computes_bf16_natively() + ["amx"] * _torch_cpu_has("_is_amx_tile_supported")
    return "+".join([_cpu_capability(), *extras])


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


# The checkout's output folder: files there change while a reproduction writes its reports.
OUTPUT_DIR = "reports"


def _git_state(checkout: Path | None = None) -> dict:
    checkout = checkout or Path(__file__).resolve().parents[2]  # trainopt_core/measure/ -> the checkout
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        # reports/ holds outputs, rewritten while a reproduction runs: not a change to the code
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 f":(exclude){OUTPUT_DIR}"], cwd=checkout, capture_output=True, text=True, timeout=30)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def code_commit() -> str | None:
    """The git commit of this package's checkout (None outside a checkout)."""
    return _git_state()["commit"]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _releases_off_pins(checkout: Path | None = None) -> dict[str, str] | None:
    """The installed packages whose release differs from the checkout's constraints.txt (the
    releases the test suite passed with), each with the release installed: {} when every pinned
    package that is installed is at its pin; None without the file (installed from a wheel).
    Pinned packages that are not installed (an extra left out, no CUDA libraries) are not listed."""
    checkout = checkout or Path(__file__).resolve().parents[2]  # trainopt_core/measure/ -> the checkout
    try:
        lines = (checkout / "constraints.txt").read_text().splitlines()
    except OSError:
        return None
    off = {}
    for line in lines:
        name, pinned_sep, pinned = line.split("#", 1)[0].strip().partition("==")
        installed = _version(name) if pinned_sep else None
        if installed is not None and installed != pinned:
            off[name] = installed
    return off


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

    releases_off_pins: the installed packages at another release than constraints.txt pins ({}:
    none; None outside a checkout).

    git: the commit of this package's checkout (`git rev-parse HEAD`) and whether tracked files
    differ from it (`dirty`; untracked files and the outputs under reports/ are ignored); both
    None outside a git checkout.

    `profile`, `device` and any further keyword fields (seed, data source, config...) are
    recorded as given, so the caller's run record keeps them beside the environment.
    """
    cpu = {"cpu_model": _cpu_model(), "cpu_vendor": _cpuinfo().get("vendor_id"), "cpu_id": _cpu_id()}
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "profile": profile,
        "device": None if device is None else str(device),
        "hardware": {
            **cpu,
            "cpu_family_model": cpu_family_model(cpu),
            "cpu_isa": cpu_isa(),
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
        "releases_off_pins": _releases_off_pins(),
        "git": _git_state(),
        **fields,
    }


def hardware_fingerprint(device: torch.device | str) -> dict:
    """What makes timings on `device` comparable: the CPU model, its family/model/stepping, the
    instruction set torch's kernels use (with native bf16 or not) and its logical core count; or
    the GPU's name and how many this machine has. Two machines with the same fingerprint are
    taken to be the same kind of machine. The model name alone is not enough: two virtual
    machines both called "AMD EPYC", one with AVX-512 BF16 and one with AVX2 only, ran the same
    bf16 ResNet step at about 290 and 39 images/s."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {"gpu_name": torch.cuda.get_device_name(index), "gpu_count": torch.cuda.device_count()}
    return {"cpu_model": _cpu_model(), "cpu_id": _cpu_id(), "cpu_isa": cpu_isa(), "cpu_logical_cores": os.cpu_count()}
