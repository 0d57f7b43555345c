"""Captions, CSV + Markdown table files, and ``reports/README.md`` (SPEC §6).

Every caption names the data that really ran -- the record's ``data_source`` string, so a
stand-in is never presented as CIFAR-10 or WikiText-2 -- plus the profile, the precision that
actually ran (with the profile's notes, e.g. fp16 -> bf16 on CPU) and the hardware.
"""
from __future__ import annotations

import json

import math
import os
import re
from pathlib import Path

import pandas as pd

from .environment import describe_hardware, describe_manifest
from .gpu_campaign import gpu_campaign_lines
from .results import load_records, resolve_reports_dir
from . import session_floor
from .._errors import fail as _fail

# Layout of one profile's folder under reports/.
SUBDIRS = {"runs": "JSON run records", "timing": "interleaved throughput windows, scaling launches, operation profiles and recompute timings (JSON)",
           "tables": "CSV numbers + captioned Markdown",
           "figures": "PNG", "notebooks": "the executed notebooks"}


# ------------------------------------------------------------------ captions
def run_context(records: list[dict]) -> dict:
    """What the reader must know to read a table: data source, model, profile, the precision
    that actually ran (with the profile's notes), hardware and number of seeds."""
    def distinct(values):
        return sorted({str(v) for v in values if v})

    notes = distinct(n for r in records for n in r.get("notes", []))
    precisions = {}
    for r in records:
        precisions.setdefault(r.get("config", {}).get("precision"), []).append(r["config_name"])
    precision = "; ".join(f"{p} ({', '.join(dict.fromkeys(names))})" for p, names in sorted(precisions.items(), key=str))
    return dict(
        data_source="; ".join(distinct(r.get("data_source") for r in records)) or "no runs",
        model="; ".join(distinct(r.get("model_name") for r in records)) or "—",
        profile=", ".join(distinct(r.get("profile") for r in records)) or "—",
        precision=precision or "—",
        notes=notes,
        hardware="; ".join(distinct(describe_hardware(r.get("manifest", {})) for r in records)) or "unknown",
        seeds=len({r.get("seed") for r in records}),
    )


def caption(title: str, records: list[dict]) -> str:
    """A table/figure caption, short: what, the data that really ran (a stand-in says so),
    profile, seeds and hardware. The rest is in `footnotes`."""
    ctx = run_context(records)
    return (f"{title}. Data: {ctx['data_source']}. Profile: {ctx['profile']}, {ctx['seeds']} seed(s). "
            f"Hardware: {ctx['hardware']}.")


_FROM_RUN = re.compile(r"^(?P<head>.+) the run of '(?P<name>[^']+)': (?P<why>.+)$")


def footnotes(records: list[dict], *, timing: bool = True, run_notes: bool = True) -> list[str]:
    """The notes of a table, each once: the model, the precision each configuration ran in, with
    `timing` what its timing intervals cover (where its records carry timing windows), then the
    runs' notes split into their clauses, with "from the run of 'X': why" clauses of the same why
    merged into one ("from the runs of 'X', 'Y': why"). Without `run_notes` (a table the runs'
    records only describe, as Table IV's launches) only their clauses on precision."""
    ctx = run_context(records)
    clauses = list(dict.fromkeys(part.strip() for note in ctx["notes"] for part in _clauses(note) if part.strip()))
    if not run_notes:
        clauses = [clause for clause in clauses if clause.lower().startswith("precision ")]
    merged: dict[tuple[str, str], list[str]] = {}
    order: list = []
    for clause in clauses:
        match = _FROM_RUN.match(clause)
        if match is None:
            order.append(clause)
            continue
        key = (match["head"], match["why"])
        if key not in merged:
            merged[key] = []
            order.append(key)
        merged[key].append(match["name"])
    notes = [f"Model: {ctx['model']}.", f"Precision that ran: {ctx['precision']}."] + _auto_notes(records)
    kinds = list(dict.fromkeys(r["timing"].get("machine_kind") for r in records if r.get("timing"))) if timing else []
    if kinds:  # what a timing interval covers (`session_floor`), and how a time's interval is made
        notes.append(session_floor.describe(kinds[0]))
        notes.append("Time to target: the geometric mean over seeds of samples to target × the timed seconds per "
                     "sample, its 95 % interval [in brackets] combined in log space.")
        notes.extend(_target_notes(records))
    for item in order:
        if isinstance(item, str):
            notes.append(item[0].upper() + item[1:] + ("" if item.endswith(".") else "."))
            continue
        (head, why), names = item, merged[item]
        runs = "the run of" if len(names) == 1 else "the runs of"
        text = f"{head} {runs} {', '.join(repr(n) for n in names)}: {why}"
        notes.append(text[0].upper() + text[1:] + ("" if text.endswith(".") else "."))
    return notes


