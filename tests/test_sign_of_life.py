"""Every command a user types says what it is doing within 5 s: the environment check of
./run_all.sh and ./run_tests.sh (importing torch, transformers, deepspeed and seaborn takes a
minute on a first run) and the imports of the scripts/ commands are announced before they start.
Each command is stopped at its first line, so these tests cost a second or two each."""
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIRST_LINE_WITHIN_S = 5.0


def first_line(argv, cwd=REPO, limit_s=60.0) -> tuple[float, str]:
    """(seconds from the start to the first complete line on stdout or stderr, that line); the
    command and everything it started are killed then."""
    start = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    said = b""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while b"\n" not in said and time.monotonic() - start < limit_s:
                if selector.select(timeout=0.05):
                    chunk = os.read(process.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    said += chunk
        return time.monotonic() - start, said.decode(errors="replace").split("\n")[0]
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        process.stdout.close()


def _commands(folder: Path):
    records = folder / "records"
    records.mkdir()
    (records / "cifar10__baseline__smoke__0000000000__seed0.json").write_text("{}")
    python = sys.executable
    return {
        "./run_all.sh": ([str(REPO / "run_all.sh"), "--profile", "smoke", "--seeds", "1", "--sections", "01",
                          "--reports-dir", str(folder / "reports")], "[trainopt] checking the environment (importing torch"),
        "./run_tests.sh": ([str(REPO / "run_tests.sh"), "--collect-only", "-q", "tests/test_layout.py"],
                           "[trainopt] checking the environment (importing torch"),
        "gpu_check.py": ([python, "scripts/gpu_check.py", "--out", str(folder / "gpu")], "[gpu_check] importing torch"),
        "gpu_campaign.py": ([python, "scripts/gpu_campaign.py", "--out", str(folder / "campaign")],
                            "[campaign] importing torch"),
        "op_profile.py": ([python, "scripts/op_profile.py", "--out", str(folder / "ops"), "--profile", "smoke"],
                          "[op_profile] importing torch"),
        "rerun_records.py": ([python, "scripts/rerun_records.py", str(records), "--out", str(folder / "rerun")],
                             "[rerun_records] importing torch"),
        "ray_kill_cost.py": ([python, "scripts/ray_kill_cost.py", str(folder / "ray")], "[ray_kill_cost] importing torch"),
    }


@pytest.mark.parametrize("name", ["./run_all.sh", "./run_tests.sh", "gpu_check.py", "gpu_campaign.py", "op_profile.py",
                                  "rerun_records.py", "ray_kill_cost.py"])
def test_a_command_says_what_it_is_doing_within_5_s(name, tmp_path):
    argv, expected = _commands(tmp_path)[name]
    seconds, line = first_line(argv)
    assert line.startswith(expected), (name, line)
    assert seconds < FIRST_LINE_WITHIN_S, f"{name}: its first line came after {seconds:.1f} s: {line!r}"
