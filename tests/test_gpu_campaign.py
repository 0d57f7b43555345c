"""scripts/gpu_campaign.py, the one command a GPU session runs: its arguments, and a rehearsal of
its plumbing on the CPU at smoke sizes -- every stage, the files it leaves, resuming, the budget."""
import json
import tarfile

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
                          "--stages", "runs:wikitext2,loops,profile:wikitext2"]) == 0
    assert campaign.main(["--out", str(second), "--resume", str(first), "--device", "cpu", "--profile", "smoke",
                          "--stages", "runs:wikitext2,loops,profile:wikitext2,plan:wikitext2"]) == 0
    summary = json.loads((second / "summary.json").read_text())
    # the first call's stages kept, only the new one run
    assert summary["stages_done"] == ["runs:wikitext2", "loops", "profile:wikitext2", "plan:wikitext2"]
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
    goals = {g["goal"]: g for g in summary["goals"]}
    assert "trainopt engine >= 0.99x the hand-written loop" in goals
    assert any(goal.startswith("planning <= 60 s (wikitext2") for goal in goals)
    with tarfile.open(second / "records.tar.gz") as tar:
        names = tar.getnames()
    assert "smoke/timing/throughput__wikitext2.json" in names  # the first call's records travel on
    assert "plans_at_paper_size/smoke/plan__wikitext2.json" in names
    text = (second / "summary.md").read_text()
    assert text.index("## Goals") < text.index("## GPT-2 124M on stand-in: ") and "(NOT WikiText-2): smoke profile" in text
    assert "## wikitext2: auto (" in (second / "profiles.txt").read_text()


def test_compiling_repays_from_compile_seconds_over_the_seconds_saved_per_sample(campaign):
    chosen = {"candidate": "bf16", "seconds_per_sample": 0.0065, "compile_s": None}
    compiled = {"candidate": "bf16, compiled", "seconds_per_sample": 0.0028, "compile_s": 37.0}
    assert campaign.compile_break_even(compiled, chosen) == pytest.approx(37.0 / 0.0037)
    assert campaign.compile_break_even(chosen, chosen) is None  # not compiled
    assert campaign.compile_break_even({**compiled, "seconds_per_sample": 0.007}, chosen) is None  # never repays
    assert campaign.compile_break_even(compiled, {**chosen, "compile_s": 5.0}) is None  # the choice compiles too


def test_the_mfu_goal_takes_the_plans_fastest_step_not_its_highest_utilization(campaign):
    def row(name, speedup, mfu, break_even=None):
        return {"candidate": name, "speedup": speedup, "speedup_ci_low": 0.9 * speedup,
                "speedup_ci_high": 1.1 * speedup, "mfu": mfu, "break_even_samples": break_even}

    plan = {"choice": "bf16", "run_samples": 2600, "speedup": 3.0, "speedup_ci": [2.9, 3.1], "planning_s": 50.0,
            "compile_s": 30.0, "candidates": [row("fp32", 1.0, 0.64), row("bf16", 3.0, 0.13),
                                              row("bf16, compiled", 7.0, 0.32, break_even=8700.0)]}
    goals = campaign.goals({"tasks": {}, "plans": {"wikitext2": plan}, "loops": None})
    (mfu,) = [g for g in goals if g["goal"].startswith("GPT-2 MFU >= 30 %")]
    assert mfu["measured"].startswith("32.0 % [28.8, 35.2], bf16, compiled; repays its compiling from 8,700 samples")
    assert mfu["verdict"] == "inconclusive (the bar is inside the 95 % interval)"


def test_the_reports_index_lists_each_gpu_campaigns_goals(tmp_path):
    from trainopt_core.reporting.index import write_reports_index

    folder = tmp_path / "gpu" / "some-gpu" / "campaign"
    folder.mkdir(parents=True)
    goals = [{"goal": "GPT-2 auto MFU >= 30 %", "measured": "13.5 % [13.5, 13.6]", "verdict": "not met"}]
    (folder / "summary.json").write_text(json.dumps({"device": "Some GPU", "goals": goals}))
    index = write_reports_index(tmp_path).read_text()
    assert "## GPU campaigns" in index and "### Some GPU: [gpu/some-gpu/](gpu/some-gpu/README.md)" in index
    assert "| GPT-2 auto MFU >= 30 % | 13.5 % [13.5, 13.6] | not met |" in index
    (folder / "summary.json").unlink()
    assert "GPU campaigns" not in write_reports_index(tmp_path).read_text()


def test_the_reports_index_shows_each_gpus_latest_campaign(tmp_path):
    from trainopt_core.reporting.index import write_reports_index

    for name, date, measured in (("campaign", "2026-11-26T10:00:00+00:00", "13.5 %"),
                                 ("campaign_abc1234", "2026-11-27T09:00:00+00:00", "13.6 %")):
        folder = tmp_path / "gpu" / "some-gpu" / name
        folder.mkdir(parents=True)
        goals = [{"goal": "GPT-2 auto MFU >= 30 %", "measured": measured, "verdict": "not met"}]
        (folder / "summary.json").write_text(json.dumps({"device": "Some GPU", "goals": goals}))
        (folder / "environment.json").write_text(json.dumps({"date_utc": date}))
    index = write_reports_index(tmp_path).read_text()
    assert index.count("### Some GPU") == 1
    assert "From `gpu/some-gpu/campaign_abc1234/`, made 2026-11-27." in index
    assert "| 13.6 % | not met |" in index and "| 13.5 % |" not in index
