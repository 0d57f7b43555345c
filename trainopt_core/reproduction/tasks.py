"""The two tasks of paper §IV-A as (model, data, loss, evaluation) bundles for the runner.

Items, the unit of throughput and of FLOPs per item: images for CIFAR-10, predicted tokens
(T - 1 per sequence of T) for GPT-2. Each task's `training_flops_per_item` counts the same
items, so model FLOPs utilization = FLOPs per item × items/s ÷ peak FLOP/s.

Baseline and optimized runs of a task use the same model code (same attention
implementation); only the trainopt components differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from . import data, models
from .profiles import TaskProfile


@dataclass
class Task:
    """A task for the runner. An *item* is what throughput counts: an image, or a predicted token.

    `training_flops_per_item` is the model's training FLOPs (forward + backward) per item, the
    numerator of model FLOPs utilization (MFU): it never includes the forward pass that
    activation checkpointing recomputes. `loss` returns the number of items its mean is over,
    which is both the weight of eq. 4 and what throughput counts, so FLOPs per item × items/s
    is the model's FLOP/s. `flops_workload` ("convolution" | "matmul") is the operation that
    dominates those FLOPs: `measure.peak_flops(..., workload=...)` picks the TF32 peak by it.
    """

    model: torch.nn.Module
    model_name: str
    data_source: str
    num_train_samples: int            # distinct training samples at hand
    training_flops_per_item: float
    train_batches: Callable[..., Iterator]
    loss: Callable                    # (model, x, y) -> (mean loss, number of items it averages)
    evaluate: Callable                # (model, engine) -> quality
    flops_workload: str = "matmul"    # "convolution" for the ResNet, "matmul" for GPT-2
    epoch_samples: int | None = None  # samples an epoch trains on (TaskProfile.epoch_samples); None: num_train_samples

    def run_samples(self, epochs: float) -> int:
        """Samples a run of `epochs` trains on: the batches cycle through the data at hand."""
        return int(epochs * (self.epoch_samples or self.num_train_samples))


def build_task(profile: TaskProfile, *, data_policy: str, data_dir, device: torch.device, seed: int) -> Task:
    if profile.task == "cifar10":
        return _cifar10(profile, data_policy, data_dir, device, seed)
    return _wikitext2(profile, data_policy, data_dir, device, seed)


def _endless(make_epoch: Callable[[int], Iterator]) -> Iterator:
    epoch = 0
    while True:
        yield from make_epoch(epoch)
        epoch += 1


# ------------------------------------------------------------------ CIFAR-10 + ResNet
def _cifar10(profile, data_policy, data_dir, device, seed) -> Task:
    dataset = data.load_image_dataset("cifar10", data_dir=data_dir, data_policy=data_policy, **profile.standin_sizes)
    n_train = min(profile.train_samples or len(dataset.train_y), len(dataset.train_y))
    train_x, train_y = dataset.train_x[:n_train], dataset.train_y[:n_train]
    n_eval = min(profile.eval_samples, len(dataset.test_y))
    test_x = data.normalize_batch(dataset.test_x[:n_eval]).to(device)
    test_y = dataset.test_y[:n_eval].to(device)
    model = models.resnet_cifar(num_classes=10, **profile.model)
    # CIFAR-10 gets the methodology's random crop + flip. The stand-in does not: its generator
    # already draws every image's placement, scale, rotation and mirror, so each training image
    # is a fresh view and cropping it adds only slower learning.
    augment = not dataset.is_standin

    def train_batches(micro_batch_size: int, seed: int = seed):
        generator = torch.Generator().manual_seed(seed)
        return _endless(lambda epoch: data.image_batches(
            train_x, train_y, micro_batch_size, shuffle=True, augment=augment, generator=generator,
            drop_last=True, device=device))

    def loss(model, x, y):
        return F.cross_entropy(model(x), y), len(y)

    @torch.no_grad()
    def evaluate(model, engine):
        was_training = model.training
        model.eval()
        correct = 0
        for start in range(0, n_eval, 256):
            with engine.autocast():
                logits = model(test_x[start:start + 256])
            correct += (logits.argmax(1) == test_y[start:start + 256]).sum().item()
        model.train(was_training)
        return correct / n_eval

    return Task(
        model=model,
        model_name=f"ResNet (bottleneck {tuple(profile.model['layers'])}, width {profile.model['width']}, CIFAR stem)",
        data_source=dataset.source,
        num_train_samples=n_train,
        training_flops_per_item=models.training_flops_per_item(model, (3, 32, 32)),
        train_batches=train_batches,
        loss=loss,
        evaluate=evaluate,
        flops_workload="convolution",
        epoch_samples=profile.epoch_samples(n_train, is_standin=dataset.is_standin),
    )


# ------------------------------------------------------------------ WikiText-2 + GPT-2
def compact_vocabulary(*splits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Renumber the GPT-2 token ids that occur in the corpus to 0..V-1 (same tokenization,
    smaller embedding / LM head). Returns the first two splits renumbered and V."""
    vocabulary = torch.unique(torch.cat(splits))
    renumbered = [torch.searchsorted(vocabulary, s) for s in splits[:2]]
    return renumbered[0], renumbered[1], len(vocabulary)


