"""Benchmark: adaptive k against fixed k at equal samples, on two models of a third-party script's kind.

The model is examples/char_gpt_model.py's (a 4-block, 128-wide character-level GPT), in two
settings, each on a stand-in text (Python source that ships with Python; no named corpus):

    b64_argparse  block 64, on the characters of argparse.py (char_gpt.py's own text): the setting
                  of docs/adopting.md's earlier table. A run reads its 89,694 training characters
                  4.6 times over.
    b128_stdlib   block 128, char_gpt.py's model at the size a user adopted it at, on the first
                  2,000,000 ASCII characters of the standard library's top-level modules (sorted by
                  name): a run reads 0.46 of its 1.8 M training characters, none twice on average.

Every run trains on the same sequences in the same order for the same number of samples (6,432
sequences: char_gpt.py's 201 iterations of 8 x 4), fp32, AdamW at LR 1e-3 (weight decay 0.1),
warmup + cosine to 1e-4 over samples, clipping at 1.0, and is scored on the whole validation
split at the end. The arms (micro-batches of 8 sequences unless said):

    fixed           k = 4
    adaptive        the defaults: k in [2, 8] from 4, k_rule "critical_batch" (k·b follows the
                    measured noise scale B_simple), the LR following the batch from the starting
                    one (lr_scaling=None: × k / 4)
    adaptive_fixed_lr  the same with the LR not scaled (lr_scaling=False)
    adaptive_kmin_lr   the same with the LR scaled from k_min's batch (lr_scaling=True: × k / 2,
                    twice the LR given at the start)
    fixed_lr2x      fixed k = 4 at twice the LR: the control for adaptive_kmin_lr's higher LR
    small_kmin      micro-batches of 1 sequence, k in [2, 64] from 32, the defaults otherwise: the
                    same effective batches at the top, but k_min's batch (2 sequences) near the
                    noise scale a run starts at, so k can follow B_simple from the first steps

Validation loss at equal samples is deterministic for a seed on one machine (the machine's load
does not change it); each arm is compared with fixed k per seed and over seeds (mean and 95 %
t-interval of the paired difference). Seconds are printed for information only. Runs go to
`--workers` processes of one thread each.

    python benchmarks/bench_adaptive_k.py [--models b64_argparse,b128_stdlib] [--seeds 3] [--workers 2]
                                          [--out benchmarks/results/adaptive_k]
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import sys
import time
from pathlib import Path

import torch

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.measure.manifest import run_manifest
from trainopt_core.measure.stats import summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from char_gpt_model import CharGPT, load_text  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001

SAMPLES = 6432  # sequences per run: 201 steps of 8 x 4
BATCH = 32  # sequences of fixed k's effective batch
LR, MIN_LR = 1e-3, 1e-4
MODELS = {  # (block size, text, the arms run by default)
    "b64_argparse": (64, "argparse", ("fixed", "adaptive", "adaptive_fixed_lr", "adaptive_kmin_lr", "fixed_lr2x")),
    "b128_stdlib": (128, "stdlib", ("fixed", "adaptive", "small_kmin")),
}
STDLIB_CHARACTERS = 2_000_000
ADAPTIVE = dict(adaptive=True, k=4, k_min=2, k_max=8)
ARMS = {  # name: (configuration, sequences per micro-batch)
    "fixed": (OptimizationConfig(name="fixed", k=4), 8),
    "adaptive": (OptimizationConfig(name="adaptive", **ADAPTIVE), 8),
    "adaptive_fixed_lr": (OptimizationConfig(name="adaptive_fixed_lr", lr_scaling=False, **ADAPTIVE), 8),
    "adaptive_kmin_lr": (OptimizationConfig(name="adaptive_kmin_lr", lr_scaling=True, **ADAPTIVE), 8),
    "fixed_lr2x": (OptimizationConfig(name="fixed_lr2x", k=4, lr_scaling=True, base_batch_size=16), 8),
    "small_kmin": (OptimizationConfig(name="small_kmin", adaptive=True, k=32, k_min=2, k_max=64), 1),
}


def stdlib_text() -> tuple[torch.Tensor, torch.Tensor, int]:
    """(train ids, val ids, vocabulary size): the first STDLIB_CHARACTERS ASCII characters of the
    standard library's top-level modules, in name order, 90 % / 10 %."""
    files = sorted(Path(argparse.__file__).parent.glob("*.py"))
    text = "".join(path.read_text(encoding="utf-8") for path in files).encode("ascii", "ignore").decode()
    text = text[:STDLIB_CHARACTERS]
    index = {c: i for i, c in enumerate(sorted(set(text)))}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(0.9 * len(ids))
    return ids[:cut], ids[cut:], len(index)


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


