"""The command line of `session_floor`: estimate the between-session floors from reproductions'
timing records, or check how often a rerun lands inside another session's interval.

    python -m trainopt_core.reporting.floors reports --out trainopt_core/reporting/session_floor.json
    python -m trainopt_core.reporting.floors reports --check

(Its own module: `trainopt_core.reporting` imports `session_floor`, and running an imported
module with -m warns.)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .session_floor import estimate, rerun_coverage


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reporting.floors",
                                     description="Between-session floors of timing intervals")
    parser.add_argument("reports", nargs="+", help="folders searched for throughput__<task>.json records")
    parser.add_argument("--out", help="write the floors here (JSON); default: print them")
    parser.add_argument("--check", action="store_true", help="instead: how often one session's value lies inside "
                        "another's interval, with the committed floors and without")
    parser.add_argument("--fresh", action="append", default=[], metavar="FOLDER",
                        help="with --check: count only the pairs of one session under FOLDER (repeatable) and one "
                        "not -- out of sample for a reproduction made after the floors")
    args = parser.parse_args(argv)
    if args.check and args.out:
        parser.error("--out is for the floors' estimate, not for --check (which prints its counts)")
    if args.fresh and not args.check:
        parser.error("--fresh is for --check (it picks the pairs counted)")
    paths = []
    for folder in args.reports:
        if not Path(folder).is_dir():
            parser.error(f"{folder}: not a folder (allowed: folders holding reproductions' timing records)")
        paths += sorted(Path(folder).rglob("throughput__*.json"))
    if args.check:
        for folder in args.fresh:
            if not Path(folder).is_dir():
                parser.error(f"--fresh {folder}: not a folder (allowed: a folder of a reproduction's timing records)")
        if args.fresh:
            paths += [p for folder in args.fresh for p in sorted(Path(folder).rglob("throughput__*.json"))
                      if p not in paths]
        if not paths:
            parser.error(f"no timing records (throughput__<task>.json) under {' '.join(args.reports + args.fresh)}: "
                         "nothing to check (allowed: folders holding two or more sessions' timing records)")
        coverage = rerun_coverage(paths, fresh=args.fresh)
        for what, counted in coverage.items():
            pairs = max(counted["pairs"], 1)
            print(f"{what}: {counted['pairs']} ordered pairs of sessions; the other session's value inside the interval "
                  f"with the floor {counted['inside']} ({100 * counted['inside'] / pairs:.0f} %), one session's alone "
                  f"{counted['inside_one_session']} ({100 * counted['inside_one_session'] / pairs:.0f} %)")
        if not any(counted["pairs"] for counted in coverage.values()):
            print(f"floors --check: nothing to check: {len(paths)} timing record(s), but no configuration timed in two "
                  "sessions of a machine kind with a floor" + (" (one of them under --fresh)" if args.fresh else ""),
                  file=sys.stderr)
            return 1
        return 0
    if not paths:
        parser.error(f"no timing records (throughput__<task>.json) under {' '.join(args.reports)}: nothing to estimate "
                     "the floors from (allowed: folders holding two or more sessions' timing records)")
    result = {"method": "between-sitting SD of the mean log rate (method of moments), RMS over cells; "
                        "see trainopt_core/reporting/session_floor.py", "floors": estimate(paths)}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text if not args.out else f"wrote {args.out}: " + ", ".join(
        f"{k} rate {100 * v['rate']:.1f} %, ratio {100 * v['ratio']:.1f} % ({v['sittings']} sittings on {v['days']} days)"
        for k, v in result["floors"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
