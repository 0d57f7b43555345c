"""The random generators a training loop draws from, saved and restored together: torch's CPU
generator, every CUDA device's (where CUDA is initialized), Python's `random` and NumPy's global
generator (where NumPy is installed). With the model, optimizer and engine state and the loop's
data position, this is what resuming needs to continue bit-identically (dropout masks, data
shuffling, augmentation)."""
from __future__ import annotations

import random

import torch


def rng_state() -> dict:
    """Every generator's state, as one dict `torch.save` can write."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "cuda": None, "numpy": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    name, keys, pos, has_gauss, cached = numpy.random.get_state()
    state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    return state


def set_rng_state(state: dict) -> None:
    """Restores `rng_state()`'s output (a state saved without CUDA or NumPy leaves those as they are)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state.get("numpy") is not None:
        import numpy
        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
