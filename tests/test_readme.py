"""The README's adoption example must run exactly as written."""
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def adopted_loop_from_readme() -> str:
    diff = re.search(r"```diff\n(.*?)```", README.read_text(), re.S).group(1)
    lines = [line[1:] for line in diff.splitlines() if line[:1] in (" ", "+")]
    return "\n".join(lines) + "\n"


def plain_loop_from_readme() -> str:
    diff = re.search(r"```diff\n(.*?)```", README.read_text(), re.S).group(1)
    return "\n".join(line[1:] for line in diff.splitlines() if line[:1] in (" ", "-")) + "\n"


def test_readme_adoption_example_runs_and_trains():
    code = adopted_loop_from_readme() + "assert engine.optimizer_steps > 0 and engine.k in range(4, 9)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "'k':" in result.stdout


def test_readme_plain_loop_is_the_diff_base():
    result = subprocess.run([sys.executable, "-c", plain_loop_from_readme()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