def _target_notes(records: list[dict]) -> list[str]:
    """The target each task's time to target is to (the profile's, from the runs' records), and
    that the paper's times are to its own."""
    targets = {}
    for record in records:
        metrics = record.get("metrics") or {}
        if metrics.get("target") is not None:
            targets.setdefault((metrics.get("quality_name"), record.get("profile")), set()).add(metrics["target"])
    notes = []
    for (quality_name, profile), values in targets.items():
        quality = " or ".join(f"accuracy ≥ {100 * v:g} %" if quality_name == "accuracy" else f"{quality_name} ≤ {v:g}"
                              for v in sorted(values))
        notes.append(f"Target: {quality} on the evaluation split, the `{profile}` profile's for this model and data "
                     "(the paper's times are to its own targets).")
    return notes


def _auto_notes(records: list[dict]) -> list[str]:
    """Where `auto` ran: what it is (`autoplan.AUTO_SENTENCE`), and that it fell back to the
    baseline where its plan could time nothing else (`Plan.fell_back`)."""
    from ..reproduction.autoplan import AUTO, AUTO_SENTENCE, baselines_training

    auto = [r for r in records if r.get("config_name") == AUTO]
    if not auto:
        return []
    plans = [r.get("plan") or {} for r in auto]
    fell_back = any(plan.get("fell_back") for plan in plans)
    return ([AUTO_SENTENCE] if baselines_training(records) else []) + (["`auto` fell back to the fp32 baseline here: its plan could time nothing else within "
                               "its planning time budget (its plan's notes say so), so it is the baseline, not a "
                               "comparison."] if fell_back else [])


