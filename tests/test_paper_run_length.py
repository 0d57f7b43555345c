"""The paper profile's run is the paper's, whatever the data at hand: with a stand-in an epoch
counts the paper's training set (CIFAR-10's 50,000 images; WikiText-2's 2.1 M tokens in 1,024-token
sequences) and the stand-in is cycled to that length, so the run's length, time to target and
plan()'s compile-repay decision are the paper workload's. The other profiles keep their epochs
and the conditions their committed records were made under."""
import dataclasses
import json
from pathlib import Path

import pytest

from trainopt_core.reproduction import profiles
from trainopt_core.reproduction.profiles import TASKS, get_profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("task, epoch, run", [("cifar10", 50_000, 1_500_000), ("wikitext2", 2_050, 41_000)])
def test_with_a_stand_in_the_paper_profile_counts_the_papers_training_set(task, epoch, run):
    prof = get_profile(task, "paper")
    assert prof.epoch_samples(130, is_standin=True) == epoch
    assert prof.epochs * prof.epoch_samples(130, is_standin=True) == run
    assert prof.epoch_samples(2_300, is_standin=False) == 2_300  # the real data set: its own size
    for other in ("smoke", "quick", "gpu"):  # the campaign's short runs stay short
        assert get_profile(task, other).epoch_samples(130, is_standin=True) == 130


def test_the_committed_reference_records_stay_reusable():
    """A profile whose epoch is the data at hand keeps the settings its records were made under."""
    for task in TASKS:
        record = json.loads(next((ROOT / "reports/quick/runs").glob(f"{task}__baseline__*seed0.json")).read_text())
        assert record["conditions"]["profile_settings"] == json.loads(json.dumps(get_profile(task, "quick").to_dict()))
    assert "paper_epoch_samples" in get_profile("cifar10", "paper").to_dict()


def test_list_prints_each_tasks_run_length_beside_the_commands(capsys):
    from trainopt_core.reproduction.__main__ import main

    assert main(["list", "--profile", "paper", "--seeds", "1", "--configs", "baseline"]) == 0
    out, err = capsys.readouterr()
    assert "30 epochs x 50,000 images = 1,500,000 images with a stand-in" in err
    assert "20 epochs x 2,050 sequences of 1,024 tokens = 41,000 sequences of 1,024 tokens with a stand-in" in err
    assert all(line.startswith("python -m trainopt_core.reproduction ") for line in out.splitlines())
    main(["list", "--profile", "quick", "--seeds", "1", "--configs", "baseline"])
    assert "2 epochs x 8,000 images = 16,000 images\n" in capsys.readouterr().err


def test_a_stand_in_is_cycled_to_the_papers_length_and_the_record_says_how_often(monkeypatch, tmp_path):
    from trainopt_core.reproduction import runner

    smoke = get_profile("cifar10", "smoke")  # 256 distinct stand-in images, 1 epoch
    monkeypatch.setitem(profiles._PROFILES, ("cifar10", "smoke"), dataclasses.replace(smoke, paper_epoch_samples=640))
    record = runner.run("cifar10", "baseline", profile="smoke", seed=0, out_dir=tmp_path, progress=False,
                        device="cpu")
    assert record["history"][-1]["samples"] >= 640  # 2.5 passes, not the one epoch of 256
    assert ("the paper's run length with a stand-in: 1 epoch x 640 samples (the paper's training set) = 640 "
            "samples, 2.5 passes over the stand-in's 256 distinct samples") in record["notes"]
    assert record["conditions"]["profile_settings"]["paper_epoch_samples"] == 640


def test_compiling_repays_over_the_papers_run_and_not_over_the_stand_ins():
    """GPT-2 at the paper's sizes: compiled 7.33x the fp32 baseline per step against the best
    eager 5.0x, compiling 53 s: it repays from about 8,350 sequences (fake timings, the shape of
    an H200's). Over the stand-in's data at hand (about 2,600 sequences) the eager candidate wins;
    over the paper profile's run the compiled one."""
    from trainopt_core.planner.choice import choose

    def rows():
        base = {"candidate": "fp32, k=1", "precision": "fp32", "k": 1, "peak_memory_bytes": 100.0, "speedup": 1.0,
                "speedup_ci_low": 1.0, "speedup_ci_high": 1.0, "energy_j_per_sample": None,
                "rejected_because": None, "feasible": False, "seconds_per_sample": 0.1}
        eager = dict(base, candidate="bf16, k=1", precision="bf16", speedup=5.0, speedup_ci_low=4.9,
                     speedup_ci_high=5.1)
        del eager["seconds_per_sample"]
        compiled = dict(eager, candidate="bf16, k=1, compiled", speedup=7.33, speedup_ci_low=7.2,
                        speedup_ci_high=7.5, compile_s=53.0)
        return [base, eager, compiled]

    def chosen(made):
        return next(row["candidate"] for row in made if row.get("chosen"))

    prof = get_profile("wikitext2", "paper")
    paper_run = int(prof.epochs * prof.epoch_samples(130, is_standin=True))
    at_hand = rows()
    choose(at_hand, None, (1.0, 0.0, 0.0), run_samples=2_600)
    assert chosen(at_hand) == "bf16, k=1"
    over_paper = rows()
    notes = choose(over_paper, None, (1.0, 0.0, 0.0), run_samples=paper_run)
    assert chosen(over_paper) == "bf16, k=1, compiled"
    assert over_paper[2]["speedup_over_run"] == pytest.approx(0.1 / (0.1 / 7.33 + 53.0 / 41_000))
    assert "41,000 samples" in notes[-1]
