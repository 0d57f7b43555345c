import contextlib
import ipaddress
import json
import os
import socket
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# One intra-op thread: tests start subprocesses (ranks, notebooks) that share the 2 cores.
torch.set_num_threads(1)
# Under pytest-xdist (run_tests.sh starts one worker per core) the processes a test starts compute
# on one thread too: two OpenMP pools spinning on one core slow both many times over.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def load_script(relative_path: str):
    """A script of the repository (``scripts/...``, ``benchmarks/...``) imported as a module."""
    import importlib.util

    path = os.path.join(REPO, relative_path)
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_loopback_address(address) -> bool:
    """Whether a socket address is loopback (127.0.0.0/8, ::1, 'localhost') or no network address
    at all (a Unix socket's path)."""
    if not isinstance(address, tuple):
        return True  # AF_UNIX: a path
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name: its look-up would leave the machine
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


@contextlib.contextmanager
def loopback_only():
    """Within it, a connection of this process to an address other than loopback is refused
    (ConnectionRefusedError, before any packet) and listed in the list it yields."""
    refused, connect, connect_ex = [], socket.socket.connect, socket.socket.connect_ex

    def check(address):
        if not is_loopback_address(address):
            refused.append(tuple(address[:2]))
            raise ConnectionRefusedError(f"tests reach loopback only (127.0.0.0/8, ::1): refused {address!r}")

    def guarded_connect(sock, address):
        check(address)
        return connect(sock, address)

    def guarded_connect_ex(sock, address):
        try:
            check(address)
        except ConnectionRefusedError:
            return 111  # ECONNREFUSED
        return connect_ex(sock, address)

    socket.socket.connect, socket.socket.connect_ex = guarded_connect, guarded_connect_ex
    try:
        yield refused
    finally:
        socket.socket.connect, socket.socket.connect_ex = connect, connect_ex


@pytest.fixture(autouse=True)
def _loopback_only():
    """Every test: its process connects to loopback only; any other address fails the test."""
    with loopback_only() as refused:
        yield
    assert not refused, f"the test tried to connect to addresses other than loopback: {refused}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _standin_notices_unseen():
    """Each test starts as a fresh process would: no stand-in notice shown yet (they are shown
    once per process)."""
    from trainopt_core.reproduction.data import sources

    sources._ANNOUNCED.clear()


@pytest.fixture
def tf32_flags():
    """Sets the matmul / cuDNN-convolution TF32 flags for a test and restores them."""
    from trainopt_core.measure import flops

    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    new_api = hasattr(matmul, "fp32_precision") and conv is not None
    saved = (matmul.fp32_precision, conv.fp32_precision) if new_api else (
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    def set_flags(*, matmul_tf32: bool, conv_tf32: bool):
        if new_api:
            matmul.fp32_precision = "tf32" if matmul_tf32 else "ieee"
            conv.fp32_precision = "tf32" if conv_tf32 else "ieee"
        else:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, conv_tf32

    yield set_flags
    if new_api:
        matmul.fp32_precision, conv.fp32_precision = saved
    else:
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    flops._cached_peak.cache_clear()


@pytest.fixture
def run_deepspeed_script():
    """Runs a Python script (with arguments) in a fresh interpreter on DeepSpeed's CPU accelerator
    and returns its stdout, after asserting that it exited 0; skips without DeepSpeed."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}

    def run(script: str, *args) -> str:
        result = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                                timeout=300, env=env, cwd=REPO, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout
    return run


# ----------------------------------------------------------------------------- runs several tests read
SMOKE_CONFIGS = ("baseline", "optimized", "auto")


@pytest.fixture(scope="session")
def smoke_reports(tmp_path_factory):
    """A reports folder whose smoke/ holds seed 0 of baseline, optimized and `auto` for both tasks
    on the stand-in data, with `auto`'s plans: trained (and planned) once per test session. The
    notebook, browser and runner tests read these same runs, each from a copy of its own
    (`copy_smoke_runs`); the notebooks reuse them as a resumed reproduction does."""
    from trainopt_core.reproduction import runner

    root = tmp_path_factory.mktemp("smoke_reports")
    for task in ("cifar10", "wikitext2"):
        for config in SMOKE_CONFIGS:
            runner.run(task, config, profile="smoke", seed=0, out_dir=root / "smoke" / "runs", data_policy="standin",
                       progress=False)
    return root


def copy_smoke_runs(smoke_reports, reports_dir, tasks=("cifar10", "wikitext2"), configs=SMOKE_CONFIGS) -> Path:
    """`smoke_reports`' run records of `tasks` x `configs`, with the tasks' plans, copied into
    `reports_dir`/smoke/; returns its runs folder. A copy, so that a test may change its records
    without touching another test's."""
    source, target = Path(smoke_reports) / "smoke", Path(reports_dir) / "smoke"
    (target / "runs" / "curves").mkdir(parents=True, exist_ok=True)
    for task in tasks:
        for record in (source / "runs").glob(f"{task}__*.json"):
            if json.loads(record.read_text())["config_name"] in configs:
                shutil.copy(record, target / "runs" / record.name)
        for curve in (source / "runs" / "curves").glob(f"{task}__*.json"):  # the checkpointed runs' curves
            shutil.copy(curve, target / "runs" / "curves" / curve.name)
        plan = source / "plans" / f"plan__{task}.json"
        if plan.is_file():
            (target / "plans").mkdir(exist_ok=True)
            shutil.copy(plan, target / "plans" / plan.name)
    return target / "runs"


# ----------------------------------------------------------------------------- order
LONGEST_FIRST = ("test_notebooks.py", "test_run_resume.py", "test_plan_distributed.py")


def pytest_collection_modifyitems(config, items):
    """The files that take longest start first (the notebooks' executions, the killed and resumed
    runs): with one worker per core (run_tests.sh) the other files fill the other core meanwhile,
    instead of one core running them alone at the end. Within a file the order stays."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
