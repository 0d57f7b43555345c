"""scripts/gpu_campaign.py, the one command a GPU session runs: its arguments, and a rehearsal of
its plumbing on the CPU at smoke sizes -- every stage, the files it leaves, resuming, the budget."""
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from conftest import load_script
from trainopt_core.reproduction.models import MODEL_SIZES
from trainopt_core.reproduction.profiles import get_profile


@pytest.fixture(scope="module")
def campaign():
    return load_script("scripts/gpu_campaign.py")


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu"], "--device cpu is allowed with --profile smoke only"),
    (["--device", "cpu", "--profile", "smoke", "--stages", "runs:cifar100"], "--stages: 'runs:cifar100' is invalid"),
    (["--device", "cpu", "--profile", "smoke", "--budget-s", "0"], "--budget-s=0.0 is invalid"),
    (["--device", "cpu", "--profile", "quick"], "--profile 'quick' is invalid: allowed gpu or smoke"),
    (["--device", "cpu", "--profile", "smoke", "--resume", "/nonexistent"], "--resume /nonexistent: no summary.json"),
])
def test_bad_arguments_name_the_value_and_what_is_allowed(campaign, capsys, argv, message):
    with pytest.raises(SystemExit):
        campaign.parse_args(["--out", "unused", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_without_cuda_it_stops_and_says_how_to_rehearse(campaign, capsys):
    with pytest.raises(SystemExit):
        campaign.parse_args(["--out", "unused"])
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_the_gpu_profile_is_the_papers_models_and_batches_in_short_runs():
    assert MODEL_SIZES["gpu"] == MODEL_SIZES["paper"]
    for task, batch in (("cifar10", 128), ("wikitext2", 32)):
        gpu, paper = get_profile(task, "gpu"), get_profile(task, "paper")
        assert gpu.model == paper.model and gpu.seq_len == paper.seq_len
        assert gpu.baseline_batch_size == paper.baseline_batch_size == batch
        assert gpu.target == paper.target  # not calibrated: the runs are far too short to reach it
        assert gpu.timing_windows_per_seed >= 6  # one seed, and still an interval from enough windows


@pytest.mark.slow
def test_a_cpu_rehearsal_runs_every_stage_leaves_its_files_and_resumes(campaign, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    # a budget already spent: every stage is left for the resuming call
    assert campaign.main(["--out", str(first), "--device", "cpu", "--profile", "smoke", "--stages", "loops",
                          "--budget-s", "1e-9"]) == 0
    summary = json.loads((first / "summary.json").read_text())
    assert summary["stages_done"] == [] and summary["stages_left"] == ["loops"]
    assert campaign.main(["--out", str(first), "--device", "cpu", "--profile", "smoke",
                          "--stages", "runs:wikitext2,reference,loops,profile:wikitext2"]) == 0
    assert campaign.main(["--out", str(second), "--resume", str(first), "--device", "cpu", "--profile", "smoke",
                          "--stages", "runs:wikitext2,reference,loops,profile:wikitext2,plan:wikitext2"]) == 0
    summary = json.loads((second / "summary.json").read_text())
    # the first call's stages kept, only the new one run
    assert summary["stages_done"] == ["runs:wikitext2", "reference", "loops", "profile:wikitext2", "plan:wikitext2"]
    assert sorted(p.name for p in second.iterdir()) == ["environment.json", "profiles.txt", "records.tar.gz",
                                                       "summary.json", "summary.md"]
    configs = summary["tasks"]["wikitext2"]["configs"]
    assert list(configs) == ["baseline", "optimized", "auto"]
    for name, entry in configs.items():
        assert entry["throughput"] > 0 and entry["throughput_ci"][0] is not None
        assert entry["training_step_peak_bytes"] > 0 and 0 < entry["mfu"] < 1
        assert (entry["speedup"] is None) == (name == "baseline")
    assert configs["auto"]["planning_s"] > 0 and configs["auto"]["plan_choice"]
    assert summary["tasks"]["wikitext2"]["recompute_overhead"]["segments"] >= 1
    assert set(summary["plans"]) == {"wikitext2"}
    assert summary["plans"]["wikitext2"]["candidates"][0]["candidate"] == "fp32, k=1"
    loops = summary["loops"]["loops"]
    assert {"hand loop", "hand loop + skip check", "trainopt engine"} <= set(loops)
    assert loops["trainopt engine"]["vs_hand"] > 0 and loops["trainopt engine"]["vs_skip_check"] > 0
    timed = [row for row in summary["plans"]["wikitext2"]["candidates"] if row["speedup"] is not None]
    assert timed and all(0 < row["mfu"] < 1 for row in timed)
    reference = summary["reference"]
    assert set(reference["rows"]) == {"reference bf16 eager", "task bf16 eager", "task auto"}  # no compiling on a CPU
    assert all(row["throughput"] > 0 for row in reference["rows"].values())
    assert set(reference["ratios"]) == {"task bf16 eager / reference bf16 eager", "task auto / reference bf16 eager"}
    # every ratio the summary states recomputes from the per-window rates it stores
    from trainopt_core import measure

    for pair, ratio in reference["ratios"].items():
        mine, theirs = pair.split(" / ")
        again = measure.paired_ratio(reference["rows"][mine]["window_rates"], reference["rows"][theirs]["window_rates"])
        assert again["mean"] == pytest.approx(ratio["mean"]) and [again["ci_low"], again["ci_high"]] == ratio["ci"]
    again = measure.paired_ratio(loops["trainopt engine"]["window_rates"], loops["hand loop"]["window_rates"])
    assert again["mean"] == pytest.approx(loops["trainopt engine"]["vs_hand"])
    for name, entry in configs.items():
        if name != "baseline":
            again = measure.paired_ratio(entry["window_rates"], configs["baseline"]["window_rates"])
            assert again["mean"] == pytest.approx(entry["speedup"])
    goals = {g["goal"]: g for g in summary["goals"]}
    assert "GPT-2 task >= 0.9x the minimal plain-PyTorch GPT-2 (benchmarks/gpt2_reference.py), bf16 eager" in goals
    assert "trainopt engine >= 0.99x the hand-written loop" in goals
    assert any(goal.startswith("planning <= 60 s (wikitext2") for goal in goals)
    with tarfile.open(second / "records.tar.gz") as tar:
        names = tar.getnames()
    assert "smoke/timing/throughput__wikitext2.json" in names  # the first call's records travel on
    assert "plans_at_paper_size/smoke/plan__wikitext2.json" in names
    text = (second / "summary.md").read_text()
    assert text.index("## Goals") < text.index("## GPT-2 124M on stand-in: ") and "(NOT WikiText-2): smoke profile" in text
    assert "## GPT-2: the task beside a minimal plain-PyTorch GPT-2" in text
    assert "## wikitext2: auto (" in (second / "profiles.txt").read_text()


def test_compiling_repays_from_compile_seconds_over_the_seconds_saved_per_sample(campaign):
    chosen = {"candidate": "bf16", "seconds_per_sample": 0.0065, "compile_s": None}
    compiled = {"candidate": "bf16, compiled", "seconds_per_sample": 0.0028, "compile_s": 37.0}
    assert campaign.compile_break_even(compiled, chosen) == pytest.approx(37.0 / 0.0037)
    assert campaign.compile_break_even(chosen, chosen) is None  # not compiled
    assert campaign.compile_break_even({**compiled, "seconds_per_sample": 0.007}, chosen) is None  # never repays
    assert campaign.compile_break_even(compiled, {**chosen, "compile_s": 5.0}) is None  # the choice compiles too
    # what the run pays, compiling again from the plan's cache, where the plan timed it
    assert campaign.compile_break_even({**compiled, "run_compile_s": 3.7}, chosen) == pytest.approx(3.7 / 0.0037)


def _plan(*rows):
    """A plan as `Plan.to_dict()` holds it: rows of (name, precision, seconds per sample, speedup, interval, compile s)."""
    return {"chosen": "bf16", "rows": [
        {"candidate": name, "precision": precision, "tf32": False, "seconds_per_sample": seconds, "speedup": speedup,
         "speedup_ci_low": low, "speedup_ci_high": high, "peak_memory_bytes": 1, "compile_s": compile_s,
         "rejected_because": None} for name, precision, seconds, speedup, (low, high), compile_s in rows]}


def test_a_candidates_mfu_and_its_interval_come_from_its_paired_speedup(campaign):
    # the compiled row's own windows ran at 1 / 0.0025 samples/s, 8.0x the baseline's mean rate, but its paired
    # speedup (the geometric mean of the per-window ratios) is 7.5x: the MFU and its interval follow the speedup
    plan = _plan(("fp32, k=1", "fp32", 0.02, 1.0, (1.0, 1.0), None), ("bf16", "bf16", 0.0065, 3.0, (2.9, 3.1), None),
                 ("bf16, compiled", "bf16", 0.0025, 7.5, (7.0, 8.0), 37.0))
    peaks = {"fp32": 60e12, "bf16": 900e12}
    rows = campaign.plan_candidates(plan, 6e9, 1000.0, lambda row: peaks[row["precision"]])
    base_rate_mfu = 6e9 * (1000.0 / 0.02)
    assert rows[0]["mfu"] == pytest.approx(base_rate_mfu / 60e12) and rows[0]["mfu_ci"] == [rows[0]["mfu"]] * 2
    compiled = rows[2]
    assert compiled["mfu"] == pytest.approx(7.5 * base_rate_mfu / 900e12)
    assert compiled["mfu_ci"] == pytest.approx([7.0 * base_rate_mfu / 900e12, 8.0 * base_rate_mfu / 900e12])
    assert compiled["break_even_samples"] == pytest.approx(37.0 / (0.0065 - 0.0025))


def test_the_mfu_goal_takes_the_plans_fastest_step_not_its_highest_utilization(campaign):
    plan = _plan(("fp32, k=1", "fp32", 0.02, 1.0, (1.0, 1.0), None), ("bf16", "bf16", 0.0065, 3.0, (2.7, 3.3), None),
                 ("bf16, compiled", "bf16", 0.0028, 7.0, (6.3, 7.7), 37.0))
    # peaks that put the compiled step at 32 % [28.8, 35.2] and the fp32 baseline at 64 %
    per_speedup = 0.32 / 7.0
    peaks = {"fp32": 1e9 * 50.0 / (0.64 / 1.0), "bf16": 1e9 * 50.0 / per_speedup}
    candidates = campaign.plan_candidates(plan, 1e9, 1.0, lambda row: peaks[row["precision"]])
    summary = {"choice": "bf16", "run_samples": 2600, "speedup": 3.0, "speedup_ci": [2.7, 3.3], "planning_s": 50.0,
               "compile_s": 30.0, "candidates": candidates}
    goals = campaign.goals({"tasks": {}, "plans": {"wikitext2": summary}, "loops": None})
    (mfu,) = [g for g in goals if g["goal"].startswith("GPT-2 MFU >= 30 %")]
    assert mfu["measured"].startswith("32.0 % [28.8, 35.2], bf16, compiled; repays its compiling from 10,000 samples")
    assert mfu["verdict"] == "inconclusive (the bar is inside the 95 % interval)"


def _write_campaign(folder, *, date: str, dirty: bool, auto_mfu: float = 0.135):
    folder.mkdir(parents=True)
    auto = {"config": "bf16, k=1", "speedup": 3.1, "speedup_ci": [3.0, 3.2], "mfu": auto_mfu, "throughput": 100.0,
            "throughput_ci": [99.0, 101.0], "planning_s": 20.0, "compile_s": 0.0}
    summary = {"device": "Some GPU", "tasks": {"wikitext2": {"profile": "gpu", "configs": {"auto": auto}}}, "plans": {}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "environment.json").write_text(json.dumps({"date_utc": date, "git": {"commit": "abc1234" * 5 + "ab",
                                                                                     "dirty": dirty}}))


def test_the_reports_index_lists_each_gpus_newest_clean_campaigns_goals(tmp_path):
    from trainopt_core.reporting.index import write_reports_index

    _write_campaign(tmp_path / "gpu" / "some-gpu" / "campaign", date="2026-11-26T10:00:00+00:00", dirty=False)
    index = write_reports_index(tmp_path).read_text()
    assert "## GPU campaigns" in index and "### Some GPU: [gpu/some-gpu/](gpu/some-gpu/README.md)" in index
    assert "| GPT-2 auto MFU >= 30 % | 13.5 % [13.4, 13.6] | not met |" in index
    assert "<!-- gpu-campaigns:start -->" in index and "<!-- gpu-campaigns:end -->" in index
    (tmp_path / "gpu" / "some-gpu" / "campaign" / "summary.json").unlink()
    assert "GPU campaigns" not in write_reports_index(tmp_path).read_text()


def test_a_newer_campaign_from_uncommitted_code_does_not_replace_the_clean_one(tmp_path):
    from trainopt_core.reporting.gpu_campaign import gpu_campaign_lines, newest_clean_campaigns

    _write_campaign(tmp_path / "gpu" / "some-gpu" / "campaign_abc1234", date="2026-11-27T09:00:00+00:00", dirty=False,
                    auto_mfu=0.136)
    _write_campaign(tmp_path / "gpu" / "some-gpu" / "campaign_dirty", date="2026-11-28T09:00:00+00:00", dirty=True,
                    auto_mfu=0.5)
    _write_campaign(tmp_path / "gpu" / "some-gpu" / "campaign_old", date="2026-11-20T09:00:00+00:00", dirty=False,
                    auto_mfu=0.1)
    assert newest_clean_campaigns(tmp_path) == {"some-gpu": tmp_path / "gpu" / "some-gpu" / "campaign_abc1234"}
    index = "\n".join(gpu_campaign_lines(tmp_path))
    assert index.count("### Some GPU") == 1 and "From `gpu/some-gpu/campaign_abc1234/` (commit abc1234, 2026-11-27)." in index
    assert "| 13.6 % [13.5, 13.7] | not met |" in index and "50.0 %" not in index and "10.0 %" not in index


REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_lines_of_the_readme_and_the_reports_index_are_what_the_code_renders():
    from trainopt_core.reporting.gpu_campaign import (INDEX_BLOCK, README_BLOCK, gpu_campaign_lines,
                                                      readme_gpu_block)

    readme = (REPO / "README.md").read_text()
    assert readme_gpu_block(REPO) in readme, "stale: run python scripts/readme_summary.py"
    index = (REPO / "reports" / "README.md").read_text()
    block = "\n".join(gpu_campaign_lines(REPO / "reports")).strip("\n")
    assert block.startswith(INDEX_BLOCK[0]) and block.endswith(INDEX_BLOCK[1]) and block in index, \
        "stale: run python scripts/readme_summary.py"
    assert "campaign_f68a878" in readme and README_BLOCK[0] in readme


@pytest.mark.parametrize("folder", sorted(p.parent.relative_to(REPO / "reports/gpu").as_posix()
                                          for p in (REPO / "reports/gpu").glob("*/*/records.tar.gz")))
def test_a_committed_campaigns_summary_is_what_the_code_renders_from_its_records(campaign, tmp_path, folder):
    committed = REPO / "reports" / "gpu" / folder
    copy = tmp_path / Path(folder).name
    shutil.copytree(committed, copy)
    campaign.rerender(copy)
    assert (copy / "summary.md").read_text() == (committed / "summary.md").read_text(), \
        f"stale: run python scripts/gpu_campaign.py --rerender {committed.relative_to(REPO)}"


def test_the_gpu_profile_plans_for_the_papers_run_and_its_mfu_goal_counts_the_compiling(campaign):
    """The campaign's gpu runs are short; their `auto` is planned for the paper's run (1,500,000
    images; 41,000 sequences), and where it compiles, the MFU goal is over that run with the
    compiling counted (the per-step figure beside it)."""
    from trainopt_core.reproduction.profiles import PAPER_RUN_SAMPLES, get_profile

    assert PAPER_RUN_SAMPLES == {"cifar10": 1_500_000, "wikitext2": 41_000}
    for task in ("cifar10", "wikitext2"):
        paper = get_profile(task, "paper")
        assert get_profile(task, "gpu").plan_run_samples == paper.epochs * paper.epoch_samples(1, is_standin=True)
        assert "plan_run_samples" not in get_profile(task, "quick").to_dict()
    auto = {"mfu": 0.33, "throughput": 100.0, "throughput_ci": [90.0, 110.0], "plan_speedup": 7.0, "planning_s": 50.0,
            "plan_speedup_over_run": 6.3, "plan_run_samples": 41_000}
    summary = {"tasks": {"wikitext2": {"configs": {"auto": auto}}}, "plans": {}, "loops": None}
    summary["tasks"]["wikitext2"]["profile"] = "gpu"
    (goal,) = [g for g in campaign.goals(summary) if g["goal"] == "GPT-2 auto MFU >= 30 %"]
    assert goal["measured"] == "29.7 % [26.7, 32.7] over the run of 41,000 samples with its compiling (33.0 % [29.7, 36.3] per step)"
    assert goal["verdict"].startswith("inconclusive")
    uncompiled = {key: auto[key] for key in ("mfu", "throughput", "throughput_ci", "planning_s")}
    summary["tasks"]["wikitext2"]["configs"]["auto"] = uncompiled
    (goal,) = [g for g in campaign.goals(summary) if g["goal"] == "GPT-2 auto MFU >= 30 %"]
    assert goal["measured"] == "33.0 % [29.7, 36.3]"
