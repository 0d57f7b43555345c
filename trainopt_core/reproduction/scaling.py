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
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tqdm.auto import tqdm

from ..distributed import run_processes
from .progress import detail as progress_detail


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


def _scaling_worker(task: str, profile: str, configs: list[str], windows: int, steps_per_window: int,
                    warmup_steps: int, seed: int, data_policy: str, probe_comm: bool, speaks: bool) -> dict:
    """One rank: every configuration built side by side, its DDP steps timed in interleaved
    windows (`measure.interleaved_windows`); returns this rank's items/s per window."""
    from .. import measure
    from .data.sources import StandinDataWarning
    from .profiles import get_profile
    from .runner import build_engine, one_optimizer_step, resolve_config
    from .tasks import build_task

    # a launch's processes print into the notebook that started them: its stand-in notice was said
    # there already (the rows name the data), and a warning goes in one line, without a file path
    warnings.filterwarnings("ignore", category=StandinDataWarning)
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"{category.__name__}: {message}\n"
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if not (speaks and rank == 0):  # every launch's ranks build the same engines: one of them says their warnings
        warnings.filterwarnings("ignore")

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if dist.get_backend() == "nccl" else torch.device("cpu")
    prof = get_profile(task, profile)
    steps, info, engines = {}, {}, []
    for config in configs:
        cfg, notes = resolve_config(config, prof, device)
        torch.manual_seed(seed)  # same initial weights on every rank
        bundle = build_task(prof, data_policy=data_policy, data_dir=None, device=device, seed=seed + rank)
        # DDP when there are replicas: prepare() compresses reduced-precision all-reduce
        engine, micro = build_engine(bundle, prof, cfg, device=device, total_samples=10**9, ddp=world_size > 1)
        model = engine.model
        engines.append(engine)
        batches = bundle.train_batches(micro, seed=seed + rank)
        ks, items_log = [], []

        def step(engine=engine, bundle=bundle, model=model, batches=batches, ks=ks, items_log=items_log) -> float:
            items, _ = one_optimizer_step(engine, bundle, model, batches)
            ks.append(engine.k)
            items_log.append(items)
            return items

        steps[config] = step
        info[config] = dict(precision=cfg.precision, notes=notes, ks=ks, items=items_log, data_source=bundle.data_source,
                            num_parameters=sum(p.numel() for p in model.parameters()))
    dist.barrier()
    rates = measure.interleaved_windows(steps, windows=windows, steps_per_window=steps_per_window,
                                        warmup_steps=warmup_steps, device=device)
    for engine in engines:
        engine.close()
    comm = _allreduce_probe() if probe_comm and world_size > 1 else None
    for i in info.values():
        ks, items = i.pop("ks"), i.pop("items")
        i.update(mean_k=sum(ks) / len(ks), items_per_step=sum(items) / len(items))
    return dict(rank=rank, rates=rates, comm_probe=comm, threads=torch.get_num_threads(), device=str(device), info=info)


def fit_ring_model(probe: list[tuple[int, float]], world_size: int) -> RingAllReduceModel:
    """α from the smallest message, β from the largest, inverting the ring cost formula."""
    n = world_size
    small_bytes, small_s = probe[0]
    large_bytes, large_s = probe[-1]
    latency = small_s / (2 * (n - 1))
    bandwidth = (2 * (n - 1) / n * large_bytes) / max(large_s - 2 * (n - 1) * latency, 1e-9)
    return RingAllReduceModel(bandwidth, latency, f"fitted to a {n}-process all-reduce probe ({large_bytes} B)")


