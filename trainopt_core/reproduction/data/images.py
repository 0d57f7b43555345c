"""Image data for the ResNet task: CIFAR-10, or an honest synthetic stand-in of its shape.

CIFAR-10: a local `cifar-10-batches-py/` (torchvision's format) -> torchvision's download
(only when allowed and the host answers) -> the stand-in, a deterministic, learnable
10-class 32x32 RGB set that is never called CIFAR-10.

Images are kept as uint8 tensors [N, 3, 32, 32] (N x 3 KiB: CIFAR-10 is 184 MB) and turned
into normalized float batches by `trainopt_core.reproduction.data.image_batches`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .sources import (
    DOWNLOAD_TIMEOUT_S,
    DataNotFoundError,
    check_data_policy,
    default_cache_dir,
    downloads_allowed,
    host_reachable,
    params_key,
    resolve_data_dir,
    warn_standin,
)

logger = logging.getLogger(__name__)

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
STANDIN_IMAGE_SOURCE = "stand-in: synthetic 10-class 32x32 images (NOT CIFAR-10)"
STANDIN_TRAIN_SIZE = 50_000
STANDIN_TEST_SIZE = 10_000
# bump when the generator changes, so cached stand-ins from older code are not reused
STANDIN_GENERATOR_VERSION = 3


@dataclass(frozen=True)
class ImageDataset:
    """uint8 images [N, 3, 32, 32] with int64 labels [N], class names, and the data source."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[str, ...]
    source: str

    @property
    def is_standin(self) -> bool:
        return self.source.startswith("stand-in")


# ------------------------------------------------------------------------------ CIFAR-10
def _unpickle(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")  # the batches were pickled by Python 2


def read_cifar10_batches(root: str | os.PathLike) -> ImageDataset:
    """Read `<root>/cifar-10-batches-py` (the official python pickles) without md5 checks.

    Same format and the same reading as torchvision's `CIFAR10`: each batch holds `data`
    (uint8 [n, 3072], channel-major 3x32x32) and `labels`; `batches.meta` holds
    `label_names`. torchvision's loader refuses any file whose md5 differs from the official
    release, which also rules out small test fixtures in the genuine format; this reader is
    what `load_image_dataset` uses after torchvision rejected a copy, labelled as unverified.
    """
    folder = Path(root) / CIFAR10_FOLDER

    def read(names):
        batches = [_unpickle(folder / name) for name in names]
        x = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches]).reshape(-1, 3, 32, 32)
        y = np.concatenate([np.asarray(b.get("labels", b.get("fine_labels")), dtype=np.int64) for b in batches])
        return torch.from_numpy(x), torch.from_numpy(y)

    train_x, train_y = read(CIFAR10_TRAIN_FILES)
    test_x, test_y = read([CIFAR10_TEST_FILE])
    classes = tuple(_unpickle(folder / CIFAR10_META_FILE)["label_names"])
    return ImageDataset(train_x, train_y, test_x, test_y, classes, f"CIFAR-10-format files in {folder}")


def _torchvision_cifar10(root: Path, download: bool) -> ImageDataset:
    """torchvision's CIFAR10 (md5-verified; downloads when `download`) as uint8 tensors."""
    from torchvision.datasets import CIFAR10

    train = CIFAR10(str(root), train=True, download=download)
    test = CIFAR10(str(root), train=False, download=False)

    def to_tensor(ds):  # torchvision keeps HWC numpy images; we keep CHW tensors
        return torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(), torch.tensor(ds.targets)

    return ImageDataset(*to_tensor(train), *to_tensor(test), tuple(train.classes), "")


@contextlib.contextmanager
def _socket_timeout(timeout_s: float):
    import socket

    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)  # torchvision's urllib download has no timeout argument
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _real_cifar10(root: Path, allow: bool) -> tuple[ImageDataset | None, list[str]]:
    notes = []
    folder = root / CIFAR10_FOLDER
    if folder.is_dir():
        try:
            data = _torchvision_cifar10(root, download=False)
            return _with_source(data, f"CIFAR-10 (local files: {folder}, md5-verified by torchvision)"), notes
        except RuntimeError as error:  # torchvision: "not found or corrupted" (md5 mismatch)
            notes.append(f"torchvision rejected {folder}: {error}")
        try:
            data = read_cifar10_batches(root)
        except (OSError, KeyError, pickle.UnpicklingError, ValueError) as error:
            notes.append(f"{folder} unreadable: {error}")
        else:
            logger.warning("%s: md5s differ from the official CIFAR-10 release; loaded anyway", folder)
            return _with_source(data, f"CIFAR-10 format (local files: {folder}; md5 NOT verified)"), notes
    else:
        notes.append(f"no {CIFAR10_FOLDER}/ in {root}")
    if not allow:
        return None, notes + ["downloads disabled"]
    from torchvision.datasets import CIFAR10

    host = urllib.parse.urlparse(CIFAR10.url).hostname
    if not host_reachable(host):
        return None, notes + [f"download impossible: {host} unreachable"]
    try:
        with _socket_timeout(DOWNLOAD_TIMEOUT_S):
            data = _torchvision_cifar10(root, download=True)
        return _with_source(data, f"CIFAR-10 (torchvision download to {folder})"), notes
    except Exception as error:
        return None, notes + [f"download failed: {error}"]


