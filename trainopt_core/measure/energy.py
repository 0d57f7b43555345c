"""Energy used during a run, from a hardware counter (SPEC §4): NVML on NVIDIA GPUs, RAPL on
CPUs where readable; otherwise `None` with the reason, never a guess."""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import torch


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
