"""One candidate of a `plan()` call on its own copy of the model and optimizer, stepping the
probe batch through the engine `prepare()` builds for the candidate's configuration: its probe
loss at the initial weights, whole steps, and steps timed in parts (`split_step`).
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Sequence

import torch

from ..compose import prepare
from ..measure.timing import Timer
from .space import Candidate, calls_sdpa


def _micro_batches(batch: Sequence[torch.Tensor], k: int) -> list[tuple[torch.Tensor, ...]]:
    return list(zip(*(tensor.chunk(k) for tensor in batch)))


class Trial:
    """One candidate on its own copy of the model and optimizer, stepping the probe batch. On
    `world_size` > 1 processes the copy trains data parallel: DDP at ZeRO stage 0, else a
    DeepSpeed engine at the candidate's stage. `model` is the copy's module, `tracked` what memory
    is tracked on (the module, or its DDP wrapper, whose gradient buckets count), `forward` what
    the forward runs through (the module, DDP or DeepSpeed)."""

    def __init__(self, candidate: Candidate, model, optimizer_factory, batch, loss_fn, device, loss_takes_model=False,
                 world_size: int = 1, optimizer_takes_model: bool = False):
        self.candidate = candidate
        self.loss_takes_model = loss_takes_model
        self.model = copy.deepcopy(model)
        wrapped, backend = self.model, "torch"
        if candidate.zero_stage:
            backend = "deepspeed"
        elif world_size > 1:
            ids = None  # a CPU module
            if device.type == "cuda":
                ids = [device.index if device.index is not None else torch.cuda.current_device()]
            wrapped = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.tracked = wrapped
        self.optimizer = optimizer_factory(self.model if optimizer_takes_model else self.model.parameters())
        self.size = len(batch[0])
        self.micro = _micro_batches(batch, candidate.k)
        self.loss_fn = loss_fn
        self.engine = prepare(wrapped, self.optimizer, candidate.config(), micro_batch_size=self.size // candidate.k,
                              device=device, world_size=world_size, backend=backend)
        self.forward = self.engine.model
        self.first_loss = self._probe_loss()

    def _loss(self, micro) -> tuple[torch.Tensor, float]:
        with self.engine.autocast():
            if self.loss_takes_model:
                out = self.loss_fn(self.forward, *micro)
            else:
                *inputs, target = micro
                out = self.loss_fn(self.forward(*inputs), target)
        loss, items = out if isinstance(out, tuple) else (out, len(micro[-1]))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = f"<a tensor of shape {tuple(loss.shape)}>" if isinstance(loss, torch.Tensor) else repr(loss)[:80]
            raise ValueError(f"loss_fn returned {what} on a micro-batch: allowed a tensor of one element, the mean loss "
                             "over the micro-batch's items, or (that loss, its item count) (reduce a per-sample loss "
                             "with .mean() or reduction='mean')")
        return loss, items

    def _probe_loss(self) -> float:
        """The probe batch's mean loss at the initial weights (the same for every candidate), in
        this candidate's precision and micro-batches, micro-batches weighted by their items, run
        eagerly. In eval mode: dropout masks and BatchNorm's per-micro-batch statistics would make it differ
        between candidates for reasons that are not numerical."""
        with self._eager_eval():
            try:
                parts = [self._loss(micro) for micro in self.micro]
            except TypeError as error:
                if self.loss_takes_model:
                    raise
                raise TypeError(
                    f"{error} -- plan() called loss_fn(model(*inputs), targets) on the batch (inputs..., targets). "
                    "For a model whose forward takes the targets and returns the loss, pass loss_takes_model=True "
                    "and loss_fn=lambda model, x, y: model(x, y)[1] (the loss out of what it returns)") from error
        loss = sum(float(loss) * float(items) for loss, items in parts) / sum(float(items) for _, items in parts)
        if self.candidate == Candidate() and not math.isfinite(loss):
            # the baseline's own loss: no candidate can be compared with it (inputs or targets
            # holding NaN/inf, a loss_fn that divides by zero), and training it would stop anyway
            raise ValueError(f"batch=<the probe batch> is invalid: the fp32 baseline's loss on it at the initial weights "
                             f"is {loss}; allowed a batch whose loss is finite (check its inputs and targets for "
                             "NaN/inf, and loss_fn)")
        return loss

    def calls_sdpa(self) -> bool:
        """Whether this copy's forward calls torch's scaled_dot_product_attention
        (`space.calls_sdpa`): on the first micro-batch, eagerly, in eval mode, without gradients."""
        with self._eager_eval():
            return calls_sdpa(lambda: self._loss(self.micro[0]))

    @contextlib.contextmanager
    def _eager_eval(self):
        """The copy in eval mode, without gradients, run eagerly: a compiled copy would otherwise
        compile (and capture) its evaluation too, time that its compile seconds do not count."""
        training = self.forward.training
        self.forward.eval()
        try:
            with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                yield
        finally:
            self.forward.train(training)

    def _backward(self, micro) -> None:
        loss, items = self._loss(micro)
        self.engine.backward(loss, num_items=items)

    def step(self) -> float:
        """One optimizer step over the whole probe batch; returns the samples it processed."""
        for micro in self.micro:
            self._backward(micro)
            self.engine.step()
        return float(self.size)

    def split_step(self, device) -> tuple[float, float, float]:
        """One optimizer step, timed in three parts: seconds of its first k - 1 micro-batches, of
        the last (whose backward, data parallel, also waits for the gradients' all-reduce), and of
        the boundary -- unscale, clip, optimizer update, zero_grad."""
        with Timer(device) as whole:
            with Timer(device) as first:
                for micro in self.micro[:-1]:
                    self._backward(micro)
                    self.engine.step()  # not a boundary: returns at once
            self._backward(self.micro[-1])
            with Timer(device) as boundary:
                self.engine.step()
        return first.elapsed_s, whole.elapsed_s - first.elapsed_s - boundary.elapsed_s, boundary.elapsed_s
