import os
import sys

import pytest
import torch

# Tests share 2 cores with each other's subprocesses; keep intra-op threads modest.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
