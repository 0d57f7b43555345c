"""examples/: each script runs, does what its feature promises, and adds the lines examples/README.md
says it adds. The adoption bar: gpt_loop_trainopt.py takes over a per-step GPT loop's hand-written
accumulation, precision, schedule and clipping in <= 5 added statements, with the same losses."""
from __future__ import annotations

import ast
import difflib
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_adoption import _reference_lr as reference_lr

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ITERS = 20  # optimizer steps per example run in the tests (the scripts default to 60)


def run_example(name: str, *args: str, source: str | None = None, names: dict | None = None) -> dict:
    """Run examples/`name` in this process as `python examples/name --max-iters ITERS args` would;
    returns its globals. `source` runs that text instead (a hand-written variant of the loop), with
    `names` defined for it."""
    argv, path = sys.argv, sys.path[:]
    sys.argv = [name, "--max-iters", str(ITERS), *args]
    sys.path.insert(0, str(EXAMPLES))
    try:
        if source is None:
            return runpy.run_path(str(EXAMPLES / name), run_name="__main__")
        namespace = {"__name__": "__main__", "__file__": str(EXAMPLES / name), **(names or {})}
        exec(compile(source, str(EXAMPLES / name), "exec"), namespace)
        return namespace
    finally:
        sys.argv, sys.path[:] = argv, path


def with_lines_after(name: str, anchor: str, lines: str) -> str:
    """examples/`name`'s text with `lines` inserted after the line holding `anchor`, indented like
    the line that follows it (the body, after a loop header)."""
    text = (EXAMPLES / name).read_text()
    all_lines = text.splitlines(keepends=True)
    index = next(i for i, line in enumerate(all_lines) if anchor in line)
    at, after = all_lines[index], all_lines[index + 1]
    indent = after[:len(after) - len(after.lstrip())]
    return text.replace(at, at + "".join(indent + line + "\n" for line in lines.splitlines()), 1)


def added_statements(original: str, adopted: str) -> tuple[int, int]:
    """(statements, physical lines) of `adopted` that `original` lacks: lines compared ignoring
    indentation, as `diff -w` does; imports, the `config = ...` statement, the module docstring,
    comments and blank lines left out. A statement wrapped over several lines counts once."""
    old = [line.strip() for line in original.splitlines()]
    new = [line.strip() for line in adopted.splitlines()]
    added = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            added += [number for number in range(j1 + 1, j2 + 1) if new[number - 1] and not new[number - 1].startswith("#")]
    tree = ast.parse(adopted)
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    excluded = set()
    for node in statements:
        is_config = isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "config" for t in node.targets)
        if isinstance(node, (ast.Import, ast.ImportFrom)) or is_config or node is tree.body[0]:
            excluded.update(range(node.lineno, node.end_lineno + 1))

    def innermost(line: int) -> ast.stmt:  # the statement a line belongs to (a compound one's header)
        holding = [node for node in statements if node.lineno <= line <= node.end_lineno]
        return max(holding, key=lambda node: (node.lineno, -node.end_lineno))

    counted = [line for line in added if line not in excluded]
    return len({id(innermost(line)) for line in counted}), len(counted)


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in getattr(model, "module", model).state_dict().items()}


