"""Activation checkpointing over a model's block sequence (paper §III-E, eqs. 18-20).

A plain forward keeps every block's activations until backward: M_activation = Σ_l |A_l|
(eq. 18). Splitting the L blocks into S contiguous segments and running each segment under
`torch.utils.checkpoint` (non-reentrant, RNG state preserved so dropout draws match) keeps only
the S segment inputs; one segment's activations are recomputed at a time during backward. With
S = ⌈√L⌉ this is eq. 19, M_checkpointed = O(√L)·M_layer, for about one extra forward of the
blocks (eq. 20).

How a model is changed (in place). The model's own forward still calls every block in turn.
The first block of each segment gets an instance-level ``forward`` that runs the whole segment
inside one checkpoint call and returns what a plain block returns; the other blocks of the
segment get a ``forward`` that hands their input straight back. Only the instance attribute
``forward`` is set, so the module tree, ``parameters()``, ``state_dict()`` keys, ``.to()``,
``copy.deepcopy`` and pickling are untouched; `remove_activation_checkpointing` undoes it.

Checkpointing is used only when grad is enabled and the blocks are in training mode; in eval
or under ``torch.no_grad()`` every block runs its own plain forward, so outputs, KV caches and
forward hooks behave exactly as without checkpointing. While checkpointing is active, hooks on
individual blocks see segment-level inputs and outputs, and per-block extras of tuple outputs
(attention weights, presents) are ``None`` for the blocks inside a segment.

Which blocks: `block_sequence` knows torchvision ResNets (the BasicBlock/Bottleneck modules
of layer1..layer4), Hugging Face GPT-2 (``transformer.h``), a plain ``nn.Sequential``, and any
model exposing ``checkpoint_blocks``: a list / ``nn.ModuleList`` of blocks that the model's
forward calls back to back in that order, each taking the previous block's output (or its
element 0 when blocks return tuples) as its first positional argument, with nothing in between.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Union

import torch
from torch import nn
from torch.utils import _python_dispatch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

Segments = Union[str, int]

_PLAN_ATTR = "_activation_checkpoint_plan"
SUPPORTED_MODELS = (
    "torchvision ResNet (blocks of layer1..layer4)",
    "Hugging Face GPT2Model / GPT2LMHeadModel (transformer.h)",
    "nn.Sequential (its children)",
    "any model with a `checkpoint_blocks` attribute (list or nn.ModuleList of blocks called back to back)",
)


@dataclass(frozen=True)
class CheckpointPlan:
    """How the L blocks were split: ``boundaries`` holds [start, end) block indices per segment."""

    adapter: str
    num_blocks: int
    segments: int
    boundaries: tuple[tuple[int, int], ...]
    policy: str = "full"

    @property
    def segment_sizes(self) -> tuple[int, ...]:
        return tuple(end - start for start, end in self.boundaries)

    @property
    def expected_saved_fraction(self) -> float:
        return expected_saved_fraction(self.num_blocks, self.segments)


# --------------------------------------------------------------------------- block adapters


def unalias_checkpoint_blocks(model: nn.Module) -> None:
    """Keep ``model.checkpoint_blocks = model.transformer.h`` (an ``nn.ModuleList`` of blocks the
    model already holds) out of the model's state_dict: nn.Module registers an assigned module,
    so the blocks' tensors would appear twice (``checkpoint_blocks.0....``) and a checkpoint saved
    before would no longer load. Such an alias becomes a plain tuple of the same blocks. A
    ``checkpoint_blocks`` that is the blocks' only owner stays registered."""
    alias = model._modules.get("checkpoint_blocks")
    if alias is None:
        return
    elsewhere = {id(module) for name, module in model.named_modules(remove_duplicate=False)
                 if name and name != "checkpoint_blocks" and not name.startswith("checkpoint_blocks.")}
    if all(id(block) in elsewhere for block in alias):
        del model._modules["checkpoint_blocks"]
        model.__dict__["checkpoint_blocks"] = tuple(alias)


def has_block_sequence(model: nn.Module) -> bool:
    """Whether `block_sequence` knows the model's blocks (SUPPORTED_MODELS)."""
    try:
        _model_blocks(model)
    except ValueError:
        return False
    return True


