"""Start data-parallel jobs: a torchrun / DeepSpeed CLI wrapper and a notebook-safe launcher.

CLI, one command per node (multi-node arguments are passed through)::

    python -m trainopt_core.launch --nproc 2 [--deepspeed] -- <arguments for trainopt_core.run>
    python -m trainopt_core.launch --nproc 8 --nnodes 2 --node-rank 0 \\
        --master-addr 10.0.0.1 --master-port 29500 -- <arguments>

runs `python -m torch.distributed.run ... -m trainopt_core.run <arguments>`, or the DeepSpeed
launcher, and exits with the job's exit code. Both end the whole job when one rank fails.
Without CUDA the DeepSpeed launcher picks its CPU accelerator (or set DS_ACCELERATOR=cpu) and
`--num_gpus N` starts N CPU processes. The launched script calls
`trainopt_core.distributed.init_distributed()`, which reads the environment of either.

`run_processes(fn, nproc)` (notebooks, tests) spawns N local ranks, runs `fn` in a process
group in each and returns the per-rank results; a failing rank ends the job with
`RankFailedError` (rank number + traceback) instead of a hang.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import pickle
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import psutil
import torch

from trainopt_core import distributed
from trainopt_core.distributed import THREADS_ENV, TIMEOUT_ENV

DEFAULT_MODULE = "trainopt_core.run"
DEFAULT_MULTINODE_MASTER_PORT = 29500  # torchrun's default; every node must agree on it
# After a failure, ranks get this long to exit on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 3.0
# A rank that sent its traceback exits right after; wait this long before stopping it.
REPORTED_EXIT_WAIT_S = 1.0
_NO_REPORT = " without reporting a result or an exception"


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


# --------------------------------------------------------------------------- ports and env

def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it; a small race with other users of
    the port remains, as with torchrun --standalone)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def launch_env(nproc: int, *, threads_per_process: int | None = None,
               dist_timeout_s: float | None = None,
               use_deepspeed: bool = False) -> dict[str, str]:
    """Environment variables the CLI adds for the launched processes.

    threads_per_process -> OMP_NUM_THREADS and TRAINOPT_THREADS_PER_PROCESS. When it is not
    given, `init_distributed` in each process sets max(1, cores // processes on the node)
    on CPU, so 1/2/4-process runs use the same total thread count either way.
    dist_timeout_s -> TRAINOPT_DIST_TIMEOUT_S (collective timeout). The DeepSpeed launcher,
    unlike torchrun, does not export LOCAL_WORLD_SIZE, so it is added here.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    env: dict[str, str] = {}
    if threads_per_process is not None:
        if threads_per_process < 1:
            raise ValueError(f"threads_per_process must be >= 1, got {threads_per_process}")
        env["OMP_NUM_THREADS"] = str(threads_per_process)
        env[THREADS_ENV] = str(threads_per_process)
    if dist_timeout_s is not None:
        if not dist_timeout_s > 0:
            raise ValueError(f"dist_timeout_s must be > 0 seconds, got {dist_timeout_s}")
        env[TIMEOUT_ENV] = str(dist_timeout_s)
    if use_deepspeed:
        env["LOCAL_WORLD_SIZE"] = str(nproc)
    return env


# --------------------------------------------------------------------------- CLI command

def build_launch_command(nproc: int, module_args: Sequence[str] = (), *, nnodes: int = 1,
                         node_rank: int = 0, master_addr: str | None = None,
                         master_port: int | None = None, use_deepspeed: bool = False,
                         hostfile: str | None = None, module: str = DEFAULT_MODULE,
                         python: str = sys.executable) -> list[str]:
    """The torchrun (or DeepSpeed launcher) command that runs `python -m module module_args`
    in `nproc` processes on this node.

    Single node: master_addr defaults to 127.0.0.1 and master_port to a free port. Multi-node
    (nnodes > 1): master_addr is required, master_port defaults to 29500, and the same
    command runs on every node with its own node_rank. DeepSpeed multi-node additionally
    needs `hostfile` (its launcher reads the node list from it; --no_ssh makes each node
    start only its own processes, like torchrun).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be in [0, {nnodes}), got {node_rank}")
    if not module:
        raise ValueError(f"module must be a module name, got {module!r}")
    if nnodes > 1 and not master_addr:
        raise ValueError("master_addr is required when nnodes > 1 (the address of node 0)")
    if hostfile is not None and not use_deepspeed:
        raise ValueError("hostfile is only used with use_deepspeed=True")
    if use_deepspeed and nnodes > 1 and hostfile is None:
        raise ValueError("use_deepspeed with nnodes > 1 needs hostfile (DeepSpeed's node list)")
    master_addr = master_addr or "127.0.0.1"
    if master_port is None:
        master_port = DEFAULT_MULTINODE_MASTER_PORT if nnodes > 1 else find_free_port()
    if not 0 < master_port < 65536:
        raise ValueError(f"master_port must be in 1..65535, got {master_port}")

    if use_deepspeed:
        cmd = [python, "-m", "deepspeed.launcher.runner"]
        if nnodes > 1:
            cmd += ["--hostfile", hostfile, "--no_ssh", f"--node_rank={node_rank}",
                    f"--num_nodes={nnodes}"]
        # --no_local_rank: the script reads LOCAL_RANK from the environment, not argv.
        cmd += [f"--num_gpus={nproc}", f"--master_addr={master_addr}",
                f"--master_port={master_port}", "--no_local_rank", "--module", module]
    else:
        cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               f"--nnodes={nnodes}", f"--node-rank={node_rank}",
               f"--master-addr={master_addr}", f"--master-port={master_port}", "-m", module]
    return cmd + list(module_args)


def _parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        own, module_args = argv[:split], argv[split + 1:]
    else:
        own, module_args = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m trainopt_core.launch",
        description="Run `python -m MODULE ARGS` in N processes per node with torchrun or "
                    "the DeepSpeed launcher. Arguments after `--` go to the module.")
    parser.add_argument("--nproc", type=int, required=True, help="processes on this node")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default=None, help="node 0's address (multi-node)")
    parser.add_argument("--master-port", type=int, default=None,
                        help="default: a free port on one node, 29500 on several")
    parser.add_argument("--deepspeed", action="store_true", help="use the DeepSpeed launcher")
    parser.add_argument("--hostfile", default=None, help="DeepSpeed multi-node host list")
    parser.add_argument("--threads-per-process", type=int, default=None,
                        help="torch threads per process (default on CPU: cores // nproc)")
    parser.add_argument("--dist-timeout-s", type=float, default=None,
                        help="collective timeout in the launched processes")
    parser.add_argument("--module", default=DEFAULT_MODULE, help="module to run with -m")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    return parser.parse_args(own), module_args


def _exit_status(returncode: int) -> int:
    # Shell convention: killed by signal N -> 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the job's exit code."""
    args, module_args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cmd = build_launch_command(
            args.nproc, module_args, nnodes=args.nnodes, node_rank=args.node_rank,
            master_addr=args.master_addr, master_port=args.master_port,
            use_deepspeed=args.deepspeed, hostfile=args.hostfile, module=args.module)
        extra_env = launch_env(args.nproc, threads_per_process=args.threads_per_process,
                               dist_timeout_s=args.dist_timeout_s, use_deepspeed=args.deepspeed)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    printable = " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(extra_env.items())]
                         + [shlex.join(cmd)])
    if args.dry_run:
        print(printable)
        return 0
    print(f"launch: {printable}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env={**os.environ, **extra_env})

    def forward(signum: int, _frame: Any) -> None:
        # torchrun / DeepSpeed stop their workers on SIGTERM/SIGINT; killing the launcher
        # outright would orphan them.
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _exit_status(proc.wait())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# --------------------------------------------------------------------------- run_processes

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
        distributed.init_distributed(backend, threads_per_process=threads_per_process)
        result = fn(*args, **kwargs)
        distributed.cleanup()
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
    `distributed.init_distributed(backend, threads_per_process=...)` (gloo on CPU, nccl on
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
    if backend is not None and backend not in distributed.ALLOWED_BACKENDS:
        raise ValueError(f"backend must be one of {distributed.ALLOWED_BACKENDS} or None, "
                         f"got {backend!r}")
    if threads_per_process is not None and threads_per_process < 1:
        raise ValueError(f"threads_per_process must be >= 1, got {threads_per_process}")
    if (backend or distributed.default_backend()) == "nccl":
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
            root = min(errors, key=lambda r: errors[r][0])
            for rank in errors:  # it reported and is exiting: let it, to keep its exit code
                processes[rank].join(timeout=REPORTED_EXIT_WAIT_S)
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


if __name__ == "__main__":
    sys.exit(main())
