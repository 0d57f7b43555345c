"""Run records: complete, reused, never mistaken for finished when interrupted."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import copy_smoke_runs
from trainopt_core import measure
from trainopt_core.reproduction import records as run_records
from trainopt_core.reproduction import runner
from trainopt_core.reproduction import twins
from trainopt_core.reporting import results
from trainopt_core.reproduction.profiles import TIMING_ONLY_SETTINGS, get_profile
from trainopt_core.config import OptimizationConfig

REQUIRED_METRICS = {
    "throughput", "throughput_unit", "peak_memory_bytes", "memory_source", "samples_to_target", "steps_to_target",
    "time_to_target_wall_s", "target", "final_quality", "quality_name", "flops_utilization", "energy_j",
    "energy_source", "skipped_steps", "wall_s", "evaluation_peak_memory_bytes", "zero_bucket_sizes",
}
CONDITIONS = ("backend", "data_policy", "data_source", "device_type", "hardware", "host_allocator", "profile_settings",
              "torch", "world_size")


class Retrained(Exception):
    pass


def retrain(*args, **kwargs):
    raise Retrained


@pytest.fixture(scope="module")
def smoke_records(tmp_path_factory, smoke_reports):
    """The baseline and optimized smoke runs of both tasks (the session's, trained once by
    `runner.run`), in a folder of this module's own; the records as `runner.run` returns them."""
    out = copy_smoke_runs(smoke_reports, tmp_path_factory.mktemp("reports"), configs=("baseline", "optimized"))
    records = {}
    for record in out.glob("*.json"):
        record = json.loads(record.read_text())
        records[record["task"], record["config_name"]] = record
    return out, records


def test_smoke_runs_of_both_tasks_write_complete_records(smoke_records):
    out, records = smoke_records
    assert len(list(out.glob("*.json"))) == 4
    for (task, config), record in records.items():
        on_disk = json.loads(run_records.record_path(out, task, OptimizationConfig.preset(config).replace(
            precision=record["config"]["precision"]), "smoke", 0).read_text())
        assert on_disk["status"] == "complete" and on_disk["config_name"] == config
        assert REQUIRED_METRICS <= set(on_disk["metrics"])
        assert on_disk["data_source"].startswith("stand-in") and "NOT" in on_disk["data_source"]
        assert on_disk["manifest"]["hardware"] and on_disk["manifest"]["libraries"]["torch"]
        assert on_disk["history"][0]["samples"] == 0 and on_disk["history"][-1]["samples"] > 0
        assert on_disk["metrics"]["throughput"] > 0 and on_disk["metrics"]["peak_memory_bytes"] > 0
        assert on_disk["seed"] == 0 and on_disk["profile"] == "smoke"


def test_optimized_run_states_what_ran_on_cpu(smoke_records):
    _, records = smoke_records
    opt = records["cifar10", "optimized"]
    reduced = "bf16" if measure.cpu_computes_bf16_natively() else "fp32"  # no bf16 instructions: emulated, slow
    assert opt["config"]["precision"] == reduced
    assert any(f"fp16 -> {reduced}" in note for note in opt["notes"])
    assert any(note.startswith("ZeRO-2: none: single process") for note in opt["notes"])
    assert {s["k"] for s in opt["steps"]} <= set(range(4, 9))
    assert opt["micro_batch_size"] == records["cifar10", "baseline"]["micro_batch_size"] // 4