def _model_blocks(model: nn.Module) -> tuple[str, tuple[nn.Module, ...]]:
    unalias_checkpoint_blocks(model)
    hook = getattr(model, "checkpoint_blocks", None)
    if hook is not None:
        blocks = tuple(hook)
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise ValueError(
                f"{type(model).__name__}.checkpoint_blocks must be a non-empty list or nn.ModuleList "
                f"of nn.Module blocks, got {hook!r}"
            )
        return "checkpoint_blocks", blocks
    if type(model).__module__.startswith("transformers.models.gpt2"):
        from transformers import GPT2PreTrainedModel

        if isinstance(model, GPT2PreTrainedModel):
            body = getattr(model, "transformer", model)
            if isinstance(getattr(body, "h", None), nn.ModuleList):
                return "gpt2", tuple(body.h)
    if type(model).__module__.startswith("torchvision.models"):
        from torchvision.models import ResNet

        if isinstance(model, ResNet):
            # ResNet.forward runs layer1..layer4 back to back, so a segment may cross stages.
            stages = (model.layer1, model.layer2, model.layer3, model.layer4)
            return "torchvision-resnet", tuple(block for stage in stages for block in stage)
    if isinstance(model, nn.Sequential):
        return "sequential", tuple(model)
    raise ValueError(
        f"model of type {type(model).__module__}.{type(model).__qualname__} has no known block "
        f"sequence: supported are {'; '.join(SUPPORTED_MODELS)}. To checkpoint another model, "
        "give it a `checkpoint_blocks` attribute listing its repeated blocks in call order "
        "(e.g. `model.checkpoint_blocks = list(model.transformer.h)`: a plain list, so the blocks keep one owner "
        "and the state_dict its keys)."
    )


def block_sequence(model: nn.Module) -> tuple[nn.Module, ...]:
    """The model's repeated blocks in the order its forward calls them (the L of eq. 18)."""
    return _model_blocks(model)[1]


# --------------------------------------------------------------------------- partitioning


def resolve_segments(num_blocks: int, segments: Segments = "sqrt") -> int:
    """Number of segments: ⌈√L⌉ for ``"sqrt"`` (Chen et al., eq. 19) or a given count in [1, L]."""
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks={num_blocks!r} is invalid: allowed an integer >= 1")
    if segments == "sqrt":
        root = math.isqrt(num_blocks)
        return root if root * root == num_blocks else root + 1
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= num_blocks:
        raise ValueError(
            f"segments={segments!r} is invalid: allowed 'sqrt' or an integer in [1, {num_blocks}] "
            f"(the model has {num_blocks} blocks)"
        )
    return segments


def segment_boundaries(num_blocks: int, segments: Segments = "sqrt") -> tuple[tuple[int, int], ...]:
    """Contiguous, near-equal [start, end) ranges; the first L mod S segments get one block more."""
    count = resolve_segments(num_blocks, segments)
    base, extra = divmod(num_blocks, count)
    bounds, start = [], 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return tuple(bounds)


def expected_saved_fraction(num_blocks: int, segments: Segments = "sqrt", boundary_fraction: float = 1.0) -> float:
    """Eq. 19 over eq. 18 for L uniform blocks: peak checkpointed / plain activation bytes.

    Each block keeps A bytes for backward in a plain run (eq. 18: L·A). Checkpointed, the S
    segment inputs stay (β·A each, β = ``boundary_fraction`` = boundary bytes / per-block
    saved bytes, at most 1), and during backward one segment at a time is recomputed, adding
    at most ⌈L/S⌉·A. The fraction is (S·β + ⌈L/S⌉) / L, about 2/√L at S = ⌈√L⌉ and β = 1.
    At the end of the forward only the S·β·A term is held.
    """
    if not 0.0 <= boundary_fraction <= 1.0:
        raise ValueError(f"boundary_fraction={boundary_fraction!r} is invalid: allowed a number in [0, 1]")
    sizes = [end - start for start, end in segment_boundaries(num_blocks, segments)]
    return (len(sizes) * boundary_fraction + max(sizes)) / num_blocks


