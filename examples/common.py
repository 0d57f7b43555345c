"""What every example shares and none of them is about: arguments, a small GPT-2, its data.

The data is a stand-in: tokens drawn from a fixed random bigram table (seeded), so the loss has
somewhere to fall. It is not WikiText-2 or any real text.
"""
from __future__ import annotations

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-iters", type=int, default=60, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per optimizer step")
    parser.add_argument("--accumulation-steps", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--min-lr", type=float, default=3e-4, help="learning rate at the end of the decay")
    parser.add_argument("--warmup-iters", type=int, default=6, help="optimizer steps of linear warmup")
    parser.add_argument("--grad-clip", type=float, default=0.5, help="global L2 norm the gradient is clipped to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the per-step losses here (JSON)")
    args = parser.parse_args(argv)
    if args.batch_size % args.accumulation_steps:
        parser.error(f"--batch-size={args.batch_size} is invalid: allowed a multiple of "
                     f"--accumulation-steps={args.accumulation_steps}")
    args.micro_batch_size = args.batch_size // args.accumulation_steps
    return args


def gpt(args: argparse.Namespace) -> GPT2LMHeadModel:
    """A 4-block GPT-2 (Hugging Face transformers), built from its config: no download."""
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=args.block_size,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def batches(args: argparse.Namespace, vocab_size: int = 128, length: int = 20_000):
    """get_batch(n) -> (x, y): n random windows of a bigram-chain token stream, y shifted by one.
    Deterministic for a seed, and independent of the global RNG (the model's init uses that)."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    logits = torch.randn(vocab_size, vocab_size, generator=generator) * 3.0
    transitions = torch.softmax(logits, dim=-1)
    # draw every token's successors up front, then walk the chain: stream[i] follows stream[i - 1]
    successors = torch.multinomial(transitions, length, replacement=True, generator=generator).tolist()
    tokens = [0]
    for i in range(1, length):
        tokens.append(successors[tokens[-1]][i])
    stream = torch.tensor(tokens)

    def get_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, length - args.block_size - 1, (n,), generator=generator)
        x = torch.stack([stream[s:s + args.block_size] for s in starts.tolist()])
        y = torch.stack([stream[s + 1:s + 1 + args.block_size] for s in starts.tolist()])
        return x, y

    return get_batch


def report(args: argparse.Namespace, losses: list[float], model: torch.nn.Module | None = None) -> None:
    """Print the first and last losses; with --out, write them all as JSON (and the model's final
    weights next to them, as OUT.pt, when `model` is given)."""
    print(f"{len(losses)} steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"losses": losses}, handle)
        if model is not None:
            torch.save(getattr(model, "module", model).state_dict(), f"{args.out}.pt")
