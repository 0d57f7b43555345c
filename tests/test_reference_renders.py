"""The committed reference is what the code renders from its records: Tables I-IV and the README's
summary block, rendered again from reports/quick/ (run records, timing records, plans), equal the
committed ones. A reference the code no longer gives cannot land; `python -m
trainopt_core.reporting.render reports --profile quick --write` brings one up to date."""
import re
import shutil
from pathlib import Path

import pytest

from trainopt_core.reporting import render
from trainopt_core.reporting.summary import profile_summary

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reports"
AGAIN = "python -m trainopt_core.reporting.render reports --profile quick --write renders it again"


@pytest.fixture(scope="module")
def rendered():
    return render.paper_tables(render.Reports(REFERENCE, "quick"))


@pytest.mark.parametrize("name", render.PAPER_TABLES)
def test_the_committed_table_is_what_the_code_renders_from_the_committed_records(rendered, name):
    tables = REFERENCE / "quick" / "tables"
    assert name in rendered, f"{name} cannot be rendered from reports/quick/"
    assert (tables / f"{name}.csv").read_text() == rendered[name].csv, f"{name}.csv is stale: {AGAIN}"
    assert (tables / f"{name}.md").read_text() == rendered[name].markdown, f"{name}.md is stale: {AGAIN}"


def test_the_readme_block_is_the_summary_of_the_rendered_tables(rendered, tmp_path):
    for name, table in rendered.items():
        (tmp_path / f"{name}.csv").write_text(table.csv)
    block = re.search(r"<!-- summary:start -->\n(.*?)<!-- summary:end -->", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no <!-- summary:start --> ... <!-- summary:end --> block"
    assert block.group(1) == profile_summary(REFERENCE, "quick", tables_dir=tmp_path), (
        "README.md's summary is not what the records give: python scripts/readme_summary.py writes it again")


def test_a_table_the_records_no_longer_give_is_named_and_written_again(tmp_path, capsys):
    folder = tmp_path / "quick"
    for part in ("runs", "timing", "plans", "tables"):
        shutil.copytree(REFERENCE / "quick" / part, folder / part)
    stale = folder / "tables" / "table1_resnet.md"
    stale.write_text(stale.read_text().replace("inconclusive", "held", 1))
    (folder / "tables" / "table4_scaling_resnet.csv").unlink()
    assert render.main([str(tmp_path), "--profile", "quick"]) == 1
    out = capsys.readouterr().out
    assert "differs from the records: table1_resnet" in out and "differs from the records: table4_scaling_resnet" in out
    assert "table2_gpt2" not in out
    reports = render.Reports(tmp_path, "quick")
    render.write(reports, render.paper_tables(reports))
    assert render.differing(reports, render.paper_tables(reports)) == []
    assert stale.read_text() == (REFERENCE / "quick" / "tables" / "table1_resnet.md").read_text()


def _sentences(text: str) -> list[str]:
    """The caption's and notes' sentences and clauses (the table's rows left out)."""
    return [s.strip() for line in text.splitlines() if not line.startswith("|")
            for s in re.split(r"(?<=[.;]) ", re.sub(r"^\d+\. ", "", line)) if len(s.strip()) > 20]


@pytest.mark.parametrize("path", sorted((REFERENCE / "quick" / "tables").glob("*.md")), ids=lambda p: p.stem)
def test_every_committed_table_has_a_short_caption_and_says_each_thing_once(path):
    text = path.read_text()
    caption = text.splitlines()[0]
    assert len(caption.split()) <= 60, f"{path.name}: a caption of {len(caption.split())} words"
    sentences = _sentences(text)
    repeated = {s for s in sentences if sentences.count(s) > 1}
    assert not repeated, f"{path.name} repeats: {sorted(repeated)[:3]}"


def test_every_figure_caption_is_short():
    from trainopt_core.reporting.index import FIGURE_CAPTIONS

    for stem in (path.stem for path in (REFERENCE / "quick" / "figures").glob("*.png")):
        assert any(stem.startswith(prefix) for prefix in FIGURE_CAPTIONS), f"{stem} has no caption"
    assert all(len(text.split()) <= 60 for text in FIGURE_CAPTIONS.values())


def test_packed_records_are_read_from_their_archive_and_another_folders_records_by_name(tmp_path):
    import tarfile

    folder = tmp_path / "quick"
    for part in ("timing", "plans", "tables"):
        shutil.copytree(REFERENCE / "quick" / part, folder / part)
    with tarfile.open(folder / "runs.tar.xz", "w:xz", preset=0) as packed:
        packed.add(REFERENCE / "quick" / "runs", arcname="runs")
    packed_tables = render.paper_tables(render.Reports(tmp_path, "quick"))
    assert packed_tables["table2_gpt2"].markdown == (folder / "tables" / "table2_gpt2.md").read_text()
    # a second timing of the same runs (a rerun/ folder) names the records it renders
    rerun = tmp_path / "rerun"
    shutil.copytree(folder, rerun / "quick", ignore=shutil.ignore_patterns("runs.tar.xz"))
    assert render.main([str(rerun), "--profile", "quick", "--runs", str(folder / "runs.tar.xz")]) == 0
    with pytest.raises(ValueError, match="runs="):
        render.Reports(rerun, "quick", runs=folder / "tables")