# --------------------------------------------------------------------------- wrapping


@contextlib.contextmanager
def _running_stats_frozen(blocks):
    """Keep BatchNorm running statistics as they were across a recompute.

    Without this the recompute in backward would apply the momentum update a second time for
    the same batch (effective momentum ~0.19 instead of 0.1), so checkpointing would change
    eval-mode behaviour. Gradients do not depend on it: train-mode BatchNorm normalizes with
    batch statistics.
    """
    norms = [
        m for block in blocks for m in block.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats
    ]
    # Outside any dispatch mode: selective checkpointing replays the forward's op sequence during
    # the recompute and would reject ops the forward did not run.
    with _python_dispatch._disable_current_modes():
        saved = [[(buf, buf.detach().clone()) for buf in (m.running_mean, m.running_var, m.num_batches_tracked)
                  if buf is not None] for m in norms]
    try:
        yield
    finally:
        with torch.no_grad(), _python_dispatch._disable_current_modes():
            for pairs in saved:
                for buf, value in pairs:
                    # .data: restoring the buffers must not bump the version counter autograd checks.
                    buf.data.copy_(value)


POLICIES = ("full", "selective")
# Selective checkpointing keeps the outputs of these ops (the expensive ones: matrix products,
# convolutions, fused attention) and recomputes everything else (pointwise ops, norms, softmax)
_SAVED_BY_SELECTIVE = tuple(
    getattr(torch.ops.aten, name) for name in (
        "mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu")
    if hasattr(torch.ops.aten, name))


def _save_expensive_ops(ctx, op, *args, **kwargs):
    if op.overloadpacket in _SAVED_BY_SELECTIVE:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _context_fn(policy: str):
    """`torch.utils.checkpoint`'s ``context_fn`` for a policy (None: full recompute)."""
    if policy == "full":
        return None
    return functools.partial(create_selective_checkpoint_contexts, _save_expensive_ops)


@functools.cache
def saved_tensor_hook_options(checkpoint_fn) -> dict:
    """`respect_saved_tensors_hooks=True` where `checkpoint_fn` takes it (torch 2.14 does; torch
    2.11 passes an unknown keyword on to the checkpointed function, which fails), else nothing:
    there a selective policy's saved tensors bypass the saved-tensor hooks, so the CPU memory
    tracker does not see them. Cached: read once per checkpoint function, not per forward."""
    takes = "respect_saved_tensors_hooks" in inspect.signature(checkpoint_fn).parameters
    return {"respect_saved_tensors_hooks": True} if takes else {}


class _SegmentState:
    """Shared by a segment's blocks: how many pass-throughs follow a whole-segment run."""

    def __init__(self):
        self.pending_pass_throughs = 0
        self.tuple_len = None


def _hidden(output):
    return output[0] if isinstance(output, tuple) else output


def _plain_forward(block, *args, **kwargs):
    return type(block).forward(block, *args, **kwargs)


class _SegmentForward:
    """``forward`` of a segment's first block: the whole segment under one checkpoint call."""

    def __init__(self, blocks, state, policy="full"):
        self.blocks = list(blocks)
        self.state = state
        self.context_fn = _context_fn(policy)

    def _run_blocks(self, calls, hidden, args, kwargs):
        calls[0] += 1  # call 1 is the forward, later calls are recomputes during backward
        with _running_stats_frozen(self.blocks) if calls[0] > 1 else contextlib.nullcontext():
            output = hidden
            for block in self.blocks:
                output = _plain_forward(block, hidden, *args, **kwargs)
                hidden = _hidden(output)
            return output

    def __call__(self, hidden, *args, **kwargs):
        head = self.blocks[0]
        if not (torch.is_grad_enabled() and head.training):
            self.state.pending_pass_throughs = 0
            return _plain_forward(head, hidden, *args, **kwargs)
        if kwargs.get("use_cache"):
            raise RuntimeError(
                "use_cache=True while training with activation checkpointing: the recompute would "
                "write the KV cache twice; set model.config.use_cache=False for training"
            )
        calls = [0]
        # selective: what the policy saves goes through any active saved-tensor hooks (the
        # memory tracker's, offloading) like every other saved tensor, where torch has the option
        extra = {} if self.context_fn is None else {"context_fn": self.context_fn, **saved_tensor_hook_options(checkpoint)}
        output = checkpoint(
            lambda h: self._run_blocks(calls, h, args, kwargs),
            hidden, use_reentrant=False, preserve_rng_state=True, **extra,
        )
        self.state.pending_pass_throughs = len(self.blocks) - 1
        self.state.tuple_len = len(output) if isinstance(output, tuple) else None
        return output


