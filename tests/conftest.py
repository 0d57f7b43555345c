import os
import sys

import pytest
import torch

# One intra-op thread: tests start subprocesses (ranks, notebooks) that share the 2 cores.
torch.set_num_threads(1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
