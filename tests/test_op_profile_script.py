"""scripts/op_profile.py: its arguments, and its plumbing at smoke size with a stored plan."""
import json

import pytest

from conftest import load_script
from trainopt_core import OptimizationConfig
from trainopt_core.reproduction.records import RECORD_SCHEMA


@pytest.fixture(scope="module")
def op_profile():
    return load_script("scripts/op_profile.py")


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps=0 is invalid: an integer >= 1"),
    (["--plans", "no/such/folder"], "--plans: no plan record no/such/folder/plan__cifar10.json"),
])
def test_bad_arguments_name_the_value_and_what_is_allowed(op_profile, capsys, argv, message):
    with pytest.raises(SystemExit):
        op_profile.parse_args(["--out", "unused", *argv])
    assert message in capsys.readouterr().err


def test_profiles_baseline_optimized_and_the_planned_auto_of_each_task(op_profile, tmp_path):
    plans = tmp_path / "plans"
    plans.mkdir()
    auto = OptimizationConfig.baseline().replace(name="auto", precision="bf16", optimizer_impl="foreach")
    for task in ("cifar10", "wikitext2"):
        (plans / f"plan__{task}.json").write_text(json.dumps(
            {"schema": RECORD_SCHEMA, "status": "complete", "kind": "plan", "config": auto.to_dict()}))
    ops = op_profile.main(["--out", str(tmp_path / "out"), "--plans", str(plans), "--profile", "smoke", "--steps", "1"])
    assert sorted(set(zip(ops["task"], ops["config"]))) == [
        (task, config) for task in ("cifar10", "wikitext2") for config in ("auto", "baseline", "optimized")]
    assert (tmp_path / "out" / "op_categories.csv").exists()
    assert (tmp_path / "out" / "op_profile__wikitext2__auto.json").exists()
