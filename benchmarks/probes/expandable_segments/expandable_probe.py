"""Does the CUDA caching allocator's fragmentation matter for the paper's configurations?

For each configuration (GPT-2 124M and ResNet-50 at the paper's batch, `optimized` without ZeRO
and an `auto`-like bf16 k=1 step), a fresh process trains a few optimizer steps with evaluation
passes in between (as the reproduction's runs do), once with the default allocator and once with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Each child reports the allocator's peaks:
allocated (what the tensors needed) and reserved (what the process took from the device), the
allocator's retries, and the median time of an optimizer step. Reserved minus allocated is the
fragmentation an out-of-memory error would see.

    python benchmarks/probes/expandable_segments/expandable_probe.py --out DIR [--device cpu --tiny]

On the CPU (``--device cpu --tiny``) only the pipeline runs: there is no caching allocator.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CASES = ("gpt2:optimized", "gpt2:auto_like", "resnet:optimized", "resnet:auto_like")
SETTINGS = ("default", "expandable_segments")


def _child(case: str, device_name: str, tiny: bool, steps: int) -> dict:
    import torch

    from trainopt_core import OptimizationConfig, measure, prepare
    from trainopt_core.reproduction.models import gpt2_model, resnet_cifar

    device = torch.device(device_name)
    task, config_name = case.split(":")
    if config_name == "optimized":
        config = OptimizationConfig.optimized().replace(zero_stage=0)
        # the paper's batch (32 sequences, 128 images) in k=4 micro-batches; adaptive k moves 4-8
        micro = 2 if tiny else (8 if task == "gpt2" else 32)
    else:
        config = OptimizationConfig(name="auto_like", precision="bf16", optimizer_impl="fused"
                                    if device.type == "cuda" else "default")
        micro = 32 if task == "gpt2" else 128
        micro = 2 if tiny else micro
    torch.manual_seed(0)
    if task == "gpt2":
        size = dict(n_layer=2, n_embd=64, n_head=2, n_positions=64) if tiny else {}
        seq = 64 if tiny else 1024
        model = gpt2_model(**size).to(device)
        batch = lambda n: torch.randint(0, 50257, (n, seq), device=device)  # noqa: E731
        loss_of = lambda x: model(x, labels=x).loss  # noqa: E731
        items = lambda n: n * (seq - 1)  # noqa: E731
    else:
        model = resnet_cifar(width=4 if tiny else 64).to(device)
        labels = {}
        batch = lambda n: torch.randn(n, 3, 32, 32, device=device)  # noqa: E731

        def loss_of(x):
            y = labels.setdefault(x.shape[0], torch.randint(0, 10, (x.shape[0],), device=device))
            return torch.nn.functional.cross_entropy(model(x), y)
        items = lambda n: n  # noqa: E731
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine = prepare(model, optimizer, config, micro_batch_size=micro, device=device,
                     total_samples=micro * 64 * steps)
    step_seconds = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for round_ in range(3):
        model.train()
        for _ in range(steps):
            measure.synchronize(device)
            started = time.perf_counter()
            stepped = False
            while not stepped:
                x = batch(micro)
                with engine.autocast():
                    loss = loss_of(x)
                engine.backward(loss, num_items=items(micro))
                stepped = engine.step()
            measure.synchronize(device)
            step_seconds.append(time.perf_counter() - started)
        model.eval()
        with torch.no_grad(), engine.autocast():
            for n in (2 * micro, micro // 2 or 1):  # an evaluation batch and a ragged last batch
                loss_of(batch(n))
    out = dict(case=case, config=config.name, micro_batch=micro, steps=len(step_seconds),
               step_s_median=statistics.median(step_seconds[1:] or step_seconds),
               step_s_all=step_seconds,
               alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        out.update(peak_allocated_mib=torch.cuda.max_memory_allocated(device) / 2**20,
                   peak_reserved_mib=torch.cuda.max_memory_reserved(device) / 2**20,
                   reserved_end_mib=torch.cuda.memory_reserved(device) / 2**20,
                   alloc_retries=stats.get("num_alloc_retries", 0), ooms=stats.get("num_ooms", 0),
                   segments=stats.get("segment.all.peak", 0))
        out["fragmentation_mib"] = out["peak_reserved_mib"] - out["peak_allocated_mib"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (a rehearsal on the CPU)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps between evaluations")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(_child(args.child, args.device, args.tiny, args.steps)), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in args.cases.split(","):
        for setting in SETTINGS:  # fresh processes: the allocator's settings are read at start
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if setting == "expandable_segments":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            command = [sys.executable, __file__, "--out", str(out), "--device", args.device,
                       "--steps", str(args.steps), "--child", case] + (["--tiny"] if args.tiny else [])
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            result = json.loads(lines[-1][7:]) if lines else dict(case=case, error=done.stderr[-2000:])
            result["setting"] = setting
            results.append(result)
            print(f"[expandable] {case} {setting}: " + ", ".join(
                f"{k} {result[k]:.1f}" if isinstance(result[k], float) else f"{k} {result[k]}"
                for k in ("peak_allocated_mib", "peak_reserved_mib", "fragmentation_mib", "alloc_retries",
                          "step_s_median", "error") if k in result), flush=True)
            (out / "expandable_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
