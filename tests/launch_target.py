"""Tiny jobs for tests/test_launch.py.

Run as a module by the launch CLI (`python -m launch_target [--fail-rank R]` with tests/ on
PYTHONPATH): every rank joins the group with `init_distributed`, all-reduces its rank, prints
one result line and, with --fail-rank, that rank raises while the others wait in a barrier.

Also holds module-level functions for `run_processes` (spawned ranks must import them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from trainopt_core import distributed

FAILURE_TEXT = "deliberate failure in launch_target"


def rank_sum_and_identity(scale: float = 1.0) -> dict:
    """All-reduce (sum) of scale * rank, plus what this rank knows about itself."""
    total = torch.tensor([scale * dist.get_rank()])
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "local_rank": int(os.environ["LOCAL_RANK"]), "sum": total.item(),
            "threads": torch.get_num_threads(), "backend": str(dist.get_backend())}


def raise_on_rank(fail_rank: int, pid_dir: str) -> int:
    """`fail_rank` raises; the others block in a barrier and, when the dead peer makes the
    barrier fail, keep hanging like a rank stuck in a collective would."""
    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    if dist.get_rank() == fail_rank:
        time.sleep(0.5)  # let the other ranks enter the barrier first
        raise RuntimeError(f"{FAILURE_TEXT} on rank {fail_rank}")
    try:
        dist.barrier()
    except RuntimeError:
        pass
    time.sleep(3600)
    return dist.get_rank()


def exit_on_rank(exit_rank: int, exit_code: int, pid_dir: str) -> int:
    """`exit_rank` leaves with os._exit (no exception); the others block in an all_reduce."""
    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    if dist.get_rank() == exit_rank:
        os._exit(exit_code)
    dist.all_reduce(torch.ones(1))
    time.sleep(3600)
    return dist.get_rank()


def sleep_forever(pid_dir: str) -> None:
    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(3600)


@record  # torchrun then prints the failing rank's traceback in its failure summary
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=None)
    args = parser.parse_args()
    info = distributed.init_distributed()
    total = torch.tensor([float(info.rank)])
    dist.all_reduce(total)
    # One write per line: the ranks share the launcher's stdout, and print() writes the text
    # and the newline separately, so lines from two ranks could interleave.
    sys.stdout.write(f"launch_target rank={info.rank} world_size={info.world_size} "
                     f"sum={total.item()} threads={torch.get_num_threads()} "
                     f"backend={info.backend}\n")
    sys.stdout.flush()
    if args.fail_rank == info.rank:
        raise RuntimeError(f"{FAILURE_TEXT} on rank {info.rank}")
    distributed.barrier()
    distributed.cleanup()


if __name__ == "__main__":
    main()
