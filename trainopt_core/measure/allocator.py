"""Host memory that stays with the process, so a training step does not fault its pages in again.

glibc's malloc serves a block above its mmap threshold with a fresh mapping and unmaps it on
free; the threshold adapts as the process runs (from 128 KiB up to 32 MiB), and the heap's top is
trimmed back to the kernel past a second threshold. A training step that allocates its
activations anew every step then takes a page fault for every 4 KiB of them, every step: on the
2-core virtual machine of the reproduction, 50,000 minor faults (200 MiB) per step of the quick
GPT-2 at batch 16, about 15 % of its step time. How much of that a configuration pays depends on its
batch (its tensors' sizes) and on the process's history of allocations, and what a fault costs
depends on the host (a VM that reports freed pages to its host pays again to get them back). That
made the reproduction's throughput ratios move between reruns with the machine's state, most for
the configurations with the largest steps.

`keep_freed_host_memory()` raises both thresholds (glibc's `mallopt`), so freed blocks stay in
the heap for the next step: after the first steps, no faults. It changes nothing on another C
library or operating system (the reason is recorded). The reproduction applies it when imported
and records `host_allocator()` in every measurement's conditions.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

try:
    import resource
except ImportError:  # not on Windows
    resource = None

# glibc's mallopt parameters (malloc.h) and the values set: blocks up to 1 GiB from the heap, and
# up to 2 GiB - 1 (mallopt takes an int) left free at the heap's top before it is trimmed.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 2**30
TRIM_THRESHOLD_BYTES = 2**31 - 1
KEPT = "glibc malloc keeps freed memory (mmap threshold 1 GiB, trim threshold 2 GiB)"
GLIBC_DEFAULT = "glibc malloc defaults (adaptive mmap threshold, freed blocks returned to the kernel)"

_state: str | None = None


def _glibc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_freed_host_memory() -> str:
    """Make glibc keep freed blocks for reuse (see the module's docstring); returns
    `host_allocator()`. Idempotent; on anything but glibc on Linux it changes nothing."""
    global _state
    if _state is None:
        libc = _glibc()
        if libc is None:
            _state = f"unchanged: {platform.system()} {platform.libc_ver()[0] or 'without glibc'}"
        elif libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES):
            _state = KEPT
        else:
            _state = "unchanged: glibc refused mallopt"
    return _state


def host_allocator() -> str:
    """How this process's host allocator treats freed memory, as `keep_freed_host_memory` left it."""
    if _state is not None:
        return _state
    return GLIBC_DEFAULT if _glibc() is not None else f"{platform.system()} default"


def minor_page_faults() -> int | None:
    """Minor page faults this process has taken so far (None where the OS does not count them)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else None


__all__ = ["GLIBC_DEFAULT", "KEPT", "host_allocator", "keep_freed_host_memory", "minor_page_faults"]
