"""The claims across machines are what the committed tables give, and the agreement check says
what it compares: it refuses two profiles, and across two kinds of machine compares verdicts only."""
import contextlib
import io
import json
import shutil
from pathlib import Path

from trainopt_core.reporting import across_machines, agreement

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
AVX2 = REPORTS / "other_machines" / "amd_epyc_avx2_f25" / "reference_2026-11-27" / "quick"


def _run(main, *argv) -> tuple[int, str]:
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        try:
            code = main(list(argv))
        except SystemExit as stopped:
            code = stopped.code
    return code, said.getvalue()


def test_the_committed_claims_across_machines_are_what_the_tables_give():
    code, said = _run(across_machines.main, str(REPORTS))
    assert code == 0, f"{said}\npython -m trainopt_core.reporting.across_machines reports --write writes them again"
    frame, entries = across_machines.claims_frame(REPORTS)
    # the reference first, then one reproduction per other kind of machine, no kind twice
    assert entries[0]["relative"] == "reports/quick"
    kinds = [entry["side"]["kind"] for entry in entries]
    assert len(kinds) == len(set(kinds)) >= 3
    assert set(frame.columns[2:]) == {across_machines._column(entry) for entry in entries}
    assert set(frame.iloc[:, 2:].to_numpy().ravel()) <= {"held", "not held", "inconclusive", "not measured", "not run"}
    # each claim says where it held; one not held on a machine and inconclusive on others says so
    text = (REPORTS / "claims_across_machines.md").read_text()
    assert "| where it held |" in text and "Not held on some, inconclusive on the rest" in text
    patterns = frame.apply(lambda row: across_machines._pattern(row, list(frame.columns[2:])), axis=1)
    assert set(patterns) <= set(across_machines.PATTERNS)


def test_the_agreement_check_refuses_two_profiles_naming_both(tmp_path):
    smoke = tmp_path / "smoke"
    shutil.copytree(REPORTS / "quick" / "tables", smoke / "tables")
    (smoke / "timing").mkdir()
    for path in (REPORTS / "quick" / "timing").glob("throughput__*.json"):
        record = json.loads(path.read_text())
        record["profile"] = "smoke"
        (smoke / "timing" / path.name).write_text(json.dumps(record))
    code, said = _run(agreement.main, str(REPORTS / "quick"), str(smoke))
    assert code == 2
    assert "its profile is 'smoke', the first's 'quick'" in said and "allowed two report folders of one profile" in said


def test_across_two_kinds_the_agreement_check_compares_verdicts_only_and_says_so():
    result = agreement.compare_reports(REPORTS / "quick", AVX2)
    assert result["across_kinds"] and result["agree"] == (not result["verdict_flips"])
    text = agreement.format_agreement(result)
    first, second = result["sides"]
    assert first["profile"] == second["profile"] == "quick" and first["seeds"] == 3
    assert "- first: quick, 3 seeds, " in text and "reduced precision ran bf16" in text
    assert "reduced precision ran fp32" in text
    assert "**Across two kinds of machine.**" in text and "outside the other run's 95 % CI" not in text
    sentence = agreement.agreement_sentence(REPORTS / "quick", AVX2, "the AVX2 one")
    assert sentence.startswith("Against the previous reference on another kind of machine")
    assert "**no**" not in sentence and "not compared" in sentence


def test_on_one_kind_the_check_states_verdicts_and_ratios_in_words():
    pointer = json.loads((REPORTS / "previous_reference.json").read_text())["quick"]
    first, second = pointer["same_kind"][0]["folders"]
    result = agreement.compare_reports(REPORTS / first, REPORTS / second)
    assert not result["across_kinds"]
    words = agreement._in_words(result)
    assert words.startswith(("verdict cells agree (0 of", f"{len(result['verdict_flips'])} of"))
    assert "speed and time ratios outside the other's 95 % interval" in words
