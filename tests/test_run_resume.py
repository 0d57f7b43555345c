"""In-run checkpoints: runs killed with SIGKILL resume to the record of an uninterrupted run.

Each run is a real child process. The child SIGKILLs itself inside its optimizer step number
`kill_at` (after the step's micro-batches were drawn, before the step finished), so the kill
points are exact while the kill itself is the real signal; a rerun resumes from the newest
checkpoint. Records are compared in everything but the wall-clock fields."""
import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from trainopt_core.reproduction import resume
from trainopt_core.reproduction.records import record_differences

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from trainopt_core.reproduction import runner
    task, config, out_dir, kill_at, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    original = runner.one_optimizer_step
    def one_optimizer_step(engine, bundle, model, batches):
        if engine.optimizer_steps + 1 == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill, mid-step
        return original(engine, bundle, model, batches)
    runner.one_optimizer_step = one_optimizer_step

    def run(rank=0):
        return runner.run(task, config, profile="smoke", seed=0, out_dir=out_dir, data_policy="standin",
                          progress=False, checkpoint_every_steps=1, backend=os.environ.get("TEST_BACKEND", "torch"))
    if world == 1:
        record = run()
    else:
        from trainopt_core.distributed import run_processes
        import child_rank
        record = run_processes(child_rank.rank_fn, world, args=(task, config, out_dir, kill_at),
                               backend="gloo", threads_per_process=1, timeout_s=240)[0]
    print("RECORD", json.dumps(record, default=str))
""")

# DDP ranks must be importable by the spawned children
CHILD_RANK = textwrap.dedent("""
    import os, signal
    from trainopt_core.reproduction import runner
    def rank_fn(task, config, out_dir, kill_at):
        original = runner.one_optimizer_step
        def one_optimizer_step(engine, bundle, model, batches):
            if engine.optimizer_steps + 1 == kill_at and int(os.environ["RANK"]) == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(engine, bundle, model, batches)
        runner.one_optimizer_step = one_optimizer_step
        record = runner.run(task, config, profile="smoke", seed=0, out_dir=out_dir, data_policy="standin",
                            progress=False, checkpoint_every_steps=1)
        return record
