"""Benchmark: torch.compile as plan() measures it -- from a cold and from a warm compile cache.

`plan()` leaves torch.compile off on a CPU unless asked (`try_compile=True`). This shows what
asking gives. For each task of the profile it plans with `try_compile=True` twice, each in a
fresh process (as the reproduction's `auto` plans: the profile's AdamW, one training batch of
the baseline's size, the runs' length as `run_samples`): first with an empty inductor cache
(`TORCHINDUCTOR_CACHE_DIR`, a new folder), then with the cache the first filled. Printed for each
compiled candidate: its seconds to compile, its speed and its eager twin's (the same candidate
without compile), both timed interleaved with the fp32 baseline in the plan's windows, its speed
over the run (compile seconds spread over `run_samples`), the samples after which compiling pays
(compile seconds / seconds per sample saved), and what the plan chose.

    python benchmarks/bench_compile.py [--profile quick] [--tasks cifar10,wikitext2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from trainopt_core.planner.space import candidate_of  # noqa: E402


def child(task: str, profile: str) -> dict:
    """One plan with try_compile=True, in this process (its inductor cache: the environment's)."""
    import warnings

    import torch

    from trainopt_core.reproduction.autoplan import plan_task
    from trainopt_core.reproduction.profiles import get_profile
    from trainopt_core.reproduction.tasks import build_task

    warnings.simplefilter("ignore")
    prof = get_profile(task, profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=torch.device("cpu"), seed=0)
    result = plan_task(bundle, prof, torch.device("cpu"), try_compile=True)
    return {"model": bundle.model_name, "data": bundle.data_source, "plan": result.to_dict()}


def compiled_rows(plan: dict) -> list[dict]:
    """Each timed compiled candidate beside its eager twin, with the samples after which it pays."""
    out = []
    for row in plan["rows"]:
        if not row["compile"] or row.get("speedup") is None:
            continue
        eager = candidate_of(row).replace(compile=False)
        twin = next((r for r in plan["rows"] if r.get("speedup") is not None and candidate_of(r) == eager), None)
        saved = None if twin is None else twin["seconds_per_sample"] - row["seconds_per_sample"]
        out.append({"candidate": row["candidate"], "compile_s": row["compile_s"], "speedup": row["speedup"],
                    "ci": [row["speedup_ci_low"], row["speedup_ci_high"]], "speedup_over_run": row["speedup_over_run"],
                    "twin": None if twin is None else twin["candidate"],
                    "twin_speedup": None if twin is None else twin["speedup"],
                    "twin_ci": None if twin is None else [twin["speedup_ci_low"], twin["speedup_ci_high"]],
                    "pays_after_samples": (row["compile_s"] / saved) if saved and saved > 0 and row["compile_s"] else None,
                    "chosen": bool(row.get("chosen")), "rejected_because": row.get("rejected_because")})
    return out


def launch(task: str, profile: str, cache_dir: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir, "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, __file__, "--child", task, "--profile", profile], capture_output=True,
                            text=True, env=env, cwd=REPO, check=False, timeout=1800)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode or not lines:
        raise RuntimeError(f"planning {task} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT "):])
    out["process_s"] = time.perf_counter() - started
    return out


def fmt(speedup: float | None, ci: list | None) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick", choices=("smoke", "quick"))
    parser.add_argument("--tasks", default="cifar10,wikitext2")
    parser.add_argument("--json", default=None, help="also write the plans and the compiled rows here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.profile), default=str))
        return 0
    import torch

    from trainopt_core import measure
    manifest = measure.run_manifest(profile=args.profile, device=torch.device("cpu"))
    print(f"machine: {manifest['hardware']}; torch {torch.__version__}")
    report = {"manifest": manifest, "profile": args.profile, "tasks": {}}
    for task in args.tasks.split(","):
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            phases = {phase: launch(task, args.profile, cache) for phase in ("cold cache", "warm cache")}
        first = phases["cold cache"]
        print(f"\n{task}: {first['model']}; {first['data']}; run_samples {first['plan']['run_samples']:,}")
        for phase, out in phases.items():
            plan = out["plan"]
            rows = compiled_rows(plan)
            best_eager = max((r for r in plan["rows"] if not r["compile"] and r.get("speedup") is not None
                              and r.get("feasible")), key=lambda r: r["speedup"], default=None)
            print(f"  {phase}: chosen {plan['chosen']} (planning {plan['planning_s']:.1f} s, compiling "
                  f"{plan['compile_s']:.1f} s of it); fastest eager: "
                  + ("-" if best_eager is None else f"{best_eager['candidate']} "
                     + fmt(best_eager["speedup"], [best_eager["speedup_ci_low"], best_eager["speedup_ci_high"]])))
            for row in rows:
                pays = row["pays_after_samples"]
                over_run = "" if row["speedup_over_run"] is None else f"  over the run {row['speedup_over_run']:.2f}x"
                pays_text = ("no eager twin timed" if row["twin"] is None
                             else f"pays after {'never' if pays is None else f'{pays:,.0f}'} samples")
                print(f"    {row['candidate']:50s} compile {row['compile_s']:5.1f} s  {fmt(row['speedup'], row['ci'])}"
                      f"  eager twin {fmt(row['twin_speedup'], row['twin_ci'])}{over_run}  {pays_text}"
                      f"  {'CHOSEN' if row['chosen'] else (row['rejected_because'] or '')[:60]}")
            out["compiled_rows"] = rows
        report["tasks"][task] = phases
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
