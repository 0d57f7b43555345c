"""The summary of whether the paper's claims held: generated from the tables, equal to them, and
leading every surface (reports/README.md, README.md, the end of ./run_all.sh)."""
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from trainopt_core.reporting.index import write_reports_index
from trainopt_core.reporting.summary import PLUMBING, counts, main, profile_summary, summary_markdown, verdict_summary

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reports"
TABLES = REFERENCE / "quick" / "tables"


def _md_rows(name: str) -> list[list[str]]:
    lines = [line for line in (TABLES / f"{name}.md").read_text().splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return header, [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_the_reference_summary_counts_every_judged_claim_of_tables_one_to_four():
    summary = verdict_summary(TABLES)
    # Tables I (5 claims) and II (4: the paper claims no GPT-2 FLOPs utilization), III (4 rungs x time,
    # memory; the paper's ladder is the ResNet's only), IV (2 measured world sizes; modelled rows are not judged)
    assert summary["table"].value_counts().to_dict() == {"I": 5, "II": 4, "III": 8, "IV": 2}
    assert sum(counts(summary).values()) == len(summary) == 19


def test_the_first_line_says_which_quantities_each_verdict_fell_on():
    """A reader wanted the answer in words before the table: which claims held, which did not."""
    import pandas as pd

    from trainopt_core.reporting.summary import by_quantity

    summary = verdict_summary(TABLES)
    said = by_quantity(summary)
    for category, quantities in summary.groupby("category")["quantity"]:
        sentence = next(part for part in said.split(". ") if part.lower().startswith(category))
        for quantity, n in quantities.value_counts().items():
            assert f"{quantity} ({n})" in sentence, (category, quantity, said)
    fake = pd.DataFrame({"quantity": ["throughput", "peak memory", "throughput", "peak memory", "peak memory"],
                         "category": ["not held", "held", "not held", "held", "inconclusive"]})
    assert by_quantity(fake) == "Held: peak memory (2). Not held: throughput (2). Inconclusive: peak memory (1)."
    assert said in profile_summary(ROOT / "reports", "quick").splitlines()[0]


@pytest.mark.parametrize("name, numeral, model", [("table1_resnet", "I", "ResNet"), ("table2_gpt2", "II", "GPT-2")])
def test_each_main_table_row_says_in_the_summary_what_the_table_says(name, numeral, model):
    summary = verdict_summary(TABLES)
    header, rows = _md_rows(name)
    col = {title: header.index(title) for title in header}
    for row in rows:
        claim = f"{model} {row[col['Metric']][0].lower()}{row[col['Metric']][1:]}"
        found = summary[(summary["table"] == numeral) & (summary["claim"] == claim)]
        if row[col["Claim held?"]] == "no claim":
            assert found.empty
            continue
        entry = found.iloc[0]
        assert entry["verdict"] == row[col["Claim held?"]]
        assert entry["paper"] == row[col["Paper change"]]
        assert entry["measured"] == row[col["Measured change (95% CI)"]]
        assert entry["auto"] == row[col["Auto change (95% CI)"]]


def test_the_ablation_and_scaling_rows_say_what_their_tables_say():
    summary = verdict_summary(TABLES).set_index("claim")
    ablation = pd.read_csv(TABLES / "table3_ablation_resnet.csv")
    rung = ablation[ablation["config"] == "+lr_schedule"].iloc[0]
    assert summary.loc["ResNet +lr_schedule: time to target", "verdict"] == rung["claim_held_time"]
    assert summary.loc["ResNet +lr_schedule: peak memory", "verdict"] == rung["claim_held_memory"]
    scaling = pd.read_csv(TABLES / "table4_scaling_resnet.csv")
    measured = scaling[(scaling["world_size"] == 2) & (scaling["source"] == "measured") & (scaling["config"] == "optimized")]
    row = summary.loc["ResNet optimized: scaling efficiency, 2 processes"]
    assert row["verdict"] == measured.iloc[0]["claim_held"]
    assert row["measured"].startswith(f"{100 * measured.iloc[0]['efficiency']:.1f}%")


def test_the_markdown_leads_with_the_counts_and_marks_each_verdict_with_its_symbol():
    text = profile_summary(REFERENCE, "quick")
    first = text.splitlines()[0]
    found = dict((category, int(n)) for n, category in re.findall(r"(\d+) [✓✗?–] ([a-z ]+?)(?= ·|\.)", first))
    assert found == {k: v for k, v in counts(verdict_summary(TABLES)).items() if v}
    assert "| I | ResNet peak memory | -25.6% |" in text and "✓ held" in text and "✗ not held" in text
    assert "NOT CIFAR-10" in text and "NOT WikiText-2" in text  # the stand-ins are named as such


def test_a_smoke_profile_is_a_plumbing_check_without_verdicts(tmp_path):
    shutil.copytree(TABLES, tmp_path / "tables")
    text = summary_markdown(tmp_path / "tables", profile="smoke")
    assert PLUMBING in text.splitlines()[0]
    assert not any(symbol in text for symbol in ("✓", "✗")) and text.count(PLUMBING) == 1 + 19


def test_no_tables_yet_says_so_and_the_command_line_names_the_folder(tmp_path, capsys):
    # a fresh folder says what is coming and where the reference's answer is
    empty = summary_markdown(tmp_path, profile="quick")
    assert "no tables in this reports folder yet" in empty and "01: Tables I and II" in empty
    assert "The committed reference's answer is at the top of the project's README.md" in empty
    with pytest.raises(ValueError, match="reports_dir=.* is invalid: allowed a reports folder holding <profile>/tables/"):
        main([str(tmp_path), "--profile", "quick"])
    assert main([str(REFERENCE), "--profile", "quick"]) == 0
    assert capsys.readouterr().out == profile_summary(REFERENCE, "quick")


def test_the_summary_says_beside_its_counts_what_its_intervals_cover_and_how_it_agrees_with_the_previous_reference(
        tmp_path):
    # the previous reference, whose manifests name no instruction set or CPU family: no between-session floor
    unknown_kind = REFERENCE / "other_machines" / "amd_epyc_avx512bf16" / "reference_2026-11-23" / "quick"
    for folder in ("quick", "other_machines/old/quick"):
        for part in ("tables", "timing"):
            shutil.copytree(unknown_kind / part, tmp_path / folder / part)
    first = profile_summary(tmp_path, "quick").splitlines()[0]
    assert "Its throughput and time intervals cover one session only" in first
    assert "previous reference" not in first
    # the previous reference differs in one verdict
    table = tmp_path / "other_machines/old/quick/tables/table1_resnet.csv"
    frame = pd.read_csv(table)
    frame.loc[frame["metric"] == "Final accuracy", "claim_held"] = "held"
    frame.to_csv(table, index=False)
    (tmp_path / "previous_reference.json").write_text('{"quick": "other_machines/old/quick"}')
    first = profile_summary(tmp_path, "quick").splitlines()[0]
    # its kind not recorded: not called the same kind, verdicts and ratios in words, no bare "no"
    assert re.search(r"Against the previous reference \(`other_machines/old/quick`, CPU AMD EPYC \(2 logical cores\)\): "
                     r"1 of \d+ verdict cells differ, none of \d+ speed and time ratios outside the other's 95 % interval", first)
    assert "**no**" not in first
    # its manifests do not record its kind of machine: the pointer says it
    (tmp_path / "previous_reference.json").write_text(
        '{"quick": {"folder": "other_machines/old/quick", "machine": "a CPU with AVX-512 BF16: another kind"}}')
    assert ("Against the previous reference on another kind of machine (`other_machines/old/quick`, a CPU with "
            "AVX-512 BF16: another kind): 1 of") in profile_summary(tmp_path, "quick").splitlines()[0]
    (tmp_path / "previous_reference.json").write_text('{"quick": {"machine": "a folder is missing"}}')
    with pytest.raises(ValueError, match=r"previous_reference.json\['quick'\]=.* is invalid: allowed a folder, or"):
        profile_summary(tmp_path, "quick")
    (tmp_path / "previous_reference.json").write_text('{"quick": "other_machines/missing/quick"}')
    with pytest.raises(ValueError, match=r"previous_reference.json\['quick'\]='other_machines/missing/quick' is invalid"):
        profile_summary(tmp_path, "quick")


def test_the_agreement_line_says_it_compares_two_kinds_and_what_reruns_on_one_kind_gave(tmp_path):
    """A reader took "agreement: no" for "not reproducible": the line says the previous reference ran
    its reduced-precision configurations in another precision than this one, and the reruns on one kind that previous_reference.json lists are
    checked beside it, with their run records' comparison."""
    import json

    reports = tmp_path / "reports"
    previous = REFERENCE / "other_machines" / "amd_epyc_avx2_f25" / "reference_2026-11-27" / "quick"
    for source, folder in ((REFERENCE / "quick", "quick"), (previous, "old/quick"), (REFERENCE / "quick", "rerun/quick")):
        for part in ("tables", "timing"):
            shutil.copytree(source / part, reports / folder / part)
    (reports / "records.txt").write_text("same    a.json: 9 deterministic fields\n"
                                         "18 of 18 records identical in every deterministic field\n")
    entry = {"folder": "old/quick", "machine": "a CPU with AVX2 only: another kind of machine",
             "same_kind": [{"what": "a second sitting", "folders": ["rerun/quick", "quick"], "records": "records.txt"}]}
    (reports / "previous_reference.json").write_text(json.dumps({"quick": entry}))
    first = profile_summary(reports, "quick").splitlines()[0]
    # its manifests name its CPU (the "machine" entry is for folders whose manifests do not)
    assert ("Against the previous reference on another kind of machine (`old/quick`, CPU AMD EPYC (family 25 model 1 "
            "stepping 1, AVX2, 2 logical cores); bf16 and the like ran fp32 there, bf16 here): ") in first
    assert "speed ratios are not expected to agree across kinds and are not compared" in first
    # the reruns on one kind come first, then the check against the previous reference
    same_kind = ("Reruns on the same kind of machine agree: a second sitting (`rerun/quick`): verdict cells agree (0 of 74 "
                 "differ), none of 56 speed and time ratios outside the other's 95 % interval (Tables I-IV); 18 of 18 "
                 "run records equal in every deterministic field (`reports/records.txt`).")
    assert same_kind in first and first.index(same_kind) < first.index(
        "Against the previous reference on another kind of machine"), first
    # a rerun whose verdict differs is said as it is
    table = reports / "rerun/quick/tables/table1_resnet.csv"
    frame = pd.read_csv(table)
    frame.loc[frame["metric"] == "Final accuracy", "claim_held"] = "held"
    frame.to_csv(table, index=False)
    assert "Reruns on the same kind of machine: a second sitting (`rerun/quick`): 1 of 74 verdict cells differ" in \
        profile_summary(reports, "quick").splitlines()[0]
    (reports / "records.txt").write_text("not a comparison\n")
    with pytest.raises(ValueError, match="a comparison written by scripts/rerun_records.py"):
        profile_summary(reports, "quick")


def test_the_reports_index_opens_with_the_summary(tmp_path):
    shutil.copytree(REFERENCE / "quick" / "tables", tmp_path / "quick" / "tables")
    index = write_reports_index(tmp_path).read_text()
    assert index.startswith("# Reports\n\n**Did the paper's claims hold? Profile `quick`:**")


def test_the_readme_shows_the_reference_summary_as_generated():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- summary:start -->\n(.*?)<!-- summary:end -->", text, re.S)
    assert block, "README.md has no <!-- summary:start --> ... <!-- summary:end --> block"
    assert block.group(1) == profile_summary(REFERENCE, "quick"), (
        "README.md's summary differs from the reference reports: python scripts/readme_summary.py writes it again")


@pytest.mark.slow
def test_a_batch_run_says_which_run_of_how_many_it_trained_and_the_reused_ones_once(tmp_path, monkeypatch):
    from trainopt_core.reporting.notebook import run_grid
    from trainopt_core.reproduction.progress import PROGRESS_LOG

    log = tmp_path / "progress.log"
    monkeypatch.setenv(PROGRESS_LOG, str(log))
    run_grid("wikitext2", ["baseline"], seeds=2, profile="smoke", out_dir=tmp_path / "smoke" / "runs")
    lines = [line for line in log.read_text().splitlines() if not line.startswith("  …")]  # heartbeats aside
    run = r"final perplexity [\d.e+]+, [\d.e+]+ tok/s on its own clock"
    assert re.fullmatch(rf"  run 1/2: wikitext2 baseline seed 0: {run}; trained in \d+ s; \d+ s so far, about \d+ s left",
                        lines[0]), lines
    assert re.fullmatch(rf"  run 2/2: wikitext2 baseline seed 1: {run}; trained in \d+ s; \d+ s so far", lines[1]), lines
    assert len(lines) == 3 and re.fullmatch(r"  2 runs trained in \d+ s \(records in <reports_dir>/smoke/runs\)",
                                            lines[2]), lines
    log.write_text("")
    run_grid("wikitext2", ["baseline"], seeds=2, profile="smoke", out_dir=tmp_path / "smoke" / "runs")
    assert log.read_text().splitlines() == [
        "  reused 2 finished runs from <reports_dir>/smoke/runs (made under the same conditions; nothing trained again)"]


def test_a_grid_says_its_reused_runs_once_and_why_the_tables_throughput_is_not_a_runs_own(tmp_path, monkeypatch):
    """The reference's notebooks carried a line per reused run (2-78 each), whose img/s (a run's own
    clock, e.g. 17.5) disagreed with the tables' (151.6) without a word on the timing windows."""
    from trainopt_core.reporting import notebook
    from trainopt_core.reproduction.progress import PROGRESS_LOG

    log = tmp_path / "progress.log"
    monkeypatch.setenv(PROGRESS_LOG, str(log))
    old = dict(metrics=dict(throughput=17.5, throughput_unit="img/s", quality_name="accuracy", final_quality=0.8),
               manifest=dict(date_utc="2026-11-27T00:00:00+00:00"))
    monkeypatch.setattr(notebook, "run", lambda task, config, **_: dict(old, task=task, config_name=config))
    monkeypatch.setattr(notebook, "measure_throughput", lambda task, configs, **_: dict(
        configs=configs, windows=12, results=dict(baseline=dict(item_unit="img/s", summary=dict(
            mean=151.6, min=140.0, max=160.0)))))
    monkeypatch.setattr(notebook, "with_throughput", lambda records, timings: records)
    paths = notebook.report_paths(tmp_path / "reports", "quick")
    records = notebook.timed_grid("cifar10,wikitext2", ["baseline", "optimized"], seeds=3, profile="quick", paths=paths)
    said = log.read_text()
    assert len(records) == 12 and "17.5" not in said and "run 1/12" not in said, said
    assert said.count("  reused 12 finished runs from <reports_dir>/quick/runs (made under the same conditions; "
                      "nothing trained again)\n") == 1, said
    assert said.count(notebook.TIMING_NOTE) == 1 and "151.6 img/s" in said, said


def test_a_profile_without_tables_yet_states_no_agreement(tmp_path):
    """A reproduction that has just begun (its first notebook shows the summary before any table
    exists) beside a previous reference: the summary says there are no tables yet, and no
    agreement check is attempted on nothing (it raised IndexError)."""
    shutil.copytree(REFERENCE / "other_machines" / "amd_epyc_avx2_f25" / "reference_2026-11-27" / "quick" / "tables",
                    tmp_path / "old" / "quick" / "tables")
    (tmp_path / "quick" / "runs").mkdir(parents=True)
    (tmp_path / "previous_reference.json").write_text('{"quick": "old/quick"}')
    assert profile_summary(tmp_path, "quick").startswith("_Profile `quick` has no tables in this reports folder yet")