def predicted_tokens(input_ids: torch.Tensor) -> int:
    """Tokens a batch of sequences (batch, T) predicts: T - 1 each (the first has no context)."""
    return input_ids.shape[0] * (input_ids.shape[1] - 1)


def gpt2_training_flops_per_predicted_token(model, seq_len: int) -> float:
    """Training FLOPs of GPT-2 per *predicted* token: one sequence's FLOPs / (seq_len - 1).

    The item of the GPT-2 task is a predicted token: the loss is a mean over the T - 1 tokens
    of a T-token sequence that have a next token, so eq. 4 weights micro-batches by that count
    and throughput counts it too. The model still runs forward and backward over all T
    positions, so a sequence costs T × `training_flops_per_token(model, T)` (per processed
    token, 6·N + 12·n_layer·n_embd·T); dividing that by T - 1 makes FLOPs per item × items/s
    the model's FLOP/s (per processed token, MFU would come out (T - 1)/T too low).
    """
    if not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len={seq_len!r} is invalid: allowed an integer >= 2 (a sequence predicts seq_len - 1 tokens)")
    return models.training_flops_per_token(model, seq_len) * seq_len / (seq_len - 1)


def _wikitext2(profile, data_policy, data_dir, device, seed) -> Task:
    corpus = data.load_text_corpus("wikitext2", data_dir=data_dir, data_policy=data_policy)
    seq_len = profile.seq_len
    train_ids, valid_ids, vocab_size = corpus.train, corpus.valid, data.GPT2_VOCAB_SIZE
    if profile.compact_vocab:
        train_ids, valid_ids, vocab_size = compact_vocabulary(corpus.train, corpus.valid, corpus.test)
    train = data.pack_sequences(train_ids, seq_len)
    valid = data.pack_sequences(valid_ids, seq_len)
    n_train = min(profile.train_samples or len(train), len(train))
    train = train[:n_train]
    n_eval = min(profile.eval_samples, len(valid))
    valid = valid[:n_eval].to(device)
    model = models.gpt2_model(vocab_size=vocab_size, **profile.model)

    def train_batches(micro_batch_size: int, seed: int = seed):
        generator = torch.Generator().manual_seed(seed)
        return _endless(lambda epoch: (
            (b, None) for b in data.text_batches(train, micro_batch_size, shuffle=True, generator=generator,
                                                 drop_last=True, device=device)))

    def loss(model, x, _):
        # next-token loss, mean over the seq_len - 1 predicted tokens of each sequence
        return model(input_ids=x, labels=x).loss, predicted_tokens(x)

    @torch.no_grad()
    def evaluate(model, engine):
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for start in range(0, n_eval, 16):
            batch = valid[start:start + 16]
            with engine.autocast():
                out = model(input_ids=batch, labels=batch)
            n = predicted_tokens(batch)
            total += out.loss.float().item() * n
            count += n
        model.train(was_training)
        return math.exp(total / count)

    cfg = profile.model
    return Task(
        model=model,
        model_name=(f"GPT-2 ({cfg['n_layer']} layers, {cfg['n_embd']} hidden, {cfg['n_head']} heads, seq {seq_len}, "
                    f"vocabulary {vocab_size}{' compacted GPT-2 BPE ids' if profile.compact_vocab else ''})"),
        data_source=corpus.source,
        num_train_samples=n_train,
        training_flops_per_item=gpt2_training_flops_per_predicted_token(model, seq_len),
        train_batches=train_batches,
        loss=loss,
        evaluate=evaluate,
        flops_workload="matmul",
        epoch_samples=profile.epoch_samples(n_train, is_standin=corpus.is_standin),
    )
