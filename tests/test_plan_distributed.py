"""`plan()` on two CPU processes (gloo): the ZeRO stage is a candidate, every process measures
the same candidates and returns the same plan, and a budget that only partitioning meets is met
with ZeRO. The rank function lives at module level: `run_processes` starts ranks with "spawn"."""
import pytest
import torch
import torch.nn.functional as F

from trainopt_core.planner.memory_model import predict
from trainopt_core.planner.ranks import Ranks
from trainopt_core.planner.space import Candidate

WORLD = 2


def _model():
    torch.manual_seed(0)  # the same weights on every process; optimizer state dominates its memory
    return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64))


def _rows(result) -> list[tuple]:
    return [(r["candidate"], r["peak_memory_bytes"], r["speedup"], r["rejected_because"], bool(r.get("chosen")))
            for r in result.rows]


def plan_rank() -> dict:
    import trainopt_core
    from trainopt_core.planner import space

    # fp32 only: the candidates then do not depend on whether this CPU computes bf16 natively
    space.native_reduced_precisions = lambda device: ()
    rank = torch.distributed.get_rank()
    generator = torch.Generator().manual_seed(rank)  # each process its own share of the batch
    batch = (torch.randn(8, 64, generator=generator), torch.randint(0, 64, (8,), generator=generator))

    def optimizer(parameters):
        return torch.optim.AdamW(parameters, lr=1e-3)

    # no time budget: what is measured must not depend on how busy the machine is
    free = trainopt_core.plan(_model(), optimizer, batch, F.cross_entropy, ks=(1,), speed_options=False,
                              time_budget_s=None)
    peaks = {r["candidate"]: r["peak_memory_bytes"] for r in free.rows}
    # between the smaller ZeRO peak and the unpartitioned one: only partitioning fits (no blocks to checkpoint)
    budget = (min(peaks["fp32, k=1, ZeRO-1"], peaks["fp32, k=1, ZeRO-2"]) + peaks["fp32, k=1"]) / 2
    fitted = trainopt_core.plan(_model(), optimizer, batch, F.cross_entropy, ks=(1,), memory_budget_bytes=budget,
                                time_budget_s=None)
    out = {"free": _rows(free), "fitted": _rows(fitted), "budget": budget, "fitted_config": fitted.config.zero_stage,
           "notes": fitted.notes}
    try:
        trainopt_core.plan(torch.nn.parallel.DistributedDataParallel(_model()), optimizer, batch, F.cross_entropy)
    except ValueError as error:
        out["ddp_error"] = str(error)
    return out


def zero_best_rank() -> list[str]:
    """A plan whose best after the ZeRO stage is forced to be the ZeRO-2 twin (timing decides it
    otherwise): the candidates its speed options measured."""
    import trainopt_core
    from trainopt_core.planner import space
    from trainopt_core.planner.search import Search

    space.native_reduced_precisions = lambda device: ()
    chosen_best = Search.best

    def best(self, **kwargs):
        zero2 = [c for c in self.rows if c.zero_stage == 2 and self.rows[c]["speedup"] is not None]
        return zero2[0] if zero2 else chosen_best(self, **kwargs)

    Search.best = best
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 6 * 6, 10))
    generator = torch.Generator().manual_seed(torch.distributed.get_rank())
    batch = (torch.randn(8, 3, 8, 8, generator=generator), torch.randint(0, 10, (8,), generator=generator))
    result = trainopt_core.plan(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch, F.cross_entropy, ks=(1,),
                                time_budget_s=None)
    return [r["candidate"] for r in result.rows if r["speedup"] is not None]


@pytest.mark.distributed
def test_a_zero_best_still_gets_channels_last_tried_on_its_ddp_twin():
    pytest.importorskip("deepspeed")
    from trainopt_core.distributed import run_processes

    measured = run_processes(zero_best_rank, WORLD, backend="gloo", threads_per_process=1, timeout_s=300)[0]
    assert "fp32, k=1, ZeRO-2" in measured and "fp32, k=1, fused optimizer, ZeRO-2" in measured
    assert "fp32, k=1, channels_last" in measured  # not under DeepSpeed, so on the DDP twin
    assert not any("channels_last" in name and "ZeRO" in name for name in measured)


def _dropout_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))


def _whole_batch():
    generator = torch.Generator().manual_seed(7)
    return torch.randn(48, 16, generator=generator), torch.randint(0, 4, (48,), generator=generator)


