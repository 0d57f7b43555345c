"""Planning on a CPU that other processes keep busy.

torch's intra-op threads wait for each other at every parallel region. Where other processes
hold the cores those threads need, a step waits for a descheduled thread: on the 2-core family-26
EPYC beside two busy loops, the quick GPT-2's fp32 step took 0.46 s or 3.9 s with two threads,
depending on how the scheduler fell, and 0.40-0.52 s with one. Timed that way, candidates' speeds
are the scheduler's, and a plan under load chose bf16 in 3 of 5 sittings and fell back to the
baseline in the others (benchmarks/results/amd_epyc_avx512bf16_f26/plan_stability/). So where the
other processes leave fewer free cores than torch has threads, plan() times its candidates with
one thread per free core (at least one), says so in a note, and gives the threads back after.
"""
from __future__ import annotations

import contextlib
import os
import time

import psutil
import torch

SAMPLE_S = 0.25  # how long the other processes' CPU use is sampled before planning


def _busy_s(times) -> float:
    """Busy CPU seconds in a psutil cpu_times: all but idle and waiting on I/O (guest time is
    already inside user time)."""
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


def _our_cpus_busy_s() -> float:
    """Busy CPU seconds so far of the CPUs this process may run on (in a container on a larger
    host the system's CPU times count every host CPU; only ours share our work)."""
    per_cpu = psutil.cpu_times(percpu=True)
    ours = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
    if max(ours, default=0) >= len(per_cpu):  # CPUs numbered past those listed (some offline): all of them
        ours = range(len(per_cpu))
    return sum(_busy_s(per_cpu[cpu]) for cpu in ours)


def others_busy_cores(sample_s: float = SAMPLE_S) -> float | None:
    """How many of this process's CPUs the machine's other processes kept busy over the next
    `sample_s` seconds (their busy time less this process's own, per second); None where the
    system's CPU times cannot be read."""
    try:
        me = psutil.Process()
        before, own_before, started = _our_cpus_busy_s(), me.cpu_times(), time.monotonic()
        time.sleep(sample_s)
        after, own_after, elapsed = _our_cpus_busy_s(), me.cpu_times(), time.monotonic() - started
    except (psutil.Error, OSError, NotImplementedError):
        return None
    own = (own_after.user - own_before.user) + (own_after.system - own_before.system)
    return max((after - before - own) / elapsed, 0.0) if elapsed > 0 else None


def threads_for(free_cores: float, threads: int) -> int:
    """The intra-op threads to plan with: `threads`, or one per free core (at least one) where
    fewer than `threads` cores are free (a core counts as free when at least half of it is)."""
    usable = max(1, int(free_cores + 0.5))
    return min(threads, usable)


@contextlib.contextmanager
def threads_the_cpu_can_run(device: torch.device, notes: list[str]):
    """On a CPU whose other processes leave fewer free cores than torch has intra-op threads,
    torch's threads set to one per free core while the block runs (a note in `notes` says so);
    elsewhere nothing changes."""
    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = others_busy_cores() if device.type == "cpu" and threads > 1 else None
    planned = threads if busy is None else threads_for(cores - busy, threads)
    if planned == threads:
        yield threads
        return
    notes.append(f"Timed with {planned} intra-op thread{'s' if planned > 1 else ''} instead of torch's {threads}: other "
                 f"processes kept {busy:.1f} of this CPU's {cores} cores busy when planning began, and threads that "
                 "wait for each other on a busy CPU time the scheduler, not the candidates (planner/contention.py). "
                 "The speedups are ratios at that thread count.")
    torch.set_num_threads(planned)
    try:
        yield planned
    finally:
        torch.set_num_threads(threads)
