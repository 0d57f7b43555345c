"""Benchmark: adaptive k against fixed k at equal samples, on a run of a third-party script's kind.

The model and data are examples/char_gpt_model.py's (a 4-block, 128-wide character-level GPT;
stand-in text: the characters of Python's argparse.py). Every configuration trains on the same
micro-batches in the same order for the same number of samples (sequences), fp32, AdamW, warmup
+ cosine over samples with clipping, and is scored on the whole validation split at the end:

    fixed       k = 4 micro-batches per optimizer step
    calibrated  adaptive k in [2, 8] from 4, k_rule "noise_scale" (sigma_target calibrated at the
                first significant estimate so that k = 4 there; k then follows the noise scale's
                growth), the LR not scaled: the defaults before "critical_batch"
    critical    adaptive k in [2, 8] from 4, k_rule "critical_batch" (k·b follows the noise scale
                B_simple itself: k grows only while the effective batch is below it), the LR not
                scaled (lr_scaling=False)
    critical_scaled  the defaults: the same with linear LR scaling (eq. 11: the LR × B_eff / B_base,
                lr_scaling's default with adaptive k) from the starting batch (k = 4: the LR given
                is the starting batch's), so a larger batch also takes a larger step
    critical_scaled_kmin  the same, lr_scaling=True: scaled from k_min's batch (k = 2), as the
                optimized preset reads eq. 11, so it starts at twice the LR given
    fixed_lr2x  fixed k = 4 at twice the LR (scaled from a batch of 2 micro-batches): the control
                for critical_scaled_kmin's higher LR

Quality is deterministic for a seed on one machine; it is compared per seed (paired with fixed k)
and over seeds (mean and 95 % t-interval of the paired difference). Seconds are printed for
information only (one run each, not interleaved).

    python benchmarks/bench_adaptive_k.py [--samples 6432] [--seeds 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.measure.stats import summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from char_gpt_model import CharGPT, load_text  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001

ADAPTIVE = dict(adaptive=True, k=4, k_min=2, k_max=8)
CONFIGS = {
    "fixed": OptimizationConfig(name="fixed", k=4),
    "calibrated": OptimizationConfig(name="calibrated", k_rule="noise_scale", lr_scaling=False, **ADAPTIVE),
    "critical": OptimizationConfig(name="critical", k_rule="critical_batch", lr_scaling=False, **ADAPTIVE),
    "critical_scaled": OptimizationConfig(name="critical_scaled", **ADAPTIVE),  # the defaults
    "critical_scaled_kmin": OptimizationConfig(name="critical_scaled_kmin", lr_scaling=True, **ADAPTIVE),
    "fixed_lr2x": OptimizationConfig(name="fixed_lr2x", k=4, lr_scaling=True),  # base batch: 2 micro-batches
}


def val_loss(model: torch.nn.Module, val: torch.Tensor, block: int) -> float:
    """Mean loss over the whole validation split, in non-overlapping windows of `block` characters."""
    starts = range(0, len(val) - block - 1, block)
    x = torch.stack([val[s:s + block] for s in starts])
    y = torch.stack([val[s + 1:s + 1 + block] for s in starts])
    model.eval()
    with torch.no_grad():
        losses = [model(xb, yb)[1] * len(xb) for xb, yb in zip(x.split(64), y.split(64))]
    model.train()
    return float(sum(losses) / len(x))


def train(name: str, seed: int, args) -> dict:
    train_data, val_data, vocab = load_text()
    torch.manual_seed(seed)
    model = CharGPT(vocab, args.block_size)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95))
    config = CONFIGS[name].replace(schedule="cosine", clip_norm=1.0)
    if name == "fixed_lr2x":
        config = config.replace(base_batch_size=2 * args.micro_batch)
    engine = prepare(model, optimizer, config, micro_batch_size=args.micro_batch, total_samples=args.samples,
                     warmup_samples=args.samples // 10, min_lr=1e-4)
    generator = torch.Generator().manual_seed(10_000 + seed)  # the same micro-batches, in order, for every config
    ks, started = [], time.perf_counter()
    while not engine.done():
        for _ in engine.micro_steps():
            ix = torch.randint(len(train_data) - args.block_size, (args.micro_batch,), generator=generator)
            x = torch.stack([train_data[i:i + args.block_size] for i in ix])
            y = torch.stack([train_data[i + 1:i + 1 + args.block_size] for i in ix])
            with engine.autocast():
                _, loss = model(x, y)
            engine.backward(loss, num_items=y.numel())
            engine.step()
        ks.append(engine.stats()["last_effective_batch_samples"] // args.micro_batch)
    seconds = time.perf_counter() - started
    stats = engine.stats()
    return {"config": name, "seed": seed, "val_loss": val_loss(model, val_data, args.block_size),
            "optimizer_steps": engine.optimizer_steps, "samples": engine.samples_consumed, "ks": ks,
            "mean_k": sum(ks) / len(ks), "k_max_reached_at_step": next((i for i, k in enumerate(ks) if k == 8), None),
            "b_simple_tokens_at_end": stats["b_simple_items"], "seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6432, help="sequences each run trains on (201 steps of 32)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--json", default=None, help="write every run's result here")
    args = parser.parse_args(argv)
    names = args.configs.split(",")
    for name in names:
        if name not in CONFIGS:
            parser.error(f"--configs: {name!r} is invalid: allowed {', '.join(CONFIGS)}")
    if "fixed" not in names:
        parser.error("--configs must include 'fixed': the others are compared with it")
    runs = []
    for seed in range(args.seeds):
        for name in names:
            runs.append(train(name, seed, args))
            run = runs[-1]
            print(f"seed {seed} {name:10s} val loss {run['val_loss']:.4f}  steps {run['optimizer_steps']:3d}  "
                  f"mean k {run['mean_k']:.2f}  k=8 from step {run['k_max_reached_at_step']}  "
                  f"B_simple {run['b_simple_tokens_at_end'] or float('nan'):.0f} tokens  {run['seconds']:.0f} s")
            if args.json:
                Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "runs": runs}, indent=1))
    fixed = {run["seed"]: run["val_loss"] for run in runs if run["config"] == "fixed"}
    print(f"\nAt {args.samples:,} sequences each, the whole validation split's loss, minus fixed k's (paired by seed):")
    for name in names:
        own = [run for run in runs if run["config"] == name]
        losses = summarize([run["val_loss"] for run in own])
        per_seed = ", ".join(f"{run['val_loss']:.4f}" for run in own)
        line = f"  {name:10s} {losses['mean']:.4f} (seeds {per_seed})"
        if name != "fixed":
            diff = summarize([run["val_loss"] - fixed[run["seed"]] for run in own])
            line += f"  difference {diff['mean']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}]"
        print(line + f"  steps {sorted({run['optimizer_steps'] for run in own})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
