"""`run_processes(fn, nproc)`: N local ranks from a notebook, a test or a script.

It spawns N ranks, runs `fn` in a process group in each and returns the per-rank results; a
failing rank ends the job with `RankFailedError` (rank number + traceback) instead of a hang,
and no rank outlives the call.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import re
import signal
import sys
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import psutil
import torch

from . import process_group
from .process_group import find_free_port

# After a failure, ranks get this long to exit on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 3.0
# A rank that sent its traceback exits right after; wait this long before stopping it.
REPORTED_EXIT_WAIT_S = 1.0
_NO_REPORT = " without reporting a result or an exception"
# A collective's error on a rank whose peer went away: a consequence, not the cause (gloo's
# "Connection closed by peer ... the remote worker", NCCL's aborted communicator)
_PEER_LOST = re.compile(r"closed by peer|reset by peer|remote worker|broken pipe|communicator was aborted", re.I)


def _root_cause(errors: dict[int, tuple[float, str]]) -> int:
    """The failure that caused the others: the first reported, unless that is a collective's error
    on losing a peer and a rank ended without a report -- then that rank (it left first; its peer
    only noticed, and may have said so before the launcher saw the exit)."""
    first = min(errors, key=lambda r: errors[r][0])
    silent = [r for r, (_, text) in errors.items() if text.endswith(_NO_REPORT)]
    if silent and _PEER_LOST.search(errors[first][1]):
        return min(silent, key=lambda r: errors[r][0])
    return first


class LaunchError(RuntimeError):
    """A local multi-process job did not complete."""


class RankFailedError(LaunchError):
    """A rank raised or died. `rank` is the first failure (the root cause), `failures` maps
    every failed rank to its traceback text or exit description, `exit_codes` every rank's
    exit code (negative: killed by that signal, e.g. -15 when the launcher stopped it)."""

    def __init__(self, rank: int, failures: dict[int, str], exit_codes: dict[int, int | None]):
        self.rank = rank
        self.failures = failures
        self.exit_codes = exit_codes
        others = sorted(r for r in failures if r != rank)
        lines = [f"rank {rank} of {len(exit_codes)} failed:", failures[rank].rstrip()]
        if others:
            lines.append(f"(ranks {others} failed or were stopped after rank {rank}; "
                         "see .failures)")
        super().__init__("\n".join(lines))


class LaunchTimeoutError(LaunchError, TimeoutError):
    """The whole job ran past `timeout_s`; all ranks were killed."""


# --------------------------------------------------------------------------- one rank

def _die_with_parent() -> None:
    """Linux: get SIGKILL if the launching process dies, so that a crashed notebook kernel
    leaves no ranks behind. Best effort elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


