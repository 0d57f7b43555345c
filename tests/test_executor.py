"""The reproduction's runs as Ray tasks (`reproduction.executor`): on a local Ray cluster of this
machine a section's smoke grid gives the records a sequential run gives, in every deterministic
field; a worker killed mid-run (SIGKILL, from outside) is retried by Ray and the run resumes from
its in-run checkpoint; without Ray the error says how to install it."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import load_script
from trainopt_core.reproduction import executor
from trainopt_core.reproduction.records import record_differences
from trainopt_core.reproduction.runner import run

STANDIN = dict(profile="smoke", data_policy="standin")


def test_an_unknown_executor_is_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"executor='dask' is invalid: allowed one of \('local', 'ray'\)"):
        executor.check_executor("dask")


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ModuleNotFoundError
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'trainopt\[cluster\]'"):
        executor.ray_module()
    from trainopt_core.reporting.notebook import run_grid

    with pytest.raises(ModuleNotFoundError, match="executor='ray' needs Ray"):
        run_grid(["cifar10"], ["baseline"], seeds=1, profile="smoke", out_dir="unused", executor="ray")


def test_a_run_holds_one_gpu_where_the_cluster_has_gpus_else_a_share_of_a_nodes_cores():
    assert executor.resources_per_run(8, 32) == (1, 1)
    assert executor.resources_per_run(1, 2, cpus_per_run=4) == (1, 1)
    assert executor.resources_per_run(0, 2) == (2, 0)
    assert executor.resources_per_run(0, 16) == (8, 0)
    assert executor.resources_per_run(0.5, 16, cpus_per_run=3) == (3, 0)  # a fraction of a GPU is not one
    with pytest.raises(ValueError, match="cpus_per_run=0 is invalid"):
        executor.resources_per_run(0, 2, cpus_per_run=0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _loopback_address(kind: str):
    """A HOST:PORT on 127.0.0.1 that no Ray cluster answers: "closed" (nothing listens: refused at
    once), "silent" (a listener whose kernel accepts every connection and that never sends a byte:
    what a proxy or a firewall in front of a dead head looks like), "unanswering" (a listener whose
    accept queue is full: the SYN is dropped and the connection never opens, as to a host that is
    gone). Tests reach loopback only, never another address."""
    if kind == "closed":
        yield f"127.0.0.1:{_free_port()}"
        return
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0 if kind == "unanswering" else 64)
        port = listener.getsockname()[1]
        if kind == "unanswering":  # fill the queue of one: later connections wait for ever
            filler = stack.enter_context(socket.socket())
            filler.connect(("127.0.0.1", port))
        yield f"127.0.0.1:{port}"


@pytest.mark.parametrize("kind", ["closed", "silent", "unanswering"])
def test_an_unreachable_ray_address_is_refused_naming_the_flag_within_30_s(kind):
    if kind == "silent":
        pytest.importorskip("ray")  # the TCP connection opens: only Ray's GCS client finds no cluster there
    with _loopback_address(kind) as address:
        started = time.perf_counter()
        with pytest.raises(ValueError) as refused:
            executor.check_ray_address(address, "--ray-address")
        assert time.perf_counter() - started < 30
    assert str(refused.value).startswith(f"--ray-address={address!r} is invalid: allowed 'auto'")
    assert "HOST:PORT of a running cluster's head" in str(refused.value)
    if kind == "silent":
        assert "a connection opened, but no Ray GCS answered" in str(refused.value)


@pytest.mark.parametrize("address", ["nonsense", "host:99999", "http://host:6379", "host:6379/path"])
def test_a_malformed_ray_address_is_refused_without_trying_it(address):
    with pytest.raises(ValueError, match=f"ray_address='{address}' is invalid: allowed 'auto'"):
        executor.check_ray_address(address)


@pytest.mark.parametrize("address", [None, "auto"])
def test_the_environments_ray_address_is_checked_and_named_where_ray_init_would_read_it(address, monkeypatch):
    unanswered = f"127.0.0.1:{_free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", unanswered)
    with pytest.raises(ValueError, match=rf"RAY_ADDRESS \(the environment's.*\)='{unanswered}' is invalid"):
        executor.check_ray_address(address)


def test_run_on_ray_checks_the_address_before_ray_init(monkeypatch, tmp_path):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init() was called"))
    address = f"127.0.0.1:{_free_port()}"
    with pytest.raises(ValueError, match=f"ray_address='{address}' is invalid"):
        executor.run_on_ray([("cifar10", "baseline", 0)], address=address, out_dir=tmp_path, **STANDIN)


def test_the_kill_helper_finds_its_own_clusters_workers_only():
    """Process trees like Ray's (a raylet started with its socket, a worker titled ray::_run_one
    under it), for two clusters and a stray process: only the named raylet's worker is listed."""
    worker = "import time; time.sleep(60)"
    raylet = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
              "'ray::_run_one']); print(child.pid, flush=True); time.sleep(60)")
    started = []
    try:
        for cluster in ("ours", "theirs"):
            parent = subprocess.Popen([sys.executable, "-c", raylet, worker,
                                       f"--raylet_socket_name=/tmp/ray/{cluster}/sockets/raylet"],
                                      stdout=subprocess.PIPE, text=True)
            started += [parent.pid, int(parent.stdout.readline())]
        stray = subprocess.Popen([sys.executable, "-c", worker, "ray::_run_one"])
        started.append(stray.pid)
        find = load_script("scripts/ray_kill_cost.py").worker_pids
        assert find({"/tmp/ray/ours/sockets/raylet"}) == [started[1]]
        assert sorted(find({"/tmp/ray/ours/sockets/raylet", "/tmp/ray/theirs/sockets/raylet"})) == [started[1],
                                                                                                   started[3]]
    finally:
        for pid in reversed(started):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_a_smoke_grid_on_ray_gives_the_sequential_records(ray_cluster, tmp_path):
    grid = [("cifar10", "baseline", 0), ("cifar10", "auto", 0), ("cifar10", "auto", 1), ("wikitext2", "optimized", 0)]
    lines = []
    on_ray = executor.run_on_ray(grid, out_dir=tmp_path / "ray", cpus_per_run=1, report=lines.append, **STANDIN)
    local = [run(task, config, seed=seed, out_dir=tmp_path / "local", progress=False, **STANDIN)
             for task, config, seed in grid]
    for (task, config, seed), remote, here in zip(grid, on_ray, local):
        assert (remote["task"], remote["config_name"], remote["seed"]) == (task, config, seed)
        assert not record_differences(here, remote), (task, config, seed)
    # progress: queued, each run done with where and how long, counts and the time left
    assert lines[0].startswith("ray: 4 runs, 1 CPU core(s) each") and "1 auto run(s) wait for their task's plan" in lines[0]
    done = [line for line in lines if " done on " in line]
    assert len(done) == 4 and "4/4 done, 0 running, 0 queued" in done[-1] and "s left" in done[0]
    # which worker runs what, as each run starts (told by the worker), before its done line
    for task, config, seed in grid:
        run_name = f"ray: {task} {config} seed {seed} "
        (start,) = [i for i, line in enumerate(lines) if line.startswith(run_name + "started on ")]
        assert start < next(i for i, line in enumerate(lines) if line.startswith(run_name + "done on "))
    assert "1 running" in next(line for line in lines if " started on " in line)
    # the second auto run waited for the first, which planned the task: one plan, reused
    assert done.index(next(d for d in done if "auto seed 1" in d)) > done.index(next(d for d in done if "auto seed 0" in d))
    assert len(list((tmp_path / "plans").glob("*.json"))) == 1


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_retried_and_resumes_from_its_checkpoint(ray_cluster, tmp_path, request):
    # the optimized rung without checkpointing, a checkpoint after every optimizer step
    item, options = ("cifar10", "-checkpointing", 0), dict(checkpoint_every_steps=1)
    reference = run(*item[:2], seed=0, out_dir=tmp_path / "reference", progress=False, **options, **STANDIN)
    out = tmp_path / "ray"
    # a process titled like a worker, of no cluster: the kill leaves it alone
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "ray::_run_one"])
    request.addfinalizer(stray.kill)
    watcher, killed = load_script("scripts/ray_kill_cost.py").kill_after_the_first_checkpoint(out)
    started = time.perf_counter()
    lines = []
    (record,) = executor.run_on_ray([item], out_dir=out, cpus_per_run=1, options=options, report=lines.append,
                                    **STANDIN)
    seconds = time.perf_counter() - started
    watcher.join(timeout=5)
    assert killed, "no worker was killed"
    assert stray.poll() is None and stray.pid not in killed, "a process of no cluster was killed"
    assert any("resumed from its in-run checkpoint after optimizer step" in note for note in record["notes"]), \
        record["notes"]
    assert not record_differences(reference, record)
    # the terminal showed the retry as it started, on which worker
    assert any(line.startswith("ray: cifar10 -checkpointing seed 0 started again (Ray's retry 1: its worker was lost) on ")
               for line in lines), lines
    print(f"\n[test_executor] killed pid {killed[0]}; the run with its retry took {seconds:.1f} s")
