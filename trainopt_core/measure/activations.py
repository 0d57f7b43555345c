"""Bytes of the activations autograd keeps for backward (eq. 18's M_activation, and after
checkpointing eq. 19's): what `torch.autograd.graph.saved_tensors_hooks` is handed during a
forward, once per storage, the model's own parameters and buffers left out.
"""
from __future__ import annotations

import torch
from torch import nn


class SavedTensorMeter:
    """Bytes of activations autograd keeps for backward while the meter is active.

    Counts every tensor packed by `torch.autograd.graph.saved_tensors_hooks`, once per storage
    (views and repeated saves of one storage count once, at the storage's size), leaving out
    the model's parameters and buffers (and, without a model, leaf tensors requiring grad).
    Inside a non-reentrant checkpoint the checkpoint's own hooks take the saved tensors, so a
    checkpointed segment shows up only as its saved inputs: what stays alive after forward.
    Storages are referenced until exit so that freed memory cannot be counted twice.
    """

    def __init__(self, model: nn.Module | None = None):
        self.model = model
        self.activation_bytes = 0
        self.num_storages = 0
        self._held: dict = {}
        self._hooks = None

    def _key(self, tensor):
        return tensor.device, tensor.untyped_storage().data_ptr()

    def _pack(self, tensor):
        key = self._key(tensor)
        excluded = key in self._excluded or (self.model is None and tensor.is_leaf and tensor.requires_grad)
        if not excluded and key not in self._held:
            storage = tensor.untyped_storage()
            self._held[key] = storage
            self.activation_bytes += storage.nbytes()
            self.num_storages += 1
        return tensor

    def __enter__(self):
        state = [] if self.model is None else [*self.model.parameters(), *self.model.buffers()]
        self._excluded = {self._key(t) for t in state}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._held.clear()
        return False


def saved_activation_bytes(model: nn.Module, *inputs, **kwargs) -> int:
    """Activation bytes held for backward by one forward: ``model(*inputs, **kwargs)``, or a
    zero-argument closure passed as the only input (e.g. forward plus loss). Grad must be
    enabled; the model's train/eval mode is left as it is."""
    with SavedTensorMeter(model) as meter:
        closure = inputs[0] if len(inputs) == 1 and not kwargs else None
        if callable(closure) and not isinstance(closure, (torch.Tensor, nn.Module)):
            output = closure()
        else:
            output = model(*inputs, **kwargs)
        del output
    return meter.activation_bytes
