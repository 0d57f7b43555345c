"""Re-run run records with the current code and compare what must not change.

    python scripts/rerun_records.py reports/quick/runs --out /tmp/rerun      # re-run, then compare
    python scripts/rerun_records.py reports/quick/runs --compare /tmp/rerun  # compare only

For a seed, a run's quality, schedule, accumulation and memory are deterministic on one machine
(same code path, same data order); its clock readings are not. This compares, exactly (floats
with ==), the deterministic fields of every record in the reference folder with the record of
the same name in the other folder:

- metrics: final quality, peak memory and its breakdown by category, optimizer and skipped steps;
- history (every evaluation): samples, step, quality, train loss, lr, k, loss scale, effective
  batch, B_simple;
- steps (every optimizer step): loss, lr, k, effective batch, loss scale, gradient norm, σ², |G|²,
  B_simple, samples consumed;
- identity: configuration and its hash, data source, model size, micro-batch size.

Timing fields (time_s, throughput, time to target, wall time) and the manifest are not compared.
Exit status 0 when every record matches, 1 otherwise (each difference is printed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
print("[rerun_records] importing torch and trainopt_core (seconds; longer on a first run) ...", file=sys.stderr,
      flush=True)  # a sign of life before the imports
from trainopt_core.reproduction.records import deterministic_fields, record_differences  # noqa: E402

def rerun(reference_dir: Path, out_dir: Path) -> None:
    from trainopt_core import OptimizationConfig
    from trainopt_core.reproduction import run

    for path in sorted(reference_dir.glob("*.json")):
        if path.name.endswith(".partial.json"):
            continue
        record = json.loads(path.read_text())
        start = time.perf_counter()
        run(record["task"], OptimizationConfig.from_dict(record["config"]), profile=record["profile"],
            seed=record["seed"], out_dir=out_dir, progress=False)
        print(f"re-ran {path.name} in {time.perf_counter() - start:.0f} s", flush=True)


def compare(reference_dir: Path, other_dir: Path) -> int:
    references = sorted(p for p in reference_dir.glob("*.json") if not p.name.endswith(".partial.json"))
    if not references:
        print(f"no run records in {reference_dir}", file=sys.stderr)
        return 1
    failed = 0
    for path in references:
        other = other_dir / path.name
        if not other.is_file():
            print(f"MISSING {path.name}: no record of that name in {other_dir}")
            failed += 1
            continue
        reference = json.loads(path.read_text())
        found = record_differences(reference, json.loads(other.read_text()))
        fields = len(deterministic_fields(reference))
        print(f"{'DIFFERS' if found else 'same   '} {path.name}: {fields} deterministic fields"
              + (f", {len(found)} differ" if found else ""))
        for line in found[:20]:
            print(f"    {line}")
        failed += bool(found)
    print(f"{len(references) - failed} of {len(references)} records identical in every deterministic field")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reference", type=Path, help="folder of reference run records")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="re-run every reference record into this folder, then compare")
    group.add_argument("--compare", type=Path, help="compare with the records in this folder")
    args = parser.parse_args(argv)
    if args.out is not None:
        count = sum(not p.name.endswith(".partial.json") for p in args.reference.glob("*.json"))
        print(f"re-running the {count} run records of {args.reference} into {args.out} (each a whole training run; "
              "a line as each ends) ...", flush=True)
        rerun(args.reference, args.out)
    return compare(args.reference, args.out or args.compare)


if __name__ == "__main__":
    sys.exit(main())