def test_complete_record_is_reused_instead_of_rerun(smoke_records, monkeypatch):
    out, records = smoke_records

    def must_not_train(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(runner, "prepare", must_not_train)
    again = runner.run("cifar10", "baseline", profile="smoke", seed=0, out_dir=out, data_policy="standin", progress=False)
    assert again == json.loads(json.dumps(records["cifar10", "baseline"]))


def test_record_carries_the_conditions_it_was_made_under(smoke_records):
    _, records = smoke_records
    conditions = records["cifar10", "baseline"]["conditions"]
    assert set(conditions) == set(CONDITIONS)
    assert conditions["hardware"]["cpu_logical_cores"] >= 1 and conditions["device_type"] == "cpu"
    assert conditions["backend"] == "torch" and conditions["world_size"] == 1
    assert conditions["data_policy"] == "standin" and "NOT" in conditions["data_source"]


def test_cpu_without_bf16_instructions_runs_the_reduced_precision_as_fp32_and_says_so(monkeypatch):
    prof = get_profile("cifar10", "smoke")
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(measure, "cpu_computes_bf16_natively", lambda: native)
        cfg, notes = runner.resolve_config("optimized", prof, torch.device("cpu"))
        assert cfg.precision == expected and any(f"fp16 -> {expected}" in note for note in notes)
    assert "no bf16 instructions" in notes[0] and "mixed precision is off" in notes[0]
    # the ladder's mixed-precision rung then computes what +accumulation does: one run, one timing serve both
    ladder = [runner.resolve_config(name, prof, torch.device("cpu"))[0] for name in ("+accumulation", "+mixed_precision")]
    assert len({run_records.computation_hash(cfg, world_size=1, backend="torch") for cfg in ladder}) == 1
    cfg, _ = runner.resolve_config("baseline", prof, torch.device("cpu"))
    assert cfg.precision == "fp32"


def test_hardware_fingerprint_tells_cpus_with_one_model_name_apart_by_instruction_set():
    fingerprint = measure.hardware_fingerprint("cpu")
    assert {"cpu_model", "cpu_id", "cpu_isa", "cpu_logical_cores"} <= set(fingerprint)
    assert fingerprint["cpu_isa"].split("+")[0] == torch.backends.cpu.get_cpu_capability()
    assert ("+bf16" in fingerprint["cpu_isa"]) == measure.cpu_computes_bf16_natively()


@pytest.mark.parametrize("condition, other", [
    ("hardware", {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 8}),   # made on another machine
    # the same model name ("AMD EPYC" names several generations in a virtual machine), another instruction set
    ("hardware", dict(measure.hardware_fingerprint("cpu"), cpu_isa="AVX512+bf16+amx"
                      if measure.cpu_isa() != "AVX512+bf16+amx" else "AVX2")),
    ("hardware", {"cpu_model": measure.hardware_fingerprint("cpu")["cpu_model"], "cpu_logical_cores": os.cpu_count()}),
    ("device_type", "cuda"), ("backend", "deepspeed"), ("world_size", 2),
    ("data_source", "CIFAR-10 (cifar-10-batches-py)"), ("data_policy", "real"), ("torch", "1.13.0"),
    ("host_allocator", "glibc malloc defaults (adaptive mmap threshold, freed blocks returned to the kernel)"),
    ("profile_settings", {"target": 1.0}),
    ("model_version", None),  # GPT-2 by transformers' GPT2LMHeadModel, before the compact module ran the task
])
def test_record_made_under_other_conditions_is_run_again(smoke_records, monkeypatch, condition, other):
    out, _ = smoke_records
    path = run_records.record_path(out, "wikitext2", OptimizationConfig.baseline(), "smoke", 0)
    original = path.read_text()
    stale = json.loads(original)
    stale["conditions"][condition] = other
    if other is None:
        del stale["conditions"][condition]
    path.write_text(json.dumps(stale))
    monkeypatch.setattr(runner, "prepare", retrain)
    try:
        with pytest.raises(Retrained):
            runner.run("wikitext2", "baseline", profile="smoke", seed=0, out_dir=out, data_policy="standin", progress=False)
        assert run_records.condition_differences(stale, json.loads(original)["conditions"]) == [condition]
    finally:
        path.write_text(original)


def test_timing_window_settings_do_not_invalidate_a_training_run(smoke_records, monkeypatch):
    """The interleaved timing's window counts are not read by a training run: its record made
    under other values is reused (the throughput record, which does read them, is not)."""
    out, _ = smoke_records
    path = run_records.record_path(out, "wikitext2", OptimizationConfig.baseline(), "smoke", 0)
    original = path.read_text()
    made = json.loads(original)
    made["conditions"]["profile_settings"] = dict(made["conditions"]["profile_settings"], timing_windows_per_seed=99,
                                                  timing_steps_per_window=99)
    path.write_text(json.dumps(made))
    monkeypatch.setattr(runner, "prepare", retrain)
    try:
        reused = runner.run("wikitext2", "baseline", profile="smoke", seed=0, out_dir=out, data_policy="standin",
                            progress=False)
        assert reused["conditions"]["profile_settings"]["timing_windows_per_seed"] == 99
        current = json.loads(original)["conditions"]
        assert run_records.condition_differences(made, current) == ["profile_settings"]
        assert run_records.condition_differences(made, current, ignore_settings=TIMING_ONLY_SETTINGS) == []
    finally:
        path.write_text(original)


def test_a_run_that_computes_what_another_did_is_taken_from_it(tmp_path, monkeypatch):
    first = runner.run("wikitext2", "+checkpointing", profile="smoke", seed=0, out_dir=tmp_path,
                       data_policy="standin", progress=False)
    monkeypatch.setattr(runner, "prepare", retrain)
    # on one process ZeRO-2 partitions nothing: +zero2 trains exactly as +checkpointing did
    twin = runner.run("wikitext2", "+zero2", profile="smoke", seed=0, out_dir=tmp_path, data_policy="standin",
                      progress=False)
    assert twin["config_name"] == "+zero2" and twin["computed_as"] == "+checkpointing"
    assert twin["metrics"] == json.loads(json.dumps(first["metrics"]))
    assert "partitions nothing" in twin["notes"][-1] and twin["config"]["zero_stage"] == 2
    assert len(list(tmp_path.glob("wikitext2__plus_zero2__*.json"))) == 1
    with pytest.raises(Retrained):  # another seed has no twin yet
        runner.run("wikitext2", "+zero2", profile="smoke", seed=1, out_dir=tmp_path, data_policy="standin",
                   progress=False)


@pytest.mark.parametrize("task", ["cifar10", "wikitext2"])
def test_a_checkpointing_twin_takes_the_curve_and_measures_only_its_memory_and_speed(tmp_path, task):
    """+checkpointing computes what +lr_schedule does, recomputing activations in backward
    (ResNet: BatchNorm; GPT-2: dropout's RNG replayed). Taken from +lr_schedule's run with a
    probe of its own first steps, its record equals in every deterministic field -- curve,
    steps, peak memory and its breakdown -- the record of +checkpointing trained in full."""
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    kwargs = dict(profile="smoke", seed=0, data_policy="standin", progress=False)
    plain = runner.run(task, "+lr_schedule", out_dir=shared, **kwargs)
    derived = runner.run(task, "+checkpointing", out_dir=shared, **kwargs)
    trained = runner.run(task, "+checkpointing", out_dir=alone, rerun=True, **kwargs)  # rerun: trained in full
    assert derived["quality_from"] == "+lr_schedule" and "quality_from" not in trained
    assert run_records.record_differences(trained, derived) == []
    assert derived["metrics"]["peak_memory_bytes"] != plain["metrics"]["peak_memory_bytes"]  # measured, not copied
    assert derived["metrics"]["probe_optimizer_steps"] < trained["metrics"]["optimizer_steps"]
    assert derived["metrics"]["time_to_target_wall_s"] is None and derived["metrics"]["train_time_s"] is None
    assert all(h["time_s"] is None for h in derived["history"]) and derived["metrics"]["throughput"] > 0
    assert "bit-identically" in derived["notes"][-1]
    (written,) = shared.glob(f"{task}__plus_checkpointing__*.json")
    assert run_records.load_record(written) == json.loads(json.dumps(derived))


def test_a_checkpointed_run_without_a_twin_trains_its_curve_without_checkpointing(tmp_path, monkeypatch):
    """With no run of the same curve yet, +checkpointing trains the curve without checkpointing
    (faster, the same values) in runs/curves/, which the tables do not read, and measures only its
    own memory and speed; +lr_schedule, the same computation, then reuses that curve run."""
    out = tmp_path / "smoke" / "runs"  # where the tables look: <reports>/<profile>/runs
    kwargs = dict(profile="smoke", seed=0, out_dir=out, data_policy="standin", progress=False)
    derived = runner.run("wikitext2", "+checkpointing", **kwargs)
    (curve_path,) = (out / twins.CURVE_RUNS).glob("*.json")
    curve = run_records.load_record(curve_path)
    assert curve["config_name"] == "+checkpointing without checkpointing" and curve["config"]["checkpointing"] is None
    assert derived["quality_from"] == curve["config_name"] and derived["config"]["checkpointing"] == "sqrt"
    assert [h["quality"] for h in derived["history"]] == [h["quality"] for h in curve["history"]]
    assert derived["metrics"]["peak_memory_bytes"] < curve["metrics"]["peak_memory_bytes"]  # its own, checkpointed
    assert [r["config_name"] for r in results.load_records(tmp_path, "smoke")] == ["+checkpointing"]
    monkeypatch.setattr(runner, "prepare", retrain)
    plain = runner.run("wikitext2", "+lr_schedule", **kwargs)
    assert plain["computed_as"] == curve["config_name"] and "the same computation" in plain["notes"][-1]
    assert plain["history"] == curve["history"] and plain["config"]["checkpointing"] is None


def test_record_comparison_ignores_guard_fields_and_sees_everything_a_seed_determines(smoke_records):
    out, _ = smoke_records
    path = next(out.glob("wikitext2__baseline__*__seed0.json"))
    record = json.loads(path.read_text())
    older = json.loads(path.read_text())
    older["config"].pop("max_nonfinite_steps")  # a record from before the guard existed
    for field in ("checkpoint_policy", "optimizer_impl", "memory_format", "compile"):
        older["config"].pop(field)  # ... and before the speed options existed (at their defaults here)
    assert run_records.record_differences(record, older) == []
    fused = json.loads(path.read_text())
    fused["config"]["optimizer_impl"] = "fused"
    assert [d.split(":")[0] for d in run_records.record_differences(record, fused)] == ["config"]
    changed = json.loads(path.read_text())
    changed["config"]["clip_norm"] = 0.5
    changed["steps"][1]["loss"] += 1e-9
    assert [d.split(":")[0] for d in run_records.record_differences(record, changed)] == ["config", "steps[1].loss"]


def test_quality_twins_only_where_recompute_is_established_bit_identical():
    plain, checkpointed = OptimizationConfig.preset("+lr_schedule"), OptimizationConfig.preset("+checkpointing")
    same = dict(world_size=1, backend="torch", device_type="cpu")
    assert run_records.quality_hash(plain, **same) == run_records.quality_hash(checkpointed, **same)
    assert run_records.quality_hash(plain, **same) != run_records.quality_hash(OptimizationConfig.preset("+accumulation"), **same)
    for other in (dict(device_type="cuda"), dict(world_size=2), dict(backend="deepspeed")):
        assert run_records.quality_hash(checkpointed, **dict(same, **other)) is None


def test_interrupted_run_leaves_no_record_that_looks_complete(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = runner.one_optimizer_step

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "one_optimizer_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run("cifar10", "baseline", profile="smoke", seed=1, out_dir=tmp_path, data_policy="standin", progress=False)
    assert list(tmp_path.glob("*.json")) == []
    # a half-written or unfinished file is not taken for a finished run
    path = tmp_path / "x.json"
    path.write_text('{"schema": 1, "status": "complete", "metr')
    assert run_records.load_record(path) is None
    path.write_text(json.dumps({"schema": 1, "status": "running"}))
    assert run_records.load_record(path) is None


def test_bad_run_arguments_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="task='imagenet'"):
        runner.run("imagenet", "baseline", profile="smoke", out_dir=tmp_path)
    with pytest.raises(ValueError, match="profile='huge'"):
        runner.run("cifar10", "baseline", profile="huge", out_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown configuration 'fast'"):
        runner.run("cifar10", "fast", profile="smoke", out_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown run option 'colour'"):
        runner.run("cifar10", "baseline", profile="smoke", out_dir=tmp_path, colour=True)


def test_command_line_writes_a_record(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "trainopt_core.reproduction", "--task", "wikitext2", "--config", "+mixed_precision",
         "--profile", "smoke", "--out", str(tmp_path), "--data-policy", "standin", "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["config"] == "+mixed_precision" and summary["quality_name"] == "perplexity"
    assert len(list(tmp_path.glob("wikitext2__plus_mixed_precision__smoke__*__seed0.json"))) == 1
    bad = subprocess.run([sys.executable, "-m", "trainopt_core.reproduction", "--task", "wikitext2", "--config", "turbo"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown configuration 'turbo'" in bad.stderr


def test_a_compiled_model_evaluates_without_compiling_again():
    """Evaluation mode (and an evaluation batch of another shape) would compile a compiled model
    again, which the plan's compile time does not count: the runner evaluates it eagerly."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.1),
                                torch.nn.Linear(8, 2))
    model.compile(backend="eager")  # dynamo's guards and recompiles, no code generation
    model(torch.randn(4, 8)).sum().backward()  # training mode, batch 4: compiled once
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= 1

    class Bundle:
        @staticmethod
        def evaluate(model, engine):
            model.eval()
            quality = model(torch.randn(6, 8)).argmax(1).float().mean().item()
            model.train()
            return quality

    class Engine:
        samples_consumed = optimizer_steps = k = 1
        lr, loss_scale, effective_batch_size = 0.1, 1.0, 4

        @staticmethod
        def stats():
            return {"b_simple_items": None}

    row = runner._evaluate(Bundle, Engine, model, 0.0, [{"loss": 1.0}])
    assert 0.0 <= row["quality"] <= 1.0
    assert counters["stats"]["unique_graphs"] == compiled
    Bundle.evaluate(model, Engine)  # the same evaluation without the runner compiles again
    assert counters["stats"]["unique_graphs"] > compiled
    torch._dynamo.reset()
