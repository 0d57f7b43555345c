"""GPT-2 as one compact PyTorch module: the paper's model (§IV-A) at the speed of plain PyTorch.

The architecture, shapes and initialisation of `transformers.GPT2LMHeadModel` (GPT-2 small:
12 layers, 768 hidden, 12 heads, 1,024 positions, tied embeddings, 124M parameters), written as
a minimal PyTorch GPT-2 is written:
- attention through `F.scaled_dot_product_attention(..., is_causal=True)`: no mask tensor, so
  a GPU runs its flash or cuDNN kernel;
- GPT-2's `gelu_new` as `nn.GELU(approximate="tanh")`, one kernel instead of eight;
- `nn.Linear` layers (HF's `Conv1D` holds the same weights transposed);
- the LM head's vocabulary padded to a multiple of 64 (50,257 -> 50,304), a shape the matmul
  kernels tile well; the padded rows start at zero and their logits are cut off before the loss,
  so they never get a gradient and the model computes exactly the unpadded one;
- the loss as plain PyTorch computes it: one `F.cross_entropy` over the logits upcast to fp32
  (as HF does). The padded columns' logits are -inf (a bias that is not a parameter), so they
  take no probability and get no gradient. Where memory is short, `loss_chunk_tokens=N`
  computes the same loss over chunks of about N tokens, recomputing each chunk's fp32 softmax
  in backward, so the fp32 logits of the whole batch never exist at once (32 x 1,024 x 50,257
  in fp32 is 6.1 GiB) -- at a cost in speed: on one H100 at the paper's sizes the task's bf16
  step ran at 0.76x the minimal GPT-2's with chunks of 4,096 tokens.

`transformers.GPT2LMHeadModel` ran the task before: on one H100 at the paper's sizes it trained
at 0.38x the tokens/s of a minimal plain-PyTorch GPT-2 (134.7k vs 358.6k tok/s, bf16). Weights
move both ways: `from_hf` / `load_hf_state_dict` and `to_hf` / `hf_state_dict`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._errors import fail as _fail

# What identifies this implementation in a run record's conditions (`records.run_conditions`):
# a record made with another GPT-2 implementation is measured again, not reused.
MODEL_VERSION = "trainopt-compact-gpt2/2"
IGNORE_INDEX = -100  # a label that is not predicted (HF's convention)
# tokens per chunk of the chunked loss (`loss_chunk_tokens`): at GPT-2's 50,257 outputs one
# chunk's fp32 logits are 0.8 GiB
LOSS_CHUNK_TOKENS = 4096
# HF's Conv1D layers: their weights are stored (in, out), nn.Linear's (out, in)
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@dataclass(frozen=True, kw_only=True)
class CompactGPT2Config:
    """GPT-2's hyper-parameters under `transformers.GPT2Config`'s names (defaults: GPT-2 small)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    n_positions: int = 1024
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    vocab_multiple: int = 64  # the LM head's rows are padded to a multiple of this
    # None: the loss in one F.cross_entropy over fp32 logits, as plain PyTorch; N: in chunks of about N
    # tokens, the whole batch's fp32 logits never held at once (`next_token_loss`)
    loss_chunk_tokens: int | None = None
    n_inner = None  # the MLP is 4 x n_embd wide, as GPT2Config's n_inner=None

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "vocab_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                _fail(name, value, "an integer >= 1")
        if self.n_embd % self.n_head:
            _fail("n_head", self.n_head, f"a divisor of n_embd ({self.n_embd})")
        if self.loss_chunk_tokens is not None and (not isinstance(self.loss_chunk_tokens, int)
                                                   or self.loss_chunk_tokens < 1):
            _fail("loss_chunk_tokens", self.loss_chunk_tokens, "None (one cross-entropy) or an integer >= 1")
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                _fail(name, getattr(self, name), "a number in [0, 1)")

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / self.vocab_multiple) * self.vocab_multiple


class GPT2Output(NamedTuple):
    loss: torch.Tensor | None  # mean next-token cross-entropy, where labels were given
    logits: torch.Tensor       # (batch, T, vocab_size): the padded columns cut off


class CausalSelfAttention(nn.Module):
    def __init__(self, config: CompactGPT2Config):
        super().__init__()
        self.n_head, self.attn_pdrop = config.n_head, config.attn_pdrop
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_pdrop if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, length, width)))