def train(model_name: str, arm: str, seed: int, samples: int = SAMPLES) -> dict:
    """One run: the arm's configuration on the model, `samples` sequences, scored at the end."""
    torch.set_num_threads(1)
    block, text, _ = MODELS[model_name]
    config, micro = ARMS[arm]
    train_data, val_data, vocab = load_text() if text == "argparse" else stdlib_text()
    torch.manual_seed(seed)
    model = CharGPT(vocab, block)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=LR, betas=(0.9, 0.95))
    engine = prepare(model, optimizer, config.replace(schedule="cosine", clip_norm=1.0), micro_batch_size=micro,
                     total_samples=samples, warmup_samples=samples // 10, min_lr=MIN_LR)
    generator = torch.Generator().manual_seed(10_000 + seed)  # the same sequences, in order, for every arm
    ks, lrs, noise, started = [], [], [], time.perf_counter()
    while not engine.done():
        for _ in engine.micro_steps():
            ix = torch.randint(len(train_data) - block, (micro,), generator=generator)
            x = torch.stack([train_data[i:i + block] for i in ix])
            y = torch.stack([train_data[i + 1:i + 1 + block] for i in ix])
            with engine.autocast():
                _, loss = model(x, y)
            engine.backward(loss, num_items=y.numel())
            engine.step()
        stats = engine.stats()
        ks.append(stats["last_effective_batch_samples"] // micro)
        lrs.append(stats["last_lr"])
        noise.append(stats["b_simple_items"] if stats["noise_significant"] else None)
    seconds = time.perf_counter() - started
    first_noise = next((b for b in noise if b is not None), None)
    return {"model": model_name, "arm": arm, "seed": seed, "block": block, "micro_batch": micro,
            "val_loss": val_loss(model, val_data, block), "optimizer_steps": engine.optimizer_steps,
            "samples": engine.samples_consumed, "ks": ks, "lrs": lrs, "b_simple_tokens": noise,
            "mean_batch_sequences": engine.samples_consumed / engine.optimizer_steps,
            "b_simple_tokens_first": first_noise, "b_simple_tokens_end": noise[-1], "seconds": seconds}


def _train(job: tuple[str, str, int, int]) -> dict:
    return train(*job)


def _range(values, spec: str = ",.0f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}-{high}"


def _difference(own: list[dict], fixed: dict) -> str:
    diff = summarize([run["val_loss"] - fixed[run["seed"]] for run in own])
    interval = "" if diff["ci_low"] is None else f" [{diff['ci_low']:+.3f}, {diff['ci_high']:+.3f}]"
    return f"{diff['mean']:+.3f}{interval}"


def summary_lines(runs: list[dict], models: list[str], arms: list[str] | None, samples: int) -> list[str]:
    """A markdown table per model: each arm's validation loss at `samples` sequences, minus fixed
    k's paired by seed (mean and 95 % t-interval over seeds), its optimizer steps, the steps it
    spent at k_min and the noise scale it measured."""
    lines = [f"At {samples:,} sequences each, the whole validation split's loss; each arm minus fixed k's, paired "
             "by seed (mean [95 % t-interval over seeds]); ranges over seeds."]
    for model in models:
        mine = [run for run in runs if run["model"] == model]
        fixed = {run["seed"]: run["val_loss"] for run in mine if run["arm"] == "fixed"}
        lines += ["", f"{model}: block {MODELS[model][0]}, text {MODELS[model][1]}",
                  "| arm | loss (mean) | minus fixed k's | optimizer steps | steps at k_min | B_simple, first significant "
                  "-> end (tokens) |", "|---|---|---|---|---|---|"]
        for arm in arms or MODELS[model][2]:
            own = sorted((run for run in mine if run["arm"] == arm), key=lambda run: run["seed"])
            config = ARMS[arm][0]
            at_k_min = _range([sum(k == config.k_min for k in run["ks"]) for run in own]) if config.adaptive else "-"
            noise = (f"{_range([run['b_simple_tokens_first'] for run in own])} -> "
                     f"{_range([run['b_simple_tokens_end'] for run in own])}" if config.adaptive else "-")
            lines.append(f"| {arm} | {summarize([run['val_loss'] for run in own])['mean']:.3f} | "
                         f"{'-' if arm == 'fixed' else _difference(own, fixed)} | "
                         f"{_range([run['optimizer_steps'] for run in own])} | {at_k_min} | {noise} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--arms", default=None, help=f"comma-separated subset of {','.join(ARMS)} (default: each "
                        "model's own, MODELS)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=SAMPLES, help="sequences each run trains on")
    parser.add_argument("--workers", type=int, default=2, help="processes (one thread each)")
    parser.add_argument("--out", default=None, help="write OUT.json (every run) and OUT.txt (the summary)")
    args = parser.parse_args(argv)
    models, arms = args.models.split(","), None if args.arms is None else args.arms.split(",")
    for flag, names, allowed in (("--models", models, MODELS), ("--arms", arms or [], ARMS)):
        for name in names:
            if name not in allowed:
                parser.error(f"{flag}: {name!r} is invalid: allowed {', '.join(allowed)}")
    if arms is not None and "fixed" not in arms:
        parser.error("--arms must include 'fixed': the others are compared with it")
    manifest = run_manifest(profile="bench_adaptive_k", device="cpu", command=" ".join(["python", *sys.argv]))
    jobs = [(model, arm, seed, args.samples) for seed in range(args.seeds) for model in models
            for arm in arms or MODELS[model][2]]
    runs, started = [], time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for run in pool.imap_unordered(_train, jobs):
            runs.append(run)
            print(f"{run['model']} seed {run['seed']} {run['arm']:18s} val loss {run['val_loss']:.4f}  steps "
                  f"{run['optimizer_steps']:4d}  B_simple first {run['b_simple_tokens_first'] or float('nan'):,.0f} "
                  f"end {run['b_simple_tokens_end'] or float('nan'):,.0f} tokens  {run['seconds']:.0f} s")
    lines = summary_lines(runs, models, arms, args.samples)
    wall_s, hardware = time.perf_counter() - started, manifest["hardware"]
    lines += ["", f"Wall time {wall_s:,.0f} s on {args.workers} worker(s) of one thread; commit "
              f"{manifest['git']['commit']} (tracked files changed: {manifest['git']['dirty']}); {hardware['cpu_model']} "
              f"({hardware['cpu_id']}, {hardware['cpu_isa']}, {hardware['cpu_logical_cores']} logical cores); "
              f"{manifest['command']}"]
    print("\n" + "\n".join(lines))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps({"manifest": manifest, "samples": args.samples, "wall_s": wall_s, "runs": runs},
                                                       indent=1))
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
