"""Fault injection: do interrupted and failing runs lose or corrupt records?

Every scenario runs real child processes of the reproduction's runner (smoke profile, stand-in
data, in-run checkpoints after every optimizer step) and compares the final record with an
uninterrupted run's, in everything but wall-clock fields:

  kill          SIGKILL inside optimizer step s (every s of the run), then rerun: resumes
  kill in save  SIGKILL while a checkpoint is half-written (before its rename), then rerun
  corrupt       the newest checkpoint truncated after a kill, then rerun: the previous one is used
  failing rank  2-process DDP, rank 1 SIGKILLed inside step s, then rerun: both ranks resume
  non-finite    a nan loss in one step (fp32, bf16): skipped and counted, run completes;
                in `max_nonfinite_steps` consecutive steps: the run stops naming the step, and
                its record says "failed" (never "complete")

Prints a table (and writes it with `--out`): scenarios, runs that survived (final record equal
to the uninterrupted one; for the stopping case, the failure recorded), records lost or
corrupted (the bar: 0).

    python benchmarks/fault_injection.py [--tasks cifar10,wikitext2] [--out benchmarks/results/fault_injection.md]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from trainopt_core.reproduction.records import record_differences  # noqa: E402


# ----------------------------------------------------------------------------- child side
def child(task: str, config: str, out_dir: str, fault: str, world: int, rank_fault: bool = False) -> None:
    import torch  # noqa: F401  (import cost outside the faults)

    from trainopt_core.reproduction import resume, runner

    kind, _, arg = fault.partition(":")
    original_step, original_save = runner.one_optimizer_step, resume.save
    rank = int(os.environ.get("RANK", "0"))

    def one_optimizer_step(engine, bundle, model, batches):
        step = engine.optimizer_steps + 1
        if kind == "kill" and step == int(arg) and (world == 1 or rank == 1):
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "nan" and step in {int(s) for s in arg.split(",")}:
            loss_fn = bundle.loss

            def poisoned(model, x, y):
                loss, items = loss_fn(model, x, y)
                return loss * float("nan"), items
            bundle.loss = poisoned
            try:
                return original_step(engine, bundle, model, batches)
            finally:
                bundle.loss = loss_fn
        return original_step(engine, bundle, model, batches)

    def save(directory, step, rank_, payload):
        if kind == "killsave" and step == int(arg):
            path = directory / f"step{step:07d}.rank{rank_}.pt.partial"
            directory.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"PK\x03\x04 half a checkpoint")
            os.kill(os.getpid(), signal.SIGKILL)
        return original_save(directory, step, rank_, payload)

    runner.one_optimizer_step, resume.save = one_optimizer_step, save
    if rank_fault:
        return
    record = runner.run(task, config, profile="smoke", seed=0, out_dir=out_dir, data_policy="standin",
                        progress=False, checkpoint_every_steps=1)
    print("RECORD", json.dumps(record, default=str))


def ddp_rank(task: str, config: str, out_dir: str, fault: str) -> dict:
    child(task, config, out_dir, fault, world=2, rank_fault=True)
    from trainopt_core.reproduction import runner
    record = runner.run(task, config, profile="smoke", seed=0, out_dir=out_dir, data_policy="standin",
                        progress=False, checkpoint_every_steps=1)
    return record


def ddp_child(task: str, config: str, out_dir: str, fault: str) -> None:
    from trainopt_core.distributed import run_processes
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fault_injection
    record = run_processes(fault_injection.ddp_rank, 2, args=(task, config, out_dir, fault), backend="gloo",
                           threads_per_process=1, timeout_s=300)[0]
    print("RECORD", json.dumps(record))


# ----------------------------------------------------------------------------- parent side
def launch(task, config, out_dir, fault="none", world=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(Path(__file__).resolve().parent)])}
    command = [sys.executable, __file__, "--child", task, config, str(out_dir), fault, str(world)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RECORD ")]
    return result, (json.loads(lines[0][7:]) if lines else None)


def same(record, reference) -> bool:
    """Equal in everything a seed determines (`records.record_differences`: all but the clocks)."""
    return record is not None and not record_differences(reference, record)


def record_on_disk(out_dir: Path) -> dict | None:
    files = [p for p in Path(out_dir).glob("*.json") if not p.name.endswith(".partial.json")]
    if len(files) != 1:
        return None
    try:
        return json.loads(files[0].read_text())
    except ValueError:
        return None


def scenarios(task: str, steps: int, ddp_steps: int):
    """Kill points: every step but the last of the one-process run (the first checkpoint follows
    the memory-tracked step, smoke's 2nd: kills before it restart the run); the failing rank
    dies in the DDP run's last step."""
    for s in range(1, steps):
        yield f"kill in step {s}", [f"kill:{s}", "none"], 1
    yield "kill while saving a checkpoint", [f"killsave:{max(3, steps // 2)}", "none"], 1
    yield "corrupt newest checkpoint", [f"kill:{max(4, steps - 1)}", "corrupt", "none"], 1
    yield "failing rank (DDP, 2 processes)", [f"kill:{ddp_steps}", "none"], 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="cifar10,wikitext2")
    parser.add_argument("--config", default="optimized")
    parser.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = parser.parse_args()
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for task in args.tasks.split(","):
            for world in (1, 2):
                result, reference = launch(task, args.config, tmp / f"{task}-ref{world}", world=world)
                if reference is None:
                    raise SystemExit(f"reference run failed:\n{result.stderr[-3000:]}")
                if world == 1:
                    reference_1, steps = reference, len(reference["steps"])
                else:
                    reference_2 = reference
            for name, faults, world in scenarios(task, steps, len(reference_2["steps"])):
                out = tmp / f"{task}-{len(rows)}"
                final = None
                for fault in faults:
                    if fault == "corrupt":
                        # the run's checkpoint folder, wherever the runner keeps it (beside its curves)
                        directory = next(next(out.rglob(".checkpoints")).iterdir())
                        newest = max(directory.glob("*.pt"), key=lambda p: p.name)
                        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
                        continue
                    result, final = launch(task, args.config, out, fault, world)
                survived = same(final, reference_1 if world == 1 else reference_2)
                on_disk = record_on_disk(out)
                intact = on_disk is not None and same(on_disk, reference_1 if world == 1 else reference_2)
                rows.append((task, name, survived, not intact))
                print(f"{task:10s} {name:34s} survived={survived} record_lost_or_corrupt={not intact}", flush=True)
            for precision, config in (("fp32", "baseline"), ("bf16", "+mixed_precision")):
                out = tmp / f"{task}-nan1-{precision}"
                result, final = launch(task, config, out, "nan:2")
                ok = final is not None and final["metrics"]["skipped_steps"] == 1
                rows.append((task, f"one nan step ({precision})", ok, record_on_disk(out) is None))
                print(f"{task:10s} one nan step ({precision}): skipped_steps="
                      f"{final and final['metrics']['skipped_steps']}", flush=True)
                out = tmp / f"{task}-nan3-{precision}"
                result, final = launch(task, config, out, "nan:2,3,4")
                on_disk = record_on_disk(out) or {}
                stopped = (final is None and "optimizer step 4" in result.stderr
                           and on_disk.get("status") == "failed" and "optimizer step 4" in on_disk.get("error", ""))
                rows.append((task, f"3 consecutive nan steps ({precision})", stopped, on_disk.get("status") == "complete"))
                print(f"{task:10s} 3 nan steps ({precision}): stopped={stopped} status={on_disk.get('status')}", flush=True)
    lines = ["| task | fault injected | survived | record lost or corrupted |", "|---|---|---|---|"]
    lines += [f"| {t} | {n} | {'yes' if s else 'NO'} | {'YES' if lost else 0} |" for t, n, s, lost in rows]
    survived, lost = sum(r[2] for r in rows), sum(r[3] for r in rows)
    lines.append(f"\n{len(rows)} faults injected, {survived} survived, {lost} records lost or corrupted "
                 f"({time.perf_counter() - started:.0f} s).")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text("# Fault injection (benchmarks/fault_injection.py)\n\n" + table + "\n")
    return 0 if survived == len(rows) and lost == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        task_, config_, out_, fault_, world_ = sys.argv[2:7]
        if int(world_) == 1:
            child(task_, config_, out_, fault_, 1)
        else:
            ddp_child(task_, config_, out_, fault_)
    else:
        sys.exit(main())
