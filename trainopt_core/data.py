"""Data for the two tasks of paper §IV-A: where it comes from, and batches of whole tensors.

Resolution order for every data set (SPEC §5): a local copy -> a download (only when allowed,
failing fast) -> an honest stand-in with a loud warning. The loaders live in
`trainopt_core.data_text` (GPT-2 tokenizer, WikiText-2 or the pydoc_data stand-in) and
`trainopt_core.data_images` (CIFAR-10 or the synthetic stand-in); they are re-exported here.

This module holds what both share: the data directory and download switches, the
`data_policy` ("auto" | "real" | "standin"), the stand-in warning, and batched augmentation,
normalization and batch iterators that work on whole tensors (CPU or GPU; no PIL, no
DataLoader workers), as fast CIFAR training scripts do.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import warnings
from pathlib import Path
from typing import Iterator

import torch

logger = logging.getLogger(__name__)

DATA_POLICIES = ("auto", "real", "standin")
DATA_DIR_ENV = "TRAINOPT_DATA_DIR"
ALLOW_DOWNLOAD_ENV = "TRAINOPT_ALLOW_DOWNLOAD"
# A download is attempted only after the host answers a TCP connect within this bound, so a
# machine without network fails in well under a second instead of waiting on library retries.
DOWNLOAD_PROBE_TIMEOUT_S = 3.0
DOWNLOAD_TIMEOUT_S = 30.0

# CIFAR-10 channel statistics from the methodology (§ data preprocessing). They are applied to
# the synthetic stand-in as well, so both data sources go through the identical pipeline.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CROP_PADDING_PX = 4


class StandinDataWarning(UserWarning):
    """A stand-in data set is used instead of the real one (CIFAR-10 / WikiText-2)."""


class DataNotFoundError(FileNotFoundError):
    """The real data set was required (data_policy="real") but no copy could be found."""


# ---------------------------------------------------------------- where data lives, policy
def default_data_dir() -> Path:
    """`$TRAINOPT_DATA_DIR`, else `<repository>/data` when run from a checkout, else `./data`."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").is_file():
        return repo / "data"
    return Path.cwd() / "data"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """`data_dir` as a Path, or `default_data_dir()` when None."""
    return default_data_dir() if data_dir is None else Path(data_dir).expanduser()


def default_cache_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where token tensors and generated stand-ins are cached: `<data_dir>/cache`."""
    return resolve_data_dir(data_dir) / "cache"


def downloads_allowed(allow_download: bool | None) -> bool:
    """`allow_download` if given, else True only when `$TRAINOPT_ALLOW_DOWNLOAD=1`."""
    if allow_download is None:
        return os.environ.get(ALLOW_DOWNLOAD_ENV, "0").strip() == "1"
    if not isinstance(allow_download, bool):
        raise ValueError(f"allow_download={allow_download!r} is invalid: allowed True, False or None")
    return allow_download


def check_data_policy(data_policy: str) -> str:
    """Validate `data_policy`: "auto" (real if found, else stand-in), "real" or "standin"."""
    if data_policy not in DATA_POLICIES:
        raise ValueError(f"data_policy={data_policy!r} is invalid: allowed one of {DATA_POLICIES}")
    return data_policy


def host_reachable(host: str, port: int = 443, timeout_s: float = DOWNLOAD_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to host:port opens within `timeout_s` (DNS included)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def warn_standin(message: str) -> None:
    """Emit the loud stand-in notice as a `StandinDataWarning` and a logging warning."""
    banner = f"STAND-IN DATA: {message}"
    logger.warning(banner)
    warnings.warn(banner, StandinDataWarning, stacklevel=3)


def params_key(params: dict) -> str:
    """A short stable hash of JSON-able parameters, used to name cache files."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ------------------------------------------------------------- augmentation, normalization
def normalize_batch(
    x: torch.Tensor, mean: tuple = CIFAR10_MEAN, std: tuple = CIFAR10_STD
) -> torch.Tensor:
    """Images [N, 3, H, W] (uint8 0..255 or float 0..1) -> float32 (x - mean) / std per channel.

    The methodology's CIFAR-10 statistics are the default for both CIFAR-10 and the synthetic
    stand-in (whose pixel statistics differ), so the two run through the same pipeline.
    """
    if x.ndim != 4 or x.shape[1] != len(mean):
        raise ValueError(f"x has shape {tuple(x.shape)}: expected [N, {len(mean)}, H, W]")
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t