def _with_source(data: ImageDataset, source: str) -> ImageDataset:
    return ImageDataset(data.train_x, data.train_y, data.test_x, data.test_y, data.classes, source)


# ------------------------------------------------------------------------ the stand-in
def _blob_images(centers, sigmas, colors, axis):
    """Sum of isotropic Gaussian blobs on the square pixel grid `axis` x `axis`.

    centers [N, K, 2] as (x, y), sigmas [N, K], colors [N, K, 3] -> images [N, 3, S, S]. An
    isotropic Gaussian factorizes into exp(-dx²/2σ²)·exp(-dy²/2σ²), so only N·K·2S exponentials
    are evaluated and the sum over blobs is one einsum (a batched matmul).
    """
    inv_two_var = 1.0 / (2 * sigmas[..., None] ** 2)
    gauss_x = torch.exp(-(axis - centers[..., 0:1]) ** 2 * inv_two_var)  # [N, K, S]
    gauss_y = torch.exp(-(axis - centers[..., 1:2]) ** 2 * inv_two_var)
    return torch.einsum("nkc,nky,nkx->ncyx", colors, gauss_y, gauss_x)


def _standin_class_structure(generator: torch.Generator, num_classes: int, prototypes: int, blobs: int):
    """Per class and prototype, `blobs` colored Gaussian blobs in [-1, 1]^2 coordinates.

    Half of each prototype's blobs are the class's shared core (jittered per prototype), half
    are its own; classes therefore differ in layout and color, and every class is multi-modal.
    """
    core = blobs // 2
    shape = (num_classes, 1, core)
    core_centers = torch.rand(*shape, 2, generator=generator) * 1.4 - 0.7
    core_colors = torch.randn(*shape, 3, generator=generator)
    shape = (num_classes, prototypes, core)
    centers = [core_centers + 0.15 * torch.randn(*shape, 2, generator=generator)]
    colors = [core_colors + 0.3 * torch.randn(*shape, 3, generator=generator)]
    shape = (num_classes, prototypes, blobs - core)
    centers.append(torch.rand(*shape, 2, generator=generator) * 1.6 - 0.8)
    colors.append(torch.randn(*shape, 3, generator=generator))
    sigmas = torch.rand(num_classes, prototypes, blobs, generator=generator) * 0.25 + 0.12
    return torch.cat(centers, 2), sigmas, torch.cat(colors, 2)


# How hard the stand-in is (data, not code paths). Chosen with `benchmarks/probes/standin/` so that
# the quick ResNet baseline climbs to a plateau well above chance and short of 100 % within its
# 125 steps (docs/data.md, "The stand-ins and the quick profile's targets"). Mild nuisances keep
# every image a fresh view; the ceiling comes from a tail of ambiguous images: in
# `ambiguous_fraction` of them another class's pattern is as strong as the image's own or
# stronger (weight in `ambiguous_weight`). They are in effect mislabeled, like CIFAR-10's
# ambiguous tail: a model that names the dominant pattern, as one trained on the rest of the data
# does, gets them wrong, so the curve flattens below 100 %.
# Measured: the quick baseline (3 seeds, 500 test images) reaches 74 % after 10k samples and
# 83 % at 16k, where it flattens; a linear probe on 4x4-pooled pixels (2,000 images, 150
# full-batch Adam steps) reaches 91 %.
STANDIN_STYLE = dict(
    rotation=0.0,          # radians, full range
    scale=(1.0, 1.0),
    shift=0.05,            # full range in [-1, 1] image coordinates
    clutter_blobs=1,
    clutter_strength=0.2,
    occlusion=0.0,         # probability of an occluding patch
    pixel_noise=0.05,
    mix_max=0.3,           # weight of another class's pattern, uniform in [0, mix_max] ...
    ambiguous_fraction=0.15,  # ... except in this fraction of the images:
    ambiguous_weight=(1.0, 1.4),
)