def _clauses(note: str) -> list[str]:
    """A run's note split before each "; precision ..." outside parentheses, the precision note
    another configuration's run may share ("auto: planned (bf16, k=2; plan record ...), with ...;
    precision fp16 -> bf16" is two clauses); the rest of a note stays with its subject ("quality
    curve from the run of 'X': ...; memory and throughput measured in ...")."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(note):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and note.startswith("; precision ", i):
            parts.append(note[start:i])
            start = i + 2
    return parts + [note[start:]]


def footnotes_markdown(notes: list[str]) -> str:
    """`notes` as a numbered list (empty string when there are none)."""
    return "\n".join(f"{i}. {note}" for i, note in enumerate(notes, 1))


# what each figure of the reproduction shows, by the start of its file stem (the data it ran on is
# in its title)
FIGURE_CAPTIONS = {
    "curves_gpt2": "Quality vs training time (evaluation excluded, each run's own clock): per configuration the "
                   "geometric mean over seeds of perplexity at each evaluation, its 95 % band, the seeds thin beneath, "
                   "the target black dashed; a dashed curve is its twin's without checkpointing, placed by its timed "
                   "speed.",
    "curves": "Quality vs training time (evaluation excluded, each run's own clock): per configuration the mean "
              "over seeds of time and quality at each evaluation, its 95 % band, the seeds thin beneath, the target "
              "black dashed; a dashed curve is its twin's without checkpointing, placed by its timed speed.",
    "memory_ladder": "Peak memory by category as the components are added one by one (Table III's ladder, then "
                     "+zero2 and optimized), each bar named with the precision it ran.",
    "noise_trajectory": "Adaptive accumulation over training, a line style per seed: the k chosen (left) and the "
                        "gradient-noise scale it follows (right), filled markers where the estimate was significant, "
                        "joined where consecutive, hollow markers (any seed) where not (k held).",
    "op_categories": "Where the training time goes: self time per item (ms per image or token) by operation category "
                     "for the baseline, optimized and auto configurations (torch.profiler).",
    "plan_pareto": "The candidates auto's plan measured: time per sample relative to the fp32 baseline's against "
                   "peak memory, the Pareto front of all of them joined, the choice ringed.",
    "scaling": "Data-parallel scaling (Table IV): throughput and efficiency against world size; measured points "
               "with their 95 % intervals, modelled ones hollow and dashed, the paper's efficiencies as crosses.",
}


def figure_caption(stem: str) -> str:
    """The caption of a figure file: what it shows (its title names the data it ran on)."""
    return next((text for prefix, text in FIGURE_CAPTIONS.items() if stem.startswith(prefix)), "See its title.")


# ------------------------------------------------------------------ tables on disk
def format_number(value: float) -> str:
    """A float for a table cell: thousands separators, 4 significant digits, no exponent
    unless tiny; NaN -> "—"."""
    if value is None or math.isnan(value):
        return "—"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 1 or magnitude == 0:
        return f"{value:.4g}"
    if magnitude >= 1e-4:
        return f"{value:.4f}".rstrip("0")
    return f"{value:.2e}"


def format_bytes_frame(frame: pd.DataFrame, *, keep=("vs", "change", "share", "fraction")) -> pd.DataFrame:
    """A copy of a table of byte counts for reading: numeric columns in MiB (signed for a
    difference, a column named "... minus ..."), except columns whose name contains one of `keep`
    (relative changes), shown as signed percentages."""
    shown = frame.copy()
    for column in shown.columns:
        if not pd.api.types.is_numeric_dtype(shown[column]):
            continue
        if any(word in str(column) for word in keep):
            shown[column] = [("—" if pd.isna(v) else f"{100 * v:+.1f}%") for v in shown[column]]
        else:
            sign = "+" if " minus " in str(column) else ""
            shown[column] = [("—" if pd.isna(v) else f"{v / 2**20:{sign},.3f} MiB") for v in shown[column]]
    for column in shown.columns:  # category names in words
        if not pd.api.types.is_numeric_dtype(frame[column]):
            shown[column] = [_words(v) if isinstance(v, str) else v for v in shown[column]]
    shown.columns = [_words(str(c)) for c in shown.columns]
    return shown


# How a column of an analysis table reads, by its name (CSV files keep the raw numbers):
# (name test, header suffix, cell format)
_READABLE_COLUMNS = (
    (lambda c: c.endswith("_ms"), " (ms)", format_number),
    (lambda c: c.endswith("_s"), " (s)", format_number),
    (lambda c: "speedup" in c or c.endswith("gain"), " (×)", lambda v: f"{v:.2f}×"),
    (lambda c: any(w in c for w in ("share", "overhead", "contribution", "saving", "fraction")), " (%)",
     lambda v: f"{100 * v:.1f} %"),
)


def _words(name: str) -> str:
    """A column name in words (``share_of_time_saved`` -> "share of time saved"; B_simple kept)."""
    return name.replace("b_simple", "\0").replace("_", " ").replace("\0", "B_simple")


def readable_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of an analysis table for reading: headers in words with their unit (``_s`` ->
    "(s)", ``_ms`` -> "(ms)", speedups and gains as "×", shares, overheads and savings in %),
    numbers formatted (`format_number`), missing values as "—". No index column."""
    shown = pd.DataFrame(index=range(len(frame)))
    for column in frame.columns:
        values, name = list(frame[column]), str(column)
        header, cell = _words(name), None
        numeric = pd.api.types.is_numeric_dtype(frame[column]) and not pd.api.types.is_bool_dtype(frame[column])
        for test, unit, fmt in _READABLE_COLUMNS:
            if numeric and test(name):
                header = _words(name.removesuffix("_ms").removesuffix("_s")) + unit
                cell = fmt
                break
        if numeric:
            cell = cell or format_number
            values = ["—" if v is None or pd.isna(v) else cell(float(v)) for v in values]
        else:
            values = ["—" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]
        shown[header] = values
    return shown


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""
    if frame.empty:
        return "_(no rows)_\n"

    def cell(value):
        if isinstance(value, float):
            value = format_number(value)
        return str(value).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def table_markdown(name: str, caption_text: str, shown: pd.DataFrame, notes=()) -> str:
    """A table file's Markdown: ``**name** — caption``, the table, its notes numbered."""
    text = f"**{name}** — {caption_text}\n\n{markdown_table(shown)}"
    if notes:
        text = text.rstrip("\n") + "\n\n" + footnotes_markdown(list(notes)) + "\n"
    return text


