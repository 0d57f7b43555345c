"""Long steps say what runs at least every `progress.HEARTBEAT_S` seconds: planning, training,
timing and every long notebook cell, on the cell's output and in ./run_all.sh's progress log."""
import sys
import time

import nbformat
import pytest

from trainopt_core.reproduction import autoplan, progress
from trainopt_core.reproduction.profiles import get_profile


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_long_step_says_what_runs_once_the_interval_passed_without_a_line(monkeypatch, capsys):
    clock = FakeClock()
    monkeypatch.setattr(progress, "_clock", clock)
    beat = progress.Heartbeat(interval_s=30)  # checked by hand at the fake clock's times
    with progress.step("run 3/78: wikitext2 auto seed 0", interval_s=1e9):  # its own thread never fires
        with progress.step("planning wikitext2"):
            progress.detail("timing 14 candidates")
            clock.now += 29
            assert not beat.check(clock.now)
            clock.now += 2
            assert beat.check(clock.now)
            clock.now += 14
            assert not beat.check(clock.now)  # 14 s after the last line
            progress.say("[plan] memory: fp32 k=1")  # any line counts
            clock.now += 29
            assert not beat.check(clock.now)
            clock.now += 2
            assert beat.check(clock.now)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["… run 3/78: wikitext2 auto seed 0 · planning wikitext2: 31 s so far; timing 14 candidates",
                     "[plan] memory: fp32 k=1",
                     "… run 3/78: wikitext2 auto seed 0 · planning wikitext2: 76 s so far; timing 14 candidates"]
    assert not beat.check(clock.now + 100)  # no step runs: nothing to say


def test_a_step_longer_than_the_interval_prints_while_it_runs_and_stops_with_it(capsys):
    start = time.monotonic()
    with progress.step("a stand-in", interval_s=0.2):
        time.sleep(1.1)
    ended = time.monotonic()
    time.sleep(0.5)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and all(line.startswith("… a stand-in: ") for line in lines), lines
    assert ended - start < 4  # the heartbeat did not hold the step up (bounds loose for a busy machine)


def test_planning_says_its_own_lines_and_heartbeats_into_the_progress_log(tmp_path, monkeypatch):
    log = tmp_path / "progress.log"
    monkeypatch.setenv(progress.PROGRESS_LOG, str(log))
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)

    class Stop(Exception):
        pass

    def plan_task(*args, progress=False, **kwargs):
        assert progress  # the reproduction asks plan() for its stage lines
        print("[plan] memory: fp32 k=1")
        time.sleep(0.5)  # a stage that runs past the interval
        raise Stop

    monkeypatch.setattr(autoplan, "plan_task", plan_task)
    with pytest.raises(Stop):
        autoplan.planned_record("wikitext2", get_profile("wikitext2", "smoke"), __import__("torch").device("cpu"),
                                plans_dir=tmp_path / "plans", data_policy="standin")
    lines = log.read_text().splitlines()
    assert lines[0].startswith("  planning wikitext2 for `auto` on this machine"), lines
    assert "  [plan] memory: fp32 k=1" in lines
    assert any(line.startswith("  … planning wikitext2: ") for line in lines), lines
    assert not isinstance(sys.stdout, progress._Lines)  # prints go where they went before


def test_every_long_notebook_cell_says_it_still_runs(tmp_path):
    import papermill
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell("from trainopt_core.reproduction import progress\nprogress.HEARTBEAT_S = 0.3\n"
                      "from trainopt_core.reporting.notebook import heartbeat_in_every_cell\nheartbeat_in_every_cell()"),
        new_code_cell("import time\ntime.sleep(1.5)"),
        new_code_cell("x = 1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "cells.ipynb")
    papermill.execute_notebook(str(tmp_path / "cells.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                               progress_bar=False, execution_timeout=120)
    cells = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    said = "".join(o.get("text", "") for o in cells[1].outputs)
    assert said.count("… still running: ") >= 2, said
    assert cells[2].outputs == []  # a short cell says nothing, and no line strays into it


def test_the_samples_trained_never_pass_the_runs_length_where_the_last_batch_does(tmp_path, monkeypatch):
    import re

    from trainopt_core.reproduction import runner

    details, bars = [], []

    class Bar:  # tqdm's bar, keeping the counts it was given
        def __init__(self, total, initial=0, **_):
            self.total, self.n = total, initial
            bars.append(self)
            self.shown = [initial]

        def update(self, n):
            self.n += n
            self.shown.append(self.n)

        def close(self):
            pass

    monkeypatch.setattr(runner, "tqdm", Bar)
    monkeypatch.setattr(progress, "detail", details.append)
    # the optimized smoke run's adaptive k held at 3 micro-batches, whose steps do not divide its
    # 256 samples: the last batch ends past them (eq. 6 alone would pick a k that depends on the
    # CPU kind's precision, and may land on 256 exactly)
    from trainopt_core import engine as engine_module

    monkeypatch.setattr(engine_module, "next_k", lambda estimate, *, k, sigma_target, **_: (3, sigma_target, "test"))
    record = runner.run("cifar10", "optimized", profile="smoke", out_dir=tmp_path, data_policy="standin", progress=False)
    total = bars[0].total
    assert max(step["samples_consumed"] for step in record["steps"]) > total  # the run does pass it
    counts = [tuple(int(n.replace(",", "")) for n in re.search(r"([\d,]+) of ([\d,]+) samples", text).groups())
              for text in details]
    assert counts and all(shown <= of for shown, of in counts), counts
    assert all(shown <= bar.total for bar in bars for shown in bar.shown)
    assert (total, total) in counts  # the count reaches the total