def pooled_probe_rank(share_sizes: tuple[int, ...]) -> dict:
    """This process's share of the whole batch (sizes by rank), in micro-batches of 3 samples."""
    from trainopt_core.noise_scale import probe_noise_scale

    rank = torch.distributed.get_rank()
    start = sum(share_sizes[:rank])
    share = tuple(t[start:start + share_sizes[rank]] for t in _whole_batch())
    return probe_noise_scale(_dropout_model(), share, F.cross_entropy, micro_batches=share_sizes[rank] // 3, seed=3,
                             across_processes=True).to_dict()


def adaptive_plan_rank(ks: tuple = (2,)) -> dict:
    import trainopt_core
    from trainopt_core.planner import space

    space.native_reduced_precisions = lambda device: ()
    rank = torch.distributed.get_rank()
    x, y = _whole_batch()
    result = trainopt_core.plan(_dropout_model(), lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                (x.chunk(WORLD)[rank], y.chunk(WORLD)[rank]), F.cross_entropy, ks=ks,
                                adaptive_accumulation=True, k_max=6, speed_options=False, time_budget_s=None)
    return {"config": result.config.to_dict(), "goodput": result.goodput, "explain": result.explain()}


@pytest.mark.distributed
@pytest.mark.parametrize("share_sizes", [(24, 24), (30, 18)])
def test_the_noise_scale_probe_pools_every_processs_share_into_the_whole_batchs_estimate(share_sizes):
    from trainopt_core.noise_scale import probe_noise_scale
    from trainopt_core.distributed import run_processes

    pooled = run_processes(pooled_probe_rank, WORLD, args=(share_sizes,), backend="gloo", threads_per_process=1,
                           timeout_s=120)
    assert pooled[0] == pooled[1]  # every process the same estimate
    # one process on the whole batch in 16 micro-batches of 3, rank 1's after rank 0's with the
    # same dropout seeds: the same micro-batch gradients, S summed in another order
    whole = probe_noise_scale(_dropout_model(), _whole_batch(), F.cross_entropy, micro_batches=16, seed=3)
    assert pooled[0]["micro_batches"] == 16 and pooled[0]["micro_batch_size"] == whole.micro_batch_size == 3.0
    for key in ("b_simple", "ci_low", "ci_high", "sigma_sq", "grad_sq"):
        assert pooled[0][key] == pytest.approx(getattr(whole, key), rel=1e-5)