def augment_batch(
    x: torch.Tensor, generator: torch.Generator | None = None, padding_px: int = CROP_PADDING_PX
) -> torch.Tensor:
    """Random crop after zero padding of `padding_px`, and random horizontal flip, per image.

    The standard CIFAR augmentation (torchvision `RandomCrop(32, padding=4)` +
    `RandomHorizontalFlip()`), done for the whole batch [N, C, H, W] with one gather: every
    image gets its own crop offset in [0, 2·padding] and its own coin flip. Shape and dtype
    are kept. Random numbers come from `generator` (on its own device), so runs replay exactly.
    """
    if x.ndim != 4:
        raise ValueError(f"x has shape {tuple(x.shape)}: expected [N, C, H, W]")
    if not isinstance(padding_px, int) or padding_px < 0:
        raise ValueError(f"padding_px={padding_px!r} is invalid: allowed an integer >= 0")
    n, c, h, w = x.shape
    gen_device = generator.device if generator is not None else torch.device("cpu")
    offset_y = torch.randint(0, 2 * padding_px + 1, (n,), generator=generator, device=gen_device)
    offset_x = torch.randint(0, 2 * padding_px + 1, (n,), generator=generator, device=gen_device)
    flip = torch.rand(n, generator=generator, device=gen_device) < 0.5
    offset_y, offset_x, flip = (t.to(x.device) for t in (offset_y, offset_x, flip))

    padded = torch.nn.functional.pad(x, (padding_px,) * 4) if padding_px else x
    ar_h = torch.arange(h, device=x.device)
    ar_w = torch.arange(w, device=x.device)
    rows = offset_y[:, None] + ar_h  # [N, H]
    # a flipped image reads its crop window right to left
    cols = offset_x[:, None] + torch.where(flip[:, None], w - 1 - ar_w, ar_w)  # [N, W]
    batch_idx = torch.arange(n, device=x.device)[:, None, None, None]
    chan_idx = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch_idx, chan_idx, rows[:, None, :, None], cols[:, None, None, :]]


# ------------------------------------------------------------------------- batch iterators
def _batch_order(n: int, shuffle: bool, generator: torch.Generator | None) -> torch.Tensor:
    if shuffle:
        gen_device = generator.device if generator is not None else torch.device("cpu")
        return torch.randperm(n, generator=generator, device=gen_device).cpu()
    return torch.arange(n)


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: allowed an integer >= 1")


def image_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    *,
    shuffle: bool = True,
    augment: bool = False,
    generator: torch.Generator | None = None,
    drop_last: bool = False,
    normalize: bool = True,
    device: torch.device | str | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (images, labels) batches from whole tensors; one pass = one epoch.

    Images are moved to `device` as uint8 (4x less traffic than float), augmented there with
    `augment_batch` when `augment`, then converted by `normalize_batch` when `normalize`.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} images but y has {y.shape[0]} labels")
    _check_batch_size(batch_size)
    order = _batch_order(x.shape[0], shuffle, generator)
    stop = (len(order) // batch_size) * batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        idx = order[start : start + batch_size]
        xb, yb = x[idx], y[idx]
        if device is not None:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        if augment:
            xb = augment_batch(xb, generator)
        if normalize:
            xb = normalize_batch(xb)
        yield xb, yb


def text_batches(
    sequences: torch.Tensor,
    batch_size: int,
    *,
    shuffle: bool = True,
    generator: torch.Generator | None = None,
    drop_last: bool = False,
    device: torch.device | str | None = None,
) -> Iterator[torch.Tensor]:
    """Yield LongTensor[B, seq_len] batches of packed sequences (see `pack_sequences`).

    Inputs and next-token targets are the same tensor: a causal LM shifts them itself
    (e.g. `GPT2LMHeadModel(input_ids=b, labels=b)`).
    """
    if sequences.ndim != 2:
        raise ValueError(f"sequences has shape {tuple(sequences.shape)}: expected [num_seq, seq_len]")
    _check_batch_size(batch_size)
    order = _batch_order(sequences.shape[0], shuffle, generator)
    stop = (len(order) // batch_size) * batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        batch = sequences[order[start : start + batch_size]]
        yield batch if device is None else batch.to(device, non_blocking=True)


# ------------------------------------------------- the loaders, re-exported (imported lazily)
_TEXT_API = ("GPT2_VOCAB_SIZE", "TextCorpus", "gpt2_tokenizer", "load_text_corpus", "load_text_splits",
             "pack_sequences", "tokenize_text")
_IMAGE_API = ("ImageDataset", "load_image_dataset", "make_standin_images", "read_cifar10_batches")


def __getattr__(name):
    # data_text / data_images import this module; importing them lazily avoids the cycle
    if name in _TEXT_API:
        from . import data_text

        return getattr(data_text, name)
    if name in _IMAGE_API:
        from . import data_images

        return getattr(data_images, name)
    raise AttributeError(f"module 'trainopt_core.data' has no attribute {name!r}")


__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "DATA_POLICIES", "DataNotFoundError", "StandinDataWarning",
    "augment_batch", "check_data_policy", "default_cache_dir", "default_data_dir",
    "downloads_allowed", "host_reachable", "image_batches", "normalize_batch", "params_key",
    "resolve_data_dir", "text_batches", "warn_standin", *_TEXT_API, *_IMAGE_API,
]