def assert_same_weights(a: dict, b: dict, *, rtol: float = 0.0, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def plain() -> dict:
    return run_example("plain_loop.py")


NORM_IN_PLAIN_LOOP = "norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))"


@pytest.fixture(scope="module")
def plain_norms() -> list[float]:
    """The plain loop's gradient norm at each step (the whole batch's gradient)."""
    return run_example("plain_loop.py", source=with_lines_after("plain_loop.py", "loss.backward()", NORM_IN_PLAIN_LOOP),
                       names={"norms": []})["norms"]


def test_the_plain_loop_learns(plain):
    assert plain["losses"][-1] < plain["losses"][0] - 0.5  # from ln(128) = 4.85 toward the chain's entropy


def test_adopting_four_components_in_a_per_step_gpt_loop_adds_at_most_five_lines_and_keeps_the_losses(capsys):
    original, adopted = (EXAMPLES / "gpt_loop.py").read_text(), (EXAMPLES / "gpt_loop_trainopt.py").read_text()
    statements, physical = added_statements(original, adopted)
    print(f"gpt_loop -> gpt_loop_trainopt: {statements} statements added ({physical} lines)")
    assert statements <= 5
    by_hand, by_engine = run_example("gpt_loop.py"), run_example("gpt_loop_trainopt.py")
    assert by_engine["engine"].config.precision == "bf16" and by_engine["engine"].k == 4
    assert by_engine["losses"] == by_hand["losses"]  # bit for bit, bf16 autocast and clipping included
    assert_same_weights(parameters(by_engine["model"]), parameters(by_hand["model"]))


def test_precision_runs_the_forward_in_bf16_and_keeps_fp32_weights(plain):
    run = run_example("feature_precision.py")
    assert run["logits"].dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in run["model"].parameters())
    assert abs(run["losses"][-1] - plain["losses"][-1]) < 0.05  # bf16 rounding, not a different run


def _reference_lr(it: int, args) -> float:
    return reference_lr(it, learning_rate=args.lr, warmup_iters=args.warmup_iters, lr_decay_iters=args.max_iters,
                        min_lr=args.min_lr)


def test_the_schedule_equals_a_hand_written_warmup_and_cosine_in_the_plain_loop():
    run = run_example("feature_schedule.py")
    source = with_lines_after("plain_loop.py", "for it in range",
                              "for group in optimizer.param_groups:\n    group['lr'] = reference_lr(it, args)")
    hand = run_example("plain_loop.py", source=source, names={"reference_lr": _reference_lr})
    assert run["engine"].lr == pytest.approx(_reference_lr(ITERS - 1, run["args"]), rel=1e-12)
    # the same LR to the last bits or so: AdamW's steps then agree to float rounding
    assert_same_weights(parameters(run["model"]), parameters(hand["model"]), rtol=1e-5, atol=1e-7)


def test_clipping_equals_clip_grad_norm_in_the_plain_loop():
    run = run_example("feature_clipping.py")
    source = with_lines_after("plain_loop.py", "loss.backward()",
                              "torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)")
    hand = run_example("plain_loop.py", source=source)
    assert run["engine"].last_grad_norm > run["args"].grad_clip  # the clip was active
    assert run["losses"] == hand["losses"]
    assert_same_weights(parameters(run["model"]), parameters(hand["model"]))


def test_checkpointing_keeps_losses_and_state_dict_of_the_plain_loop(plain):
    from trainopt_core.checkpointing import checkpoint_plan

    run = run_example("feature_checkpointing.py")
    assert checkpoint_plan(run["model"]).segments == 2
    assert run["losses"] == plain["losses"]  # recompute gives the same values on the CPU
    assert list(run["model"].state_dict()) == list(plain["model"].state_dict())
    assert_same_weights(parameters(run["model"]), parameters(plain["model"]))


def test_accumulation_takes_the_steps_of_the_whole_batch(plain, plain_norms):
    # the accumulated gradient's norm at every step beside the whole batch's in the plain loop: a
    # missing or doubled 1/k shows as a factor 4 (the weights alone would hide it: AdamW's update
    # does not change when the gradient is scaled)
    run = run_example("feature_accumulation.py", source=with_lines_after(
        "feature_accumulation.py", "engine.step()", "norms.append(float(engine.last_grad_norm))"), names={"norms": []})
    assert run["engine"].k == 4 and run["engine"].samples_consumed == ITERS * 16
    assert run["norms"][0] == pytest.approx(plain_norms[0], rel=1e-6)
    assert run["norms"] == pytest.approx(plain_norms, rel=1e-3)
    # the same steps, summed in another order: equal to float rounding, which AdamW's division by
    # sqrt(v) enlarges on parameters whose gradient is near zero
    assert_same_weights(parameters(run["model"]), parameters(plain["model"]), rtol=1e-3, atol=1e-4)