def measure_scaling(task: str = "cifar10", profile: str = "quick", *, configs=("baseline", "optimized"),
                    world_sizes=None, rounds: int = 3, windows: int = 3, steps_per_window: int = 2,
                    warmup_steps: int = 2, seed: int = 0, threads_per_process: int = 1, data_policy: str = "auto",
                    modelled_world_sizes=(4, 8), timeout_s: float = 900, progress: bool = True,
                    out_dir: str | os.PathLike | None = None, rerun: bool = False) -> list[dict]:
    """Measured rows for every world size this machine offers, plus labeled modelled rows.

    Each of `rounds` rounds launches every world size in turn (1, 2, 1, 2, ...); inside one
    launch the configurations run side by side in `windows` interleaved timing windows. A
    world size's throughput is the mean ± 95 % CI over all its windows; its efficiency
    T_n / (n · T_1) is taken per round (median windows of the same round) and summarized over
    rounds, so a slow round affects T_n and T_1 alike. On CPU each process gets
    `threads_per_process` threads, so T_1 and T_n use the same compute per replica; world sizes
    default to 1..min(#GPUs or #cores, 2 on CPU / 4 on GPU).

    With `out_dir`, the rows are written to ``<out_dir>/scaling__<task>.json`` and reused (unless
    `rerun`) when that file was made under the same conditions with the same settings.
    """
    from .. import measure
    from .profiles import TIMING_ONLY_SETTINGS, get_profile
    from .records import keep_record, kept_record, run_conditions
    from .tasks import build_task

    if world_sizes is None:
        limit = torch.cuda.device_count() if torch.cuda.is_available() else (os.cpu_count() or 1) // threads_per_process
        world_sizes = list(range(1, max(1, min(limit, 4 if torch.cuda.is_available() else 2)) + 1))
    for argument, value in (("rounds", rounds), ("windows", windows), ("steps_per_window", steps_per_window)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{argument}={value!r} is invalid: allowed an integer >= 1")
    configs = list(configs)
    settings = dict(configs=configs, world_sizes=list(world_sizes), rounds=rounds, windows=windows,
                    steps_per_window=steps_per_window, warmup_steps=warmup_steps, seed=seed,
                    threads_per_process=threads_per_process, modelled_world_sizes=list(modelled_world_sizes))
    path = None if out_dir is None else Path(out_dir) / f"scaling__{task}.json"
    if path is not None:
        prof = get_profile(task, profile)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        source = build_task(prof, data_policy=data_policy, data_dir=None, device=torch.device("cpu"), seed=seed).data_source
        conditions = run_conditions(device=device, backend="torch", world_size=max(world_sizes), data_source=source,
                                    data_policy=data_policy, profile_settings=prof.to_dict())
        existing = None if rerun else kept_record(path, kind="scaling", settings=settings, conditions=conditions,
                                                  ignore_settings=TIMING_ONLY_SETTINGS)
        if existing is not None:
            return existing["rows"]
    per_round: dict[int, list[dict]] = {n: [] for n in world_sizes}  # n -> [{config: [global items/s]}]
    first, comm_model = {}, None
    bar = tqdm(total=rounds * len(world_sizes), desc=f"{task} scaling launches", unit="launch",
               disable=not progress, leave=False)
    for round_index in range(rounds):
        for index, n in enumerate(world_sizes):
            launch = round_index * len(world_sizes) + index + 1  # the heartbeat's detail (reproduction.progress)
            progress_detail(f"scaling launch {launch} of {rounds * len(world_sizes)} ({n} process(es))")
            first_of_most = round_index == 0 and n == max(world_sizes)  # probes the all-reduce, says the warnings
            results = run_processes(_scaling_worker, n, args=(task, profile, configs, windows, steps_per_window,
                                                              warmup_steps, seed, data_policy, first_of_most,
                                                              first_of_most),
                                    threads_per_process=threads_per_process, timeout_s=timeout_s)
            # every replica processes the same items per window: the slowest replica sets the pace
            per_round[n].append({c: [n * min(r["rates"][c][w] for r in results) for w in range(windows)]
                                 for c in configs})
            first.setdefault(n, results[0])
            if results[0]["comm_probe"]:
                comm_model = fit_ring_model(results[0]["comm_probe"], n)
            bar.update(1)
    bar.close()
    rows = []
    for config in configs:
        def median_of(n, r):
            return measure.summarize(per_round[n][r][config])["median"]

        measured = {}
        for n in world_sizes:
            windows_all = [rate for round_rates in per_round[n] for rate in round_rates[config]]
            summary = measure.summarize(windows_all)
            efficiency = (measure.summarize([median_of(n, r) / (n * median_of(1, r)) for r in range(rounds)])
                          if 1 in world_sizes else None)
            info = first[n]["info"][config]
            measured[n] = summary
            rows.append(dict(
                task=task, profile=profile, config=config, world_size=n, modelled=False,
                throughput=summary["mean"], throughput_ci=[summary["ci_low"], summary["ci_high"]],
                throughput_median=summary["median"], throughput_range=[summary["min"], summary["max"]],
                efficiency=None if efficiency is None else efficiency["mean"],
                efficiency_ci=None if efficiency is None else [efficiency["ci_low"], efficiency["ci_high"]],
                efficiency_per_round=None if efficiency is None else [median_of(n, r) / (n * median_of(1, r))
                                                                       for r in range(rounds)],
                windows=len(windows_all), rounds=rounds, mean_k=info["mean_k"], precision=info["precision"],
                threads_per_process=first[n]["threads"], device=first[n]["device"], data_source=info["data_source"],
                source="measured: interleaved windows, world sizes alternating"))
        if comm_model is not None and 1 in measured:
            info = first[1]["info"][config]
            t1 = measured[1]["median"]
            items_per_step_per_replica = info["items_per_step"]
            for n in sorted(set(modelled_world_sizes) | set(world_sizes)):
                throughput = modelled_throughput(
                    compute_s_per_step=items_per_step_per_replica / t1, items_per_step_per_replica=items_per_step_per_replica,
                    world_size=n, num_parameters=info["num_parameters"], precision=info["precision"], comm=comm_model)
                rows.append(dict(task=task, profile=profile, config=config, world_size=n, modelled=True,
                                 throughput=throughput, efficiency=throughput / (n * t1), mean_k=info["mean_k"],
                                 precision=info["precision"], source=f"modelled: ring all-reduce, {comm_model.source}",
                                 bandwidth_bytes_per_s=comm_model.bandwidth_bytes_per_s, latency_s=comm_model.latency_s))
    if path is not None:
        keep_record(path, kind="scaling", settings=settings, conditions=conditions, profile=profile, device=device,
                    task=task, rows=rows)
    return rows


__all__ = ["RingAllReduceModel", "fit_ring_model", "gradient_bytes", "measure_scaling", "modelled_throughput"]
