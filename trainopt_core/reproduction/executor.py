"""Where the reproduction's training runs execute: `local` (one after another in this process,
the default) or `ray` (each task x configuration x seed a Ray task on a Ray cluster, local or
joined at an address).

On Ray each run holds one GPU where the cluster has GPUs, else `cpus_per_run` cores (default:
all of one node's cores for one run at a time on a 2-core machine, two runs on 4 or more). Its
record and in-run checkpoints are written by the worker into `out_dir`, which every worker must
reach (a shared file system; the machine itself for a local cluster). A worker lost in the middle
of a run (killed, its node gone) is retried by Ray (`MAX_RETRIES`), and the retry resumes from
the run's last in-run checkpoint. A task's `auto` runs wait for its first `auto` run, which plans
the task; the plan is kept beside the records and reused. Each worker says when it starts a run
(a Ray queue), so the terminal shows which worker runs what, each retry of a lost worker's run,
and runs done / running / queued.

Interleaved throughput timing and Table IV's multi-process launches do not go through here: they
compare configurations in one process on one device.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
from typing import Callable

from .._errors import fail as _fail

EXECUTORS = ("local", "ray")
MAX_RETRIES = 3  # Ray's retries of a run whose worker died (a run's own errors are not retried)
INSTALL_HINT = "pip install 'trainopt[cluster]' (Ray)"
# How long a cluster's address may take to accept a TCP connection: ray.init() itself waits on an
# address nobody answers at for many minutes, naming nothing
CONNECT_TIMEOUT_S = 5.0
RAY_ADDRESSES = ("'auto' (the cluster `ray start` runs on this machine), HOST:PORT of a running cluster's head (its "
                 "GCS port: 6379 unless `ray start --port` chose another) or ray://HOST:PORT (Ray Client) that this "
                 "machine reaches, or empty: a cluster of this machine, started here")


def check_executor(executor: str) -> str:
    if executor not in EXECUTORS:
        _fail("executor", executor, f"one of {EXECUTORS}")
    return executor


def ray_module():
    """`ray`, or a ModuleNotFoundError that says how to install it."""
    try:
        import ray
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(f"executor='ray' needs Ray, which is not installed: {INSTALL_HINT}",
                                  name="ray") from missing
    return ray


def _host_and_port(address: str) -> tuple[str, int] | None:
    """HOST:PORT (or ray://HOST:PORT, [IPv6]:PORT) split, or None where `address` is not one."""
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    try:
        parts = urllib.parse.urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or port is None or parts.path or parts.query or parts.fragment or parts.username:
        return None
    return host, port


def _within(seconds: float, attempt: Callable[[], None]) -> str | None:
    """Why `attempt` raised, or that it did not return within `seconds`; None where it returned.
    In a daemon thread: a name look-up or a client that blocks is left behind, not waited for."""
    outcome: list[str | None] = []

    def run():
        try:
            attempt()
            outcome.append(None)
        except Exception as error:  # whatever the client raises says why
            outcome.append(f"{type(error).__name__}: {str(error).strip()[:200]}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else f"no answer within {seconds:g} s"


def _gcs_client():
    """Ray's own GCS client class (internal to Ray), or None where this release lacks it. A GCS
    that answers it with the cluster's id is there; a TCP connection alone proves little: a proxy or
    a firewall may accept it, and ray.init() then waits for ever."""
    try:
        from ray._raylet import GcsClient
    except ImportError:
        return None
    return GcsClient


def check_ray_address(address: str | None, argument: str = "ray_address",
                      timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ValueError naming `argument` where `address` (or, without one, the RAY_ADDRESS environment
    variable ray.init() reads) is no cluster address, where nothing accepts a TCP connection at it
    within `timeout_s`, or where no Ray GCS answers there within 2 x `timeout_s` (a Ray Client
    address, ray://, is checked for the connection only)."""
    if not address and os.environ.get("RAY_ADDRESS"):
        address, argument = os.environ["RAY_ADDRESS"], "RAY_ADDRESS (the environment's)"
    if not address or address == "local" or (address == "auto" and not os.environ.get("RAY_ADDRESS")):
        return  # a cluster started here, or Ray's own look-up of this machine's, which fails at once
    if address == "auto":
        address, argument = os.environ["RAY_ADDRESS"], "RAY_ADDRESS (the environment's, for 'auto')"
    if not isinstance(address, str) or _host_and_port(address) is None:
        _fail(argument, address, RAY_ADDRESSES)
    host, port = _host_and_port(address)
    why = _within(timeout_s, lambda: socket.create_connection((host, port), timeout=timeout_s).close())
    client = None if why is not None or address.startswith("ray://") else _gcs_client()
    if client is not None:
        why = _within(2 * timeout_s, lambda: client(address=f"{host}:{port}"))
        why = why and f"a connection opened, but no Ray GCS answered ({why})"
    if why is not None:
        _fail(argument, address, f"{RAY_ADDRESSES}; at {host}:{port}: {why}")


def _run_one(task: str, config: str, seed: int, profile: str, out_dir: str, data_policy: str, threads: int,
             options: dict, events) -> tuple[dict, dict]:
    """One run on a Ray worker: the record, and where it ran. Puts (task, config, seed, host, pid)
    on `events` (a Ray queue) when it starts."""
    import torch

    from .runner import run

    events.put((task, config, seed, socket.gethostname(), os.getpid()))
    torch.set_num_threads(max(1, threads))
    started = time.perf_counter()
    record = run(task, config, profile=profile, seed=seed, out_dir=out_dir, data_policy=data_policy, progress=False,
                 **options)
    return record, dict(host=socket.gethostname(), pid=os.getpid(), seconds=time.perf_counter() - started)


def resources_per_run(cluster_gpus: float, node_cpus: int, cpus_per_run: int | None = None) -> tuple[int, int]:
    """(CPU cores, GPUs) one run holds: one GPU (and one core) on a cluster with GPUs; else
    `cpus_per_run`, or by default all of a node's cores below 4 and half of them from 4."""
    if cpus_per_run is not None and (isinstance(cpus_per_run, bool) or not isinstance(cpus_per_run, int)
                                     or cpus_per_run < 1):
        _fail("cpus_per_run", cpus_per_run, "None or an integer >= 1")
    if cluster_gpus >= 1:
        return 1, 1
    if cpus_per_run is not None:
        return cpus_per_run, 0
    return (node_cpus if node_cpus < 4 else max(1, node_cpus // 2)), 0


def run_on_ray(grid: list[tuple[str, str, int]], *, profile: str, out_dir, data_policy: str = "auto",
               address: str | None = None, cpus_per_run: int | None = None, options: dict | None = None,
               report: Callable[[str], None] = print) -> list[dict]:
    """The records of `grid` ((task, configuration, seed) each), run as Ray tasks, in `grid`'s
    order. `address`: a running cluster's ("auto", "HOST:PORT"), else a local one is started for
    this process. `report` gets one line per event: what was queued, each run started (where; a
    second start is Ray's retry of a lost worker's run) and done (where, how long), and runs done /
    running / queued with the time left at the pace so far."""
    ray = ray_module()
    from ray.util.queue import Empty, Queue
    if not ray.is_initialized():
        check_ray_address(address)
        ray.init(address=address or None, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    node_cpus = max((int(n["Resources"].get("CPU", 1)) for n in ray.nodes() if n.get("Alive")), default=1)
    cpus, gpus = resources_per_run(ray.cluster_resources().get("GPU", 0), node_cpus, cpus_per_run)
    remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=MAX_RETRIES)(_run_one)
    out = os.fspath(os.path.abspath(out_dir))
    options = dict(options or {})
    events = Queue(actor_options={"num_cpus": 0})

    def submit(item):
        task, config, seed = item
        return remote.remote(task, config, seed, profile, out, data_policy, cpus, options, events)

    # a task's first auto run plans it; its other auto runs wait for that plan
    planners = {task: min((s for t, c, s in grid if t == task and c == "auto"), default=None) for task, _, _ in grid}
    held = [item for item in grid if item[1] == "auto" and item[2] != planners[item[0]]]
    pending = {submit(item): item for item in grid if item not in held}
    report(f"ray: {len(grid)} runs, {gpus or cpus} {'GPU' if gpus else 'CPU core(s)'} each on "
           f"{int(ray.cluster_resources().get('CPU', 0))} cores / {int(ray.cluster_resources().get('GPU', 0))} GPUs"
           + (f"; {len(held)} auto run(s) wait for their task's plan" if held else ""))
    done: dict[tuple, dict] = {}
    running: dict[tuple, str] = {}  # started and not done: where
    starts: dict[tuple, int] = {}
    started = time.perf_counter()

    def counts() -> str:
        return (f"{len(done)}/{len(grid)} done, {len(running)} running, "
                f"{len(grid) - len(done) - len(running)} queued")

    def report_starts():
        while True:
            try:
                task, config, seed, host, pid = events.get_nowait()
            except Empty:
                return
            item = (task, config, int(seed))
            if item in done:
                continue
            running[item] = f"{host} (pid {pid})"
            starts[item] = starts.get(item, 0) + 1
            again = f" again (Ray's retry {starts[item] - 1}: its worker was lost)" if starts[item] > 1 else ""
            report(f"ray: {task} {config} seed {seed} started{again} on {running[item]}; {counts()}")

    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            report_starts()
            if not ready:
                continue
            item = pending.pop(ready[0])
            try:
                record, where = ray.get(ready[0])
            except Exception as error:  # the run's own error (retries are for lost workers), or retries spent
                raise RuntimeError(f"run {item[0]} {item[1]} seed {item[2]} failed on Ray: "
                                   f"{str(error).strip().splitlines()[-1][:400]}") from error
            done[item] = record
            running.pop(item, None)
            if item[1] == "auto" and item[2] == planners[item[0]]:
                for waiting in [h for h in held if h[0] == item[0]]:
                    held.remove(waiting)
                    pending[submit(waiting)] = waiting
            elapsed = time.perf_counter() - started
            left = len(grid) - len(done)
            eta = f", about {elapsed / len(done) * left:.0f} s left" if left else ""
            report(f"ray: {item[0]} {item[1]} seed {item[2]} done on {where['host']} (pid {where['pid']}) in "
                   f"{where['seconds']:.1f} s; {counts()}{eta}")
    finally:
        events.shutdown()  # also when a run failed
    return [done[item] for item in grid]
