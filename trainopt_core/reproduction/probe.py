"""Eq. 9 as a measurement: k_optimal = argmax_k Throughput(k) / Memory(k).

At a fixed effective batch B_eff, each k trains with micro-batch B_eff / k; throughput comes
from a few timed optimizer steps and peak memory from the same measurement the runner uses
(CUDA allocator, or the CPU live-tensor tracker on one step).
"""
from __future__ import annotations

import time

import torch

from .. import measure
from ..config import OptimizationConfig
from .profiles import get_profile
from .runner import build_engine, one_optimizer_step, resolve_config
from .tasks import build_task


def probe_accumulation_steps(
    task: str,
    profile: str = "quick",
    *,
    ks: tuple[int, ...] = (1, 2, 4, 8),
    effective_batch_size: int | None = None,
    config: str | OptimizationConfig = "+mixed_precision",
    timed_steps: int = 3,
    data_policy: str = "auto",
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Throughput and peak memory per k at a fixed effective batch, and eq. 9's argmax.

    Returns {"rows": [{k, micro_batch_size, throughput, throughput_unit, peak_memory_bytes,
    throughput_per_gib}], "k_optimal": k, "effective_batch_size": B, "memory_source": ...}.
    """
    prof = get_profile(task, profile)
    batch = effective_batch_size or prof.baseline_batch_size
    bad = [k for k in ks if not isinstance(k, int) or k < 1 or batch % k]
    if bad:
        raise ValueError(f"ks={ks!r} is invalid: allowed integers >= 1 dividing effective_batch_size={batch} (not {bad})")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base_cfg, _ = resolve_config(config, prof, dev)
    rows = []
    for k in ks:
        torch.manual_seed(seed)
        bundle = build_task(prof, data_policy=data_policy, data_dir=None, device=dev, seed=seed)
        cfg = base_cfg.replace(k=k, adaptive=False, k_min=1, k_max=max(k, 1))
        engine, micro = build_engine(bundle, prof, cfg, device=dev, micro=batch // k, total_samples=10**9)
        model, optimizer = engine.model, engine.optimizer
        batches = bundle.train_batches(micro, seed=seed)
        one_optimizer_step(engine, bundle, model, batches)  # warm-up
        memory = measure.PeakMemory(dev)
        with memory.track_step(model, optimizer, breakdown=not cfg.cuda_graphs) as tracker:
            one_optimizer_step(engine, bundle, model, batches)
        memory.add_tracked(tracker)
        items, start = 0.0, time.perf_counter()
        for _ in range(timed_steps):
            step_items, _ = one_optimizer_step(engine, bundle, model, batches)
            items += step_items
        elapsed = measure.elapsed_s(start, dev)
        engine.close()
        peak = memory.peak_bytes()
        throughput = items / elapsed
        rows.append(dict(k=k, micro_batch_size=micro, throughput=throughput, throughput_unit=prof.item_unit,
                         peak_memory_bytes=peak, throughput_per_gib=throughput / (peak / 2**30)))
    best = max(rows, key=lambda row: row["throughput_per_gib"])
    return dict(rows=rows, k_optimal=best["k"], effective_batch_size=batch, memory_source=memory.source,
                precision=base_cfg.precision, task=task, profile=profile)