def write_table(table: pd.DataFrame, out_dir: str | os.PathLike, name: str, caption_text: str,
                display: pd.DataFrame | None = None, notes: list[str] | tuple = ()) -> dict[str, Path]:
    """Write ``<name>.csv`` (the numbers of `table`) and ``<name>.md`` (`table_markdown`: the
    caption, then `display` -- default `table` -- as Markdown, then `notes` numbered) under
    `out_dir`; returns both paths."""
    if not isinstance(name, str) or not name or any(ch in name for ch in "/\\ "):
        _fail("name", name, "a non-empty file stem without slashes or spaces")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{name}.csv", out / f"{name}.md"
    table.to_csv(csv_path, index=False)
    md_path.write_text(table_markdown(name, caption_text, display if display is not None else table, notes))
    return {"csv": csv_path, "markdown": md_path}


# Tables whose intervals come from the interleaved timing windows (their notes say what those cover).
TIMED_TABLES = ("table1", "table2", "table3")


def published_table(table: pd.DataFrame, name: str, title: str, records: list[dict],
                    display: pd.DataFrame | None = None) -> tuple[pd.DataFrame, str, list[str]]:
    """What a report shows of `table`: (the frame shown -- `display`, default `readable_frame`,
    without columns that hold nothing, a smoke run's verdicts marked as a plumbing check --, its
    caption, its notes). The notebooks publish it and `render` renders it again from the records."""
    from .summary import PLUMBING  # imported here, as in write_reports_index

    # Table IV's rows and the operation profile come from their own launches, not from the runs: the
    # runs' notes (one process, their clocks and curves) are not theirs
    text, notes = caption(title, records), footnotes(records, timing=name.startswith(TIMED_TABLES),
                                                     run_notes=not name.startswith(("table4_scaling", "op_categories")))
    shown = display if display is not None else readable_frame(table)
    empty = [c for c in shown.columns
             if all(v is None or v in ("—", "") or (isinstance(v, float) and math.isnan(v)) for v in shown[c])]
    shown = shown.drop(columns=empty) if len(empty) < len(shown.columns) else shown  # columns with nothing in them
    if records and all(r.get("profile") == "smoke" for r in records) and "Claim held?" in shown:
        # smoke runs one seed for seconds: its tables show the plumbing, not whether claims held
        shown = shown.assign(**{"Claim held?": [PLUMBING if v not in ("—", "no claim") else v
                                                for v in shown["Claim held?"]]})
    return shown, text, notes


# ------------------------------------------------------------------ reports/README.md
def _profile_dirs(root: Path) -> list[Path]:
    order = {"quick": 0, "gpu": 1, "paper": 2}  # the reference first; a plumbing check (smoke) last
    found = [p for p in root.iterdir() if p.is_dir() and any((p / sub).is_dir() for sub in SUBDIRS)] if root.is_dir() else []
    return sorted(found, key=lambda p: (order.get(p.name, 9), p.name))


