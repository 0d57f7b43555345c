"""Table IV: data-parallel throughput and scaling efficiency, measured and modelled.

Measured: `measure_scaling` trains the task model with DDP in 1..N local processes (gloo on
CPU with a fixed number of threads per process, nccl on GPUs), per-replica micro-batch fixed
(weak scaling, as in the paper), and reports throughput T_n and efficiency T_n / (n · T_1).

Modelled: a ring all-reduce costs 2(n-1)/n · V / β + 2(n-1) · α per optimizer step, with V the
gradient bytes (parameters × 4 for fp32, × 2 when reduced precision also compresses the
gradient all-reduce), β the bus bandwidth and α the per-hop latency. The step's compute time
comes from the measured single-process run; β and α from an all-reduce microbenchmark on the
same processes. Accumulating k micro-batches divides the communication per item by k, which is
why the paper's optimized configuration scales better. Modelled rows are always labeled so.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..distributed import run_processes


@dataclass(frozen=True)
class RingAllReduceModel:
    """Communication cost of one gradient all-reduce (Patarasuk & Yuan 2009; Thakur et al. 2005)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    source: str

    def allreduce_s(self, world_size: int, volume_bytes: float) -> float:
        if world_size <= 1:
            return 0.0
        n = world_size
        return 2 * (n - 1) / n * volume_bytes / self.bandwidth_bytes_per_s + 2 * (n - 1) * self.latency_s


def gradient_bytes(num_parameters: int, precision: str) -> int:
    """All-reduce volume: fp32 gradients, or half-size ones when reduced precision compresses them."""
    return num_parameters * (4 if precision == "fp32" else 2)


def modelled_throughput(*, compute_s_per_step: float, items_per_step_per_replica: float, world_size: int,
                        num_parameters: int, precision: str, comm: RingAllReduceModel) -> float:
    """Items/s of n replicas when one all-reduce per optimizer step adds to the step time (no overlap)."""
    step_s = compute_s_per_step + comm.allreduce_s(world_size, gradient_bytes(num_parameters, precision))
    return world_size * items_per_step_per_replica / step_s


