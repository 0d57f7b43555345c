"""Do two reproductions agree? Compare the tables of two report folders.

    python -m trainopt_core.reporting.agreement reports/quick /tmp/rerun/quick --out agreement.md

Reads the CSV tables (numbers, not the formatted Markdown) of Tables I-IV in both folders'
``tables/`` and lists:

- every cell whose verdict differs ("held" / "not held" / "inconclusive"; the reason in
  brackets may differ without counting as a flip);
- every measured quantity with a 95 % CI (changes, throughputs, efficiencies) whose value in one
  run lies outside the other run's interval ("moved beyond its CI"), and among them the throughput
  and time ratios (optimized/baseline, `auto`/baseline, each ladder or leave-one-out configuration
  vs the baseline): the bar. Those intervals carry the machine kind's between-session floor
  (`session_floor`), so they say where a rerun on that kind lands;
- as context, every throughput ratio that moved by more than ±5 % between the two
  (`RATIO_TOLERANCE`: the former bar, which measured the machine's drift more than the software).

Beside them, as context and not part of the bar, each configuration's speed in the two folders'
timing windows (``timing/throughput__<task>.json``) and that of the machine probes timed in the
same rounds: interleaving cancels a change in the machine's state only where it slows every
configuration alike, so ratios move when the configurations' speeds changed by different amounts.

Exit status 1 when a verdict flipped or a throughput or time ratio lies outside the other run's
interval, 2 when there was nothing to compare, else 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

from ..reproduction.throughput import load_throughput
from .environment import describe_hardware
from .session_floor import machine_kind
from .verdicts import verdict_category
from .._errors import fail as _fail

RATIO_TOLERANCE = 0.05
# Row keys of the tables compared (by file-name prefix).
_KEYS = {"table1": ("metric",), "table2": ("metric",), "table3": ("config",), "table4": ("config", "source", "world_size")}
# Changes that are throughput ratios minus one: (file prefix, key value or None, column).
_THROUGHPUT_RATIOS = (("table1", "Throughput", "measured_relative"), ("table2", "Throughput", "measured_relative"),
                      ("table3", None, "measured_throughput_change"))
# The bar: ratios of throughput and of time to target to the baseline, (file prefix, key values or
# None for every row, columns); each must lie inside the other run's interval.
_TIMING_RATIOS = (("table1", ("Throughput", "Time to target"), ("measured_relative", "measured_auto_relative")),
                  ("table2", ("Throughput", "Time to target"), ("measured_relative", "measured_auto_relative")),
                  ("table3", None, ("measured_time_change", "measured_throughput_change")))


def _timing_ratio(name: str, row_key, column: str) -> bool:
    return any(name.startswith(prefix) and (keys is None or row_key in keys) and column in columns
               for prefix, keys, columns in _TIMING_RATIOS)


def _tables(folder: Path) -> dict[str, pd.DataFrame]:
    tables = {}
    for path in sorted((folder / "tables").glob("table*.csv")):
        prefix = path.stem.split("_")[0]
        if prefix in _KEYS:
            tables[path.stem] = pd.read_csv(path)
    return tables


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def compare_reports(first: str | Path, second: str | Path) -> dict:
    """Differences between the tables of two report folders (``reports/<profile>``)."""
    first, second = Path(first), Path(second)
    a_tables, b_tables = _tables(first), _tables(second)
    out = dict(first=str(first), second=str(second), tables=sorted(set(a_tables) & set(b_tables)),
               missing=sorted(set(a_tables) ^ set(b_tables)), verdict_flips=[], beyond_ci=[], ratio_moves=[],
               ratios_outside=[], ratios_compared=0, timing_ratios_compared=0, verdicts_compared=0)
    for name in out["tables"]:
        keys = [k for k in _KEYS[name.split("_")[0]] if k in a_tables[name].columns]
        a = a_tables[name].set_index(keys)
        b = b_tables[name].set_index(keys)
        for row_key in a.index.intersection(b.index):
            label = f"{name}: {row_key if not isinstance(row_key, tuple) else ' / '.join(map(str, row_key))}"
            ra, rb = a.loc[row_key], b.loc[row_key]
            for column in (c for c in a.columns if c.startswith("claim_held") and c in b.columns):
                va, vb = str(ra[column]), str(rb[column])
                out["verdicts_compared"] += 1
                if verdict_category(va) != verdict_category(vb):
                    out["verdict_flips"].append(dict(cell=f"{label} [{column}]", first=va, second=vb))
            for column in (c for c in a.columns if f"{c}_ci_low" in a.columns and f"{c}_ci_high" in a.columns
                           and c in b.columns):
                values = [ra[column], rb[column], ra[f"{column}_ci_low"], ra[f"{column}_ci_high"],
                          rb[f"{column}_ci_low"], rb[f"{column}_ci_high"]]
                if not all(_finite(v) for v in values):
                    continue
                x_a, x_b, lo_a, hi_a, lo_b, hi_b = values
                timing_ratio = _timing_ratio(name, row_key, column)
                out["timing_ratios_compared"] += timing_ratio
                if not (lo_a <= x_b <= hi_a and lo_b <= x_a <= hi_b):
                    moved = dict(cell=f"{label} [{column}]", first=x_a, first_ci=(lo_a, hi_a),
                                 second=x_b, second_ci=(lo_b, hi_b))
                    out["beyond_ci"].append(moved)
                    if timing_ratio:
                        out["ratios_outside"].append(moved)
            for prefix, key_value, column in _THROUGHPUT_RATIOS:
                if name.startswith(prefix) and (key_value is None or row_key == key_value) and column in a.columns:
                    if _finite(ra[column]) and _finite(rb[column]):
                        out["ratios_compared"] += 1
                        moved = (1 + rb[column]) / (1 + ra[column]) - 1
                        if abs(moved) > RATIO_TOLERANCE:
                            out["ratio_moves"].append(dict(cell=f"{label} [{column}]", first=1 + ra[column],
                                                           second=1 + rb[column], moved=moved))
    out["sides"] = [describe_side(first), describe_side(second)]
    kinds = [side["kind"] for side in out["sides"]]
    # across two kinds of machine the speed ratios are not expected to agree (bf16 on one, fp32 on the
    # other; another memory system): verdicts are what can agree
    out["across_kinds"] = None not in kinds and kinds[0] != kinds[1]
    out["agree"] = not out["verdict_flips"] and (out["across_kinds"] or not out["ratios_outside"])
    out["speeds"] = compare_speeds(first, second)
    return out


def describe_side(folder: str | Path) -> dict:
    """What a report folder's reproduction was, from its timing records: profile, seeds, timing
    windows (and steps each), the machine kind and its hardware in words, and the precision its
    reduced-precision configurations ran in."""
    folder = Path(folder)
    timings = _throughput_records(folder)
    first = next(iter(timings.values()), None)
    kind, hardware = _machine(folder)
    date = str(((first or {}).get("manifest") or {}).get("date_utc") or "")[:10] or None
    return dict(folder=str(folder), profile=first.get("profile") if first else None, date=date,
                seeds=first.get("seeds") if first else None, windows=first.get("windows") if first else None,
                steps_per_window=first.get("steps_per_window") if first else None, kind=kind, hardware=hardware,
                precision=reduced_precision_ran(folder) or _optimized_precision(timings))


def _optimized_precision(timings: dict) -> str | None:
    """The precision `optimized` ran in, from the timing records (a reproduction without Table III)."""
    ran = {str(r["results"]["optimized"].get("precision")) for r in timings.values()
           if "optimized" in r.get("results", {}) and r["results"]["optimized"].get("precision")}
    return "/".join(sorted(ran)) or None


def side_words(side: dict) -> str:
    """One side of a comparison in words: "quick, 3 seeds, 12 timing windows of 6 steps, <hardware>,
    reduced precision ran bf16"."""
    parts = [side["profile"] or "profile not recorded",
             f"{side['seeds']} seed{'s' if side['seeds'] != 1 else ''}" if side["seeds"] else "seeds not recorded",
             (f"{side['windows']} timing windows of {side['steps_per_window']} steps" if side["windows"]
              else "no timing records"), side["hardware"],
             f"reduced precision ran {side['precision']}" if side["precision"] else "precision not recorded"]
    return ", ".join(parts)


