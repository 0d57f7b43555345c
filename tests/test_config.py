import json
from importlib import resources

import pytest
import torch

from trainopt_core import ABLATION_LADDER, OptimizationConfig, leave_one_out

CLAIMS = json.loads(resources.files("trainopt_core.reporting").joinpath("paper_claims.json").read_text())


def test_presets_match_paper_setup():
    setup = CLAIMS["setup"]
    base, opt = OptimizationConfig.baseline(), OptimizationConfig.optimized()
    assert base.precision == setup["baseline"]["precision"]
    assert base.k == setup["baseline"]["accumulation_k"] and not base.adaptive
    assert base.schedule == "constant" and base.warmup_fraction == 0.0 and base.clip_norm is None
    assert base.checkpointing is None and base.zero_stage == setup["baseline"]["zero_stage"]
    o = setup["optimized"]
    assert opt.adaptive and [opt.k_min, opt.k_max] == o["k_choices"]
    assert opt.precision == o["precision"]
    assert opt.warmup_fraction == o["warmup_fraction"] and opt.schedule == o["schedule"]
    assert opt.min_lr_ratio == o["min_lr_ratio"] and opt.lr_scaling
    assert opt.clip_norm == o["clip_norm"] and opt.checkpointing == "sqrt" and opt.zero_stage == o["zero_stage"]


def test_ablation_ladder_is_cumulative_table_iii():
    names = [c.name for c in ABLATION_LADDER]
    assert names == ["baseline", "+accumulation", "+mixed_precision", "+lr_schedule", "+checkpointing", "+zero2"]
    assert ABLATION_LADDER[1].k == 4  # Table III: "+ Gradient Accum (k=4)"
    for before, after in zip(ABLATION_LADDER, ABLATION_LADDER[1:]):
        changed = {k for k, v in after.to_dict().items() if before.to_dict()[k] != v} - {"name"}
        assert changed, after.name
        # each rung keeps everything the previous rung switched on
        assert after.k >= before.k and (after.precision != "fp32" or before.precision == "fp32")
    assert ABLATION_LADDER[-2].checkpointing == "sqrt" and ABLATION_LADDER[-2].precision == "fp16"


def test_leave_one_out_differs_from_optimized_in_one_component_each():
    opt = OptimizationConfig.optimized().to_dict()
    variants = leave_one_out()
    assert len(variants) == 5
    for v in variants:
        assert v.name.startswith("-") and v.to_dict() != opt


def test_presets_resolve_by_name_and_roundtrip():
    for name in ["baseline", "optimized", "+mixed_precision", "-checkpointing"]:
        cfg = OptimizationConfig.preset(name)
        assert OptimizationConfig.from_dict(cfg.to_dict()) == cfg
    assert OptimizationConfig.baseline().config_hash() != OptimizationConfig.optimized().config_hash()
    with pytest.raises(ValueError, match="unknown configuration 'fastest'"):
        OptimizationConfig.preset("fastest")


@pytest.mark.parametrize(
    "fields, field_name",
    [
        (dict(precision="fp8"), "precision"),
        (dict(k=0), "k"),
        (dict(adaptive=True, k=4, k_min=4, k_max=2), "k_max"),
        (dict(adaptive=True, k=9, k_min=4, k_max=8), "k"),
        (dict(warmup_fraction=1.0), "warmup_fraction"),
        (dict(warmup_fraction=-0.1), "warmup_fraction"),
        (dict(clip_norm=-1.0), "clip_norm"),
        (dict(clip_norm="1.0"), "clip_norm"),
        (dict(clip_norm=True), "clip_norm"),
        (dict(checkpointing="cube"), "checkpointing"),
        (dict(checkpointing=0), "checkpointing"),
        (dict(zero_stage=3), "zero_stage"),
        (dict(schedule="linear"), "schedule"),
        (dict(sigma_target=0.0), "sigma_target"),
        (dict(sigma_target=float("inf")), "sigma_target"),
        (dict(k_rule="both"), "k_rule"),
        (dict(noise_window=0), "noise_window"),
        (dict(min_lr_ratio=1.5), "min_lr_ratio"),
        (dict(base_batch_size=0), "base_batch_size"),
    ],
)
def test_invalid_values_raise_naming_field_value_and_allowed(fields, field_name):
    with pytest.raises(ValueError) as err:
        OptimizationConfig(**fields)
    message = str(err.value)
    assert f"OptimizationConfig.{field_name}=" in message
    assert repr(fields.get(field_name, list(fields.values())[-1]))[:3] in message
    assert "allowed" in message


def test_adaptive_with_one_micro_batch_rejected_on_one_process_only():
    cfg = OptimizationConfig(adaptive=True, k=1, k_min=1, k_max=8)
    with pytest.raises(ValueError, match=r"k_min=1 .*>= 2"):
        cfg.validate_for_run(device="cpu", world_size=1)
    cfg.validate_for_run(device="cpu", world_size=2)  # two replicas give two gradients


def test_reduced_precision_rejected_where_autocast_cannot_run_it(monkeypatch):
    from trainopt_core import config as config_module

    monkeypatch.setattr(config_module, "autocast_supports", lambda device_type, dtype: dtype != torch.float16)
    with pytest.raises(ValueError, match=r"precision='fp16'.*'cpu'"):
        OptimizationConfig(precision="fp16").validate_for_run(device="cpu")
    OptimizationConfig(precision="bf16").validate_for_run(device="cpu")


def test_autocast_support_probe_on_this_cpu():
    from trainopt_core.config import autocast_supports

    assert autocast_supports("cpu", torch.bfloat16)
    assert not autocast_supports("cpu", torch.float64)


def test_every_committed_records_configuration_is_accepted_with_the_hash_it_was_stored_under():
    """The checks refuse no configuration a committed run record holds, and its hash (the records'
    key) is the one stored with it."""
    from pathlib import Path

    checked = 0
    for path in (Path(__file__).resolve().parents[1] / "reports").rglob("*__seed*.json"):
        record = json.loads(path.read_text())
        if isinstance(record.get("config"), dict) and "config_hash" in record:
            assert OptimizationConfig.from_dict(record["config"]).config_hash() == record["config_hash"], path
            checked += 1
    assert checked >= 90  # the reference alone holds 93 (other machines keep theirs packed)
