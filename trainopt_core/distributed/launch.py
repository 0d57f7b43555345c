"""The launch CLI: torchrun or the DeepSpeed launcher, one command per node.

    python -m trainopt_core.distributed --nproc 2 [--deepspeed] -- <arguments for the module>
    python -m trainopt_core.distributed --nproc 8 --nnodes 2 --node-rank 0 \\
        --master-addr <node 0's address> --master-port 29500 -- <arguments>

runs `python -m torch.distributed.run ... -m <module> <arguments>`, or the DeepSpeed launcher,
and exits with the job's exit code; both end the whole job when one rank fails. The module is
`--module` (default: the reproduction's run CLI, `trainopt_core.reproduction`). Without CUDA the
DeepSpeed launcher picks its CPU accelerator (or set DS_ACCELERATOR=cpu) and `--num_gpus N`
starts N CPU processes. The launched script calls
`trainopt_core.distributed.init_distributed()`, which reads the environment of either.

For N local processes from a notebook or a test, use `trainopt_core.distributed.run_processes`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from typing import Any, Sequence

from .process_group import THREADS_ENV, TIMEOUT_ENV, find_free_port

# A module name, not an import: the library does not depend on the reproduction harness.
DEFAULT_MODULE = "trainopt_core.reproduction"
DEFAULT_MULTINODE_MASTER_PORT = 29500  # torchrun's default; every node must agree on it


# --------------------------------------------------------------------------- environment

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
        prog="python -m trainopt_core.distributed",
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
