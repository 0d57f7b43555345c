"""Benchmark: is `auto` the same good choice in every sitting of one machine?

For each task of the profile, `plan()` runs as the reproduction's `auto` plans it
(`autoplan.plan_task`: `base=` the baseline's configuration, one training batch of the baseline's
size, the profile's planning time budget), `--repeats` times, each in a process of its own -- first
on a quiet machine, then beside each count of busy loops in `--busy` (processes spinning on the
CPU for the whole plan). Each process also measures the CPU's peak FLOP/s as the runs' MFU
denominator does (`measure.peak_flops`), quiet processes only: the same kind of machine must give
the same peak.

It writes `plan_stability.json` (every plan: the candidate chosen, planning seconds against the
budget, the notes, the peak) and `plan_stability.md` (per task and condition: how many plans chose
the most frequent configuration, the planning seconds against the budget + 10 %, the peaks' spread),
with the commit and the machine.

    python benchmarks/bench_plan_stability.py [--profile quick] [--tasks cifar10,wikitext2] [--repeats 5]
                                              [--busy 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
print = functools.partial(print, flush=True)  # noqa: A001
BUSY_LOOP = "while True:\n    pass"
OVER_BUDGET = 1.10  # a plan may end this far past its budget


def plan_once(task: str, profile: str) -> dict:
    """One plan of `task` as `auto` makes it, in this process, and this process's peak FLOP/s."""
    import warnings

    import torch

    from trainopt_core import measure
    from trainopt_core.reproduction.autoplan import plan_task
    from trainopt_core.reproduction.profiles import get_profile
    from trainopt_core.reproduction.tasks import build_task

    warnings.simplefilter("ignore")
    load_before = os.getloadavg()[0]
    prof = get_profile(task, profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="standin", data_dir=None, device=torch.device("cpu"), seed=0)
    started = time.perf_counter()
    result = plan_task(bundle, prof, torch.device("cpu"))
    planning_s = time.perf_counter() - started
    peak, source = measure.peak_flops("cpu", "fp32", workload=bundle.flops_workload)
    return dict(task=task, profile=profile, chosen=result.chosen["candidate"], planning_s=planning_s,
                budget_s=prof.plan_time_budget_s, fell_back=result.fell_back, notes=list(result.notes),
                stage_s=dict(result.stage_s), peak_flops_per_s=peak, peak_source=source, threads=torch.get_num_threads(),
                load_before=load_before, load_after=os.getloadavg()[0])


@contextlib.contextmanager
def busy_loops(count: int):
    """`count` processes spinning on the CPU while the block runs."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        time.sleep(2.0 if loops else 0.0)  # the load established before planning starts
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def plan_in_a_process(task: str, profile: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", task, "--profile", profile], capture_output=True,
                         text=True, cwd=ROOT, timeout=1800)
    if out.returncode != 0:
        return dict(task=task, error=out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary_lines(plans: list[dict]) -> list[str]:
    """Per task and condition: the choices, the planning seconds against budget + 10 %, the peaks."""
    lines = ["| task | condition | plans | most frequent choice | chosen by | planning s (budget) | within budget + 10 % "
             "| fell back | peak GFLOP/s (spread) |", "|---|---|---|---|---|---|---|---|---|"]
    groups = collections.defaultdict(list)
    for plan in plans:
        groups[(plan["task"], plan["condition"])].append(plan)
    for (task, condition), group in groups.items():
        done = [p for p in group if "error" not in p]
        choices = collections.Counter(p["chosen"] for p in done)
        (top, count), = choices.most_common(1) or [("—", 0)]
        seconds = [p["planning_s"] for p in done]
        within = sum(p["planning_s"] <= OVER_BUDGET * p["budget_s"] for p in done)
        peaks = [p["peak_flops_per_s"] / 1e9 for p in done if p.get("peak_flops_per_s")]
        spread = f"{min(peaks):.1f}-{max(peaks):.1f} ({100 * (max(peaks) / min(peaks) - 1):.1f} %)" if peaks else "—"
        lines.append(f"| {task} | {condition} | {len(group)} | {top} | {count} of {len(group)} | "
                     f"{min(seconds, default=0):.1f}-{max(seconds, default=0):.1f} ({done[0]['budget_s'] if done else '—'}) "
                     f"| {within} of {len(group)} | {sum(p['fell_back'] for p in done)} | {spread} |")
        others = {c: n for c, n in choices.items() if c != top}
        if others:
            lines.append(f"| | | | others: {'; '.join(f'{c} ({n})' for c, n in others.items())} | | | | | |")
    return lines


def machine_line() -> str:
    from trainopt_core import measure

    manifest = measure.run_manifest(profile="quick", device="cpu")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip()
    import torch

    hardware = manifest.get("hardware", {})
    return (f"commit {commit}{' (tracked files changed)' if dirty else ''}; {hardware.get('cpu_model', '?')} "
            f"({hardware.get('cpu_family_model', '?')}, {hardware.get('cpu_isa', '?')}, {os.cpu_count()} logical "
            f"cores); torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--tasks", default="cifar10,wikitext2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", default="2", help="comma-separated counts of busy loops, each a condition "
                                                    "after the quiet one (default 2)")
    parser.add_argument("--out", default=None, help="folder for plan_stability.json and .md (default: print only)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(plan_once(args.child, args.profile), default=str))
        return 0
    print(f"[bench] importing and checking ({machine_line()}) ...")
    busy = [int(n) for n in args.busy.split(",") if n.strip()]
    plans = []
    for loops in [0] + busy:
        condition = "quiet" if loops == 0 else f"{loops} busy loops"
        with busy_loops(loops):
            for task in args.tasks.split(","):
                for repeat in range(args.repeats):
                    plan = dict(plan_in_a_process(task, args.profile), condition=condition, repeat=repeat)
                    if loops:
                        plan.pop("peak_flops_per_s", None)  # a peak under load is not the machine's
                    plans.append(plan)
                    print(f"[bench] {task} {condition} #{repeat + 1}: {plan.get('chosen', plan.get('error'))} in "
                          f"{plan.get('planning_s', float('nan')):.1f} s (budget {plan.get('budget_s')}); load "
                          f"{plan.get('load_before', float('nan')):.1f}")
    lines = [f"# plan() stability: `auto`'s plans, {args.repeats} per task and condition", "", machine_line(), "",
             *summary_lines(plans)]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan_stability.json").write_text(json.dumps(dict(machine=machine_line(), plans=plans), indent=1,
                                                            default=str))
        (out / "plan_stability.md").write_text("\n".join(lines) + "\n")
        print(f"[bench] wrote {out / 'plan_stability.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