class MLP(nn.Module):
    def __init__(self, config: CompactGPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's gelu_new
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: CompactGPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CompactGPT2(nn.Module):
    """GPT-2 with an LM head tied to its token embedding; `model(input_ids, labels=...)` returns
    `GPT2Output(loss, logits)` as GPT2LMHeadModel's output does (labels: the input ids, shifted
    inside; -100 not predicted)."""

    def __init__(self, config: CompactGPT2Config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
            wpe=nn.Embedding(config.n_positions, config.n_embd),
            drop=nn.Dropout(config.embd_pdrop),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon),
        ))
        # the LM head's bias: 0 for the vocabulary, -inf for the padded columns (not a parameter,
        # not in the state dict), so a padded column takes no probability and gets no gradient
        padding = torch.zeros(config.padded_vocab_size)
        padding[config.vocab_size:] = float("-inf")
        self.register_buffer("vocab_padding", padding, persistent=False)
        self.reset_parameters()

    @property
    def checkpoint_blocks(self) -> tuple[nn.Module, ...]:
        """The transformer blocks in call order: the L of eq. 18 (`trainopt_core.checkpointing`)."""
        return tuple(self.transformer.h)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """HF's GPT-2 initialisation: weights normal(0, 0.02), each residual branch's output
        projection normal(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorms 1 and 0; the padded
        vocabulary rows 0."""
        std = self.config.initializer_range
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                scale = math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj") else 1.0
                nn.init.normal_(module.weight, mean=0.0, std=std / scale)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        self.transformer.wte.weight[self.config.vocab_size:] = 0.0

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> GPT2Output:
        length = input_ids.shape[1]
        if length > self.config.n_positions:
            _fail("input_ids", f"a sequence of {length} tokens", f"at most n_positions={self.config.n_positions}")
        positions = torch.arange(length, device=input_ids.device)
        x = self.transformer.drop(self.transformer.wte(input_ids) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x)
        # (batch, T, padded vocabulary), the padded columns -inf
        logits = F.linear(self.transformer.ln_f(x), self.transformer.wte.weight, self.vocab_padding)
        loss = None if labels is None else next_token_loss(logits, labels, self.config.vocab_size,
                                                           self.config.loss_chunk_tokens)
        return GPT2Output(loss=loss, logits=logits[..., :self.config.vocab_size])


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                    chunk_tokens: int | None = LOSS_CHUNK_TOKENS) -> torch.Tensor:
    """Mean cross-entropy of position t's logits against label t+1, over the labels that are not
    -100 (GPT2LMHeadModel's loss), in fp32. `chunk_tokens=None`: one `F.cross_entropy` over all
    columns of `logits` (the padded ones must be -inf, as CompactGPT2's are). Otherwise only the
    first `vocab_size` columns enter it (the rest get gradient 0), over chunks of about
    `chunk_tokens` tokens; for backward only `logits` is kept (`_ChunkedCrossEntropy`)."""
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # the last position predicts nothing
    if chunk_tokens is None:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    per_chunk = max(1, chunk_tokens // logits.shape[0])
    if torch.is_grad_enabled() and logits.requires_grad:
        return _ChunkedCrossEntropy.apply(logits, targets, vocab_size, per_chunk)
    total, count = _loss_sum(logits, targets, vocab_size, per_chunk)
    return total / count


def _chunks(length: int, per_chunk: int):
    return (slice(start, start + per_chunk) for start in range(0, length, per_chunk))


def _loss_sum(logits, targets, vocab_size: int, per_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the cross-entropies, number of predicted labels), one chunk of positions at a time in fp32."""
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for piece in _chunks(logits.shape[1], per_chunk):
        scores, target = logits[:, piece, :vocab_size].float(), targets[:, piece]
        picked = scores.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        total = total + ((torch.logsumexp(scores, dim=-1) - picked) * (target != IGNORE_INDEX)).sum()
    return total, (targets != IGNORE_INDEX).sum()


class _ChunkedCrossEntropy(torch.autograd.Function):
    """The mean next-token cross-entropy (`next_token_loss`), keeping only the logits for backward:
    backward recomputes each chunk's fp32 softmax and writes its gradient (softmax - one-hot, over
    the count) into one tensor of the logits' dtype, as autograd casts the fp32 gradient of HF's
    upcast logits. The padded columns' gradient stays 0."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_size: int, per_chunk: int):
        total, count = _loss_sum(logits, targets, vocab_size, per_chunk)
        ctx.save_for_backward(logits, targets, count)
        ctx.vocab_size, ctx.per_chunk = vocab_size, per_chunk
        return total / count

    @staticmethod
    def backward(ctx, grad):
        logits, targets, count = ctx.saved_tensors
        grad_logits = torch.zeros_like(logits)
        for piece in _chunks(logits.shape[1], ctx.per_chunk):
            target = targets[:, piece]
            keep = (target != IGNORE_INDEX).unsqueeze(-1)
            gradient = torch.softmax(logits[:, piece, :ctx.vocab_size], dim=-1, dtype=torch.float32)
            gradient.scatter_add_(-1, target.clamp(min=0).unsqueeze(-1), -keep.to(gradient.dtype))
            gradient.mul_(keep * (grad / count))
            grad_logits[:, piece, :ctx.vocab_size] = gradient
        return grad_logits, None, None, None