def _throughput_records(folder: Path) -> dict[str, dict]:
    """{task: finished throughput record} of a report folder's timing/ (`load_throughput` decides
    what is finished, as the reproduction does when it reuses one)."""
    timing = folder / "timing"
    tasks = (path.stem.partition("__")[2] for path in sorted(timing.glob("throughput__*.json")))
    return {task: record for task in tasks if (record := load_throughput(timing, task)) is not None}


def compare_speeds(first: str | Path, second: str | Path) -> list[dict]:
    """Median rate in the timing windows of every configuration (timed itself, not as a twin)
    and machine probe that both folders timed, per task, and its change from first to second."""
    a_records, b_records = _throughput_records(Path(first)), _throughput_records(Path(second))
    rows = []
    for task in sorted(set(a_records) & set(b_records)):
        a, b = a_records[task], b_records[task]
        pairs = [(name, result, b["results"].get(name)) for name, result in a["results"].items()]
        for name, ra, rb in pairs:
            if rb is None or "timed_as" in ra or "timed_as" in rb:
                continue
            rows.append(dict(task=task, what=name, unit=ra.get('item_unit', 'items/s'),
                             first=statistics.median(ra["items_per_s"]), second=statistics.median(rb["items_per_s"]),
                             same_config=ra.get("config_hash") == rb.get("config_hash")))
        probes_b = b.get("machine_probes", {})
        for name, pa in a.get("machine_probes", {}).items():
            if name in probes_b:
                rows.append(dict(task=task, what=f"machine probe: {name}", unit=pa["unit"],
                                 first=statistics.median(pa["per_window"]),
                                 second=statistics.median(probes_b[name]["per_window"]), same_config=True))
    for row in rows:
        row["change"] = row["second"] / row["first"] - 1 if row["first"] > 0 else math.nan
    return rows


