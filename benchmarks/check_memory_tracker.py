"""Check: the CPU live-tensor tracker against the CPU allocator's own count and glibc's heap.

On a CPU, peak memory comes from `MemoryTracker` (the live storages ops create and autograd
saves). This script checks it from outside: torch.profiler with `profile_memory=True` records
every allocation and free of the c10 CPU allocator with the running total of live bytes, and the
largest total within the tracked step is the allocator's peak. For each task of the profile, the
planner's trial of fp32 with k = 2 micro-batches on the process's share of the baseline's batch
(the candidate the planner calibrates its memory model on, split in two) is built, stepped to warm
up (`--warmup-steps`, 1 as the planner does), then stepped once tracked, all while profiled, on
`--processes` processes (gloo, one thread each):

- one process's copy, not wrapped (the module alone);
- DDP (its gradient buckets: a copy of the gradients the reducer allocates in C++);
- DeepSpeed ZeRO-1 and ZeRO-2 (where DeepSpeed is installed).

Each `--repeats` times, each time in a fresh set of processes; then once more without the
profiler (whose own records would count) for a second outside count, blind to no thread: glibc's
bytes in use (`mallinfo2`), sampled after every op of the tracked step beside the tracker's live
bytes, the largest rise of each over the step's start (glibc's includes the Python objects and
malloc overhead the step adds, a fraction of a MiB). Printed per process: the
tracker's peak, the allocator's peak in the step, the allocator's live bytes when the step
starts, and the tracker's breakdown.

The allocator's count has one blind spot: the profiler registers a free only on a thread that is
profiled, so a block freed by another thread (gloo's workers drop finished collectives' tensors)
stays counted, and which thread drops a block varies from run to run. Such leftovers raise the
allocator's reading (at the step's start too), never lower it: the comparison is made in the
repeat with the smallest reading. The tracker sees such a free when it happens, so where a block
is dropped by gloo's thread at a varying moment (DDP's coalesced broadcast of BatchNorm buffers)
its own reading can vary between repeats by that block.

    python benchmarks/check_memory_tracker.py [--profile quick] [--tasks cifar10,wikitext2] [--processes 2]
                                              [--repeats 3] [--warmup-steps 1] [--without-buckets] [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import importlib.util
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainopt_core import measure
from trainopt_core.distributed import run_processes

print = functools.partial(print, flush=True)  # noqa: A001
MIB = 2**20
MARK = "tracked step"
SETUPS = ("one process's copy", "DDP", "ZeRO-1", "ZeRO-2")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use() -> Callable[[], int] | None:
    """glibc's bytes in use (`mallinfo2`: heap chunks handed out plus mmapped blocks), every thread's
    allocations included; None where the C library has no mallinfo2."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None

    def in_use() -> int:
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd
    return in_use


class _HeapSampler(TorchDispatchMode):
    """After every op (entered inside the tracker, so the tracker has counted the op's outputs):
    the largest rise of glibc's bytes in use, and of the tracker's live bytes, over the step's start."""

    def __init__(self, tracker, in_use: Callable[[], int]):
        super().__init__()
        self.tracker, self.in_use = tracker, in_use
        self.heap_start, self.tracker_start = in_use(), tracker.current_bytes
        self.heap_rise = self.tracker_rise = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.heap_rise = max(self.heap_rise, self.in_use() - self.heap_start)
        self.tracker_rise = max(self.tracker_rise, self.tracker.current_bytes - self.tracker_start)
        return out