# ----------------------------------------------------------------------------- GPT2LMHeadModel's weights
def hf_state_dict(model: CompactGPT2) -> dict[str, torch.Tensor]:
    """`model`'s weights as `GPT2LMHeadModel`'s state dict: Conv1D weights transposed, the
    vocabulary unpadded, `lm_head.weight` the token embedding."""
    vocab = model.config.vocab_size
    state = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach()
        if name.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()
        elif name == "transformer.wte.weight":
            tensor = tensor[:vocab]
        state[name] = tensor.contiguous().clone()
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def load_hf_state_dict(model: CompactGPT2, state: dict[str, torch.Tensor]) -> None:
    """Load `GPT2LMHeadModel`'s state dict into `model` (the padded vocabulary rows set to 0).
    Its LM head must be its token embedding (GPT-2's tied weights)."""
    state = dict(state)
    head = state.pop("lm_head.weight", None)
    if head is not None and not torch.equal(head, state["transformer.wte.weight"]):
        _fail("state['lm_head.weight']", "a matrix unlike transformer.wte.weight", "tied embeddings (equal to it)")
    ours = {}
    for name, tensor in state.items():
        if name.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()
        elif name == "transformer.wte.weight":
            tensor = F.pad(tensor, (0, 0, 0, model.config.padded_vocab_size - tensor.shape[0]))
        ours[name] = tensor
    model.load_state_dict(ours)


def config_from_hf(hf_config) -> CompactGPT2Config:
    """The `CompactGPT2Config` of a `transformers.GPT2Config`; refuses what this module does not build."""
    for name, wanted in (("activation_function", "gelu_new"), ("tie_word_embeddings", True),
                         ("add_cross_attention", False), ("scale_attn_weights", True),
                         ("scale_attn_by_inverse_layer_idx", False), ("n_inner", None)):
        if getattr(hf_config, name, wanted) != wanted:
            _fail(f"GPT2Config.{name}", getattr(hf_config, name), f"{wanted!r} (GPT-2's own)")
    return CompactGPT2Config(
        n_layer=hf_config.n_layer, n_head=hf_config.n_head, n_embd=hf_config.n_embd, vocab_size=hf_config.vocab_size,
        n_positions=hf_config.n_positions, resid_pdrop=hf_config.resid_pdrop, embd_pdrop=hf_config.embd_pdrop,
        attn_pdrop=hf_config.attn_pdrop, layer_norm_epsilon=hf_config.layer_norm_epsilon,
        initializer_range=hf_config.initializer_range)


def from_hf(hf_model) -> CompactGPT2:
    """A `CompactGPT2` holding the weights of a `transformers.GPT2LMHeadModel`."""
    model = CompactGPT2(config_from_hf(hf_model.config))
    load_hf_state_dict(model, hf_model.state_dict())
    return model


def to_hf(model: CompactGPT2):
    """A `transformers.GPT2LMHeadModel` holding `model`'s weights (SDPA attention, no KV cache)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    end_of_text = min(50256, c.vocab_size - 1)  # GPT-2's <|endoftext|>, kept inside a smaller vocabulary
    hf_model = GPT2LMHeadModel(GPT2Config(
        n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, vocab_size=c.vocab_size, n_positions=c.n_positions,
        resid_pdrop=c.resid_pdrop, embd_pdrop=c.embd_pdrop, attn_pdrop=c.attn_pdrop,
        layer_norm_epsilon=c.layer_norm_epsilon, initializer_range=c.initializer_range,
        bos_token_id=end_of_text, eos_token_id=end_of_text, use_cache=False, attn_implementation="sdpa"))
    hf_model.load_state_dict(hf_state_dict(model))
    return hf_model


__all__ = ["CompactGPT2", "CompactGPT2Config", "GPT2Output", "LOSS_CHUNK_TOKENS", "MODEL_VERSION", "config_from_hf",
           "from_hf", "hf_state_dict", "load_hf_state_dict", "next_token_loss", "to_hf"]
