"""The claims across machines: each claim's verdict on every kind of machine the committed
reproductions ran on, with the precision each ran and its date, rendered from their tables.

One reproduction stands for each kind: the reference for its own, and for every other kind under
``reports/other_machines/`` the one with the most judged claims, then the most seeds, then the
newest. A reader sees which claims hold everywhere, which depend on the hardware (bf16 native or
emulated, the memory system), and which hold nowhere -- and which kind their own machine is
nearest to. The GPU campaigns measure other goals (MFU, the planner at the paper's sizes) and are
linked, not counted.

    python -m trainopt_core.reporting.across_machines reports [--profile quick] [--write]

Without ``--write`` it says whether the committed files are what the tables give (exit 1 where
not); with it, it writes ``reports/claims_across_machines.{md,csv,png}`` and the README's block
between ``<!-- machines:start -->`` and ``<!-- machines:end -->``.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pandas as pd

from .agreement import describe_side
from .summary import SYMBOLS, verdict_summary

START, END = "<!-- machines:start -->\n", "<!-- machines:end -->"
NAME = "claims_across_machines"


def _judged(side_folder: Path) -> pd.DataFrame:
    return verdict_summary(side_folder / "tables")


def machines(reports_root: str | os.PathLike, profile: str = "quick") -> list[dict]:
    """The reproduction that stands for each kind of machine: the reference first, then one per
    other kind (most judged claims, then most seeds, then newest), each with its side
    (`agreement.describe_side`) and its folder relative to `reports_root`."""
    root = Path(reports_root)
    reference = root / profile
    chosen = [dict(folder=reference, role="the reference", **{"side": describe_side(reference)})]
    kinds = {chosen[0]["side"]["kind"]}
    others = root / "other_machines"
    for machine in sorted(p for p in others.iterdir() if p.is_dir()) if others.is_dir() else []:
        folders = [f / profile for f in sorted(machine.iterdir()) if (f / profile / "tables").is_dir()]
        ranked = []
        for folder in folders:
            side = describe_side(folder)
            if side["kind"] is None or side["kind"] in kinds:
                continue
            ranked.append(((len(_judged(folder)), side["seeds"] or 0, side["date"] or ""), folder, side))
        if ranked:
            _, folder, side = max(ranked, key=lambda item: item[0])
            kinds.add(side["kind"])
            chosen.append(dict(folder=folder, role=machine.name, side=side))
    for entry in chosen:
        entry["relative"] = os.path.relpath(entry["folder"], root.parent)
    return chosen


def _column(entry: dict) -> str:
    side = entry["side"]
    return f"{side['kind']} ({side['precision'] or '?'}, {side['date'] or '?'})"


def claims_frame(reports_root: str | os.PathLike, profile: str = "quick") -> tuple[pd.DataFrame, list[dict]]:
    """(one row per claim judged on any machine, a column per machine with its verdict category;
    the machines). A claim a machine's reproduction did not judge (a section not run) is "not run"."""
    entries = machines(reports_root, profile)
    claims, verdicts = [], {}
    for entry in entries:
        judged = _judged(entry["folder"])
        for table, claim, category in zip(judged["table"], judged["claim"], judged["category"]):
            if (table, claim) not in claims:
                claims.append((table, claim))  # the reference's order, then what others add
            verdicts[(table, claim, _column(entry))] = category
    order = {numeral: i for i, numeral in enumerate(("I", "II", "III", "IV"))}
    claims.sort(key=lambda key: order[key[0]])  # stable: each table's own row order
    frame = pd.DataFrame([{"table": table, "claim": claim,
                           **{_column(e): verdicts.get((table, claim, _column(e)), "not run") for e in entries}}
                          for table, claim in claims])
    return frame, entries


PATTERNS = ("held on every machine that measured it", "held on some machines, not on others", "held on some, inconclusive on the rest",
            "inconclusive everywhere", "not held on some, inconclusive on the rest", "not held on any machine")


def _pattern(row: pd.Series, columns: list[str]) -> str:
    """Where a claim held, over the machines that judged it (one of `PATTERNS`)."""
    judged = [row[c] for c in columns if row[c] not in ("not run", "not measured")]
    held, not_held = judged.count("held"), judged.count("not held")
    unsure = len(judged) - held - not_held
    if held and not not_held and not unsure:
        return PATTERNS[0]
    if held and not_held:
        return PATTERNS[1]
    if held:
        return PATTERNS[2]
    if not not_held:
        return PATTERNS[3]
    return PATTERNS[4] if unsure else PATTERNS[5]


