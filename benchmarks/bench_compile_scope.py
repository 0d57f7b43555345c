"""Benchmark: what compiling costs, the whole model against each repeated block (regional
compilation), from a cold and from a warm compile cache.

For each task of the profile and each compile scope (`OptimizationConfig.compile_scope`: "model",
the whole model as one graph; "blocks", each transformer Block / ResNet Bottleneck on its own), a
fresh process builds the task's model twice (same seed), the configuration `auto` trains with --
the precision this CPU computes fastest, k=1 -- once eager and once compiled, and trains both:

- compile seconds: the compiled copy's first two optimizer steps (where dynamo traces and inductor
  compiles) less two of its steady steps;
- steady speed: then the eager and the compiled copy are timed in interleaved windows (E, C, E,
  C, ...) of a few optimizer steps each; the compiled step's speed relative to the eager one is
  the median of the per-window ratios, with the range.

Each scope runs twice in a fresh process: first with an empty inductor cache
(`TORCHINDUCTOR_CACHE_DIR`, a new folder), then with the cache the first filled -- what a run pays
after a plan compiled the same graphs on the same machine.

    python benchmarks/bench_compile_scope.py [--profile quick] [--tasks wikitext2,cifar10] [--json FILE]
        [--device cuda --compile-mode reduce-overhead]

On a GPU (`--device cuda`), `--compile-mode reduce-overhead` compiles into CUDA graphs, as `plan()`'s
CUDA-graphs candidate does; both copies stay resident, so the gpu profile's GPT-2 needs two copies'
memory.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCOPES = ("model", "blocks")
WINDOWS = 5
STEPS_PER_WINDOW = 3


def child(task: str, profile: str, scope: str, device_name: str = "cpu", compile_mode: str = "default") -> dict:
    """One task, one scope, in this process (its inductor cache: the environment's)."""
    import warnings

    import torch

    from trainopt_core.config import OptimizationConfig
    from trainopt_core.precision import choose_precision
    from trainopt_core.reproduction.profiles import get_profile
    from trainopt_core.reproduction.runner import build_engine, one_optimizer_step
    from trainopt_core.reproduction.tasks import build_task

    warnings.simplefilter("ignore")
    device = torch.device(device_name)
    prof = get_profile(task, profile)
    precision = choose_precision(device)[0]
    engines = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
        cfg = OptimizationConfig(name="compiled" if compiled else "eager", precision=precision, k=1,
                                 compile=compiled, compile_scope=scope if compiled else "model",
                                 compile_mode=compile_mode if compiled else "default")
        engine, micro = build_engine(bundle, prof, cfg, device=device)
        engines[compiled] = (engine, bundle, iter(bundle.train_batches(micro, seed=0)))

    def steps(compiled: bool, n: int) -> tuple[float, int]:
        engine, bundle, batches = engines[compiled]
        start, items = time.perf_counter(), 0
        for _ in range(n):
            items += one_optimizer_step(engine, bundle, engine.model, batches)[0]  # reads the loss: syncs
        return time.perf_counter() - start, items

    first_two, _ = steps(True, 2)  # dynamo traces, inductor compiles (or loads from its cache)
    steps(False, 2)                # the eager copy's warm-up
    step_s = {False: [], True: []}  # seconds per optimizer step, window by window
    for _ in range(WINDOWS):
        for compiled in (False, True):
            step_s[compiled].append(steps(compiled, STEPS_PER_WINDOW)[0] / STEPS_PER_WINDOW)
    ratios = [e / c for e, c in zip(step_s[False], step_s[True])]
    compiled_step_s = statistics.median(step_s[True])
    return {"task": task, "scope": scope, "device": device_name, "compile_mode": compile_mode, "precision": precision, "model": engines[True][1].model_name,
            "data": engines[True][1].data_source, "first_two_steps_s": first_two,
            "compile_s": max(first_two - 2 * compiled_step_s, 0.0), "compiled_step_s": compiled_step_s,
            "eager_step_s": statistics.median(step_s[False]), "speedup": statistics.median(ratios),
            "speedup_range": [min(ratios), max(ratios)], "step_s_compiled": step_s[True],
            "step_s_eager": step_s[False]}


def run_child(task: str, profile: str, scope: str, cache_dir: str, device: str = "cpu",
              compile_mode: str = "default") -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir, "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, __file__, "--child", task, "--profile", profile, "--scope", scope,
                             "--device", device, "--compile-mode", compile_mode],
                            capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{task} {scope} failed:\n{result.stderr[-3000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - start
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--tasks", default="wikitext2,cifar10")
    parser.add_argument("--json", default=None, help="write every measurement here as well")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--compile-mode", default="default", choices=("default", "reduce-overhead"),
                        help="torch.compile's mode; reduce-overhead (CUDA graphs) needs --device cuda")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scope", default="model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_mode == "reduce-overhead" and args.device != "cuda":
        parser.error("--compile-mode reduce-overhead is invalid with --device cpu: CUDA graphs need --device cuda")
    if args.child:
        print(json.dumps(child(args.child, args.profile, args.scope, args.device, args.compile_mode)))
        return 0
    from trainopt_core.measure.manifest import run_manifest

    rows = []
    manifest = run_manifest(args.profile, args.device) if args.json else None
    print(f"[bench_compile_scope] profile {args.profile}, {args.device}, compile mode {args.compile_mode}; "
          "each line one fresh process", flush=True)
    for task in args.tasks.split(","):
        for scope in SCOPES:
            with tempfile.TemporaryDirectory(prefix="inductor_cache_") as cache:
                for phase in ("cold", "warm"):
                    row = dict(run_child(task, args.profile, scope, cache, args.device, args.compile_mode),
                               cache=phase)
                    rows.append(row)
                    if args.json:  # after every process: a run cut short keeps what it measured
                        Path(args.json).write_text(json.dumps({"manifest": manifest, "rows": rows}, indent=1))
                    low, high = row["speedup_range"]
                    print(f"{task:9s} {scope:6s} {phase}: compile {row['compile_s']:6.1f} s (first two steps "
                          f"{row['first_two_steps_s']:.1f} s; process {row['process_s']:.0f} s); compiled step "
                          f"{row['compiled_step_s'] * 1e3:.0f} ms vs eager {row['eager_step_s'] * 1e3:.0f} ms: "
                          f"{row['speedup']:.2f}x [{low:.2f}, {high:.2f}] ({row['precision']})", flush=True)
    for task in args.tasks.split(","):
        by = {(r["scope"], r["cache"]): r for r in rows if r["task"] == task}
        whole, regional = by[("model", "cold")]["compile_s"], by[("blocks", "cold")]["compile_s"]
        print(f"{task}: regional/whole compile seconds, cold cache: {regional:.1f} / {whole:.1f} s = "
              f"{regional / whole:.2f}; warm: {by[('blocks', 'warm')]['compile_s']:.1f} / "
              f"{by[('model', 'warm')]['compile_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