@pytest.mark.distributed
@pytest.mark.parametrize("ks", [(2,), (1,)])
def test_adaptive_accumulation_is_planned_on_two_processes_by_goodput_over_the_global_batch(ks):
    from trainopt_core.distributed import run_processes

    rank0, rank1 = run_processes(adaptive_plan_rank, WORLD, args=(ks,), backend="gloo", threads_per_process=1,
                                 timeout_s=400)
    assert rank0["config"] == rank1["config"] and rank0["goodput"] == rank1["goodput"]  # agreed
    good, config = rank0["goodput"], rank0["config"]
    # on two processes the replicas give eq. 7 its two micro-batch gradients: the fp32 baseline's
    # k = 1 is a candidate beside the splits asked for (ks=(1,): the only one)
    k = good["k_min"]
    assert k in ks + (1,) and (ks != (1,) or k == 1)
    assert config["adaptive"] and config["k_min"] == k and config["k_max"] == 6
    assert config["k"] == good["k"] == max(good["rows"], key=lambda row: row["goodput"])["k"]
    share_parts = len(torch.arange(48 // WORLD).chunk(16))  # the probe's 16 micro-batches of a share of 24: 12 of 2
    assert good["world_size"] == WORLD and good["noise_scale"]["micro_batches"] == WORLD * share_parts
    # a step of k micro-batches of b samples on each process takes 2·k·b samples
    assert good["micro_batch_size"] == 24 / k
    assert [row["effective_batch"] for row in good["rows"]] == [WORLD * j * good["micro_batch_size"]
                                                                for j in range(k, 7)]
    assert good["micro_s"] > 0 and good["optimizer_s"] >= 0
    assert "on each of 2 processes" in rank0["explain"]
    # a step of one micro-batch has none without the all-reduce: timed as steps of two of its size
    assert good["timed_with_k"] == max(k, 2)
    assert ("timed in steps of 2 micro-batches" in rank0["explain"]) == (k == 1)


@pytest.fixture(scope="module")
def ranks():
    pytest.importorskip("deepspeed")
    from trainopt_core.distributed import run_processes

    return run_processes(plan_rank, WORLD, backend="gloo", threads_per_process=1, timeout_s=400)


@pytest.mark.distributed
def test_every_process_measures_the_zero_stages_and_returns_the_same_plan(ranks):
    rank0, rank1 = ranks
    assert rank0["free"] == rank1["free"] and rank0["fitted"] == rank1["fitted"]  # agreed, to the last digit
    free = {name: (peak, speedup, rejected) for name, peak, speedup, rejected, _ in rank0["free"]}
    assert set(free) == {"fp32, k=1", "fp32, k=1, ZeRO-1", "fp32, k=1, ZeRO-2"}
    for stage in (1, 2):  # measured, and partitioning the AdamW state over 2 processes holds less
        peak, speedup, _ = free[f"fp32, k=1, ZeRO-{stage}"]
        assert speedup is not None and peak < free["fp32, k=1"][0]


@pytest.mark.distributed
def test_a_budget_only_zero_meets_is_met_with_zero(ranks):
    rank0 = ranks[0]
    chosen = [(name, peak) for name, peak, _, _, is_chosen in rank0["fitted"] if is_chosen]
    assert len(chosen) == 1 and "ZeRO-" in chosen[0][0] and chosen[0][1] <= rank0["budget"]
    assert rank0["fitted_config"] in (1, 2)
    assert any("prepare(..., backend='deepspeed')" in note for note in rank0["notes"])
    assert "the plain module" in rank0["ddp_error"]


def test_the_memory_model_partitions_state_and_gradients_by_the_zero_stage():
    calibration = {"fixed_bytes": 1000.0, "activation_bytes_per_sample": 0.0, "temporary_bytes_per_sample": 0.0,
                   "num_blocks": None, "optimizer_state_bytes": 400, "gradient_bytes": 200}
    predicted = [predict(calibration, Candidate(zero_stage=stage), 8, world_size=4) for stage in (0, 1, 2)]
    assert predicted == [1000.0, 1000.0 - 300, 1000.0 - 300 - 150]
    assert predict(calibration, Candidate(zero_stage=2), 8, world_size=1) == 1000.0  # one process: nothing partitioned
    # measured on DDP: its gradient buckets (a gradient copy) go with it under any ZeRO stage
    calibration["ddp_bucket_bytes"] = 200
    predicted = [predict(calibration, Candidate(zero_stage=stage), 8, world_size=4) for stage in (0, 1, 2)]
    assert predicted == [1000.0, 1000.0 - 300 - 200, 1000.0 - 300 - 150 - 200]


def test_one_process_agrees_with_itself():
    ranks = Ranks(torch.device("cpu"))
    assert ranks.world_size == 1 and ranks.max([3.0, 1.0]) == [3.0, 1.0] and ranks.mean([2.0]) == [2.0]
    assert ranks.all(True) and not ranks.all(False)


@pytest.mark.distributed
def test_the_two_process_benchmark_runs_and_finds_the_processes_agreed(tmp_path, capsys, monkeypatch):
    pytest.importorskip("deepspeed")
    import importlib
    import json
    from pathlib import Path

    # importable by name: the spawned processes import the function they run (sys.path travels with them)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = importlib.import_module("bench_plan_processes")
    out = tmp_path / "bench.json"
    # no planning time budget: which candidates a plan measures must not depend on the machine's load
    assert bench.main(["--profile", "smoke", "--tasks", "wikitext2", "--adaptive", "--windows", "2",
                       "--time-budget", "none", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "every process returned the same plans: yes" in printed and "optimizer step with the all-reduce" in printed
    task = json.loads(out.read_text())["tasks"][0]
    assert task["same_plan_on_every_process"] and task["share"] * 2 == task["batch"]
    assert set(task["plans"]) == {"no budget", "50 % budget", "adaptive accumulation"}
    good = task["plans"]["adaptive accumulation"]["goodput"]
    assert good["world_size"] == 2
    # the step-time model checked on the processes, from k_min up to k_max micro-batches of b (k_min is the
    # split the timing chose: on the smoke model k = 2 and k = 4 can trade places within the noise)
    ks = sorted({good["k_min"], min(2 * good["k_min"], good["k_max"]), good["k_max"]})
    assert len(ks) >= 2
    assert [check["k"] for check in task["step_time_model"]] == ks
    assert [check["batch"] for check in task["step_time_model"]] == [2 * k * good["micro_batch_size"] for k in ks]
    assert task["step_time_model"][0]["measured_ratio"] == task["step_time_model"][0]["model_ratio"] == 1.0
    assert any(row["zero_stage"] for row in task["plans"]["no budget"]["rows"])
