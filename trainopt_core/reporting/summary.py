"""Did the paper's claims hold? One row per claim of Tables I-IV, from a profile's tables.

Each row: the claim, the paper's change, the measured change with its 95 % CI, the verdict with
a symbol (✓ held, ✗ not held, ? inconclusive, – not measured; `verdicts` has the rule), and the
`auto` configuration's measured change beside it (the paper claims nothing for `auto`, so it has
no verdict). The tables are the ones the notebooks write from the run records
(``reports/<profile>/tables/*.csv``), so the summary says exactly what they say. A `smoke`
profile is a plumbing check: its rows carry no verdict.

    python -m trainopt_core.reporting.summary [REPORTS_DIR] [--profile quick]
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import pandas as pd

from ..reproduction.autoplan import AUTO_SENTENCE, baselines_training
from .agreement import agreement_sentence, previous_reference, previous_reference_machine, same_kind_sentence
from .environment import describe_manifest
from . import session_floor
from .results import as_number, load_records, profile_dir, stored_throughput
from .tables import change_cell, format_change
from .verdicts import verdict_category
from .._errors import fail as _fail
from ..reproduction.profiles import PROFILES

SYMBOLS = {"held": "✓", "not held": "✗", "inconclusive": "?", "not measured": "–"}
PLUMBING = "plumbing check — not evidence"
# (table file, the table's name in the summary, task)
_MAIN = (("table1_resnet", "I", "ResNet"), ("table2_gpt2", "II", "GPT-2"))
_ABLATION = (("table3_ablation_resnet", "ResNet"), ("table3_ablation_gpt2", "GPT-2"))
_SCALING = (("table4_scaling_resnet", "ResNet"),)
_NOT_JUDGED = ("no claim", "—", "modelled, not judged")


def _change(row, key: str, timed: bool = True) -> str:
    return change_cell(row, key, row.get("timing_windows") if timed else None)


def _pct(value) -> str:
    return format_change(as_number(value))  # "+27.4%", "—" where there is none


def _read(tables_dir: Path, name: str) -> pd.DataFrame | None:
    path = tables_dir / f"{name}.csv"
    return pd.read_csv(path, keep_default_na=False, na_values=[""]) if path.is_file() else None


_TASK_OF = {"ResNet": "cifar10", "GPT-2": "wikitext2"}
KEPT_BASELINE = "= the baseline: its plan found nothing faster beyond the noise"


def _auto_is_baseline(tables_dir: Path, model: str) -> bool:
    """Whether `auto`'s plan for `model`'s task (``<profile>/plans/``) kept the baseline's fp32, k=1."""
    import json

    path = tables_dir.parent / "plans" / f"plan__{_TASK_OF[model]}.json"
    try:
        chosen = json.loads(path.read_text())["plan"]["chosen"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return chosen == "fp32, k=1"


def verdict_summary(tables_dir: str | os.PathLike) -> pd.DataFrame:
    """One row per judged claim of Tables I-IV in `tables_dir`: table, claim, paper change,
    measured change (95 % CI), verdict, its category, and `auto`'s change (95 % CI) or "—" --
    or, where `auto`'s plan kept the baseline, `KEPT_BASELINE` (a +0.0 % would read as a result)."""
    tables_dir = Path(tables_dir)
    rows = []
    for name, numeral, model in _MAIN:
        table = _read(tables_dir, name)
        for _, r in (table if table is not None else pd.DataFrame()).iterrows():
            if r["claim_held"] in _NOT_JUDGED:
                continue
            metric = f"{r['metric'][0].lower()}{r['metric'][1:]}"
            rows.append(dict(table=numeral, claim=f"{model} {metric}", quantity=metric, paper=_pct(r["paper_relative"]),
                             measured=_change(r, "measured_relative"), verdict=r["claim_held"],
                             auto=_change(r, "measured_auto_relative") if "measured_auto_relative" in r else "—"))
    for name, model in _ABLATION:
        table = _read(tables_dir, name)
        if table is None:
            continue
        auto = table[table["config"] == "auto"]
        auto = auto.iloc[0] if len(auto) else None
        for _, r in table.iterrows():
            for short, what in (("time", "time to target"), ("memory", "peak memory")):
                if r[f"claim_held_{short}"] in _NOT_JUDGED:
                    continue
                timed = short == "time"
                rows.append(dict(table="III", claim=f"{model} {r['config']}: {what}", quantity=what,
                                 paper=_pct(r[f"paper_{short}_change"]),
                                 measured=_change(r, f"measured_{short}_change", timed), verdict=r[f"claim_held_{short}"],
                                 auto="—" if auto is None else _change(auto, f"measured_{short}_change", timed)))
    for name, model in _SCALING:
        table = _read(tables_dir, name)
        for _, r in (table if table is not None else pd.DataFrame()).iterrows():
            if str(r["claim_held"]) in _NOT_JUDGED:
                continue
            efficiency, low, high = (as_number(r[k]) for k in ("efficiency", "efficiency_ci_low", "efficiency_ci_high"))
            measured = "—" if not math.isfinite(efficiency) else f"{100 * efficiency:.1f}%" + (
                f" [{100 * low:.1f}, {100 * high:.1f}]" if math.isfinite(low) and math.isfinite(high) else "")
            rows.append(dict(table="IV", claim=f"{model} {r['config']}: scaling efficiency, {int(r['world_size'])} "
                                                f"processes", quantity="scaling efficiency", paper=f"{100 * as_number(r['paper_efficiency']):.1f}%",
                             measured=measured, verdict=r["claim_held"], auto="—"))
    for row in rows:
        model = next((m for m in _TASK_OF if row["claim"].startswith(m)), None)
        if model and row["auto"] != "—" and _auto_is_baseline(tables_dir, model):
            row["auto"] = KEPT_BASELINE
    frame = pd.DataFrame(rows, columns=["table", "claim", "quantity", "paper", "measured", "verdict", "auto"])
    frame["category"] = [verdict_category(v) for v in frame["verdict"]]
    # a claim not measured shows no measurement (Table III's mixed-precision rung that ran fp32 has
    # the change of the rung before it, which says nothing of mixed precision)
    frame.loc[frame["category"] == "not measured", "measured"] = "—"
    return frame


def by_quantity(summary: pd.DataFrame) -> str:
    """Which quantities each verdict fell on, most first: "Held: peak memory (6). Not held: time to
    target (3), throughput (2). ..." -- the answer in words, before the table."""
    sentences = []
    for category in SYMBOLS:
        quantities = summary.loc[summary["category"] == category, "quantity"].value_counts(sort=False)
        if len(quantities):
            ordered = sorted(quantities.items(), key=lambda item: -item[1])  # stable: the tables' order on ties
            sentences.append(f"{category[0].upper()}{category[1:]}: " + ", ".join(f"{q} ({n})" for q, n in ordered) + ".")
    return " ".join(sentences)


def counts(summary: pd.DataFrame) -> dict[str, int]:
    """How many claims fell in each category (held, not held, inconclusive, not measured)."""
    return {category: int((summary["category"] == category).sum()) for category in SYMBOLS}


def profile_summary(reports_dir: str | os.PathLike, profile: str, *, tables_dir=None) -> str:
    """`summary_markdown` of ``<reports_dir>/<profile>/tables`` (or `tables_dir`), with the data and
    hardware its runs' records name, and beside the counts what its timing intervals cover and,
    where ``previous_reference.json`` names one, the agreement check against the previous reference
    and those of the reruns on one kind of machine it lists."""
    records = load_records(reports_dir, profile)
    described = describe_manifest(records)
    context = {key: described[key] for key in ("Data", "Hardware") if key in described}
    timings = stored_throughput(profile_dir(reports_dir, profile) / "timing", ("cifar10", "wikitext2"))
    headline = []
    if timings:  # what the timing intervals cover: one session, or the machine kind's sittings too
        kind = session_floor.machine_kind(timings[0].get("manifest"))
        context["Intervals"] = session_floor.describe(kind).rstrip(".")
        if session_floor.one_session_only(kind):
            headline.append("Its throughput and time intervals cover one session only (no between-session spread is "
                            "known for this machine): a rerun may land outside them.")
    tables = Path(tables_dir) if tables_dir else Path(reports_dir) / profile / "tables"
    # no agreement to state before this profile has tables (a reproduction that has just begun)
    previous = previous_reference(reports_dir, profile) if profile != "smoke" and any(tables.glob("*.csv")) else None
    if previous is not None:
        # what a rerun on one kind of machine gives first, then the check against the previous
        # reference, which may be another kind (a reader took its "no" for "not reproducible")
        headline += filter(None, [same_kind_sentence(reports_dir, profile)])
        headline.append(agreement_sentence(profile_dir(reports_dir, profile), previous,
                                           previous.relative_to(Path(reports_dir)).as_posix(),
                                           previous_reference_machine(reports_dir, profile)))
    return summary_markdown(tables_dir or Path(reports_dir) / profile / "tables", profile=profile, context=context,
                            headline=headline, auto_sentence=baselines_training(records))


def summary_markdown(tables_dir: str | os.PathLike, *, profile: str, context: dict | None = None,
                     headline=(), auto_sentence: bool = False) -> str:
    """The summary as Markdown: a line of counts (followed by the `headline` sentences), the table
    (claims of the smoke profile carry no verdict: it is a plumbing check), and a line on what it
    was measured on (`context`: {"Data": ..., "Hardware": ...})."""
    summary = verdict_summary(tables_dir)
    if summary.empty:
        return (f"_Profile `{profile}` has no tables in this reports folder yet: the section notebooks make them "
                "from the runs (01: Tables I and II, 02: Table III, 03: Table IV), and `./run_all.sh` prints this "
                "summary at its end. The committed reference's answer is at the top of the project's README.md "
                "and of reports/README.md._\n")
    plumbing = profile == "smoke"
    if plumbing:
        head = (f"**Profile `{profile}`: a {PLUMBING}.** One seed, a window or two of timing and runs of a few "
                "steps show that the pipeline runs end to end; they say nothing about the claims.")
    else:
        head = " ".join([f"**Did the paper's claims hold? Profile `{profile}`:** " + " · ".join(
            f"{n} {SYMBOLS[c]} {c}" for c, n in counts(summary).items() if n) + ".", by_quantity(summary), *headline])
    lines = [head, "", "| Table | Claim | Paper | Measured (95% CI) | Verdict | `auto` (95% CI) |",
             "|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        verdict = PLUMBING if plumbing else f"{SYMBOLS.get(r['category'], '')} {r['verdict']}".strip()
        lines.append(f"| {r['table']} | {r['claim']} | {r['paper']} | {r['measured']} | {verdict} | {r['auto']} |")
    lines += ["", "Measured: the change from the baseline (Table IV: the scaling efficiency) with its 95 % interval "
              "(over seeds; throughput and time over interleaved timing windows; peak memory is the same in every "
              "seed, so its interval has no width); \"≥\" marks a bound, where one configuration never reached the "
              "target: what its interval guarantees. `auto`: the configuration `plan()` chose on the same machine, "
              "its change from the baseline (one configuration: the same in every Table III row); the paper "
              "claims nothing for it." + (" " + AUTO_SENTENCE if auto_sentence else "")]
    for key, value in (context or {}).items():
        lines += ["", f"{key}: {value}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports_dir", nargs="?", default="reports")
    parser.add_argument("--profile", default="quick", choices=PROFILES)
    args = parser.parse_args(argv)
    reports_dir = Path(args.reports_dir).absolute()  # from here, not from notebooks/ as a notebook's path is
    tables = reports_dir / args.profile / "tables"
    if not tables.is_dir() or not any(tables.glob("*.csv")):  # a file, a folder without the profile, or no tables yet
        _fail("reports_dir", str(tables), f"a reports folder holding <profile>/tables/ with the tables of a reproduction "
              f"(run ./run_all.sh --profile {args.profile} first)")
    print(profile_summary(reports_dir, args.profile), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
