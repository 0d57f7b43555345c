"""Launch layer: notebook-safe run_processes and the torchrun / DeepSpeed CLI wrapper.

Every job here uses 2 CPU processes with gloo and 1 thread each, so it fits 2 shared cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:  # spawned ranks and the CLI import launch_target by name
    sys.path.insert(0, str(TESTS_DIR))

import launch_target  # noqa: E402
from trainopt_core import distributed  # noqa: E402
from trainopt_core.distributed import LaunchTimeoutError, RankFailedError, launch, run_processes  # noqa: E402

pytestmark = pytest.mark.distributed


def _assert_no_rank_alive(pid_dir: Path, expected_ranks: int) -> None:
    pid_files = sorted(pid_dir.glob("rank*.pid"))
    assert len(pid_files) == expected_ranks
    for pid_file in pid_files:
        pid = int(pid_file.read_text())
        if psutil.pid_exists(pid):
            # A pid reused by an unrelated process is fine; one of ours still running is not.
            proc = psutil.Process(pid)
            assert proc.status() == psutil.STATUS_ZOMBIE or proc.ppid() != os.getpid(), \
                f"rank process {pid} from {pid_file.name} is still alive"


def _cli_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path.rstrip(os.pathsep)}


def _result_lines(stdout: str) -> list[str]:
    return sorted(re.findall(r"launch_target rank=\d+ world_size=\d+ sum=\S+ threads=\d+ "
                             r"backend=\w+?(?=\n|$|launch_target)", stdout))


def _run_cli(*argv: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainopt_core.distributed", *argv],
                          cwd=REPO_ROOT, env=_cli_env(), capture_output=True, text=True,
                          timeout=timeout_s)


# ------------------------------------------------------------------ run_processes

def test_run_processes_returns_rank_ordered_results_with_summed_all_reduce():
    results = run_processes(launch_target.rank_sum_and_identity, 2, kwargs={"scale": 10.0},
                            backend="gloo", threads_per_process=1, timeout_s=60)
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["local_rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" for r in results)
    assert [r["sum"] for r in results] == [10.0, 10.0]  # 10*0 + 10*1 on every rank
    assert [r["threads"] for r in results] == [1, 1]


def test_raising_rank_ends_job_with_its_traceback_while_peer_is_blocked(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as excinfo:
        run_processes(launch_target.raise_on_rank, 2, args=(1, str(tmp_path)), backend="gloo",
                      threads_per_process=1, timeout_s=120)
    elapsed_s = time.monotonic() - start
    err = excinfo.value
    assert elapsed_s < 90  # not the job's 120 s timeout: the hanging peer was stopped (bounds loose for a busy machine)
    assert err.rank == 1
    assert "rank 1" in str(err)
    assert f"{launch_target.FAILURE_TEXT} on rank 1" in str(err)
    assert "Traceback" in str(err) and "raise_on_rank" in str(err)
    assert err.exit_codes[1] == 1, err.exit_codes
    assert err.exit_codes[0] != 0, err.exit_codes  # the hanging rank had to be terminated
    assert "rank 0 was stopped after rank 1 failed" in err.failures[0]
    _assert_no_rank_alive(tmp_path, expected_ranks=2)


def test_rank_exiting_without_exception_is_reported_with_its_exit_code(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as excinfo:
        run_processes(launch_target.exit_on_rank, 2, args=(1, 3, str(tmp_path)),
                      backend="gloo", threads_per_process=1, timeout_s=120)
    assert time.monotonic() - start < 90  # not the job's 120 s timeout
    assert excinfo.value.rank == 1
    assert excinfo.value.exit_codes[1] == 3, excinfo.value.exit_codes
    assert "rank 1 exited with code 3" in str(excinfo.value)
    _assert_no_rank_alive(tmp_path, expected_ranks=2)


def test_job_past_timeout_is_killed_and_raises(tmp_path):
    start = time.monotonic()
    # long enough for both ranks to start (and write their pid files) on a busy 2-core machine
    with pytest.raises(LaunchTimeoutError, match=r"ranks \[0, 1\] had not finished"):
        run_processes(launch_target.sleep_forever, 2, args=(str(tmp_path),), backend="gloo",
                      threads_per_process=1, timeout_s=45)
    assert time.monotonic() - start < 45 + 45  # killed at the timeout, not left to sleep
    _assert_no_rank_alive(tmp_path, expected_ranks=2)


def test_run_processes_rejects_functions_spawned_ranks_cannot_import():
    with pytest.raises(ValueError, match="fn="):
        run_processes(lambda: 0, 2, backend="gloo")
    with pytest.raises(ValueError, match="nproc"):
        run_processes(launch_target.rank_sum_and_identity, 0, backend="gloo")
    with pytest.raises(ValueError, match="backend"):
        run_processes(launch_target.rank_sum_and_identity, 2, backend="tcp")


# ------------------------------------------------------------------ init_distributed

def test_init_distributed_without_world_size_is_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    threads_before = __import__("torch").get_num_threads()
    info = distributed.init_distributed(backend="gloo")
    assert (info.rank, info.world_size, info.local_rank, info.backend) == (0, 1, 0, None)
    assert not info.is_distributed and info.is_main_process
    assert info.device.type == "cpu"
    assert __import__("torch").get_num_threads() == threads_before  # left alone
    assert distributed.all_gather_object({"a": 1}) == [{"a": 1}]
    assert distributed.is_main_process()


def test_init_distributed_names_bad_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="RANK=2, WORLD_SIZE=2"):
        distributed.init_distributed(backend="gloo")
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK is not set"):
        distributed.init_distributed(backend="gloo")
    with pytest.raises(ValueError, match="backend must be one of"):
        distributed.init_distributed(backend="tcp")


def test_the_group_init_distributed_created_is_destroyed_before_the_interpreter_exits():
    # a gloo group left to the interpreter's teardown can abort the process after its work is
    # done (SIGABRT, "terminate called without an active exception"); a handler registered
    # before init_distributed runs after init_distributed's own (atexit is last-in, first-out)
    script = (
        "import atexit, torch, torch.distributed as dist\n"
        "from trainopt_core import distributed\n"
        "atexit.register(lambda: print('group at exit:', dist.is_initialized()))\n"
        "info = distributed.init_distributed(backend='gloo')\n"
        "total = torch.ones(1)\n"
        "dist.all_reduce(total)\n"
        "print('world', info.world_size, 'sum', float(total))\n"
    )
    env = {**_cli_env(), "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(distributed.find_free_port())}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["world 1 sum 1.0", "group at exit: False"]


def test_default_threads_split_cores_between_processes():
    cores = distributed.available_cpu_cores()
    assert distributed.default_threads_per_process(1) == cores
    assert distributed.default_threads_per_process(cores * 4) == 1
    assert distributed.default_threads_per_process(2) == max(1, cores // 2)


# ------------------------------------------------------------------ CLI

def test_dry_run_builds_multinode_torchrun_command_that_torchrun_parses():
    result = _run_cli("--nproc", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                      "127.0.0.2", "--master-port", "29611", "--threads-per-process", "3",
                      "--dry-run", "--", "--task", "resnet50", "--profile", "smoke")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert "OMP_NUM_THREADS=3" in line and "TRAINOPT_THREADS_PER_PROCESS=3" in line
    cmd = launch.build_launch_command(4, ["--task", "resnet50", "--profile", "smoke"],
                                      nnodes=2, node_rank=1, master_addr="127.0.0.2",
                                      master_port=29611)
    assert line.endswith(" ".join(cmd[1:]))  # same command as the API builds
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    from torch.distributed.run import get_args_parser
    parsed = get_args_parser().parse_args(cmd[3:])
    assert parsed.nproc_per_node == "4" and parsed.nnodes == "2" and parsed.node_rank == 1
    assert parsed.master_addr == "127.0.0.2" and parsed.master_port == 29611
    assert parsed.module and parsed.training_script == "trainopt_core.reproduction"
    assert parsed.training_script_args == ["--task", "resnet50", "--profile", "smoke"]


def test_deepspeed_command_is_accepted_by_deepspeed_runner(tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.launcher.runner import parse_args
    hostfile = tmp_path / "hostfile"
    cmd = launch.build_launch_command(2, ["--x", "1"], nnodes=2, node_rank=1,
                                      master_addr="127.0.0.2", use_deepspeed=True,
                                      hostfile=str(hostfile), module="launch_target")
    assert cmd[1:3] == ["-m", "deepspeed.launcher.runner"]
    parsed = parse_args(cmd[3:])
    assert (parsed.num_gpus, parsed.num_nodes, parsed.node_rank) == (2, 2, 1)
    assert parsed.no_ssh and parsed.no_local_rank and parsed.module
    assert parsed.master_addr == "127.0.0.2" and parsed.master_port == 29500
    assert parsed.user_script == "launch_target" and parsed.user_args == ["--x", "1"]
    with pytest.raises(ValueError, match="hostfile"):
        launch.build_launch_command(2, nnodes=2, master_addr="127.0.0.2", use_deepspeed=True)
    with pytest.raises(ValueError, match="master_addr"):
        launch.build_launch_command(2, nnodes=2)


def test_cli_runs_two_processes_and_exits_zero():
    result = _run_cli("--nproc", "2", "--threads-per-process", "1", "--module",
                      "launch_target")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _result_lines(result.stdout) == [
        f"launch_target rank={r} world_size=2 sum=1.0 threads=1 backend=gloo" for r in (0, 1)]


def test_cli_exits_nonzero_with_failing_ranks_error_in_bounded_time():
    start = time.monotonic()
    result = _run_cli("--nproc", "2", "--threads-per-process", "1", "--dist-timeout-s", "20",
                      "--module", "launch_target", "--", "--fail-rank", "1")
    assert time.monotonic() - start < 120  # not left hanging: the peer stopped (at the latest its 20 s collective timeout)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"{launch_target.FAILURE_TEXT} on rank 1" in output
    assert "rank      : 1" in output  # torchrun's root-cause summary names the rank


@pytest.mark.slow
def test_cli_deepspeed_launcher_starts_cpu_processes():
    pytest.importorskip("deepspeed")
    if __import__("torch").cuda.is_available():
        pytest.skip("checks the CPU path of the DeepSpeed launcher")
    result = _run_cli("--nproc", "2", "--deepspeed", "--threads-per-process", "1",
                      "--module", "launch_target")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _result_lines(result.stdout) == [
        f"launch_target rank={r} world_size=2 sum=1.0 threads=1 backend=gloo" for r in (0, 1)]


def test_a_peers_collective_error_is_not_taken_for_the_cause_of_a_rank_that_left_silently():
    """The race CI once lost: rank 1 leaves with os._exit, rank 0's all_reduce reports gloo's
    "Connection closed by peer" before the launcher sees rank 1's exit. The root is rank 1."""
    from trainopt_core.distributed.spawn import _NO_REPORT, _root_cause

    errors = {0: (10.0, "rank 0:\nRuntimeError: Connection closed by peer [127.0.0.1]:1234 ... the remote worker"),
              1: (10.5, f"rank 1 exited with code 3{_NO_REPORT}")}
    assert _root_cause(errors) == 1
    # a rank's own error, reported first, stays the root; and with no silent rank, the first report
    errors[0] = (10.0, "rank 0:\nValueError: bad input")
    assert _root_cause(errors) == 0
    assert _root_cause({0: (11.0, "rank 0:\nRuntimeError: Connection closed by peer"),
                        1: (10.0, "rank 1:\nValueError: bad input")}) == 1
