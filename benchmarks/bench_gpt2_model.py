"""Benchmark: the GPT-2 task's model, transformers' GPT2LMHeadModel vs the compact module, same weights.

Both train the same AdamW step (forward, loss, backward, optimizer step) on the same batch, timed
in interleaved windows (A, B, A, B, ...: `measure.interleaved_windows`) in one process; printed:
each one's median tokens/s over the windows with its spread (min-max), the median of the per-window
ratios compact / HF, and each one's training-step peak (the live-tensor `MemoryTracker` on a CPU,
the allocator's peak on CUDA). Sizes:
- `quick`: the task's quick model (4 layers x 128, its compacted vocabulary) on 8 sequences of 128
  tokens of its data;
- `reduced`: GPT-2 small's widths and vocabulary (768 hidden, 12 heads, 50,257 tokens) with 2 of
  its 12 layers, on 4 sequences of 256 random tokens.

    python benchmarks/bench_gpt2_model.py [--sizes quick,reduced] [--windows 7] [--steps 1] [--precision fp32]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from trainopt_core import measure  # noqa: E402
from trainopt_core.measure.tracker import MemoryTracker  # noqa: E402
from trainopt_core.reproduction import models  # noqa: E402
from trainopt_core.reproduction.gpt2 import to_hf  # noqa: E402


def quick_setup():
    """The quick profile's GPT-2 and 8 sequences of its data."""
    from trainopt_core.reproduction.profiles import get_profile
    from trainopt_core.reproduction.tasks import build_task

    torch.manual_seed(0)
    bundle = build_task(get_profile("wikitext2", "quick"), data_policy="auto", data_dir=None,
                        device=torch.device("cpu"), seed=0)
    tokens, _ = next(bundle.train_batches(8, seed=0))
    return bundle.model, tokens, bundle.model_name


def reduced_setup():
    """GPT-2 small's widths and vocabulary with 2 layers, 4 random sequences of 256 tokens."""
    torch.manual_seed(0)
    model = models.gpt2_model(n_layer=2, n_embd=768, n_head=12, vocab_size=50257, n_positions=256)
    tokens = torch.randint(0, 50257, (4, 256))
    return model, tokens, "GPT-2 small's widths, 2 of 12 layers, vocabulary 50,257"


def training_step(model, tokens, precision, device):
    """One AdamW step of `model` on `tokens`; returns the step function (it returns the tokens it trained)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[precision]

    def step() -> float:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(tokens.numel())

    return step, optimizer


def measure_size(name: str, windows: int, steps: int, precision: str, device: torch.device) -> dict:
    compact, tokens, description = {"quick": quick_setup, "reduced": reduced_setup}[name]()
    compact, tokens = compact.to(device), tokens.to(device)
    hf = to_hf(compact).to(device)  # the same weights
    steps_fns, peaks = {}, {}
    for label, model in (("transformers GPT2LMHeadModel", hf), ("compact GPT-2", compact)):
        step, optimizer = training_step(model.train(), tokens, precision, device)
        step()  # the optimizer state exists: the peak below is a steady step's
        with MemoryTracker(model, optimizer, device) as tracker:
            step()
        peaks[label], steps_fns[label] = tracker.peak_bytes, step
    rates = measure.interleaved_windows(steps_fns, windows=windows, steps_per_window=steps, warmup_steps=1,
                                        device=device)
    hf_rates, compact_rates = rates["transformers GPT2LMHeadModel"], rates["compact GPT-2"]
    return {
        "size": name, "model": description, "batch": list(tokens.shape), "precision": precision,
        "windows": windows, "steps_per_window": steps,
        "tokens_per_s": {label: {"median": statistics.median(r), "min": min(r), "max": max(r), "windows": r}
                         for label, r in rates.items()},
        "ratio_compact_over_hf": {"median": statistics.median(c / h for c, h in zip(compact_rates, hf_rates)),
                                  "min": min(c / h for c, h in zip(compact_rates, hf_rates)),
                                  "max": max(c / h for c, h in zip(compact_rates, hf_rates))},
        "step_peak_bytes": peaks, "memory_source": tracker.source,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="quick,reduced")
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps per timing window")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    device = torch.device(args.device)
    hardware = measure.hardware_fingerprint(device)
    print(f"machine: {hardware.get('gpu_name') or hardware.get('cpu_model')} ({measure.cpu_isa()}); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    results = []
    for name in [s for s in args.sizes.split(",") if s]:
        result = measure_size(name, args.windows, args.steps, args.precision, device)
        results.append(result)
        print(f"\n{name}: {result['model']}, batch {result['batch']}, {args.precision}, "
              f"{args.windows} windows of {args.steps} step(s)")
        for label, rate in result["tokens_per_s"].items():
            print(f"  {label:30s} {rate['median']:10,.0f} tok/s (windows {rate['min']:,.0f}-{rate['max']:,.0f}), "
                  f"step peak {result['step_peak_bytes'][label] / 2**20:,.1f} MiB")
        ratio = result["ratio_compact_over_hf"]
        print(f"  compact / HF, per window: median {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