def render_markdown(frame: pd.DataFrame, entries: list[dict]) -> str:
    columns = [_column(e) for e in entries]
    symbols = dict(SYMBOLS, **{"not run": " "})
    lines = ["# The claims across machines", "",
             "Each claim's verdict on every kind of machine the committed `quick` reproductions ran on (✓ held, ✗ not "
             "held, ? inconclusive, – not measured: the rung ran fp32 where the machine has no native bf16; blank: "
             "that reproduction did not run the section). Columns: the kind of machine (the precision its "
             "reduced-precision configurations ran, the date). Rendered from the tables by "
             "`python -m trainopt_core.reporting.across_machines reports --write`.", ""]
    for i, entry in enumerate(entries, 1):
        side = entry["side"]
        only_01 = not any((entry["folder"] / "tables").glob("table3_*.csv"))
        lines.append(f"{i}. `{entry['relative']}` ({entry['role']}): {side['hardware']}, {side['seeds']} seed(s), "
                     f"reduced precision ran {side['precision']}, {side['date']}"
                     + ("; section 01 only (Tables I and II)" if only_01 else ""))
    lines += ["", "| Table | Claim | " + " | ".join(f"{i}" for i in range(1, len(entries) + 1)) + " | where it held |",
              "|---|---|" + "---|" * len(entries) + "---|"]
    for _, row in frame.iterrows():
        lines.append(f"| {row['table']} | {row['claim']} | " + " | ".join(symbols[row[c]] for c in columns)
                     + f" | {_pattern(row, columns)} |")
    lines += ["", in_words(frame, entries), ""]
    return "\n".join(lines)


def in_words(frame: pd.DataFrame, entries: list[dict]) -> str:
    """The table's answer in sentences: the claims by where they held."""
    columns = [_column(e) for e in entries]
    patterns = frame.apply(lambda row: _pattern(row, columns), axis=1)
    parts = []
    for pattern in PATTERNS:
        claims = list(frame.loc[patterns == pattern, "claim"])
        if claims:
            parts.append(f"{pattern[0].upper()}{pattern[1:]} ({len(claims)}): " + "; ".join(claims) + ".")
    return " ".join(parts)


def readme_block(frame: pd.DataFrame, entries: list[dict]) -> str:
    """The README's lines: the machines, and how many claims fell in each pattern."""
    columns = [_column(e) for e in entries]
    patterns = frame.apply(lambda row: _pattern(row, columns), axis=1)
    kinds = "; ".join(f"{e['side']['kind']} ({e['side']['precision']}, {e['side']['date']})" for e in entries)
    counted = ", ".join(f"{int((patterns == p).sum())} {p}" for p in PATTERNS if (patterns == p).any())
    return (f"**Across machines** ({len(entries)} kinds of 2-core CPU: {kinds}), of {len(frame)} claims: {counted}. "
            f"Claim by claim, with a figure: [reports/{NAME}.md](reports/{NAME}.md).\n")


def draw(frame: pd.DataFrame, entries: list[dict], path: Path) -> None:
    """The table as a figure: claims down, machines across, one colour per verdict."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    columns = [_column(e) for e in entries]
    order = ["held", "inconclusive", "not held", "not measured", "not run"]
    values = frame[columns].apply(lambda column: column.map(order.index)).to_numpy()
    figure, axes = plt.subplots(figsize=(2.2 + 1.6 * len(columns), 0.32 * len(frame) + 1.8))
    colours = ListedColormap(["#4c9a5f", "#e0c060", "#c8504a", "#bbbbbb", "#ffffff"])
    axes.imshow(values, cmap=colours, vmin=0, vmax=len(order) - 1, aspect="auto")
    symbols = dict(SYMBOLS, **{"not run": ""})
    for (i, j), value in np.ndenumerate(values):
        axes.text(j, i, symbols[order[value]], ha="center", va="center", fontsize=9)
    axes.set_xticks(range(len(columns)), [c.replace(", ", "\n", 1).replace(" (", "\n(") for c in columns], fontsize=7)
    axes.set_yticks(range(len(frame)), [f"{t}: {c}" for t, c in zip(frame["table"], frame["claim"])], fontsize=7)
    axes.set_title("Did each claim hold? One column per kind of machine (quick profile, stand-in data)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def rendered(frame: pd.DataFrame, entries: list[dict]) -> dict[str, str]:
    """The files and the README block, as text, from `claims_frame`'s table and machines."""
    return {f"{NAME}.md": render_markdown(frame, entries), f"{NAME}.csv": frame.to_csv(index=False),
            "README block": readme_block(frame, entries)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainopt_core.reporting.across_machines",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("reports", help="the reports folder (reports/)")
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--readme", default=None, help="the README whose machines block is written (default: beside reports/)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    root = Path(args.reports)
    if not (root / args.profile / "tables").is_dir():
        parser.error(f"reports {args.reports!r} is invalid: no {args.profile}/tables/ there; allowed the reports folder")
    readme = Path(args.readme) if args.readme else root.resolve().parent / "README.md"
    frame, entries = claims_frame(root, args.profile)  # the tables read once, for the files and the figure
    out = rendered(frame, entries)
    block = START + out.pop("README block") + END
    if args.write:
        for name, text in out.items():
            (root / name).write_text(text)
        draw(frame, entries, root / f"{NAME}.png")
        text = readme.read_text()
        if START in text and END in text:
            readme.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S))
        print(f"wrote {', '.join(out)} and {NAME}.png into {root}, and the block into {readme}")
        return 0
    stale = [name for name, text in out.items() if not (root / name).is_file() or (root / name).read_text() != text]
    if readme.is_file() and block not in readme.read_text():
        stale.append(str(readme))
    print("\n".join(f"differs from the tables: {name}" for name in stale) or "the claims across machines are what the tables give")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