def _rank_entry(fn: Callable[..., Any], args: tuple, kwargs: dict, rank: int, nproc: int,
                master_port: int, backend: str | None, threads_per_process: int | None,
                parent_pid: int, result_conn: Any) -> None:
    """Body of one spawned rank: env, process group, fn, result or traceback to the parent."""
    _die_with_parent()
    if os.getppid() != parent_pid:  # parent died before prctl took effect
        os._exit(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                       "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(nproc)})
    try:
        process_group.init_distributed(backend, threads_per_process=threads_per_process)
        result = fn(*args, **kwargs)
        process_group.cleanup()
        message = ("ok", result, time.time())
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        result_conn.send(("error", traceback.format_exc(), time.time()))
        result_conn.close()
        # Skip interpreter shutdown: destroying a group whose peers are gone can block.
        os._exit(1)
    try:
        result_conn.send(message)
    except Exception:  # the result itself does not pickle
        result_conn.send(("error", f"rank {rank}: return value could not be sent to the "
                                   f"parent:\n{traceback.format_exc()}", time.time()))
        result_conn.close()
        os._exit(1)
    result_conn.close()


def _check_importable(fn: Callable[..., Any]) -> None:
    main_module = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not hasattr(main_module, "__file__"):
        raise ValueError(
            f"fn={fn!r} is defined in an interactive session (notebook/REPL); spawned ranks "
            "cannot import it. Define it at module level in a .py file and import it.")
    try:
        pickle.dumps(fn)
    except Exception as err:
        raise ValueError(f"fn={fn!r} must be a module-level function that spawned processes "
                         f"can import (not a lambda or nested function): {err}") from None


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _kill_all(processes: Sequence[Any], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM every live rank and its children, SIGKILL what survives `grace_s`, reap all.

    Ranks are stopped and reaped through their multiprocessing handles (so their exit codes
    stay readable); psutil only finds and stops the ranks' own children (e.g. data workers).
    """
    live = [proc for proc in processes if proc.pid is not None and proc.is_alive()]
    descendants: list[psutil.Process] = []
    for proc in live:
        try:
            descendants += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for target in [*live, *descendants]:
        try:
            target.terminate()
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + grace_s
    for proc in live:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=grace_s)
    _, survivors = psutil.wait_procs(descendants, timeout=max(0.0, deadline - time.monotonic()))
    for child in survivors:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def run_processes(fn: Callable[..., Any], nproc: int, *, args: tuple = (),
                  kwargs: dict | None = None, backend: str | None = None,
                  timeout_s: float = 600.0, threads_per_process: int | None = None) -> list[Any]:
    """Run `fn(*args, **kwargs)` in `nproc` local ranks and return their results by rank.

    Safe in notebooks: ranks are started with the "spawn" method (forking a process that
    holds CUDA or notebook threads is unsafe), so `fn` must be importable by the children --
    a module-level function in a .py file, not one defined in a notebook cell, a lambda or
    a nested function (a script calling this needs the `if __name__ == "__main__":` guard).
    `args`, `kwargs` and the return values must be picklable.

    Each rank sees MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK
    and LOCAL_WORLD_SIZE, and runs `fn` inside a process group made by
    `process_group.init_distributed(backend, threads_per_process=...)` (gloo on CPU, nccl on
    GPU by default), destroyed afterwards. Ranks' stdout/stderr go to the parent's streams
    (in Jupyter: the kernel's terminal); errors come back in the exception.

    Raises RankFailedError as soon as one rank raises or dies (exit code or signal), after
    terminating the other ranks, which may be blocked in a collective; LaunchTimeoutError
    when the job runs past `timeout_s`. No rank outlives this call.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if backend is not None and backend not in process_group.ALLOWED_BACKENDS:
        raise ValueError(f"backend must be one of {process_group.ALLOWED_BACKENDS} or None, "
                         f"got {backend!r}")
    if threads_per_process is not None and threads_per_process < 1:
        raise ValueError(f"threads_per_process must be >= 1, got {threads_per_process}")
    if (backend or process_group.default_backend()) == "nccl":
        if nproc > torch.cuda.device_count():
            raise ValueError(f"nproc={nproc} exceeds the {torch.cuda.device_count()} visible "
                             "GPUs for backend nccl; use backend='gloo' for CPU ranks")
    _check_importable(fn)

    ctx = multiprocessing.get_context("spawn")
    master_port = find_free_port()
    processes, readers, writers = [], [], []
    for rank in range(nproc):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_rank_entry, name=f"trainopt-rank{rank}",
            args=(fn, tuple(args), dict(kwargs or {}), rank, nproc, master_port, backend,
                  threads_per_process, os.getpid(), writer))
        processes.append(proc)
        readers.append(reader)
        writers.append(writer)
    results: dict[int, Any] = {}
    errors: dict[int, tuple[float, str]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for proc, writer in zip(processes, writers):
            proc.start()
            # Drop the parent's write end: the rank's reader then sees EOF once the rank dies.
            writer.close()
        pending = set(range(nproc))
        while pending and not errors:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise LaunchTimeoutError(
                    f"job of {nproc} ranks ran past timeout_s={timeout_s}; ranks "
                    f"{sorted(pending)} had not finished and were killed")
            waitables = [processes[r].sentinel for r in pending]
            waitables += [readers[r] for r in pending if not readers[r].closed]
            ready = set(wait(waitables, timeout=remaining_s))
            for rank in sorted(pending):
                if readers[rank] in ready or processes[rank].sentinel in ready:
                    _collect(rank, readers[rank], processes[rank], results, errors)
                    if rank in results or rank in errors:
                        pending.discard(rank)
        if errors:
            for rank in list(errors):  # it reported and is exiting: let it, to keep its exit code
                processes[rank].join(timeout=REPORTED_EXIT_WAIT_S)
            for rank in sorted(set(range(nproc)) - set(results) - set(errors)):
                if not processes[rank].is_alive():  # ended on its own before the launcher stopped anyone
                    _collect(rank, readers[rank], processes[rank], results, errors)
            root = _root_cause(errors)
            _kill_all(processes)
            for rank in sorted(set(range(nproc)) - set(results) - set(errors)):
                # A peer may have raised in the meantime (its collective lost rank `root`).
                _collect(rank, readers[rank], processes[rank], results, errors)
                if rank in errors and errors[rank][1].endswith(_NO_REPORT):
                    errors[rank] = (errors[rank][0], f"rank {rank} was stopped after rank {root} "
                                    f"failed ({_describe_exit(processes[rank].exitcode)})")
            raise RankFailedError(root, {r: text for r, (_, text) in errors.items()},
                                  {r: p.exitcode for r, p in enumerate(processes)})
        for proc in processes:
            proc.join(timeout=TERMINATE_GRACE_S)
        return [results[rank] for rank in range(nproc)]
    finally:
        _kill_all(processes)
        for conn in readers + writers:
            conn.close()


def _collect(rank: int, reader: Any, proc: Any, results: dict[int, Any],
             errors: dict[int, tuple[float, str]]) -> None:
    """Read rank's message if one arrived; otherwise, if it exited, record how. A reader at
    EOF (rank gone without a message) is closed so that it stops waking up the wait loop."""
    if not reader.closed and reader.poll():
        try:
            status, payload, when = reader.recv()
        except EOFError:
            reader.close()
        else:
            if status == "ok":
                results[rank] = payload
            else:
                errors[rank] = (when, f"rank {rank}:\n{payload}")
            return
    if proc.pid is not None and not proc.is_alive():
        proc.join()
        errors[rank] = (time.time(), f"rank {rank} {_describe_exit(proc.exitcode)}{_NO_REPORT}")