def test_adaptive_k_moves_within_its_bounds_and_runs_to_the_samples_asked(capsys):
    run = run_example("feature_adaptive_k.py")
    logged = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    ks = [entry["next_k_micro_batches"] for entry in logged]
    assert len(logged) >= 2 and all(2 <= k <= 8 for k in ks) and len(set(ks + [2])) > 1
    assert all(entry["b_simple_items"] > 0 for entry in logged)
    engine = run["engine"]
    assert engine.done() and ITERS * 16 <= engine.samples_consumed < ITERS * 16 + 8 * 4
    # micro-batches of 4: between ITERS * 16 / (8 * 4) steps (k = 8 throughout) and / (2 * 4) (k = 2)
    assert ITERS * 16 // 32 <= engine.optimizer_steps == len(run["losses"]) < ITERS * 16 // 8


@pytest.mark.parametrize("name", ["feature_ddp.py", "feature_zero.py"])
def test_data_parallel_on_two_processes_takes_the_steps_of_one(name, plain, plain_norms, tmp_path):
    if name == "feature_zero.py":
        pytest.importorskip("deepspeed")
    script = tmp_path / name  # the example, printing each step's gradient norm on rank 0
    script.write_text(with_lines_after(name, "engine.step()",
                                       "print('grad norm', float(engine.last_grad_norm)) if dist.rank == 0 else None"))
    out = tmp_path / "losses.json"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script),
         "--max-iters", str(ITERS), "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLES)]), "DS_ACCELERATOR": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    if name == "feature_zero.py":
        assert "ZeRO-2 over 2 processes (optimizer state and gradients partitioned)" in result.stdout
    assert len(json.loads(out.read_text())["losses"]) == ITERS
    norms = [float(line.split()[-1]) for line in result.stdout.splitlines() if line.startswith("grad norm")]
    # each process's half of every batch, all-reduced: the whole batch's gradient (a missing
    # average over the 2 processes would double it)
    assert norms[0] == pytest.approx(plain_norms[0], rel=1e-6)
    assert norms == pytest.approx(plain_norms, rel=1e-3)
    # and the one-process steps, to float rounding (enlarged by AdamW where a gradient is near zero)
    weights = torch.load(f"{out}.pt", weights_only=True)
    assert_same_weights(weights, parameters(plain["model"]), rtol=1e-3, atol=1e-4)


def _readme_table() -> dict[str, int]:
    text = (EXAMPLES / "README.md").read_text()
    rows = re.findall(r"^\| \[`(feature_\w+\.py)`\]\([^)]*\) \| [^|]+ \| (\d+) \|", text, flags=re.MULTILINE)
    return {name: int(count) for name, count in rows}


def test_the_readme_table_lists_every_feature_example_with_the_statements_it_adds():
    table = _readme_table()
    assert sorted(table) == sorted(path.name for path in EXAMPLES.glob("feature_*.py"))
    plain_text = (EXAMPLES / "plain_loop.py").read_text()
    measured = {name: added_statements(plain_text, (EXAMPLES / name).read_text())[0] for name in table}
    assert measured == table


def code(name: str) -> list[str]:
    """examples/`name`'s lines below its module docstring."""
    text = (EXAMPLES / name).read_text()
    return text[text.index('"""', 3) + 4:].splitlines(keepends=True)


def adoption_diff(original: str, adopted: str) -> str:
    """`original` -> `adopted` (examples/ scripts) as `diff -u` shows it, below the module docstrings."""
    return "".join(difflib.unified_diff(code(original), code(adopted), f"examples/{original}",
                                        f"examples/{adopted}", n=1))


def test_the_readme_shows_the_adoption_diffs_as_they_are():
    shown = re.findall(r"```diff\n(.*?)```", (EXAMPLES / "README.md").read_text(), flags=re.DOTALL)
    assert shown == [adoption_diff("gpt_loop.py", "gpt_loop_trainopt.py"),
                     adoption_diff("char_gpt.py", "char_gpt_trainopt.py")]


