"""Data for the two tasks of paper §IV-A: where it comes from, and batches of whole tensors.

- `sources`: data directory, download switches, `data_policy`, the loud stand-in warning.
- `images`: CIFAR-10 (local copy or torchvision download) or the synthetic stand-in.
- `text`: the GPT-2 tokenizer and WikiText-2 (local, `datasets`) or the pydoc_data stand-in.
- `batches`: batched augmentation, normalization and batch iterators over whole tensors.

A stand-in is never presented as CIFAR-10 or WikiText-2: its source name says what it is.
"""
from .batches import CIFAR10_MEAN, CIFAR10_STD, augment_batch, image_batches, normalize_batch, text_batches
from .images import ImageDataset, load_image_dataset, make_standin_images, read_cifar10_batches
from .sources import (
    DATA_POLICIES, DataNotFoundError, StandinDataWarning, check_data_policy, default_cache_dir, default_data_dir,
    downloads_allowed, host_reachable, params_key, resolve_data_dir, warn_standin,
)
from .text import (
    GPT2_VOCAB_SIZE, TextCorpus, gpt2_tokenizer, load_text_corpus, load_text_splits, pack_sequences, tokenize_text,
)

__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "DATA_POLICIES", "DataNotFoundError", "GPT2_VOCAB_SIZE", "ImageDataset",
    "StandinDataWarning", "TextCorpus", "augment_batch", "check_data_policy", "default_cache_dir",
    "default_data_dir", "downloads_allowed", "gpt2_tokenizer", "host_reachable", "image_batches",
    "load_image_dataset", "load_text_corpus", "load_text_splits", "make_standin_images", "normalize_batch",
    "pack_sequences", "params_key", "read_cifar10_batches", "resolve_data_dir", "text_batches",
    "tokenize_text", "warn_standin",
]
