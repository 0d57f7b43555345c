"""The command line of `session_floor`: estimate the between-session floors from reproductions'
timing records, or check how often a rerun lands inside another session's interval.

    python -m trainopt_core.reporting.floors reports --out trainopt_core/reporting/session_floor.json
    python -m trainopt_core.reporting.floors reports --check [--docs docs/verdicts.md]

`--docs FILE` writes the committed floors and the check's counts as the two tables of FILE
between its ``<!-- floors:start -->`` / ``<!-- floors:end -->`` and ``<!-- floors-check:start -->``
/ ``<!-- floors-check:end -->`` lines (tests/test_session_floor.py checks docs/verdicts.md's).

(Its own module: `trainopt_core.reporting` imports `session_floor`, and running an imported
module with -m warns.)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .session_floor import estimate, floors, rerun_coverage

REFERENCE = Path("reports") / "quick"  # the reference's folder, named in the floors' table when among its records
MODEL = {"cifar10": "ResNet", "wikitext2": "GPT-2"}


def floors_markdown(floor_table: dict) -> str:
    """The floors as a Markdown table: each machine kind's relative SDs and the sittings and
    sessions they come from, with the reference's timings where they are among them."""
    lines = ["| machine kind | rates (relative SD) | ratios to the baseline | sittings |", "|---|---|---|---|"]
    for kind, floor in floor_table.items():
        records = [Path(record) for record in floor["records"]]
        sessions = {record.parents[1] for record in records}  # <session>/<profile>/timing/throughput__<task>.json
        reference = sorted(MODEL.get(r.stem.removeprefix("throughput__"), r.stem) for r in records
                           if r.parents[1] == REFERENCE)
        among = f", the reference's {' and '.join(reference)} timing among them" if reference else ""
        lines.append(f"| {kind} | {100 * floor['rate']:.1f} % | {100 * floor['ratio']:.1f} % | {floor['sittings']}, on "
                     f"{floor['days']} days ({len(sessions)} sessions{among}) |")
    return "\n".join(lines) + "\n"


def coverage_markdown(coverage: dict) -> str:
    """`rerun_coverage`'s counts as a Markdown table."""
    lines = ["| | pairs | inside, with the floor | inside, one session's interval |", "|---|---|---|---|"]
    for what, title in (("rate", "rates"), ("ratio", "ratios to the baseline")):
        counted, pairs = coverage[what], max(coverage[what]["pairs"], 1)
        lines.append(f"| {title} | {counted['pairs']:,} | {counted['inside']:,} ({100 * counted['inside'] / pairs:.0f} %) "
                     f"| {counted['inside_one_session']:,} ({100 * counted['inside_one_session'] / pairs:.0f} %) |")
    return "\n".join(lines) + "\n"


def with_tables(text: str, floor_table: dict, coverage: dict) -> str:
    """`text` with its floors and rerun-check tables (between their marker lines) made again."""
    for name, table in (("floors", floors_markdown(floor_table)), ("floors-check", coverage_markdown(coverage))):
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        if start not in text or end not in text:
            raise ValueError(f"no {start.strip()} ... {end} lines to write the table between")
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: start + table + end, text, flags=re.S)
    return text


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
    parser.add_argument("--docs", metavar="FILE", help="with --check: write the committed floors and the counts as "
                        "FILE's two tables (docs/verdicts.md)")
    args = parser.parse_args(argv)
    if args.check and args.out:
        parser.error("--out is for the floors' estimate, not for --check (which prints its counts)")
    if args.fresh and not args.check:
        parser.error("--fresh is for --check (it picks the pairs counted)")
    if args.docs and (not args.check or args.fresh):
        parser.error("--docs is for --check without --fresh (its tables count every pair of sessions)")
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
        if args.docs:
            docs = Path(args.docs)
            try:
                docs.write_text(with_tables(docs.read_text(), floors(), coverage))
            except (OSError, ValueError) as error:
                parser.error(f"--docs {docs}: {error}")
            print(f"wrote the floors and these counts into {docs}")
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