def write_reports_index(reports_root: str | os.PathLike) -> Path:
    """Write ``<reports_root>/README.md``: first the answer of every profile that is evidence --
    did the paper's claims hold (`summary.summary_markdown`) --, then per profile the environment
    of its runs (from the records' manifests), every table inline, every figure linked and the
    executed notebooks. A smoke run is a plumbing check: it never goes above the answer; its page
    is ``<reports_root>/smoke/README.md``, linked at the end. Returns the path."""
    root = resolve_reports_dir(reports_root)
    root.mkdir(parents=True, exist_ok=True)
    # imported here: `python -m trainopt_core.reporting.summary` then finds it not yet imported
    from .summary import profile_summary

    profiles = _profile_dirs(root)
    evidence = [folder for folder in profiles if folder.name not in PLUMBING_PROFILES]
    lines = ["# Reports", ""]
    for folder in evidence:  # the answer first: did the claims hold, per profile
        if (folder / "tables").is_dir():
            lines += [profile_summary(root, folder.name).rstrip("\n"), ""]
    lines += _INTRO
    if not profiles:
        lines += ["_No profile has been run yet._", ""]
    for folder in evidence:
        lines += _profile_section(root, folder, folder.relative_to(root).as_posix())
    for folder in profiles:
        if folder.name in PLUMBING_PROFILES:
            page = [f"# Profile `{folder.name}`", ""]
            if (folder / "tables").is_dir():
                page += [profile_summary(root, folder.name).rstrip("\n"), ""]
            (folder / "README.md").write_text("\n".join(page + _profile_section(root, folder, ".")))
            lines += [f"## Profile `{folder.name}`: a plumbing check", "",
                      f"Not evidence: runs of seconds that show the pipeline runs end to end. Its tables and figures: "
                      f"[{folder.name}/README.md]({folder.name}/README.md).", ""]
    if (root / "other_machines" / "README.md").is_file():
        lines += ["## Other machines", "", "Reproductions made on other kinds of machine, one folder per machine: "
                  "[other_machines/README.md](other_machines/README.md).", ""]
        if (root / "quick" / "tables").is_dir():
            from .across_machines import NAME, claims_frame, render_markdown

            frame, entries = claims_frame(root, "quick")
            body = render_markdown(frame, entries).split("\n", 2)[2]  # without its title
            lines += ["## The claims across machines", "", f"![Each claim's verdict on every kind of machine]({NAME}.png)",
                      "", body]
    lines += gpu_campaign_lines(root)
    path = root / "README.md"
    path.write_text("\n".join(lines))
    return path


# Profiles whose runs are a plumbing check, not evidence: never above the answer in the index.
PLUMBING_PROFILES = ("smoke",)
_INTRO = ["Generated from the JSON run records by the notebooks (`./run_all.sh`). Each profile folder holds "
          + ", ".join(f"`{k}/` ({v})" for k, v in SUBDIRS.items()) + ".",
          "Paper values are the paper's claims; measured values come from the runs listed. Measured values are "
          "means ± half their 95 % CI (over seeds; over interleaved timing windows for throughput; a time to target "
          "is a geometric mean with its interval in brackets). A claim is "
          "judged only when the whole CI of the measured change clears the rule: *held* when it lies at or beyond "
          "half the claimed change (quality: within ±0.5 %), *not held* when it lies entirely short of it, "
          "*inconclusive* otherwise.", ""]


def _profile_section(root: Path, folder: Path, rel: str) -> list[str]:
    """One profile's environment, tables, figures and executed notebooks, linked from `rel` (the
    folder as the page that holds the section sees it)."""
    records = load_records(root, folder.name)
    lines = [f"## Profile `{folder.name}`", "", "### Environment", ""]
    lines += [f"- **{k}:** {v}" for k, v in describe_manifest(records).items()] + [""]
    # the paper's tables (table1..table4) first, then the error-analysis tables
    tables = sorted((folder / "tables").glob("*.md"), key=lambda p: (not p.stem.startswith("table"), p.stem)) \
        if (folder / "tables").is_dir() else []
    lines += ["### Tables", ""]
    for table in tables:
        lines += [table.read_text().rstrip(), "", f"CSV: [{rel}/tables/{table.stem}.csv]({rel}/tables/{table.stem}.csv)", ""]
    if not tables:
        lines += ["_No tables yet._", ""]
    figures = sorted((folder / "figures").glob("*.png")) if (folder / "figures").is_dir() else []
    lines += ["### Figures", ""]
    for figure in figures:
        lines += [f"![{figure.stem}]({rel}/figures/{figure.name})", "",
                  f"**[{figure.stem}]({rel}/figures/{figure.name})** — {figure_caption(figure.stem)}", ""]
    if not figures:
        lines += ["_No figures yet._"]
    notebooks = sorted((folder / "notebooks").glob("*.ipynb")) if (folder / "notebooks").is_dir() else []
    lines += ["", "### Executed notebooks", ""]
    lines += [f"- [{n.name}]({rel}/notebooks/{n.name})" for n in notebooks] or ["_None yet._"]
    return lines + [""]