def _outside_table(title: str, cells: list[dict]) -> list[str]:
    if not cells:
        return []
    return ([f"## {title}", "", "| cell | first [CI] | second [CI] |", "|---|---|---|"]
            + [f"| {m['cell']} | {m['first']:.4g} [{m['first_ci'][0]:.4g}, {m['first_ci'][1]:.4g}] | "
               f"{m['second']:.4g} [{m['second_ci'][0]:.4g}, {m['second_ci'][1]:.4g}] |" for m in cells] + [""])


def format_agreement(result: dict) -> str:
    """The comparison as Markdown."""
    sides = result.get("sides") or [describe_side(result["first"]), describe_side(result["second"])]
    lines = [f"# Rerun agreement: `{result['first']}` vs `{result['second']}`", "",
             "What is compared:", "", f"- first: {side_words(sides[0])}", f"- second: {side_words(sides[1])}", ""]
    if result.get("across_kinds"):
        lines += ["**Across two kinds of machine.** Speed and time ratios are not expected to agree across kinds "
                  "(another precision where one has native bf16, another memory system): only the verdicts are "
                  "compared, and the ratios are not listed.", "",
                  f"- verdicts compared: {result['verdicts_compared']}, differing: **{len(result['verdict_flips'])}**", "",
                  f"Verdicts agree: **{'yes' if result['agree'] else 'no'}**", ""]
        if result["verdict_flips"]:
            lines += ["## Verdicts that differ", "", "| cell | first | second |", "|---|---|---|"]
            lines += [f"| {f['cell']} | {f['first']} | {f['second']} |" for f in result["verdict_flips"]] + [""]
        return "\n".join(lines)
    lines += [f"Tables compared: {', '.join(result['tables']) or 'none'}"
             + (f"; only in one folder: {', '.join(result['missing'])}" if result["missing"] else ""), "",
             f"- verdicts compared: {result['verdicts_compared']}, differing: **{len(result['verdict_flips'])}**",
             f"- throughput and time ratios to the baseline compared: {result['timing_ratios_compared']}, outside the "
             f"other run's 95 % CI: **{len(result['ratios_outside'])}**",
             f"- all measured values outside the other run's 95 % CI: {len(result['beyond_ci'])}",
             f"- context: throughput ratios moved by more than ±{100 * RATIO_TOLERANCE:.0f} %: "
             f"{len(result['ratio_moves'])} of {result['ratios_compared']}", "",
             f"Agreement: **{'yes' if result['agree'] else 'no'}** (the bar: no verdict differs and every "
             "throughput and time ratio lies inside the other run's 95 % CI, which carries the machine kind's "
             "between-session floor where one is known)", ""]
    if result["verdict_flips"]:
        lines += ["## Verdicts that differ", "", "| cell | first | second |", "|---|---|---|"]
        lines += [f"| {f['cell']} | {f['first']} | {f['second']} |" for f in result["verdict_flips"]] + [""]
    lines += _outside_table("Throughput and time ratios outside the other run's 95 % CI", result["ratios_outside"])
    if result["ratio_moves"]:
        lines += [f"## Throughput ratios that moved beyond ±{100 * RATIO_TOLERANCE:.0f} % (context)", "", "| cell | first | second | moved |", "|---|---|---|---|"]
        lines += [f"| {m['cell']} | {m['first']:.3f} | {m['second']:.3f} | {100 * m['moved']:+.1f}% |"
                  for m in result["ratio_moves"]] + [""]
    lines += _outside_table("Other values outside the other run's 95 % CI",
                            [m for m in result["beyond_ci"] if m not in result["ratios_outside"]])
    if result.get("speeds"):
        lines += ["## Speed in the timing windows (context, not part of the bar)", "",
                  "Median rate of each configuration and machine probe in each folder's interleaved timing windows. "
                  "Interleaving cancels a change in the machine's state only where it slows every configuration "
                  "alike; where the speeds changed by different amounts, the ratios moved. The probes (a copy far "
                  "beyond the cache, a matmul inside it) show what the machine itself could do in the same rounds.",
                  "", "| task | timed | first | second | change |", "|---|---|---|---|---|"]
        lines += [f"| {row['task']} | {row['what']}{'' if row['same_config'] else ' (another configuration: its plan differs)'} | "
                  f"{row['first']:.4g} {row['unit']} | {row['second']:.4g} {row['unit']} | {100 * row['change']:+.1f}% |"
                  for row in result["speeds"]] + [""]
    return "\n".join(lines)