class _PassThroughForward:
    """``forward`` of a later block of a segment: its input already went through it."""

    def __init__(self, block, state):
        self.block = block
        self.state = state

    def __call__(self, hidden, *args, **kwargs):
        if self.state.pending_pass_throughs == 0:
            return _plain_forward(self.block, hidden, *args, **kwargs)
        self.state.pending_pass_throughs -= 1
        if self.state.tuple_len is None:
            return hidden
        return (hidden,) + (None,) * (self.state.tuple_len - 1)


def _is_wrapped(block: nn.Module) -> bool:
    return isinstance(block.__dict__.get("forward"), (_SegmentForward, _PassThroughForward))


def apply_activation_checkpointing(model: nn.Module, segments: Segments = "sqrt", policy: str = "full") -> CheckpointPlan:
    """Checkpoint the model's blocks in ⌈√L⌉ (or ``segments``) contiguous segments, in place.

    ``policy="full"`` keeps only each segment's input; ``"selective"`` also keeps the outputs
    of matrix products, convolutions and fused attention and recomputes only the rest (torch's
    selective-checkpoint contexts): more memory than full, far less recompute.
    Applying again with the same resolved segment count and policy returns the existing plan;
    anything else raises ValueError (call `remove_activation_checkpointing` first). For GPT-2,
    ``config.use_cache`` is set to False: a KV cache must not be written during training.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is invalid: allowed one of {POLICIES}")
    adapter, blocks = _model_blocks(model)
    count = resolve_segments(len(blocks), segments)
    existing = model.__dict__.get(_PLAN_ATTR)
    if existing is not None:
        if (existing.segments, existing.policy) == (count, policy):
            return existing
        raise ValueError(
            f"segments={segments!r}, policy={policy!r} is invalid: activation checkpointing is already applied "
            f"with {existing.segments} segments, policy {existing.policy!r}; call "
            "remove_activation_checkpointing(model) first"
        )
    if any(_is_wrapped(block) for block in blocks):
        raise ValueError("activation checkpointing is already applied to these blocks (through another model)")
    if any(getattr(block, "gradient_checkpointing", False) for block in blocks):
        raise ValueError(
            "the blocks already checkpoint themselves (transformers' gradient_checkpointing_enable()); "
            "call model.gradient_checkpointing_disable() first"
        )
    if adapter == "gpt2" or getattr(getattr(model, "config", None), "use_cache", False):
        model.config.use_cache = False  # a Hugging Face model, however its blocks were named
    boundaries = segment_boundaries(len(blocks), count)
    for start, end in boundaries:
        state = _SegmentState()
        blocks[start].forward = _SegmentForward(blocks[start:end], state, policy)
        for block in blocks[start + 1:end]:
            block.forward = _PassThroughForward(block, state)
    plan = CheckpointPlan(adapter=adapter, num_blocks=len(blocks), segments=count, boundaries=boundaries,
                          policy=policy)
    model.__dict__[_PLAN_ATTR] = plan
    return plan


def checkpoint_plan(model: nn.Module) -> CheckpointPlan | None:
    """The plan applied to ``model``, or None."""
    return model.__dict__.get(_PLAN_ATTR)


def remove_activation_checkpointing(model: nn.Module) -> None:
    """Restore every block's plain forward (no-op when nothing is applied)."""
    for block in block_sequence(model):
        if _is_wrapped(block):
            del block.__dict__["forward"]
    model.__dict__.pop(_PLAN_ATTR, None)
