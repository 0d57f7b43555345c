"""Two GPU questions the campaign (scripts/gpu_campaign.py) raised, measured in one process.

1. CUDA graphs on the launch-bound ResNet-50 (CIFAR stem, batch 128, bf16): in the campaign's
   plan the CUDA-graphs candidate "compiled" in 0.0 s, after the default-mode candidate had
   compiled for 34 s -- was it compiled (and captured) at all, or did it run the first
   candidate's compiled code? Here the CUDA-graphs copy is built first, then the default-mode
   copy; each records its first step's seconds and how many graphs dynamo compiled for it
   (`torch._dynamo.utils.counters`), then eager, compiled and CUDA-graphs steps are timed in
   interleaved windows.
2. The GPT-2 step's LM head: the campaign's profile showed three GEMMs on an sm75 CUTLASS kernel
   taking 30 % of the bf16 step; GPT-2's vocabulary (50,257) is no multiple of 8. The same
   step with the vocabulary padded to 50,304 (a multiple of 64), timed interleaved.

    python benchmarks/probes/gpu_levers/gpu_levers_probe.py --out DIR [--device cpu --tiny]

Environment: PROBE_PRECISION (bf16, the default, or fp16) is the ResNet's precision;
PROBE_SKIP_GPT2=1 leaves out the GPT-2 part.
"""
from __future__ import annotations

import argparse
import os
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainopt_core import OptimizationConfig, measure, prepare  # noqa: E402
from trainopt_core.reproduction.models import gpt2_model, resnet_cifar  # noqa: E402


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def resnet_probe(device, tiny: bool, windows: int, steps: int) -> dict:
    batch = 8 if tiny else 128
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    precision = os.environ.get("PROBE_PRECISION", "bf16")
    modes = ["eager", "reduce-overhead", "default"] if device.type == "cuda" else ["eager", "default"]
    out, fns = {"modes": {}}, {}
    for mode in modes[1:] + modes[:1]:  # the CUDA-graphs copy compiles first
        torch.manual_seed(0)
        model = resnet_cifar(width=4 if tiny else 64).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        cfg = OptimizationConfig(precision=precision, compile=mode != "eager",
                                 compile_mode="default" if mode == "eager" else mode)
        engine = prepare(model, optimizer, cfg, micro_batch_size=batch, device=device)

        def step(engine=engine, model=model):
            with engine.autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y)
            engine.backward(loss, num_items=batch)
            engine.step()
            return float(batch)

        before = _graphs_compiled()
        started = time.perf_counter()
        step()
        measure.synchronize(device)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        step()
        measure.synchronize(device)
        second_s = time.perf_counter() - started
        out["modes"][mode] = dict(first_step_s=first_s, second_step_s=second_s,
                                  graphs_compiled=_graphs_compiled() - before)
        fns[mode] = step
        print(f"[probe] resnet {mode}: first step {first_s:.2f} s, second {second_s:.3f} s, "
              f"{out['modes'][mode]['graphs_compiled']} graphs compiled", flush=True)
    rates = measure.interleaved_windows({m: fns[m] for m in modes}, windows=windows, steps_per_window=steps,
                                        warmup_steps=3, device=device)
    for mode in modes:
        summary = measure.summarize(rates[mode])
        ratio = measure.paired_ratio(rates[mode], rates["eager"])
        out["modes"][mode].update(img_per_s=summary["mean"], ci=[summary["ci_low"], summary["ci_high"]],
                                  vs_eager=ratio["mean"], vs_eager_ci=[ratio["ci_low"], ratio["ci_high"]])
    return out


def gpt2_probe(device, tiny: bool, windows: int, steps: int) -> dict:
    size = dict(n_layer=2, n_embd=64, n_head=2, n_positions=64) if tiny else {}
    seq, batch = (64, 2) if tiny else (1024, 32)
    out, fns = {"vocab": {}}, {}
    tokens = torch.randint(0, 50257, (batch, seq), device=device)
    for vocab in (50257, 50304):
        torch.manual_seed(0)
        model = gpt2_model(vocab_size=vocab, **size).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        cfg = OptimizationConfig(precision="bf16")
        engine = prepare(model, optimizer, cfg, micro_batch_size=batch, device=device)

        def step(engine=engine, model=model):
            with engine.autocast():
                loss = model(tokens, labels=tokens).loss
            engine.backward(loss, num_items=batch * (seq - 1))
            engine.step()
            return float(batch * seq)

        fns[vocab] = step
    rates = measure.interleaved_windows({str(v): fns[v] for v in fns}, windows=windows, steps_per_window=steps,
                                        warmup_steps=3, device=device)
    for vocab in fns:
        summary = measure.summarize(rates[str(vocab)])
        ratio = measure.paired_ratio(rates[str(vocab)], rates["50257"])
        out["vocab"][vocab] = dict(tok_per_s=summary["mean"], ci=[summary["ci_low"], summary["ci_high"]],
                                   vs_50257=ratio["mean"], vs_50257_ci=[ratio["ci_low"], ratio["ci_high"]])
        print(f"[probe] gpt2 vocab {vocab}: {summary['mean']:,.0f} tok/s, {ratio['mean']:.3f}x", flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (a rehearsal on the CPU)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "manifest": measure.run_manifest(profile="gpu", device=device)}
    windows, steps = (2, 1) if args.tiny else (6, 10)
    result["resnet"] = resnet_probe(device, args.tiny, windows, steps)
    (out / "levers_probe.json").write_text(json.dumps(result, indent=1, default=str))
    if not os.environ.get("PROBE_SKIP_GPT2"):
        result["gpt2"] = gpt2_probe(device, args.tiny, windows, 1 if args.tiny else 3)
    (out / "levers_probe.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: result[k] for k in ("resnet", "gpt2") if k in result}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