""")

def run_child(tmp_path, task, config, out_dir, kill_at=0, world=1, backend="torch"):
    (tmp_path / "child_rank.py").write_text(CHILD_RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}",
           "PYTHONWARNINGS": "ignore", "TEST_BACKEND": backend, "DS_ACCELERATOR": "cpu"}
    result = subprocess.run([sys.executable, "-c", CHILD, task, config, str(out_dir), str(kill_at), str(world)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RECORD ")]
    return result, (json.loads(lines[0][len("RECORD "):]) if lines else None)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """`uninterrupted(task, config, world=1, backend="torch")`: the record of a run that was never
    killed, the reference a killed and resumed run is compared against. Each is trained once per
    module (a child process, like the runs it is compared with), however many tests compare with it."""
    records = {}

    def record(task, config, world=1, backend="torch"):
        key = (task, config, world, backend)
        if key not in records:
            folder = tmp_path_factory.mktemp("uninterrupted")
            result, records[key] = run_child(folder, task, config, folder / "reference", world=world, backend=backend)
            assert records[key] is not None, result.stderr[-3000:]
        return copy.deepcopy(records[key])
    return record


@pytest.mark.slow
@pytest.mark.parametrize("task", ["cifar10", "wikitext2"])
def test_a_run_killed_twice_resumes_to_the_uninterrupted_record(tmp_path, task, uninterrupted):
    # the optimized rung without checkpointing: on one CPU process a checkpointed configuration
    # trains its curve without checkpointing (runner._train_curve), which is this run
    reference = uninterrupted(task, "-checkpointing")
    out = tmp_path / "interrupted"
    for kill_at in (3, 4):  # no checkpoint before the memory-tracked step (smoke: step 1) has run
        result, record = run_child(tmp_path, task, "-checkpointing", out, kill_at=kill_at)
        assert result.returncode == -signal.SIGKILL and record is None, result.stderr[-2000:]
        assert any((out / ".checkpoints").rglob("*.pt")), "no checkpoint survived the kill"
    result, resumed = run_child(tmp_path, task, "-checkpointing", out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any("resumed from its in-run checkpoint after optimizer step 3" in note for note in resumed["notes"])
    assert not record_differences(reference, resumed)
    assert len({step["k"] for step in reference["steps"]}) >= 1
    assert not (out / ".checkpoints").exists(), "checkpoints are removed once the record is written"


@pytest.mark.slow
def test_a_deepspeed_run_resumes_through_deepspeeds_checkpoints(tmp_path, uninterrupted):
    # fp32 ZeRO-2 with adaptive k, schedule and checkpointing (the optimized rung without mixed
    # precision): under DeepSpeed bf16 the ResNet's evaluation fails on CPU (BatchNorm in eval mode
    # gets bf16 activations and fp32 running statistics), with or without checkpoints
    pytest.importorskip("deepspeed")
    reference = uninterrupted("cifar10", "-mixed_precision", backend="deepspeed")
    out = tmp_path / "interrupted"
    result, _ = run_child(tmp_path, "cifar10", "-mixed_precision", out, kill_at=4, backend="deepspeed")
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    (directory,) = (out / ".checkpoints").iterdir()
    assert sorted(p.name for p in (directory / "deepspeed").iterdir() if p.is_dir()) == ["step0000002", "step0000003"]
    result, resumed = run_child(tmp_path, "cifar10", "-mixed_precision", out, backend="deepspeed")
    assert result.returncode == 0, result.stderr[-3000:]
    assert any("after optimizer step 3" in note for note in resumed["notes"])
    assert not record_differences(reference, resumed)
    assert not (out / ".checkpoints").exists()


@pytest.mark.slow
def test_no_checkpoint_before_the_memory_tracked_step(tmp_path):
    out = tmp_path / "interrupted"
    result, _ = run_child(tmp_path, "cifar10", "baseline", out, kill_at=2)  # smoke tracks step 1, the 2nd
    assert result.returncode == -signal.SIGKILL
    assert not any((out / ".checkpoints").rglob("*.pt")) if (out / ".checkpoints").exists() else True


@pytest.mark.slow
def test_a_corrupt_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, uninterrupted):
    # the killed-twice test's configuration, whose uninterrupted run is trained once for both
    reference = uninterrupted("cifar10", "-checkpointing")
    out = tmp_path / "interrupted"
    result, _ = run_child(tmp_path, "cifar10", "-checkpointing", out, kill_at=5)
    assert result.returncode == -signal.SIGKILL
    (directory,) = (out / ".checkpoints").iterdir()
    newest, previous = resume.steps_saved(directory, 0)
    assert (newest, previous) == (4, 3)
    path = directory / f"step{newest:07d}.rank0.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # half-written
    (directory / "step0000009.rank0.pt.partial").write_bytes(b"killed while writing")
    result, resumed = run_child(tmp_path, "cifar10", "-checkpointing", out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any("after optimizer step 3" in note for note in resumed["notes"])
    assert not record_differences(reference, resumed)


@pytest.mark.slow
def test_a_ddp_run_whose_rank_is_killed_resumes_to_the_uninterrupted_record(tmp_path, uninterrupted):
    reference = uninterrupted("cifar10", "optimized", world=2)
    out = tmp_path / "interrupted"
    result, record = run_child(tmp_path, "cifar10", "optimized", out, kill_at=3, world=2)
    assert result.returncode != 0 and record is None  # rank 1 died: the launcher stops the job
    result, resumed = run_child(tmp_path, "cifar10", "optimized", out, world=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any("after optimizer step 2" in note for note in resumed["notes"])
    assert not record_differences(reference, resumed)


# ----------------------------------------------------------------------------- the checkpoint files
def test_checkpoints_are_atomic_keep_two_and_reject_other_runs(tmp_path):
    identity = resume.as_saved({"task": "t", "betas": (0.9, 0.99)})
    for step in (1, 2, 3):
        resume.save(tmp_path, step, 0, {"identity": identity, "value": torch.tensor([step])})
    assert resume.steps_saved(tmp_path, 0) == [3, 2]
    assert not list(tmp_path.glob("*.partial"))
    assert int(resume.newest_loadable(tmp_path, 0, identity)["value"]) == 3
    with pytest.warns(resume.CheckpointWarning, match="another run"):
        assert resume.newest_loadable(tmp_path, 0, resume.as_saved({"task": "u"})) is None
    (tmp_path / "step0000003.rank0.pt").write_bytes(b"\x00garbage")
    with pytest.warns(resume.CheckpointWarning, match="unreadable"):
        assert int(resume.newest_loadable(tmp_path, 0, identity)["value"]) == 2
    resume.remove(tmp_path)
    assert not tmp_path.exists()


def test_random_generators_roundtrip():
    import random

    np = pytest.importorskip("numpy")
    state = resume.rng_state()
    expected = (torch.rand(3), random.random(), np.random.rand())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resume.set_rng_state(state)
    assert (torch.equal(torch.rand(3), expected[0]), random.random(), np.random.rand()) == (True, *expected[1:])