# reports/previous_reference.json: {profile: the previous reference's folder, relative to reports/},
# or {profile: {"folder": ..., "machine": ..., "same_kind": [...]}} where its manifests do not record
# what kind of machine it ran on (no instruction set, no CPU family) and "machine" says it, and
# "same_kind" lists committed reruns on one kind of machine whose agreement the summary states beside
# it: {"what": in words, "folders": [two report folders relative to reports/], "records": optionally
# the comparison of their run records by scripts/rerun_records.py, relative to reports/}
PREVIOUS_REFERENCE = "previous_reference.json"


def _pointer(reports_root: str | Path, profile: str) -> dict | None:
    """`profile`'s entry of ``previous_reference.json`` as {"folder": ..., "machine": ... or None,
    "same_kind": [...]}."""
    pointer = Path(reports_root) / PREVIOUS_REFERENCE
    entry = json.loads(pointer.read_text()).get(profile) if pointer.is_file() else None
    if entry is None:
        return None
    entry = {"folder": entry} if isinstance(entry, str) else entry
    if not isinstance(entry, dict) or not isinstance(entry.get("folder"), str):
        _fail(f"{PREVIOUS_REFERENCE}[{profile!r}]", entry, 'a folder, or {"folder": ..., "machine": ...}')
    same_kind = entry.get("same_kind") or []
    if not all(isinstance(c, dict) and isinstance(c.get("what"), str) and isinstance(c.get("folders"), list)
               and len(c["folders"]) == 2 for c in same_kind):
        _fail(f"{PREVIOUS_REFERENCE}[{profile!r}]['same_kind']", same_kind,
              'a list of {"what": ..., "folders": [two report folders], "records": optional}')
    return {"folder": entry["folder"], "machine": entry.get("machine"), "same_kind": same_kind}


