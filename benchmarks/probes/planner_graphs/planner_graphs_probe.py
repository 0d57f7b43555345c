"""Why `plan()` times CUDA graphs at 0.89-1.10x on the ResNet when the same lever, timed apart,
is 2.4-2.6x (an H200 campaign, reports/gpu/nvidia-h200/README.md). One process, the planner's
own `Trial` copies (fp16, k = 1, the paper's ResNet-50 at batch 128), timed against an eager copy
in interleaved windows after each of the steps `plan()` takes with a compiled copy:

1. `built`: the CUDA-graphs copy after its warm-up step (what `_built` does);
2. `allocator peak`: after one step under `MemoryTracker(breakdown=False)` (the allocator's peak
   only: what `_measure_one` does with a CUDA-graphs candidate);
3. `tracked`: after one step under the full MemoryTracker (its breakdown's dispatch mode and
   hooks: what `_measure_one` did before);
4. `other copy`: after a second compiled copy (mode "default") was built, stepped and released
   (what the planner does with the next compiled candidate).

After each, the compile/CUDA-graph counters (`torch._dynamo.utils.counters`) are printed, so a
re-recording or a skipped graph shows.

    python benchmarks/probes/planner_graphs/planner_graphs_probe.py --out DIR [--device cpu --tiny]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainopt_core import measure  # noqa: E402
from trainopt_core.measure.tracker import MemoryTracker  # noqa: E402
from trainopt_core.planner.space import Candidate  # noqa: E402
from trainopt_core.planner.trial import Trial  # noqa: E402
from trainopt_core.reproduction.models import resnet_cifar  # noqa: E402


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {group: dict(values) for group, values in counters.items()
            if group in ("stats", "inductor", "frames", "graph_break") and values}


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y), len(y)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny ResNet (a rehearsal on the CPU)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batch_size, width = (8, 4) if args.tiny else (128, 64)
    precision = "fp16" if device.type == "cuda" else "fp32"
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    windows, steps = (2, 1) if args.tiny else (5, 10)
    torch.manual_seed(0)
    source = resnet_cifar(width=width).to(device)
    batch = (torch.randn(batch_size, 3, 32, 32, device=device), torch.randint(0, 10, (batch_size,), device=device))

    def optimizer(parameters):
        return torch.optim.AdamW(parameters, lr=1e-4)

    def trial(candidate):
        return Trial(candidate, source, optimizer, batch, _loss, device, loss_takes_model=True)

    eager = trial(Candidate(precision=precision))
    eager.step()
    graphs = trial(Candidate(precision=precision, compile=True, compile_mode=mode))
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "mode": mode, "precision": precision, "phases": {}}

    def timed(phase: str) -> None:
        rates = measure.interleaved_windows({"eager": eager.step, "graphs": graphs.step}, windows=windows,
                                            steps_per_window=steps, warmup_steps=0, device=device)
        ratio = measure.paired_ratio(rates["graphs"], rates["eager"])
        result["phases"][phase] = dict(eager_img_s=measure.summarize(rates["eager"])["mean"],
                                       graphs_img_s=measure.summarize(rates["graphs"])["mean"],
                                       ratio=ratio["mean"], ratio_ci=[ratio["ci_low"], ratio["ci_high"]],
                                       windows=rates, counters=_counters())
        print(f"[graphs probe] {phase}: {ratio['mean']:.2f}x [{ratio['ci_low']:.2f}, {ratio['ci_high']:.2f}] "
              f"counters {_counters()}", flush=True)
        (out / "planner_graphs_probe.json").write_text(json.dumps(result, indent=1, default=str))

    graphs.step()  # _built's warm-up step
    timed("built")
    if device.type == "cuda":
        with MemoryTracker(graphs.tracked, graphs.optimizer, device, breakdown=False):
            graphs.step()
        timed("allocator peak")
    with MemoryTracker(graphs.tracked, graphs.optimizer, device):
        graphs.step()
    timed("tracked")
    other = trial(Candidate(precision=precision, compile=True))
    other.step()
    with MemoryTracker(other.tracked, other.optimizer, device):
        other.step()
    del other
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    timed("other copy")
    timed("again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