def test_the_checkpoint_lines_the_docs_show_are_the_adopted_scripts():
    readme = (ROOT / "docs" / "adopting.md").read_text()
    shown = re.search(r"resumes bit for bit:\n\n```diff\n(.*?)```", readme, flags=re.DOTALL).group(1)
    original = {line.rstrip() for line in code("char_gpt.py")}
    adopted = {line.rstrip() for line in code("char_gpt_trainopt.py")}
    for line in shown.splitlines():
        mark, text = line[:1], line[1:].rstrip()
        if text.strip() == "...":
            continue
        assert mark in "+- ", line
        assert (mark == "+" or text in original) and (mark == "-" or text in adopted), line


def test_the_line_count_counts_what_it_should():
    original = "import torch\nx = 1\nfor i in range(3):\n    y = i\n"
    adopted = ('"""doc"""\nimport torch\nimport trainopt_core\nconfig = dict(\n    a=1)\nx = 1\n'
               "for i in range(4):\n    if i:\n        y = i\n    z = f(a,\n          b)\n")
    # range(4) (a changed header), if i: and z = f(...) (two lines, one statement); y = i only re-indented
    assert added_statements(original, adopted) == (3, 4)


# ---------------------------------------------------------------- a third-party-style script
CHAR_GPT = ("--eval-interval", "4", "--eval-iters", "2", "--warmup-iters", "3", "--lr-decay-iters", "12",
            "--dtype", "float32")


def char_gpt(name: str, out_dir: Path, max_iters: int, *args: str) -> dict:
    """Run examples/`name` (char_gpt.py or its adopted twin) to iteration `max_iters` with its
    checkpoints in `out_dir`; returns its log (each iteration's loss, each evaluation)."""
    log = out_dir.parent / f"{out_dir.name}-{name}-{max_iters}.json"
    run_example(name, *CHAR_GPT, "--max-iters", str(max_iters), "--out-dir", str(out_dir), "--log", str(log), *args)
    return json.loads(log.read_text())


def test_a_third_party_script_adopted_the_readmes_way_keeps_its_fp32_losses(tmp_path, capsys):
    original = char_gpt("char_gpt.py", tmp_path / "original", 12)
    adopted = char_gpt("char_gpt_trainopt.py", tmp_path / "adopted", 12)
    assert original["iters"] == adopted["iters"] == list(range(13))  # iter_num 0..max_iters, as the script counts
    # the same to fp32 rounding: the engine's LR (base x factor) and the script's formula differ in the last bit
    assert max(abs(a - b) for a, b in zip(original["losses"], adopted["losses"])) < 1e-5
    assert [e[0] for e in original["evals"]] == [e[0] for e in adopted["evals"]]
    assert max(abs(a[1] - b[1]) for a, b in zip(original["evals"], adopted["evals"])) < 1e-5
    assert adopted["losses"][-1] < adopted["losses"][0] - 0.5  # it learns


def test_the_adopted_script_resumes_bit_for_bit_and_the_original_does_not(tmp_path, capsys):
    def weights(out_dir):
        return torch.load(out_dir / "ckpt.pt", weights_only=True)["model"]

    for name in ("char_gpt_trainopt.py", "char_gpt.py"):
        whole = char_gpt(name, tmp_path / f"whole-{name}", 12)
        char_gpt(name, tmp_path / f"parts-{name}", 8)  # stopped after iteration 8; its checkpoint is at 8
        rest = char_gpt(name, tmp_path / f"parts-{name}", 12, "--init-from", "resume")
        assert rest["iters"] == list(range(8, 13))
        same = rest["losses"] == whole["losses"][8:] and rest["evals"] == whole["evals"][2:]
        same_weights = all(torch.equal(a, b) for a, b in zip(weights(tmp_path / f"whole-{name}").values(),
                                                            weights(tmp_path / f"parts-{name}").values()))
        # the adopted script's checkpoint carries the engine, the generators and the prefetched
        # batch; the original's own resume draws another batch and other dropout masks
        assert same == same_weights == (name == "char_gpt_trainopt.py"), name
