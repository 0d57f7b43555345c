"""The between-session spread of timings on one machine kind -- instruction set and CPU family --
(reporting.session_floor), estimated from reproductions' timing records of different sittings
(days and commits) and carried into every throughput and time interval."""
import json
import math
import re
from pathlib import Path

import pytest

from trainopt_core.reporting import results, session_floor
from trainopt_core.reporting.index import footnotes

ROOT = Path(__file__).resolve().parents[1]


KIND = "AVX2, AMD family 25 model 1"


def _timing_record(folder: Path, session_factor: float, *, isa="AVX2", device="cpu", ratio=0.5, settings=None,
                   sitting=("2030-01-01", "a"), cpu_id="family 25 model 1 stepping 1"):
    """One session's interleaved timing of a baseline and an optimized configuration: every rate
    of the session scaled by `session_factor`, the optimized one at `ratio` of the baseline; made
    on the day and at the commit of `sitting`."""
    base = [100.0 * session_factor * (1 + 0.001 * i) for i in range(4)]
    hardware = {"cpu_isa": isa, "cpu_model": "AMD EPYC", **({"cpu_id": cpu_id} if cpu_id else {})}
    record = {"kind": "interleaved_throughput", "status": "complete", "task": "cifar10", "profile": "quick",
              "conditions": {"device_type": device, "hardware": {"cpu_isa": isa, "cpu_id": str(session_factor)},
                             "profile_settings": settings or {"model": "small", "timing_windows_per_seed": 4}},
              "manifest": {"device": device, "hardware": hardware, "date_utc": f"{sitting[0]}T10:00:00+00:00",
                           "git": {"commit": sitting[1], "dirty": False}},
              "results": {"baseline": {"items_per_s": base, "config_hash": "a"},
                          "optimized": {"items_per_s": [ratio * b for b in base], "config_hash": "b"}}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "throughput__cifar10.json"
    path.write_text(json.dumps(record))
    return path


SITTINGS = (("2030-01-01", "a"), ("2030-01-02", "b"), ("2030-01-03", "c"))


def _sessions(folder: Path, factors=(1.0, 1.2, 0.9)):
    return [_timing_record(folder / f"s{i}", f, sitting=SITTINGS[i]) for i, f in enumerate(factors)]


def test_the_floor_is_the_spread_of_sitting_means_less_the_windows_own(tmp_path):
    factors = (1.0, 1.2, 0.9)
    paths = _sessions(tmp_path, factors)
    # a rerun in the first sitting (its day, its commit) is pooled with it, not counted as a sitting
    paths.append(_timing_record(tmp_path / "rerun", 1.0, sitting=SITTINGS[0]))
    # no floor from: one AMX session, one GPU session, sessions whose CPU family is not recorded,
    # another CPU family's sessions in one sitting
    paths.append(_timing_record(tmp_path / "amx", 1.0, isa="AVX512+bf16+amx"))
    paths.append(_timing_record(tmp_path / "gpu", 3.0, device="cuda"))
    paths += [_timing_record(tmp_path / f"old{i}", 1.5, cpu_id=None, sitting=SITTINGS[i]) for i in range(2)]
    paths += [_timing_record(tmp_path / f"f23_{i}", 0.5, cpu_id="family 23 model 1 stepping 2") for i in range(2)]
    floors = session_floor.estimate(paths)
    assert set(floors) == {KIND}
    logs = [math.log(f) for f in factors]
    mean = sum(logs) / 3
    between = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2)
    assert floors[KIND]["rate"] == pytest.approx(between, rel=0.01)  # the windows' own spread is tiny
    assert floors[KIND]["ratio"] == pytest.approx(0.0, abs=1e-6)  # the ratio held in every session
    assert (floors[KIND]["sittings"], floors[KIND]["days"], floors[KIND]["commits"]) == (3, 3, 3)
    assert len(floors[KIND]["records"]) == 4


def test_sessions_of_one_sitting_or_one_day_give_no_floor(tmp_path):
    same_sitting = [_timing_record(tmp_path / f"a{i}", f) for i, f in enumerate((1.0, 1.5))]
    assert session_floor.estimate(same_sitting) == {}
    one_day = [_timing_record(tmp_path / f"b{i}", f, sitting=("2030-01-01", c)) for i, (f, c) in
               enumerate(((1.0, "a"), (1.5, "b")))]
    assert session_floor.estimate(one_day) == {}
    two_days = one_day + [_timing_record(tmp_path / "c", 1.2, sitting=("2030-01-02", "c"))]
    assert set(session_floor.estimate(two_days)) == {KIND}