def previous_reference(reports_root: str | Path, profile: str) -> Path | None:
    """The folder of `profile`'s previous reference, as ``<reports_root>/previous_reference.json``
    names it (written when a reference is re-executed and the old one moved aside), or None."""
    entry = _pointer(reports_root, profile)
    if entry is None:
        return None
    if not (Path(reports_root) / entry["folder"] / "tables").is_dir():
        _fail(f"{PREVIOUS_REFERENCE}[{profile!r}]", entry["folder"], "a report folder under reports/ holding tables/ "
              "(e.g. other_machines/<machine>/quick)")
    return Path(reports_root) / entry["folder"]


def previous_reference_machine(reports_root: str | Path, profile: str) -> str | None:
    """What ``previous_reference.json`` says of the previous reference's machine, or None."""
    entry = _pointer(reports_root, profile)
    return entry["machine"] if entry else None


def _machine(folder: Path) -> tuple[str | None, str]:
    """(the machine kind a timing floor is looked up by, or None; the hardware in words) of a
    report folder, from its first timing record's manifest."""
    timings = _throughput_records(folder)
    manifest = next(iter(timings.values())).get("manifest") if timings else None
    kind = machine_kind(manifest)
    return (None if kind is None or "unknown" in kind else kind), describe_hardware(manifest or {}) or "its machine unknown"


def reduced_precision_ran(folder: str | Path) -> str | None:
    """The precision the reduced-precision configurations of a report folder ran in ("bf16",
    "fp32" where none could run reduced), from Table III's "precision" column; None without it."""
    ran = set()
    for path in sorted((Path(folder) / "tables").glob("table3_ablation_*.csv")):
        table = pd.read_csv(path)
        if "precision" in table.columns:
            ran |= set(table.loc[table["config"] != "baseline", "precision"].dropna().astype(str))
    return ("/".join(sorted(ran - {"fp32"})) or "fp32") if ran else None


def _tables_named(result: dict) -> str:
    """The tables compared, as the paper numbers them: "Tables I-IV", "Tables I and II"."""
    numerals = [("I", "II", "III", "IV")[n - 1] for n in sorted({int(name[5]) for name in result["tables"]})]
    if len(numerals) > 2 and len(numerals) == ("I", "II", "III", "IV").index(numerals[-1]) + 1:
        return f"Tables I-{numerals[-1]}"
    return "Table " + numerals[0] if len(numerals) == 1 else f"Tables {', '.join(numerals[:-1])} and {numerals[-1]}"


def agreement_sentence(current: str | Path, previous: str | Path, name: str, machine: str | None = None) -> str:
    """The agreement check of `current` against `previous` (named `name`) in one sentence, in words a
    reader understands: the previous one's machine (as its manifests record it, or `machine` where
    they do not record its kind), whether it is the kind `current` ran on, the precision each one's
    reduced-precision configurations ran in where it differs; across kinds the verdicts only (speed
    ratios are not expected to agree there), on one kind the verdicts and the ratios."""
    result = compare_reports(previous, current)
    (kind, hardware), (current_kind, _) = _machine(Path(previous)), _machine(Path(current))
    if kind is None and machine:
        hardware = machine
    other_kind = (kind != current_kind) if kind and current_kind else "another kind" in (machine or "")
    there, here = reduced_precision_ran(previous), reduced_precision_ran(current)
    precision = f"; bf16 and the like ran {there} there, {here} here" if there and here and there != here else ""
    flips, compared = len(result["verdict_flips"]), result["verdicts_compared"]
    if other_kind:
        return (f"Against the previous reference on another kind of machine (`{name}`, {hardware}{precision}): "
                f"{'verdict cells agree' if not flips else f'{flips} of {compared} verdict cells differ'} "
                f"({compared} verdict cells of {_tables_named(result)}; speed ratios are not expected to agree across "
                "kinds and are not compared).")
    same = bool(kind and current_kind and kind == current_kind)
    return (f"Against the previous reference{' on the same kind of machine' if same else ''} (`{name}`, "
            f"{hardware}{precision}): {_in_words(result)}.")