def _place(centers, u, mirror_u):
    """`centers` [n, K, 2] through a random similarity transform (keeps round blobs round)
    and mirror; returns the placed centers and the scale."""
    style = STANDIN_STYLE
    angle = (u[:, 0:1] - 0.5) * style["rotation"]
    low, high = style["scale"]
    scale = low + (high - low) * u[:, 1:2]
    shift = (u[:, None, 2:4] - 0.5) * style["shift"]
    mirror = torch.where(mirror_u < 0.5, -1.0, 1.0)
    cx, cy = centers.unbind(-1)
    cx = cx * mirror
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.stack([cos * cx - sin * cy, sin * cx + cos * cy], -1) * scale[..., None] + shift, scale


def _render_standin(labels, structure, generator, image_size, chunk=4096):
    """Render one image per label: its class's blobs (a random prototype) seen through a random
    similarity transform and flip, mixed with a weaker pattern of another class, on a random
    smooth background with clutter blobs, color jitter, an occluding patch and pixel noise."""
    style = STANDIN_STYLE
    centers, sigmas, colors = structure
    num_classes, prototypes, blobs, _ = centers.shape
    axis = torch.linspace(-1, 1, image_size)
    out = torch.empty(len(labels), 3, image_size, image_size, dtype=torch.uint8)
    for start in range(0, len(labels), chunk):
        y = labels[start : start + chunk]
        n = len(y)
        u = torch.rand(n, 16, generator=generator)
        proto = torch.randint(0, prototypes, (n,), generator=generator)
        placed, scale = _place(centers[y, proto], u[:, 0:4], u[:, 4:5])
        signal = _blob_images(placed, sigmas[y, proto] * scale, colors[y, proto], axis)
        # the other class's pattern, independently placed, with weight in [0, mix_max]
        other = (y + torch.randint(1, num_classes, (n,), generator=generator)) % num_classes
        other_proto = torch.randint(0, prototypes, (n,), generator=generator)
        placed, other_scale = _place(centers[other, other_proto], u[:, 12:16], u[:, 11:12])
        mix = style["mix_max"] * torch.rand(n, 1, 1, 1, generator=generator)
        # ambiguous images: the other class's pattern as strong as the own, or stronger
        low, high = style["ambiguous_weight"]
        ambiguous = torch.rand(n, 1, 1, 1, generator=generator) < style["ambiguous_fraction"]
        mix = torch.where(ambiguous, low + (high - low) * torch.rand(n, 1, 1, 1, generator=generator), mix)
        signal = signal + mix * _blob_images(placed, sigmas[other, other_proto] * other_scale,
                                             colors[other, other_proto], axis)
        # clutter: blobs of random color and place, unrelated to the class
        m = style["clutter_blobs"]
        clutter = _blob_images(torch.rand(n, m, 2, generator=generator) * 2 - 1,
                               0.1 + 0.2 * torch.rand(n, m, generator=generator),
                               style["clutter_strength"] * torch.randn(n, m, 3, generator=generator), axis)
        # background: a random color plus a random linear gradient
        gradient = torch.randn(n, 3, 2, 1, 1, generator=generator) * 0.3
        background = (torch.randn(n, 3, 1, 1, generator=generator) * 0.4
                      + gradient[:, :, 0] * axis[None, :] + gradient[:, :, 1] * axis[:, None])
        per_image = u[:, :, None, None, None]  # [n, 16, 1, 1, 1]: broadcast over channels, pixels
        image = background + clutter + signal * (0.6 + 0.6 * per_image[:, 5])
        # color jitter: contrast, per-channel gain, brightness
        gains = 0.75 + 0.5 * torch.rand(n, 3, 1, 1, generator=generator)
        image = image * (0.6 + 0.8 * per_image[:, 6]) * gains + 0.8 * (per_image[:, 7] - 0.5)
        # occlusion: a random gray patch of 8-16 px in a fraction of the images
        side = (8 + 9 * u[:, 8]).long()
        top = (u[:, 9] * (image_size - side)).long()
        left = (u[:, 10] * (image_size - side)).long()
        pix = torch.arange(image_size)
        inside_y = (pix[None] >= top[:, None]) & (pix[None] < (top + side)[:, None])
        inside_x = (pix[None] >= left[:, None]) & (pix[None] < (left + side)[:, None])
        occluded_images = torch.rand(n, generator=generator) < style["occlusion"]
        occluded = (inside_y[:, :, None] & inside_x[:, None, :] & occluded_images[:, None, None])[:, None]
        patch = torch.randn(n, 1, 1, 1, generator=generator) * 0.5
        image = torch.where(occluded, patch, image)
        image = image + style["pixel_noise"] * torch.randn(image.shape, generator=generator)
        out[start : start + n] = (127.5 + 64.0 * image).clamp_(0, 255).round_().to(torch.uint8)
    return out