def test_the_machine_kind_names_the_cpu_family_from_the_manifest_or_says_it_is_unknown():
    def manifest(**hardware):
        return {"device": "cpu", "hardware": hardware}

    assert session_floor.machine_kind(manifest(cpu_isa="AVX2", cpu_model="AMD EPYC",
                                               cpu_id="family 25 model 1 stepping 1")) == KIND
    assert session_floor.machine_kind(manifest(cpu_isa="AVX2", cpu_family_model="AMD family 23 model 1")) == \
        "AVX2, AMD family 23 model 1"
    assert session_floor.machine_kind(manifest(cpu_isa="AVX2", cpu_model="AMD EPYC")) == "AVX2, family unknown"
    assert session_floor.machine_kind(manifest(cpu_model="AMD EPYC")) == "CPU, instruction set and family unknown"
    assert session_floor.machine_kind({"device": "cuda:0", "hardware": {"cpu_isa": "AVX2"}}) is None
    assert "its manifests predate these fields" in session_floor.describe("AVX2, family unknown")
    # a manifest made now records the family, which its kind then names
    from trainopt_core.measure import run_manifest

    made = run_manifest(device="cpu")
    family = made["hardware"]["cpu_family_model"]
    assert family == "unknown" or " model " in family
    assert session_floor.machine_kind(made).endswith(family if family != "unknown" else "family unknown")


def test_sessions_of_another_workload_or_only_other_timing_settings(tmp_path):
    other = _timing_record(tmp_path / "other", 2.0, settings={"model": "large", "timing_windows_per_seed": 4},
                           sitting=SITTINGS[1])
    same = _timing_record(tmp_path / "same", 2.0, settings={"model": "small", "timing_windows_per_seed": 8},
                          sitting=SITTINGS[1])
    first = _timing_record(tmp_path / "first", 1.0)
    assert session_floor.estimate([first, other]) == {}  # another model: nothing to pool
    assert session_floor.estimate([first, same])[KIND]["rate"] == pytest.approx(math.log(2) / math.sqrt(2), rel=0.01)


def test_widening_adds_the_floor_in_quadrature_in_log_space():
    summary = {"mean": 100.0, "ci_low": 90.0, "ci_high": 110.0}
    wide = session_floor.widen(summary, 0.1)
    assert wide["ci_low"] == pytest.approx(100 * math.exp(-math.hypot(math.log(100 / 90), 1.959964 * 0.1)))
    assert wide["ci_high"] == pytest.approx(100 * math.exp(math.hypot(math.log(110 / 100), 1.959964 * 0.1)))
    assert (wide["session_ci_low"], wide["session_ci_high"]) == (90.0, 110.0)
    assert session_floor.widen(summary, None) is summary
    assert session_floor.widen({"mean": 1.0, "ci_low": None, "ci_high": None}, 0.1)["ci_low"] is None


def _runs(kind):
    base = [80.0, 100.0, 120.0, 100.0]
    timing = {"baseline": base, "optimized": [b * 0.5 for b in base]}
    return [{"task": "cifar10", "config_name": name, "seed": seed, "model_name": "ResNet", "data_source": "stand-in",
             "config": {"precision": "fp32"}, "metrics": {"samples_to_target": 1000.0 + 100 * seed},
             "timing": {"items_per_s": rates, "samples_per_s": rates, "machine_kind": kind}}
            for name, rates in timing.items() for seed in (0, 1)]


