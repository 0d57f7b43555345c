"""The two model families of paper §IV-A, their per-profile sizes, and analytic training FLOPs.

- ResNet-50 for CIFAR-10: torchvision's bottleneck ResNet [3, 4, 6, 3] (16 blocks) with the CIFAR
  stem (3x3 stride-1 conv, no max-pool), `reproduction.resnet.CifarResNet` (imported, and torchvision
  with it, only when a ResNet is built). Scaled-down profiles keep the same 16-block sequence
  and shrink the base width, so √L checkpointing partitions the same block sequence.
- GPT-2 small for WikiText-2: `reproduction.gpt2.CompactGPT2`, `transformers.GPT2LMHeadModel`'s
  architecture and initialisation as a compact PyTorch module (it loads and saves that model's
  weights), trained from scratch (no pretrained weights are ever downloaded).

Training FLOPs per item (image or token) feed the FLOPs-utilization metric of SPEC §4.
"""
from __future__ import annotations

import torch
from torch import nn

from .._errors import fail as _fail
from .gpt2 import CompactGPT2, CompactGPT2Config

MODEL_KINDS = ("resnet", "gpt2")
PROFILES = ("paper", "quick", "smoke", "gpu")

# Model sizes per profile (data, not code paths). "paper" is paper §IV-A exactly; "quick" keeps the
# model families and block counts the components act on (16 bottleneck blocks; a stack of GPT-2
# blocks) at a size a 2-core CPU trains a few hundred steps of in minutes; "smoke" is the tiniest.
# The quick sizes were chosen from AdamW training-step times on a shared 2-core CPU (one thread,
# CPU seconds / wall seconds): ResNet [3,4,6,3] width 8, 32 images: 0.13 / 0.22 s (width 16:
# 0.38 / 0.60 s); GPT-2 4x128 (transformers' GPT2LMHeadModel then), 8 sequences of 128 tokens: 1.0 /
# 1.8 s, about 90% of it the 50257-way LM head and its loss (2 blocks cost the same as 4).
MODEL_SIZES: dict[str, dict[str, dict]] = {
    "paper": {
        "resnet": {"layers": (3, 4, 6, 3), "width": 64},
        "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq_len": 1024, "n_positions": 1024},
    },
    # the paper's models, in runs sized for one GPU session (reproduction.profiles)
    "gpu": {
        "resnet": {"layers": (3, 4, 6, 3), "width": 64},
        "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq_len": 1024, "n_positions": 1024},
    },
    "quick": {
        "resnet": {"layers": (3, 4, 6, 3), "width": 8},
        "gpt2": {"n_layer": 4, "n_embd": 128, "n_head": 4, "seq_len": 128, "n_positions": 128},
    },
    "smoke": {
        "resnet": {"layers": (3, 4, 6, 3), "width": 4},
        "gpt2": {"n_layer": 4, "n_embd": 32, "n_head": 2, "seq_len": 32, "n_positions": 32},
    },
}


# ----------------------------------------------------------------------------- ResNet (CIFAR)
def __getattr__(name: str):
    # `models.CifarResNet` imports torchvision on first use only (module `resnet`), so a process
    # that builds no ResNet -- a GPT-2 rank, a notebook kernel reading records -- never pays for it.
    if name == "CifarResNet":
        from .resnet import CifarResNet

        return CifarResNet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resnet_cifar(layers=(3, 4, 6, 3), width: int = 64, num_classes: int = 10) -> CifarResNet:
    """A bottleneck ResNet for 32x32 images: `layers` blocks per stage, base width `width`."""
    layers = tuple(layers)
    if len(layers) != 4 or not all(isinstance(n, int) and n >= 1 for n in layers):
        _fail("layers", layers, "four integers >= 1 (blocks per stage)")
    if not isinstance(width, int) or width < 1:
        _fail("width", width, "an integer >= 1")
    if not isinstance(num_classes, int) or num_classes < 1:
        _fail("num_classes", num_classes, "an integer >= 1")
    from .resnet import CifarResNet

    return CifarResNet(layers, width, num_classes)


def resnet50_cifar(num_classes: int = 10, width: int = 64) -> CifarResNet:
    """ResNet-50 ([3, 4, 6, 3] bottleneck blocks) with the CIFAR stem (paper §IV-A)."""
    return resnet_cifar((3, 4, 6, 3), width, num_classes)


# ----------------------------------------------------------------------------- GPT-2
def gpt2_config(
    n_layer: int = 12,
    n_embd: int = 768,
    n_head: int = 12,
    vocab_size: int = 50257,
    n_positions: int = 1024,
    dropout: float = 0.1,
) -> CompactGPT2Config:
    """The configuration of `gpt2_model` (defaults: GPT-2 small, 124M parameters with tied
    embeddings); `dropout` is GPT2Config's resid, embd and attn pdrop, as in GPT-2."""
    if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
        _fail("dropout", dropout, "a number in [0, 1)")
    return CompactGPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                             n_positions=n_positions, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)


