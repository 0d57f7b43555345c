"""plan(base=...) on a third-party-style script: is the script's own configuration replaced when a
candidate is faster beyond the timing noise, and is the replacement faster when timed apart?

The script is examples/char_gpt*.py's (4 layers, 128 wide, block 128, batch 8 x 4 accumulation,
its own configure_optimizers, a forward that returns (logits, loss)); its configuration is fp32 (or
`--base-precision bf16`), k=4, cosine LR, clipping 1.0. The plan is made with `base=` that configuration; then the script's
configuration and the plan's are stepped interleaved (A, B, A, B, ...) through prepare(), each
window an optimizer step of the same 32 sequences, and the ratio of their rates is reported with
its 95 % interval over windows.

Run from the repository root: python benchmarks/probes/plan_base/plan_base_char_gpt.py [--windows 12]
    [--base-precision fp32|bf16]
"""
from __future__ import annotations

import argparse
import copy
import platform
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import trainopt_core  # noqa: E402
from trainopt_core.measure.stats import paired_ratio  # noqa: E402
from trainopt_core.measure.timing import interleaved_windows  # noqa: E402
from char_gpt_model import CharGPT, load_text  # noqa: E402

BATCH, ACCUMULATION, BLOCK = 8, 4, 128


def batch_of(ids: torch.Tensor, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(len(ids) - BLOCK - 1, (size,), generator=generator)
    x = torch.stack([ids[s:s + BLOCK] for s in starts])
    y = torch.stack([ids[s + 1:s + BLOCK + 1] for s in starts])
    return x, y


def stepper(model: torch.nn.Module, config, x: torch.Tensor, y: torch.Tensor):
    """One optimizer step of the effective batch (x, y) under `config`, through prepare()."""
    model = copy.deepcopy(model)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    splits = config.batch_splits
    micro = len(x) // splits
    engine = trainopt_core.prepare(model, optimizer, config, micro_batch_size=micro, total_steps=10_000,
                                   warmup_steps=20, min_lr=1e-4)

    def step() -> float:
        for i in range(splits):
            with engine.autocast():
                _, loss = model(x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro])
            engine.backward(loss, num_items=micro)
            engine.step()
        return float(len(x))
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--base-precision", default="fp32", choices=("fp32", "bf16"),
                        help="the script's precision (bf16 is emulated, slow, on a CPU without AVX-512 BF16/AMX)")
    args = parser.parse_args(argv)
    torch.manual_seed(1337)
    train, _, vocab = load_text()
    model = CharGPT(vocab, BLOCK, n_layer=4, n_embd=128, n_head=4, dropout=0.0)
    x, y = batch_of(train, BATCH * ACCUMULATION, torch.Generator().manual_seed(0))
    yours = trainopt_core.OptimizationConfig(precision=args.base_precision, k=ACCUMULATION, schedule="cosine", clip_norm=1.0)
    result = trainopt_core.plan(model, lambda m: m.configure_optimizers(0.1, 1e-3, (0.9, 0.95)), (x, y),
                                lambda m, x, y: m(x, y)[1], loss_takes_model=True, optimizer_takes_model=True,
                                base=yours, time_budget_s=None)
    print(result.explain())
    micro, k = result.split_for(BATCH, ACCUMULATION)
    print(f"\nsplit_for({BATCH}, {ACCUMULATION}) -> micro-batch {micro}, k={k}")
    chosen = result.config
    if chosen == yours:
        print("\nThe plan kept your configuration: nothing to time against it.")
        return 0
    rates = interleaved_windows({"yours": stepper(model, yours, x, y), "plan": stepper(model, chosen, x, y)},
                                windows=args.windows, steps_per_window=1, warmup_steps=2)
    ratio = paired_ratio(rates["plan"], rates["yours"])
    median = {name: sorted(r)[len(r) // 2] for name, r in rates.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip())
    print(f"\nInterleaved, {args.windows} windows of one optimizer step (32 sequences): yours {median['yours']:.1f} "
          f"seq/s, the plan's {median['plan']:.1f} seq/s (medians); the plan's rate over yours "
          f"{ratio['mean']:.3f}x [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}] (95 % interval over windows).")
    print(f"commit {commit}{' (tracked files changed)' if dirty else ''}; {platform.processor() or platform.machine()}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