def test_tables_carry_the_floor_of_the_timings_machine_kind_and_say_what_an_interval_covers(monkeypatch):
    monkeypatch.setattr(session_floor, "floors", lambda: {"AVX2": {"rate": 0.2, "ratio": 0.06, "sittings": 7,
                                                                   "days": 3}})
    one_session, floored = results.aggregate(_runs("GPU-or-unknown")), results.aggregate(_runs("AVX2"))
    for column in ("throughput", "time_to_target_s"):
        assert floored[f"{column}_ci_low"][0] < one_session[f"{column}_ci_low"][0]
        assert floored[f"{column}_ci_high"][0] > one_session[f"{column}_ci_high"][0]
        assert floored[f"{column}_mean"][0] == one_session[f"{column}_mean"][0]
    for key in ("throughput", "time_to_target_s"):
        narrow = results.measured_change(_runs(None), "cifar10", "baseline", "optimized", key)
        wide = results.measured_change(_runs("AVX2"), "cifar10", "baseline", "optimized", key)
        assert wide["mean"] == pytest.approx(narrow["mean"])
        assert wide["ci_low"] < narrow["ci_low"] and wide["ci_high"] > narrow["ci_high"]
    # the paired ratio is exactly 0.5 in every window: its interval is the floor's alone
    wide = results.measured_change(_runs("AVX2"), "cifar10", "baseline", "optimized", "throughput")
    assert wide["ci_high"] + 1 == pytest.approx(0.5 * math.exp(1.959964 * 0.06))
    assert "spread between sittings measured on AVX2 (20.0 % for rates, 6.0 % for ratios to the baseline, " \
        "relative SD, from 7 sittings on 3 days)" in " ".join(footnotes(_runs("AVX2")))
    assert "cover this session's interleaved windows only" in " ".join(footnotes(_runs(None)))
    assert "interleaved windows" not in " ".join(footnotes(_runs("AVX2"), timing=False))  # a table without timing


def test_the_committed_floors_are_what_the_committed_reproductions_give(monkeypatch):
    monkeypatch.chdir(ROOT)  # the committed file names its records relative to the checkout
    committed = json.loads(session_floor.FLOOR_FILE.read_text())["floors"]
    paths = sorted((ROOT / "reports").rglob("throughput__*.json"))
    measured = session_floor.estimate([p.relative_to(ROOT) for p in paths]) if paths else {}
    assert set(committed) == set(measured) and committed
    for kind, floor in committed.items():
        assert floor["rate"] == pytest.approx(measured[kind]["rate"]) and floor["records"] == measured[kind]["records"]


def test_the_floors_and_rerun_check_tables_of_docs_verdicts_are_what_the_floors_check_writes(monkeypatch):
    """docs/verdicts.md's two tables went stale once (1,296 pairs where the check gave 1,370)."""
    from trainopt_core.reporting import floors

    monkeypatch.chdir(ROOT)  # the check reads the records as the command line names them
    committed = (ROOT / "docs" / "verdicts.md").read_text()
    coverage = session_floor.rerun_coverage(sorted(Path("reports").rglob("throughput__*.json")))
    assert floors.with_tables(committed, session_floor.floors(), coverage) == committed, (
        "python -m trainopt_core.reporting.floors reports --check --docs docs/verdicts.md writes them again")
    # the table names which of the reference's timings are among the floor's records (GPT-2's, ResNet's or both)
    assert re.search(r"the reference's (GPT-2 and ResNet|GPT-2|ResNet) timing among them", committed), \
        "docs/verdicts.md: say which of the reference's timings are among the floor's records"


def test_the_rerun_check_counts_how_often_a_session_lands_inside_another_sessions_interval(tmp_path, capsys):
    from trainopt_core.reporting.floors import main

    paths = _sessions(tmp_path)
    floors = session_floor.estimate(paths)
    counted = session_floor.rerun_coverage(paths, floors)
    # 3 sessions: 6 ordered pairs per cell; the windows are far narrower than the session spread
    assert counted["rate"] == {"pairs": 12, "inside": counted["rate"]["inside"], "inside_one_session": 0}
    assert counted["rate"]["inside"] > 0
    assert counted["ratio"]["pairs"] == 6 and counted["ratio"]["inside"] == 6  # the ratio is the same everywhere
    assert session_floor.rerun_coverage(paths, {}) == {w: {"pairs": 0, "inside": 0, "inside_one_session": 0}
                                                       for w in ("rate", "ratio")}
    out = tmp_path / "floors.json"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["floors"][KIND]["rate"] == pytest.approx(floors[KIND]["rate"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    assert "missing: not a folder" in capsys.readouterr().err
    # one fresh session against the others: only its pairs, both ways (2 of the 6 per cell are s0-s1, s1-s0 ...)
    fresh = session_floor.rerun_coverage(paths, floors, fresh=[tmp_path / "s2"])
    assert fresh["rate"]["pairs"] == 8 and fresh["ratio"]["pairs"] == 4
    assert main([str(tmp_path / "s0"), str(tmp_path / "s1"), "--check", "--fresh", str(tmp_path / "s2")]) == 0
    assert "rate: 8 ordered pairs of sessions" in capsys.readouterr().out
