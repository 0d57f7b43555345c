"""Throughput of the configurations a table compares, timed side by side (SPEC §4).

A training run's own clock moves ±20 % between runs on a shared machine, and two runs made
minutes apart see different machine states. So the tables do not take throughput from the
training runs: `measure_throughput` builds every configuration of a table in one process and
times them in interleaved windows (A, B, C, ..., then again, `measure.interleaved_windows`),
after untimed warm-up steps and with no evaluation inside a window. Window i of each
configuration ran in the same round, so the ratio optimized/baseline is taken per round and
what the machine did during that round cancels -- as far as it slows every configuration alike:
two machine probes (`measure.probes`, a memory copy and a cached matmul) are timed in the same
rounds and recorded beside the configurations, so that a rerun whose ratios moved can be
checked for a change in the machine's state. Seconds per sample from these windows, multiplied
by the samples to target of the training runs (deterministic for a seed), give the tables' time
to target.

The result is written to ``<out_dir>/throughput__<task>.json`` and reused, like a run record,
only when it was made under the same conditions (`records.run_conditions`) for (at least) the
same configurations.
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import measure
from ..distributed import cleanup, find_free_port
from ..measure.allocator import minor_page_faults
from ..measure.probes import machine_probes
from .autoplan import plans_dir_for
from .profiles import get_profile
from .progress import detail as progress_detail
from .records import (RECORD_SCHEMA, computation_hash, condition_differences, load_record, run_conditions,
                      same_computation_notes, write_record)
from .runner import build_engine, one_optimizer_step, resolve_config
from .tasks import build_task

TIMING_KIND = "interleaved_throughput"
PROBE_PREFIX = "probe:"  # the machine probes' names among the timed workloads


def throughput_path(out_dir: str | os.PathLike, task: str) -> Path:
    return Path(out_dir) / f"throughput__{task}.json"


def load_throughput(out_dir: str | os.PathLike, task: str) -> dict | None:
    """The finished throughput record of `task` in `out_dir`, or None."""
    record = load_record(throughput_path(out_dir, task))
    return record if record is not None and record.get("kind") == TIMING_KIND else None


def timing_windows(prof, seeds: int) -> int:
    """Windows per configuration for a reproduction of `seeds` seeds (at least 2, for a CI)."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r} is invalid: allowed an integer >= 1")
    return max(2, prof.timing_windows_per_seed * seeds)