def gpt2_model(
    n_layer: int = 12,
    n_embd: int = 768,
    n_head: int = 12,
    vocab_size: int = 50257,
    n_positions: int = 1024,
    dropout: float = 0.1,
) -> CompactGPT2:
    """A randomly initialised GPT-2 (`reproduction.gpt2.CompactGPT2`: GPT2LMHeadModel's model and
    initialisation, trained from scratch; `gpt2.to_hf` gives the same weights as a GPT2LMHeadModel)."""
    return CompactGPT2(gpt2_config(n_layer, n_embd, n_head, vocab_size, n_positions, dropout))


# ----------------------------------------------------------------------------- profiles
def model_size(model_kind: str, profile: str) -> dict:
    """The size parameters of `model_kind` ("resnet" | "gpt2") in `profile` (`PROFILES`)."""
    if model_kind not in MODEL_KINDS:
        _fail("model_kind", model_kind, f"one of {MODEL_KINDS}")
    if profile not in PROFILES:
        _fail("profile", profile, f"one of {PROFILES}")
    return dict(MODEL_SIZES[profile][model_kind])


def build_model(model_kind: str, profile: str, *, num_classes: int = 10, vocab_size: int = 50257,
                dropout: float = 0.1) -> nn.Module:
    """The model of `model_kind` at the size `MODEL_SIZES[profile]` names."""
    size = model_size(model_kind, profile)
    if model_kind == "resnet":
        return resnet_cifar(size["layers"], size["width"], num_classes)
    return gpt2_model(size["n_layer"], size["n_embd"], size["n_head"], vocab_size, size["n_positions"], dropout)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters; tied weights (GPT-2's embedding / LM head) count once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ----------------------------------------------------------------------------- FLOPs
def forward_flops(model: nn.Module, example_input: torch.Tensor) -> int:
    """FLOPs of one forward pass counted by `torch.utils.flop_counter.FlopCounterMode`.

    FlopCounterMode counts matmuls, convolutions and (CUDA) attention kernels at 2 FLOPs per
    multiply-add; normalisation and element-wise ops are not counted. The model runs in eval
    mode under no_grad, so batch-norm running statistics are left untouched.
    """
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: only where FLOPs are counted

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(example_input)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


def gpt2_training_flops_per_token(config, seq_len: int | None = None) -> float:
    """Training FLOPs per token of a GPT-2 config: 6·N + 12·n_layer·n_embd·seq_len.

    The standard transformer count (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, App. B):
    forward 2 FLOPs per matmul weight per token, backward twice the forward (3x in all), plus
    the attention score and value matmuls (QKᵀ and AV: 4·T·d forward per layer, not halved for
    the causal mask). N counts the weights that take part in matmuls: the blocks, the final
    layer norm and the LM-head matrix (vocab x n_embd; with tied embeddings the input lookup
    itself costs no FLOPs, and position embeddings are a lookup too). The vocabulary is the
    model's (`config.vocab_size`), not the padded rows its LM head multiplies by (model FLOPs).
    """
    d, n_layer, vocab = config.n_embd, config.n_layer, config.vocab_size
    seq_len = config.n_positions if seq_len is None else seq_len
    if not isinstance(seq_len, int) or seq_len < 1:
        _fail("seq_len", seq_len, "an integer >= 1")
    inner = config.n_inner or 4 * d
    per_block = (d * 3 * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d) + 4 * d
    matmul_params = n_layer * per_block + 2 * d + vocab * d
    return 6.0 * matmul_params + 12.0 * n_layer * d * seq_len


def training_flops_per_item(model: nn.Module, input_shape=(3, 32, 32)) -> float:
    """Analytic training FLOPs per image of an image model: 3 x the forward FLOPs of one item.

    Forward FLOPs are counted with FlopCounterMode on one input of `input_shape` (C, H, W); the
    backward pass is taken as 2x the forward (the usual convention), so training = 3x forward.
    Batch-norm and element-wise ops are not counted. For GPT-2 use `training_flops_per_token`.
    """
    input_shape = tuple(input_shape)
    if len(input_shape) != 3 or not all(isinstance(n, int) and n >= 1 for n in input_shape):
        _fail("input_shape", input_shape, "(channels, height, width), positive integers")
    if hasattr(getattr(model, "config", None), "n_embd"):
        _fail("model", type(model).__name__, "an image model (use training_flops_per_token for GPT-2)")
    parameter = next(model.parameters())
    example = torch.zeros(1, *input_shape, device=parameter.device, dtype=parameter.dtype)
    return 3.0 * forward_flops(model, example)


def training_flops_per_token(model_or_config, seq_len: int | None = None) -> float:
    """Training FLOPs per token of a GPT-2 model or its configuration (`CompactGPT2Config` or
    transformers' `GPT2Config`; `gpt2_training_flops_per_token`)."""
    config = getattr(model_or_config, "config", model_or_config)
    if not all(hasattr(config, name) for name in ("n_embd", "n_layer", "vocab_size", "n_positions")):
        _fail("model_or_config", type(model_or_config).__name__, "a GPT2Config or a model carrying one")
    return gpt2_training_flops_per_token(config, seq_len)


__all__ = [
    "MODEL_SIZES", "MODEL_KINDS", "PROFILES", "CifarResNet",
    "resnet_cifar", "resnet50_cifar", "gpt2_config", "gpt2_model", "model_size", "build_model",
    "count_parameters", "forward_flops", "gpt2_training_flops_per_token", "training_flops_per_item",
    "training_flops_per_token",
]
