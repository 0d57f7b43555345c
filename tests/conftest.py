import os
import subprocess
import sys

import pytest
import torch

# One intra-op thread: tests start subprocesses (ranks, notebooks) that share the 2 cores.
torch.set_num_threads(1)

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