def _in_words(result: dict) -> str:
    """A same-kind comparison in words: "verdict cells agree (0 of 10 differ), 1 of 8 speed and time
    ratios outside the other's 95 % interval"."""
    flips, compared = len(result["verdict_flips"]), result["verdicts_compared"]
    outside, ratios = len(result["ratios_outside"]), result["timing_ratios_compared"]
    # cells, not claims: a table row whose claim is "no claim" is a cell too (Table II's MFU)
    verdicts = (f"verdict cells agree (0 of {compared} differ)" if not flips
                else f"{flips} of {compared} verdict cells differ")
    return (f"{verdicts}, {outside if outside else 'none'} of {ratios} speed and time ratios outside the other's 95 % "
            f"interval ({_tables_named(result)})")


def _records_identical(path: Path) -> str | None:
    """"N of M" from the last line of scripts/rerun_records.py's comparison, or None."""
    lines = path.read_text().strip().splitlines() if path.is_file() else []
    found = re.fullmatch(r"(\d+ of \d+) records identical in every deterministic field", lines[-1]) if lines else None
    return found.group(1) if found else None


def same_kind_sentence(reports_root: str | Path, profile: str) -> str | None:
    """The agreement checks of the reruns on one kind of machine that ``previous_reference.json``
    lists for `profile` (made now, from their tables), in one sentence; None where it lists none."""
    entry, root = _pointer(reports_root, profile), Path(reports_root)
    parts, agree = [], True
    for comparison in (entry or {}).get("same_kind", []):
        first, second = comparison["folders"]
        result = compare_reports(root / first, root / second)
        agree &= result["agree"]
        shown = ", ".join(f"`{folder}`" for folder in (first, second) if folder != profile)
        part = f"{comparison['what']} ({shown}): {_in_words(result)}"
        records = comparison.get("records")
        if records:
            identical = _records_identical(root / records)
            if identical is None:
                _fail(f"{PREVIOUS_REFERENCE}[{profile!r}]['same_kind'] records", records,
                      "a comparison written by scripts/rerun_records.py, ending 'N of M records identical ...'")
            part += (f"; {identical} run records equal in every deterministic field "
                     f"(`{os.path.normpath(Path(root.name) / records)}`)")
        parts.append(part)
    if not parts:
        return None
    return ("Reruns on the same kind of machine agree: " if agree else "Reruns on the same kind of machine: ") + "; ".join(parts) + "."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reporting.agreement",
                                     description="Compare the tables of two report folders (reports/<profile>).")
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--out", default=None, help="write the comparison (Markdown) here as well")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not (Path(folder) / "tables").is_dir():
            parser.error(f"{folder!r} has no tables/ folder: pass a report folder such as reports/quick")
    profiles = [describe_side(folder)["profile"] for folder in (args.first, args.second)]
    if None not in profiles and profiles[0] != profiles[1]:
        parser.error(f"{args.second!r} is invalid beside {args.first!r}: its profile is {profiles[1]!r}, the first's "
                     f"{profiles[0]!r} (other models, batches and run lengths: their tables are not comparable); "
                     "allowed two report folders of one profile")
    result = compare_reports(args.first, args.second)
    text = format_agreement(result)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if not result["verdicts_compared"] and not result["timing_ratios_compared"]:
        print(f"agreement: nothing compared: {args.first!r} and {args.second!r} share no table row with a verdict or a "
              "throughput or time ratio (allowed: two report folders of the same profile's tables)", file=sys.stderr)
        return 2
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PREVIOUS_REFERENCE", "RATIO_TOLERANCE", "agreement_sentence", "compare_reports", "compare_speeds",
           "describe_side", "format_agreement", "main", "previous_reference", "previous_reference_machine", "reduced_precision_ran",
           "same_kind_sentence"]
