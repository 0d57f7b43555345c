"""What losing a Ray worker costs: one smoke run (the stand-in CIFAR task's optimized rung without
checkpointing, an in-run checkpoint after every optimizer step) on a local Ray cluster, without and
with a SIGKILL of its worker (this cluster's only) right after the first checkpoint, interleaved
(plain, killed) x 3 in one process; each record is compared with a sequential run's in every
deterministic field.

    python scripts/ray_kill_cost.py OUT_DIR      # about 2.5 min on a 2-core CPU; needs trainopt[cluster]
"""
from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
print("[ray_kill_cost] importing torch, Ray and trainopt_core (seconds; longer on a first run) ...", file=sys.stderr,
      flush=True)  # a sign of life before the imports

import psutil  # noqa: E402
import torch  # noqa: E402

from trainopt_core.reproduction import executor  # noqa: E402
from trainopt_core.reproduction.records import record_differences  # noqa: E402
from trainopt_core.reproduction.runner import run  # noqa: E402

STANDIN = dict(profile="smoke", data_policy="standin")
ITEM, OPTIONS = ("cifar10", "-checkpointing", 0), dict(checkpoint_every_steps=1)
REPEATS = 3


def cluster_raylets() -> set[str]:
    """The raylet socket of each live node of the Ray cluster this process is connected to."""
    import ray

    return {node["RayletSocketName"] for node in ray.nodes() if node.get("Alive")}


def worker_pids(raylets: set[str]) -> list[int]:
    """Processes whose title says they run the executor's task (Ray names them ray::<function>)
    and that descend from one of `raylets` (their sockets, `cluster_raylets`): this cluster's
    workers, not another cluster's on the same machine."""
    flags = {f"--raylet_socket_name={socket}" for socket in raylets}
    pids = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if not any("ray::_run_one" in part for part in process.info["cmdline"] or ()):
                continue
            if any(flags & set(parent.cmdline()) for parent in process.parents()):
                pids.append(process.pid)
        except psutil.Error:  # gone, or not ours to read
            pass
    return pids


def kill_after_the_first_checkpoint(out: Path) -> tuple[threading.Thread, list[int]]:
    """A started thread that SIGKILLs the executor's worker processes of this process's Ray cluster
    as soon as a run writing into `out` has saved its first in-run checkpoint (watching for up to
    240 s), and the list of the process ids it killed, filled as it does."""
    killed: list[int] = []
    raylets = cluster_raylets()

    def watch():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            if any((out / ".checkpoints").rglob("step*.rank0.pt")):
                for pid in worker_pids(raylets):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher, killed


def timed_run(out: Path, kill: bool) -> tuple[float, dict]:
    if kill:
        watcher, killed = kill_after_the_first_checkpoint(out)
    started = time.perf_counter()
    (record,) = executor.run_on_ray([ITEM], out_dir=out, cpus_per_run=1, options=OPTIONS, report=lambda line: None,
                                    **STANDIN)
    seconds = time.perf_counter() - started
    if kill:
        watcher.join(timeout=5)
        if not killed or not any("resumed from its in-run checkpoint" in note for note in record["notes"]):
            raise SystemExit(f"the worker was not killed mid-run, or the retry did not resume: {record['notes']}")
    return seconds, record


def main(root: Path) -> None:
    import ray

    torch.set_num_threads(1)  # as the workers train (cpus_per_run=1): the same reductions, the same bits
    print(f"[ray_kill_cost] a local Ray cluster, a sequential run, then (plain, killed) x {REPEATS} "
          "(about 2.5 min on a 2-core CPU) ...", flush=True)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        reference = run(*ITEM[:2], seed=0, out_dir=root / "sequential", progress=False, **OPTIONS, **STANDIN)
        seconds = {"plain": [], "killed": []}
        for repeat in range(REPEATS):
            for kind in seconds:
                took, record = timed_run(root / f"{kind}{repeat}", kill=kind == "killed")
                seconds[kind].append(took)
                print(f"{kind} {repeat}: {took:.2f} s; fields differing from the sequential run: "
                      f"{len(record_differences(reference, record))}", flush=True)
    finally:
        ray.shutdown()
    for kind, values in seconds.items():
        print(f"{kind}: median {statistics.median(values):.2f} s (range {min(values):.2f}-{max(values):.2f})")
    cost = [killed - plain for plain, killed in zip(seconds["plain"], seconds["killed"])]
    print(f"a kill's cost, pair by pair: {', '.join(f'{c:.1f}' for c in cost)} s; median {statistics.median(cost):.1f} s")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
