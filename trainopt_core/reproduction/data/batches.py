"""Batches of whole tensors: augmentation, normalization and batch iterators (CPU or GPU; no
PIL, no DataLoader workers), as fast CIFAR training scripts do."""
from __future__ import annotations

from typing import Iterator

import torch

# CIFAR-10 channel statistics from the methodology (§ data preprocessing). They are applied to
# the synthetic stand-in as well, so both data sources go through the identical pipeline.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CROP_PADDING_PX = 4


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