def make_standin_images(
    train_size: int = STANDIN_TRAIN_SIZE,
    test_size: int = STANDIN_TEST_SIZE,
    seed: int = 0,
    *,
    num_classes: int = 10,
    prototypes_per_class: int = 4,
    blobs_per_prototype: int = 6,
    image_size: int = 32,
) -> ImageDataset:
    """The synthetic stand-in: a seeded, learnable `num_classes`-way uint8 image set.

    Each class is a few prototypes made of colored Gaussian blobs; every image shows one of
    them rotated (+-26 deg), scaled (0.75-1.3x), shifted and maybe mirrored, over a random
    background with clutter blobs, then color-jittered, half-occluded and noised. A small CNN
    needs several epochs to learn it. Labels are balanced (exactly, when the size divides by
    `num_classes`). The test set depends on `seed` only, not on `train_size`.
    """
    for arg, value in (("train_size", train_size), ("test_size", test_size), ("num_classes", num_classes),
                       ("prototypes_per_class", prototypes_per_class), ("image_size", image_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg}={value!r} is invalid: allowed an integer >= 1")
    if not isinstance(blobs_per_prototype, int) or blobs_per_prototype < 2:
        raise ValueError(f"blobs_per_prototype={blobs_per_prototype!r} is invalid: allowed an integer >= 2")
    structure = _standin_class_structure(torch.Generator().manual_seed(seed), num_classes,
                                         prototypes_per_class, blobs_per_prototype)
    parts = []
    for stream, size in ((1, train_size), (2, test_size)):  # independent streams per split
        generator = torch.Generator().manual_seed(seed * 1000 + stream)
        labels = torch.arange(size) % num_classes
        labels = labels[torch.randperm(size, generator=generator)]
        parts += [_render_standin(labels, structure, generator, image_size), labels]
    classes = tuple(f"synthetic_{i}" for i in range(num_classes))
    return ImageDataset(*parts, classes=classes, source=STANDIN_IMAGE_SOURCE)


def _cached_standin(cache_dir: Path, **params) -> ImageDataset:
    """`make_standin_images(**params)`, cached in `<cache_dir>/standin-images-<hash>.pt`."""
    key = params_key({"version": STANDIN_GENERATOR_VERSION, "style": STANDIN_STYLE, **params})
    path = cache_dir / f"standin-images-{key}.pt"
    if path.is_file():
        with contextlib.suppress(Exception):  # a damaged cache file is just regenerated
            return ImageDataset(**torch.load(path))
    data = make_standin_images(**params)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        torch.save(dict(vars(data)), partial)
        os.replace(partial, path)
    return data


def load_image_dataset(
    name: str = "cifar10",
    data_dir: str | os.PathLike | None = None,
    allow_download: bool | None = None,
    data_policy: str = "auto",
    *,
    standin_train_size: int = STANDIN_TRAIN_SIZE,
    standin_test_size: int = STANDIN_TEST_SIZE,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> ImageDataset:
    """CIFAR-10 from `data_dir` (or a torchvision download when allowed), else the stand-in.

    `data_policy`: "auto" = CIFAR-10 if found, else the synthetic stand-in with a
    `StandinDataWarning`; "real" = CIFAR-10 or `DataNotFoundError`; "standin" = always the
    stand-in (`standin_*_size` images, from `seed`; cached under `cache_dir`, default
    `<data_dir>/cache`).
    """
    if name != "cifar10":
        raise ValueError(f"name={name!r} is invalid: allowed 'cifar10'")
    check_data_policy(data_policy)
    root = resolve_data_dir(data_dir)
    allow = downloads_allowed(allow_download)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(data_dir)
    standin = dict(train_size=standin_train_size, test_size=standin_test_size, seed=seed)
    if data_policy == "standin":
        warn_standin(f"data_policy='standin': using {STANDIN_IMAGE_SOURCE}")
        return _cached_standin(cache, **standin)
    data, notes = _real_cifar10(root, allow)
    if data is not None:
        if notes:
            logger.warning("CIFAR-10: %s", "; ".join(notes))
        return data
    why = "; ".join(notes)
    if data_policy == "real":
        raise DataNotFoundError(
            f"CIFAR-10 is required (data_policy='real') but was not found: {why}. Extract "
            f"cifar-10-python.tar.gz so that {root / CIFAR10_FOLDER} holds data_batch_1..5, test_batch and "
            f"batches.meta, set TRAINOPT_DATA_DIR to the folder holding {CIFAR10_FOLDER}/, or allow the "
            f"download (allow_download=True or TRAINOPT_ALLOW_DOWNLOAD=1) on a machine with network access.")
    warn_standin(f"CIFAR-10 not available ({why}); using {STANDIN_IMAGE_SOURCE}. Results are NOT CIFAR-10 "
                 f"results. Put {CIFAR10_FOLDER}/ in {root} to use the real data.")
    return _cached_standin(cache, **standin)