# ------------------------------------------------------------------ measured (one process per rank)
def _allreduce_probe(sizes=(1, 2**20 // 4, 2**22 // 4), repeats: int = 5) -> list[tuple[int, float]]:
    """Seconds per all-reduce of fp32 tensors of the given element counts (median of repeats)."""
    results = []
    for numel in sizes:
        tensor = torch.ones(numel)
        dist.all_reduce(tensor)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        results.append((numel * 4, sorted(times)[len(times) // 2]))
    return results


def _scaling_worker(task: str, profile: str, config: str, steps: int, warmup_steps: int, seed: int,
                    data_policy: str, probe_comm: bool) -> dict:
    """One rank: DDP training steps, timed after warm-up; returns this rank's counts."""
    from ..compose import prepare
    from .profiles import get_profile
    from .runner import _one_optimizer_step, micro_batch_size, resolve_config
    from .tasks import build_task

    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if dist.get_backend() == "nccl" else torch.device("cpu")
    prof = get_profile(task, profile)
    cfg, notes = resolve_config(config, prof, device)
    torch.manual_seed(seed)  # same initial weights on every rank
    bundle = build_task(prof, data_policy=data_policy, data_dir=None, device=device, seed=seed + rank)
    model = bundle.model.to(device)
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)  # prepare() compresses reduced-precision all-reduce
    optimizer = torch.optim.AdamW(model.parameters(), lr=prof.lr, betas=prof.betas, weight_decay=prof.weight_decay)
    micro = micro_batch_size(cfg, prof)
    engine = prepare(model, optimizer, cfg, total_samples=10**9, micro_batch_size=micro, device=device)
    batches = bundle.train_batches(micro, seed=seed + rank)
    for _ in range(warmup_steps):
        _one_optimizer_step(engine, bundle, model, batches)
    dist.barrier()
    items, ks = 0.0, []
    start = time.perf_counter()
    for _ in range(steps):
        step_items, _ = _one_optimizer_step(engine, bundle, model, batches)
        items += step_items
        ks.append(engine.k)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    engine.close()
    comm = _allreduce_probe() if probe_comm and world_size > 1 else None
    return dict(rank=rank, items=items, seconds=elapsed, mean_k=sum(ks) / len(ks), precision=cfg.precision,
                num_parameters=sum(p.numel() for p in model.parameters()), notes=notes, comm_probe=comm,
                threads=torch.get_num_threads(), device=str(device))


def fit_ring_model(probe: list[tuple[int, float]], world_size: int) -> RingAllReduceModel:
    """α from the smallest message, β from the largest, inverting the ring cost formula."""
    n = world_size
    small_bytes, small_s = probe[0]
    large_bytes, large_s = probe[-1]
    latency = small_s / (2 * (n - 1))
    bandwidth = (2 * (n - 1) / n * large_bytes) / max(large_s - 2 * (n - 1) * latency, 1e-9)
    return RingAllReduceModel(bandwidth, latency, f"fitted to a {n}-process all-reduce probe ({large_bytes} B)")


def measure_scaling(task: str = "cifar10", profile: str = "quick", *, configs=("baseline", "optimized"),
                    world_sizes=None, steps: int = 6, warmup_steps: int = 2, seed: int = 0,
                    threads_per_process: int = 1, data_policy: str = "auto",
                    modelled_world_sizes=(4, 8), timeout_s: float = 900) -> list[dict]:
    """Measured rows for every world size this machine offers, plus labeled modelled rows.

    On CPU, each process gets `threads_per_process` threads so T_1 and T_n use the same
    compute per replica; world sizes default to 1..min(#GPUs or #cores, 2 on CPU / 4 on GPU).
    """
    if world_sizes is None:
        limit = torch.cuda.device_count() if torch.cuda.is_available() else (os.cpu_count() or 1) // threads_per_process
        world_sizes = list(range(1, max(1, min(limit, 4 if torch.cuda.is_available() else 2)) + 1))
    rows = []
    for config in configs:
        measured = {}
        comm_model = None
        for n in world_sizes:
            results = run_processes(_scaling_worker, n, args=(task, profile, config, steps, warmup_steps, seed,
                                                              data_policy, n == max(world_sizes)),
                                    threads_per_process=threads_per_process, timeout_s=timeout_s)
            items = sum(r["items"] for r in results)
            seconds = max(r["seconds"] for r in results)
            measured[n] = dict(throughput=items / seconds, step_s=seconds / steps,
                               items_per_step_per_replica=results[0]["items"] / steps, mean_k=results[0]["mean_k"],
                               precision=results[0]["precision"], num_parameters=results[0]["num_parameters"],
                               threads=results[0]["threads"], device=results[0]["device"])
            if results[0]["comm_probe"]:
                comm_model = fit_ring_model(results[0]["comm_probe"], n)
        t1 = measured[world_sizes[0]]["throughput"] if world_sizes[0] == 1 else None
        for n, m in measured.items():
            rows.append(dict(task=task, profile=profile, config=config, world_size=n, modelled=False,
                             throughput=m["throughput"], efficiency=None if t1 is None else m["throughput"] / (n * t1),
                             mean_k=m["mean_k"], precision=m["precision"], threads_per_process=m["threads"],
                             device=m["device"], source="measured"))
        if comm_model is not None and 1 in measured:
            base = measured[1]
            for n in sorted(set(modelled_world_sizes) | set(world_sizes)):
                throughput = modelled_throughput(
                    compute_s_per_step=base["step_s"], items_per_step_per_replica=base["items_per_step_per_replica"],
                    world_size=n, num_parameters=base["num_parameters"], precision=base["precision"], comm=comm_model)
                rows.append(dict(task=task, profile=profile, config=config, world_size=n, modelled=True,
                                 throughput=throughput, efficiency=throughput / (n * t1), mean_k=base["mean_k"],
                                 precision=base["precision"], source=f"modelled: ring all-reduce, {comm_model.source}",
                                 bandwidth_bytes_per_s=comm_model.bandwidth_bytes_per_s, latency_s=comm_model.latency_s))
    return rows


__all__ = ["RingAllReduceModel", "fit_ring_model", "gradient_bytes", "measure_scaling", "modelled_throughput"]