def measure_setup(task: str, profile: str, setup: str, warmup_steps: int = 1, count_buckets: bool = True,
                  profiled: bool = True) -> dict:
    """On this process: the trial of `setup` built, warmed up and stepped once tracked, all profiled
    (`profiled`), or the tracked step's ops sampled for glibc's heap (the profiler's own records
    would be in it)."""
    if not count_buckets:  # the tracker as it was before it counted DDP's gradient buckets
        from trainopt_core.measure import tracker as tracker_module
        tracker_module.ddp_bucket_bytes = lambda model: 0

    from bench_plan_processes import _share_of_the_batch  # this folder is on sys.path when run as a script

    from trainopt_core.measure.memory import cpu_allocator_reading
    from trainopt_core.measure.tracker import MemoryTracker
    from trainopt_core.planner.trial import Trial
    from trainopt_core.planner.space import Candidate
    from trainopt_core.reproduction.profiles import get_profile
    from trainopt_core.reproduction.tasks import build_task

    warnings.simplefilter("ignore")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    prof = get_profile(task, profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=torch.device("cpu"), seed=0)
    share = _share_of_the_batch(bundle, rank, world)
    batch = tuple(t for t in next(share.train_batches(prof.baseline_batch_size, seed=0)) if t is not None)

    def optimizer(parameters):
        return torch.optim.AdamW(parameters, lr=prof.lr, betas=prof.betas, weight_decay=prof.weight_decay)

    def loss(model, x, y=None):
        return bundle.loss(model, x, y)

    stage = {"ZeRO-1": 1, "ZeRO-2": 2}.get(setup, 0)
    processes = 1 if setup == SETUPS[0] else world
    with contextlib.ExitStack() as profiling:
        if profiled:
            prof_ = profiling.enter_context(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                                   profile_memory=True))
        # a copy of the share, made while profiled: autograd saves micro-batches (views of it) for
        # backward, so the tracker counts its storage, which the allocator's count must include
        batch = tuple(t.clone() for t in batch)
        trial = Trial(Candidate(k=2, zero_stage=stage), bundle.model, optimizer, batch, loss, torch.device("cpu"),
                      loss_takes_model=True, world_size=processes)
        for _ in range(warmup_steps):
            trial.step()
        in_use = None if profiled else _heap_in_use()
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.profiler.record_function(MARK))
            tracker = stack.enter_context(MemoryTracker(trial.tracked, trial.optimizer))
            heap = stack.enter_context(_HeapSampler(tracker, in_use)) if in_use else None
            trial.step()
        tracked = dict(peak=tracker.peak_bytes, breakdown=dict(tracker.breakdown_at_peak),
                       heap_rise=heap.heap_rise if heap else None, tracker_rise=heap.tracker_rise if heap else None)
        del trial, tracker, heap
        gc.collect()  # freed while profiled: the next setup's count starts clean
    reading = cpu_allocator_reading(prof_, MARK) if profiled else dict(peak_bytes=None, at_start_bytes=None)
    return dict(task=task, setup=setup, rank=rank, share=len(batch[0]), model=bundle.model_name,
                data_source=bundle.data_source, tracker_peak_bytes=tracked["peak"],
                tracker_breakdown_bytes=tracked["breakdown"], allocator_peak_bytes=reading["peak_bytes"],
                allocator_live_at_start_bytes=reading["at_start_bytes"], heap_rise_bytes=tracked["heap_rise"],
                tracker_rise_bytes=tracked["tracker_rise"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="quick", choices=("smoke", "quick"))
    parser.add_argument("--tasks", default="cifar10,wikitext2")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per setup")
    parser.add_argument("--warmup-steps", type=int, default=1,
                        help="steps before the tracked one (1: the planner's; DDP rebuilds its buckets in the second)")
    parser.add_argument("--without-buckets", action="store_true",
                        help="the tracker as it was before it counted DDP's gradient buckets (no ZeRO setups)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    setups = [s for s in SETUPS if not s.startswith("ZeRO") or (importlib.util.find_spec("deepspeed")
                                                                 and not args.without_buckets)]
    print(f"machine: {measure.run_manifest(profile=args.profile, device='cpu')['hardware']}")
    print(f"torch {torch.__version__}; {args.processes} processes (gloo, one thread each); allocator: "
          "torch.profiler profile_memory (c10 CPU allocator)")
    rows = []
    for task in args.tasks.split(","):
        for setup in setups:
            repeats = [run_processes(measure_setup, args.processes, args=(task, args.profile, setup, args.warmup_steps,
                                                                        not args.without_buckets),
                                     backend="gloo", threads_per_process=1, timeout_s=600) for _ in range(args.repeats)]
            heap_run = run_processes(measure_setup, args.processes, args=(task, args.profile, setup, args.warmup_steps,
                                                                        not args.without_buckets, False),
                                     backend="gloo", threads_per_process=1, timeout_s=600)
            first = repeats[0]
            if setup == setups[0]:
                print(f"\n{task}: {first[0]['model']}; {first[0]['data_source']}; fp32, k=2 on "
                      f"{first[0]['share']} samples per process; tracked step {args.warmup_steps + 1}"
                      + ("; the tracker without DDP's buckets" if args.without_buckets else ""))
            for rank in range(len(first)):
                readings = [results[rank] for results in repeats]
                # the repeat least raised by frees the profiler missed is the comparison's
                r = dict(min(readings, key=lambda x: x["allocator_peak_bytes"]), repeats=readings,
                         heap_run=heap_run[rank])
                tracker, allocator = r["tracker_peak_bytes"], r["allocator_peak_bytes"]
                parts = ", ".join(f"{k.replace('_', ' ')} {v / MIB:.2f}"
                                  for k, v in r["tracker_breakdown_bytes"].items() if v)
                spread = max(x["tracker_peak_bytes"] for x in readings) - min(x["tracker_peak_bytes"] for x in readings)
                pairs = ", ".join(f"{x['tracker_peak_bytes'] / MIB:.2f}/{x['allocator_peak_bytes'] / MIB:.2f} "
                                  f"({x['allocator_live_at_start_bytes'] / MIB:.2f})" for x in readings)
                heap = heap_run[rank]
                rises = (None if heap["heap_rise_bytes"] is None else
                         f"{heap['tracker_rise_bytes'] / MIB:.2f}/{heap['heap_rise_bytes'] / MIB:.2f} MiB (peak "
                         f"{heap['tracker_peak_bytes'] / MIB:.2f}, unprofiled)")
                print(f"  {setup:18s} rank {rank}: tracker {tracker / MIB:7.2f} MiB, allocator "
                      f"{allocator / MIB:7.2f} MiB ({(tracker / allocator - 1) * 100:+.2f} %)"
                      + (f"; the tracker's readings spread over {spread / 1024:.1f} KiB" if spread else "")
                      + f"\n      repeats (tracker/allocator, allocator at the step's start): {pairs}"
                      + (f"\n      rise over the step's start, tracker/glibc heap: {rises}" if rises else "")
                      + f"\n      tracker: {parts}")
                rows.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(profile=args.profile, processes=args.processes,
                                                   repeats=args.repeats, warmup_steps=args.warmup_steps,
                                                   counts_ddp_buckets=not args.without_buckets, rows=rows,
                                                   manifest=measure.run_manifest(profile=args.profile, device="cpu")),
                                              indent=1))
    print(f"\ncheck took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
