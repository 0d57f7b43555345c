"""Process-group helpers shared by the launchers and the training engines.

Every process of a data-parallel job calls `init_distributed()` once. It reads the variables
that torchrun, the DeepSpeed launcher and `trainopt_core.distributed.run_processes` all set
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), joins the process group with a
bounded collective timeout, pins the process to its GPU, and on CPU fixes the number of torch
threads per process. Without WORLD_SIZE it returns a single-process `DistInfo` and changes
nothing, so the same training script runs with and without a launcher. A group it created is
destroyed when the interpreter exits, if the script has not done so itself.
"""

from __future__ import annotations

import atexit
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

ALLOWED_BACKENDS = ("gloo", "nccl", "mpi")

# A collective that waits longer than this raises instead of hanging (torch's own default is
# 30 min). Long enough for one rank to evaluate or save while the others wait at a barrier.
DEFAULT_DIST_TIMEOUT_S = 600.0

# Set by `python -m trainopt_core.distributed --threads-per-process / --dist-timeout-s` so that the
# launched processes pick the values up without the training script forwarding them.
THREADS_ENV = "TRAINOPT_THREADS_PER_PROCESS"
TIMEOUT_ENV = "TRAINOPT_DIST_TIMEOUT_S"

# What `cleanup` waits before destroying a gloo group, for its worker threads to drop the last
# collectives' work objects while the interpreter is whole (see `cleanup`).
GLOO_SETTLE_S = 0.2


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it; a small race with other users of
    the port remains, as with torchrun --standalone)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job.

    `backend` is None for a single process without a process group. `threads_per_process`
    is the torch intra-op thread count this helper set, or None when it left it alone.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    threads_per_process: int | None = None

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0


def available_cpu_cores() -> int:
    """CPU cores this process may run on (affinity mask / cgroup cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def default_threads_per_process(local_world_size: int) -> int:
    """max(1, cores // processes on this node): the processes share the node's cores evenly,
    so a 1-, 2- or 4-process run uses the same total number of threads (Table IV)."""
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be >= 1, got {local_world_size}")
    return max(1, available_cpu_cores() // local_world_size)


def default_backend() -> str:
    """nccl when CUDA is available, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def _env_int(name: str, *, required: bool, default: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if required:
            raise ValueError(f"environment variable {name} is not set; it is required when "
                             "WORLD_SIZE is set (torchrun and the DeepSpeed launcher set both)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _resolve_threads(threads_per_process: int | None, local_world_size: int,
                     explicit_only: bool) -> int | None:
    if threads_per_process is None:
        from_env = _env_int(THREADS_ENV, required=False)
        if from_env is not None:
            threads_per_process = from_env
        elif explicit_only:
            return None
        else:
            threads_per_process = default_threads_per_process(local_world_size)
    if threads_per_process < 1:
        raise ValueError(f"threads_per_process must be >= 1, got {threads_per_process}")
    return threads_per_process


def _resolve_timeout_s(timeout_s: float | None) -> float:
    if timeout_s is None:
        raw = os.environ.get(TIMEOUT_ENV)
        try:
            timeout_s = float(raw) if raw else DEFAULT_DIST_TIMEOUT_S
        except ValueError:
            raise ValueError(f"environment variable {TIMEOUT_ENV} must be a number of "
                             f"seconds, got {raw!r}") from None
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    return float(timeout_s)


def init_distributed(backend: str | None = None, *, threads_per_process: int | None = None,
                     timeout_s: float | None = None) -> DistInfo:
    """Join the process group described by the launcher's environment variables.

    backend: "gloo", "nccl" or "mpi"; default nccl when CUDA is available, else gloo. The
        device follows the backend: nccl -> cuda:LOCAL_RANK (set as current device), any
        other backend -> cpu.
    threads_per_process: torch intra-op threads per process on CPU; default from
        TRAINOPT_THREADS_PER_PROCESS, else max(1, cores // LOCAL_WORLD_SIZE) (LOCAL_WORLD_SIZE
        falls back to WORLD_SIZE), so scaling runs compare equal total thread counts.
    timeout_s: collective timeout; a peer that died or stopped participating makes the
        waiting ranks raise after this long instead of hanging. Default from
        TRAINOPT_DIST_TIMEOUT_S, else DEFAULT_DIST_TIMEOUT_S.

    Without WORLD_SIZE in the environment this is a no-op returning rank 0 of 1 (it sets the
    thread count only when `threads_per_process` is passed). Calling it again once the group
    exists returns the same description without re-initializing.

    The group it creates is destroyed at interpreter exit (`cleanup`, registered with atexit),
    while Python is still whole: gloo's worker threads that release a collective's tensors
    during the interpreter's teardown abort the process after the script's work is done
    (SIGABRT, "terminate called without an active exception"; see `cleanup`). Calling
    `cleanup()` earlier is fine; the exit handler then does nothing.
    """
    if backend is not None and backend not in ALLOWED_BACKENDS:
        raise ValueError(f"backend must be one of {ALLOWED_BACKENDS} or None, got {backend!r}")
    world_size = _env_int("WORLD_SIZE", required=False)
    if world_size is None:
        threads = _resolve_threads(threads_per_process, 1, explicit_only=True)
        on_cuda = torch.cuda.is_available() and backend != "gloo"
        if threads is not None and not on_cuda:
            torch.set_num_threads(threads)
        device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
        return DistInfo(rank=0, world_size=1, local_rank=0, device=device, backend=None,
                        threads_per_process=threads if not on_cuda else None)

    rank = _env_int("RANK", required=True)
    local_rank = _env_int("LOCAL_RANK", required=True)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", required=False, default=world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= RANK < WORLD_SIZE, got RANK={rank}, WORLD_SIZE={world_size}")
    if dist.is_initialized():
        backend = str(dist.get_backend())
    backend = backend or default_backend()

    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA, which is not available; use 'gloo' on CPU")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA "
                             "devices are visible; launch at most one process per GPU")
        device = torch.device("cuda", local_rank)
        # Pin before any CUDA work so that every rank does not create a context on GPU 0.
        torch.cuda.set_device(device)
        threads = None
    else:
        device = torch.device("cpu")
        threads = _resolve_threads(threads_per_process, local_world_size, explicit_only=False)
        torch.set_num_threads(threads)

    if not dist.is_initialized():
        timeout = timedelta(seconds=_resolve_timeout_s(timeout_s))
        extra: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=timeout, **extra)
        atexit.register(cleanup)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device,
                    backend=backend, threads_per_process=threads)


def is_main_process() -> bool:
    """True on rank 0, and in a single process without a process group."""
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    """Wait for all ranks; a no-op without a process group."""
    if dist.is_initialized():
        dist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), indexed by rank; `[obj]` without a process group.

    torch's object collectives need numpy, which an install of torch alone may lack; the engines
    gather tensors instead."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def cleanup(destroy: Callable[[], Any] | None = None) -> None:
    """Destroy the process group if one exists (safe to call more than once), with `destroy`
    when given (default `torch.distributed.destroy_process_group`).

    A gloo group first gets GLOO_SETTLE_S with the GIL released: gloo's worker threads drop a
    finished collective's work object, and with it the tensors Python handed it, a moment after
    the caller sees the collective done. A worker that does so once the interpreter is
    finalizing needs the GIL to release a tensor's Python object, cannot have it, and aborts the
    process (SIGABRT, "terminate called without an active exception") -- destroying the group
    does not stop those threads, so the wait is what closes the window."""
    if dist.is_initialized():
        if dist.get_backend() == "gloo":
            time.sleep(GLOO_SETTLE_S)
        (destroy or dist.destroy_process_group)()