def measure_throughput(task: str, configs, *, profile: str = "quick", seed: int = 0, seeds: int = 3,
                       out_dir: str | os.PathLike = "reports/quick/timing", device: str | None = None,
                       backend: str = "torch", data_policy: str = "auto", data_dir=None, rerun: bool = False,
                       progress: bool = True) -> dict:
    """Items/s and samples/s of every configuration in `configs`, in interleaved timing windows
    (`timing_windows(profile, seeds)` of them); returns (and writes) the throughput record.

    Configurations that compute exactly the same (`records.computation_hash`: a ZeRO rung and
    its ZeRO-0 twin on one process) are timed once; the twin's result says so."""
    configs = list(dict.fromkeys(configs))
    if not configs:
        raise ValueError("configs=[] is invalid: allowed a non-empty list of configuration names")
    prof = get_profile(task, profile)
    windows = timing_windows(prof, seeds)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    path = throughput_path(out_dir, task)
    owns_group = backend == "deepspeed" and not torch.distributed.is_initialized()
    if owns_group:  # every DeepSpeed engine of the session shares one 1-rank process group
        os.environ.setdefault("LOCAL_RANK", "0")
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                             init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    planning = dict(plans_dir=plans_dir_for(out_dir), data_policy=data_policy, data_dir=data_dir)
    twin_of: dict[str, str] = {}  # configuration -> the configuration timed for it
    first_by_computation: dict[str, str] = {}
    hashes: dict[str, str] = {}  # what each name computes here (`auto`: what this machine's plan chose)
    resolved: dict[str, tuple] = {}  # name -> (configuration as run here, notes of resolving it)
    for name in configs:
        cfg, _ = resolved[name] = resolve_config(name, prof, device, **planning)
        hashes[name] = cfg.config_hash()
        computation = computation_hash(cfg, world_size=1, backend=backend)
        twin_of[name] = first_by_computation.setdefault(computation, name)
    workloads: dict[str, _Workload] = {}
    conditions = None
    try:
        for name in dict.fromkeys(twin_of.values()):
            workload = workloads[name] = _Workload(task, prof, name, device=device, backend=backend, seed=seed,
                                                   **planning)
            if conditions is None:
                conditions = run_conditions(device=device, backend=backend, world_size=1,
                                            data_source=workload.data_source, data_policy=data_policy,
                                            profile_settings=prof.to_dict())
                existing = None if rerun else load_throughput(out_dir, task)
                if (existing is not None and not condition_differences(existing, conditions)
                        and existing.get("windows") == windows and _times_the_same(existing, hashes)):
                    return dict(existing, reused=True)  # `reused`: said by the caller, never written
        probes = machine_probes(device)
        timed = {name: w.step for name, w in workloads.items()}
        timed.update({PROBE_PREFIX + name: probe for name, probe in probes.items()})
        bar = tqdm(total=windows * len(timed), desc=f"{task} throughput windows", unit="window",
                   disable=not progress, leave=False)
        windows_timed = itertools.count(1)

        def window_timed() -> None:  # the bar, and the heartbeat's detail (reproduction.progress)
            bar.update(1)
            progress_detail(f"{next(windows_timed)} of {windows * len(timed)} timing windows")

        rates = measure.interleaved_windows(
            timed, windows=windows, steps_per_window=prof.timing_steps_per_window,
            warmup_steps=prof.throughput_warmup_steps, device=device, progress=window_timed)
        bar.close()
    finally:
        for workload in workloads.values():
            workload.close()
        if owns_group:
            cleanup()
    results = {}
    for name, workload in workloads.items():
        per_sample = workload.items / workload.samples
        results[name] = dict(
            items_per_s=rates[name],
            samples_per_s=[rate / per_sample for rate in rates[name]],
            items_per_sample=per_sample,
            item_unit=prof.item_unit,
            summary=measure.summarize(rates[name]),
            precision=workload.cfg.precision,
            config_hash=workload.cfg.config_hash(),
            micro_batch_size=workload.micro,
            mean_k=sum(workload.ks) / len(workload.ks),
            minor_page_faults_per_step=_mean(workload.page_faults[prof.throughput_warmup_steps:]),
            notes=workload.notes,
        )
    for name, timed in twin_of.items():
        if name != timed:
            (cfg, notes), timed_cfg = resolved[name], resolved[timed][0]
            results[name] = dict(results[timed], timed_as=timed, config_hash=hashes[name], notes=same_computation_notes(
                notes, results[timed], zero_stage=cfg.zero_stage, measured_zero_stage=timed_cfg.zero_stage,
                source=f"timed as {timed!r}"))
    # what the machine itself could do in the same rounds (not a configuration; see measure.probes)
    machine_state = {name: dict(what=probe.describe(), unit=probe.unit, per_window=rates[PROBE_PREFIX + name],
                                summary=measure.summarize(rates[PROBE_PREFIX + name]))
                     for name, probe in probes.items()}
    record = dict(
        schema=RECORD_SCHEMA, status="complete", kind=TIMING_KIND, task=task, profile=profile, seed=seed,
        configs=configs, conditions=conditions, windows=windows, seeds=seeds,
        steps_per_window=prof.timing_steps_per_window, warmup_steps=prof.throughput_warmup_steps,
        order="interleaved: one window per configuration (and machine probe) per round, the order rotating each round",
        results=results, machine_probes=machine_state, manifest=measure.run_manifest(profile=profile, device=device),
    )
    write_record(path, record)
    return record


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None


def _times_the_same(existing: dict, hashes: dict[str, str]) -> bool:
    """Whether `existing` timed every configuration of `hashes` as it computes now (a record
    written before results carried their hash times the presets, which never change)."""
    results = existing["results"]
    return all(name in results and results[name].get("config_hash", hashes[name]) == hashes[name] for name in hashes)


class _Workload:
    """One configuration ready to step: model, optimizer, engine and its batches."""

    def __init__(self, task, prof, name, *, device, backend, data_policy, data_dir, seed, plans_dir):
        self.cfg, self.notes = resolve_config(name, prof, device, plans_dir=plans_dir, data_policy=data_policy,
                                              data_dir=data_dir)
        torch.manual_seed(seed)
        self.bundle = build_task(prof, data_policy=data_policy, data_dir=data_dir, device=device, seed=seed)
        self.data_source = self.bundle.data_source
        self.engine, self.micro = build_engine(self.bundle, prof, self.cfg, device=device, backend=backend)
        self.batches = self.bundle.train_batches(self.micro, seed=seed)
        self.items = self.samples = 0.0
        self.ks: list[int] = []
        self.page_faults: list[int] = []  # minor page faults of each step (see measure.allocator)
        self._closed = False

    def step(self) -> float:
        samples_before, faults_before = self.engine.samples_consumed, minor_page_faults()
        items, _ = one_optimizer_step(self.engine, self.bundle, self.engine.model, self.batches)
        if faults_before is not None:
            self.page_faults.append(minor_page_faults() - faults_before)
        self.items += items
        self.samples += self.engine.samples_consumed - samples_before
        self.ks.append(self.engine.k)
        return items

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.close()


__all__ = ["load_throughput", "measure_throughput", "throughput_path", "timing_windows"]
