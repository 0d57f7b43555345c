"""Two CPU processes (gloo) reach what one process reaches with the same global batch: DDP with
the torch-native engine and DeepSpeed ZeRO through `prepare(backend="deepspeed")`.

The rank functions live at module level: `run_processes` starts ranks with "spawn", which must
import them. Results come back as plain lists (tensors sent between processes would travel as
shared-memory handles that die with the rank).
"""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainopt_core import OptimizationConfig, prepare
from trainopt_core.distributed import deepspeed_config, run_processes
from trainopt_core.engine import _torch_zero_partitioning
from trainopt_core.schedule import LRSchedule

WORLD = 2
# float64 runs differ from one process only by summation order; float32 (DeepSpeed) by rounding
# that Adam's normalization can amplify to about 1e-6 relative.
DDP_TOL = 1e-10
DEEPSPEED_FP32_TOL = 1e-6
# bf16 weights and activations (8 mantissa bits) over 8 micro-batches of Adam at lr 1e-2
DEEPSPEED_BF16_TOL = 1e-2


def mlp(dtype):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)


def micro_batch(step, rank, micro, size, dtype, noisy_labels=False):
    """Deterministic data for one rank's micro-batch, so the one-process reference can rebuild it."""
    g = torch.Generator().manual_seed(10_000 * step + 100 * rank + micro)
    x = torch.randn(size, 6, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (size,), generator=g) if noisy_labels else (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    return x, y


def params_as_lists(module):
    return [p.detach().double().flatten().tolist() for p in module.parameters()]


def max_abs_difference(a, b):
    return max(abs(u - v) for pa, pb in zip(a, b) for u, v in zip(pa, pb))


# ---------------------------------------------------------------------------------------- DDP
# micro-batch sizes [step][rank][micro]: unequal within and across replicas from step 1 on
DDP_SIZES = [[[4, 4], [4, 4]], [[3, 5], [4, 2]], [[2, 4], [5, 1]]]
DDP_CONFIG = dict(k=2, schedule="cosine", warmup_fraction=0.2, total=60, lr_scaling=True, base_batch_size=16)


def ddp_config():
    c = DDP_CONFIG
    return OptimizationConfig(k=c["k"], schedule=c["schedule"], warmup_fraction=c["warmup_fraction"],
                              lr_scaling=c["lr_scaling"], base_batch_size=c["base_batch_size"], zero_stage=2)


def ddp_accumulation_rank():
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(mlp(torch.float64))
    all_reduces = [0]

    def counting_allreduce(state, bucket):
        all_reduces[0] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_allreduce)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    with pytest.warns(UserWarning, match="backend='deepspeed'"):
        engine = prepare(model, optimizer, ddp_config(), total_samples=DDP_CONFIG["total"], micro_batch_size=4)
    syncs, lrs, batches = [], [], []
    for step, per_rank in enumerate(DDP_SIZES):
        for micro, size in enumerate(per_rank[rank]):
            x, y = micro_batch(step, rank, micro, size, torch.float64)
            with engine.autocast():
                loss = F.cross_entropy(model(x), y)
            engine.backward(loss, num_items=size, num_samples=size)
            engine.step()
            syncs.append(all_reduces[0])
        lrs.append(engine.lr)
        batches.append(engine.effective_batch_size)
    return dict(params=params_as_lists(model.module), syncs=syncs, lrs=lrs, batches=batches,
                zero_partitioning=engine.zero_partitioning, samples=engine.samples_consumed)


def one_process_reference(replica_weighting="items"):
    """AdamW on the global batch of every step. replica_weighting="replicas" averages per-replica
    means instead (what a replica-local item weighting would give): the case the test must tell apart."""
    model = mlp(torch.float64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = LRSchedule(total_samples=DDP_CONFIG["total"], kind="cosine", warmup_fraction=DDP_CONFIG["warmup_fraction"],
                       lr_scaling=True, base_batch_size=DDP_CONFIG["base_batch_size"])
    consumed, lrs = 0, []
    for step, per_rank in enumerate(DDP_SIZES):
        replicas = []
        for rank, sizes in enumerate(per_rank):
            parts = [micro_batch(step, rank, m, n, torch.float64) for m, n in enumerate(sizes)]
            replicas.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
        if replica_weighting == "items":
            x, y = torch.cat([x for x, _ in replicas]), torch.cat([y for _, y in replicas])
            F.cross_entropy(model(x), y).backward()
        else:
            sum(F.cross_entropy(model(x), y) / len(replicas) for x, y in replicas).backward()
        batch = sum(len(y) for _, y in replicas)
        consumed += batch
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * sched.lr_multiplier(consumed, batch)
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        optimizer.zero_grad()
    return params_as_lists(model), lrs


@pytest.mark.distributed
def test_ddp_accumulation_matches_one_process_on_the_global_batch_and_syncs_only_at_the_boundary():
    ranks = run_processes(ddp_accumulation_rank, WORLD, backend="gloo", threads_per_process=1, timeout_s=120)
    reference, reference_lrs = one_process_reference()
    for result in ranks:
        assert max_abs_difference(result["params"], reference) < DDP_TOL
        # one gradient all-reduce per effective batch: none after the first micro-batch of a step
        assert result["syncs"] == [0, 1, 1, 2, 2, 3]
        # world_size: the effective batch is the sum over replicas, and eq. 11 scales the LR by it
        assert result["batches"] == [16, 14, 12] and result["samples"] == 42
        assert result["lrs"] == pytest.approx(reference_lrs, rel=1e-12)
        assert result["zero_partitioning"] == "none: torch-native engine (use backend='deepspeed' for ZeRO-2)"
    naive, _ = one_process_reference(replica_weighting="replicas")
    assert max_abs_difference(naive, reference) > 1e-4  # the unequal sizes do change the result


def ddp_adaptive_rank(steps):
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(mlp(torch.float32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = OptimizationConfig(k=1, adaptive=True, k_min=1, k_max=5, sigma_target=0.7, k_rule="variance", noise_window=3,
                                lr_scaling=False)
    engine = prepare(model, optimizer, config, total_samples=10_000, micro_batch_size=4)
    ks, b_simple, estimate_sizes, micro = [engine.k], [], [], 0
    while engine.optimizer_steps < steps:
        # labels partly random and different on each rank: local noise estimates would disagree
        x, y = micro_batch(engine.optimizer_steps, rank, micro, 4, torch.float32, noisy_labels=rank == 1)
        with engine.autocast():
            loss = F.cross_entropy(model(x), y)
        engine.backward(loss)
        micro += 1
        if engine.step():
            ks.append(engine.k)
            b_simple.append(engine.b_simple)
            estimate_sizes.append(engine.monitor.last.num_micro_batches if engine.monitor.last else None)
    local_only = engine.monitor.last  # the last estimate, from all replicas' micro-batch norms
    return dict(ks=ks, b_simple=b_simple, estimate_sizes=estimate_sizes, params=params_as_lists(model.module),
                sigma_sq=local_only.sigma_sq)


@pytest.mark.distributed
def test_adaptive_k_is_the_same_on_every_rank_under_ddp():
    steps = 6
    rank0, rank1 = run_processes(ddp_adaptive_rank, WORLD, args=(steps,), backend="gloo",
                                 threads_per_process=1, timeout_s=120)
    assert rank0["ks"] == rank1["ks"]
    assert len(set(rank0["ks"])) > 1  # k did move: the agreement is not the trivial one
    assert rank0["b_simple"] == rank1["b_simple"] and rank0["sigma_sq"] == rank1["sigma_sq"]
    # eq. 7's sample holds every replica's micro-batches: world_size * (k of that step)
    assert rank0["estimate_sizes"] == [WORLD * k for k in rank0["ks"][:-1]]
    assert rank0["params"] == rank1["params"]  # the replicas stayed identical


# ---------------------------------------------------------------------------------- DeepSpeed
DS_MICRO = 4
DS_K_PER_STEP = [2, 3, 1, 2]  # set between effective batches, as adaptive accumulation does
DS_CONFIG = dict(schedule="cosine", warmup_fraction=0.25, clip_norm=0.3, zero_stage=2)
DS_TOTAL = DS_MICRO * WORLD * sum(DS_K_PER_STEP)


def run_fixed_k_schedule(engine, rank, world, micro_size, dtype):
    """Train with DS_K_PER_STEP; every rank (or the one-process reference: world=1 with
    micro-batches `world` times as large) sees the same global data per micro-batch."""
    model = engine.model
    record = dict(stepped=[], lrs=[], grad_norms=[], gas=[])
    for step, k in enumerate(DS_K_PER_STEP):
        engine.k = k
        for micro in range(k):
            parts = [micro_batch(step, r, micro, DS_MICRO, dtype) for r in range(rank, rank + world)]
            x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            with engine.autocast():
                loss = F.cross_entropy(model(x).float(), y)
            engine.backward(loss, num_items=len(y))
            record["stepped"].append(engine.step())
        record["lrs"].append(engine.lr)
        record["grad_norms"].append(engine.last_grad_norm)
        if hasattr(engine, "ds_engine"):
            record["gas"].append(engine.ds_engine.gradient_accumulation_steps())
    record["params"] = params_as_lists(engine.module if hasattr(engine, "module") else model)
    record["effective_batch_size"] = engine.effective_batch_size
    return record


def deepspeed_rank():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    rank = dist.get_rank()
    out = {}
    for stage in (0, 1, 2):
        model = mlp(torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        config = OptimizationConfig(**{**DS_CONFIG, "zero_stage": stage})
        engine = prepare(model, optimizer, config, total_samples=DS_TOTAL, micro_batch_size=DS_MICRO, backend="deepspeed")
        out[f"stage{stage}"] = run_fixed_k_schedule(engine, rank, 1, DS_MICRO, torch.float32)
        out[f"stage{stage}"]["zero_partitioning"] = engine.zero_partitioning
        out[f"stage{stage}"]["loss_scale"] = engine.loss_scale

    model = mlp(torch.float32)
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01),
                     OptimizationConfig(**DS_CONFIG, precision="bf16"), total_samples=DS_TOTAL,
                     micro_batch_size=DS_MICRO, backend="deepspeed")
    out["bf16"] = run_fixed_k_schedule(engine, rank, 1, DS_MICRO, torch.float32)
    out["bf16"]["param_dtype"] = str(next(model.parameters()).dtype)

    model = mlp(torch.float32)
    config = OptimizationConfig(k=1, adaptive=True, k_min=1, k_max=5, sigma_target=0.7, k_rule="variance",
                               noise_window=3, zero_stage=2, lr_scaling=False)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), config, total_samples=10_000,
                     micro_batch_size=DS_MICRO, backend="deepspeed")
    ks, gas, micro = [engine.k], [engine.ds_engine.gradient_accumulation_steps()], 0
    while engine.optimizer_steps < 6:
        x, y = micro_batch(engine.optimizer_steps, rank, micro, DS_MICRO, torch.float32, noisy_labels=rank == 1)
        loss = F.cross_entropy(engine.model(x), y)
        engine.backward(loss)
        micro += 1
        if engine.step():
            ks.append(engine.k)
            gas.append(engine.ds_engine.gradient_accumulation_steps())
    out["adaptive"] = dict(ks=ks, gas=gas, b_simple=engine.b_simple)

    # unequal micro-batches; SGD at lr 1, so each update is the gradient DeepSpeed formed
    model = mlp(torch.float32)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=1.0), OptimizationConfig(k=2, zero_stage=2),
                     total_samples=1000, micro_batch_size=DS_MICRO, backend="deepspeed")
    ratios = []
    for step in range(2):
        for micro, size in enumerate(DS_UNEQUAL[rank]):
            x, y = micro_batch(step, rank, micro, size, torch.float32)
            engine.backward(F.cross_entropy(engine.model(x), y), num_items=size)
            engine.step()
        ratios.append(engine.item_weight_ratio)
    out["unequal"] = dict(ratios=ratios, params=params_as_lists(model))
    engine.close()
    return out


DS_UNEQUAL = [[3, 5], [4, 4]]  # micro-batch sizes [rank][micro], every step


@pytest.fixture(scope="module")
def deepspeed_ranks():
    pytest.importorskip("deepspeed")
    return run_processes(deepspeed_rank, WORLD, backend="gloo", threads_per_process=1, timeout_s=300)


@pytest.fixture(scope="module")
def deepspeed_reference():
    model = mlp(torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    config = OptimizationConfig(**{**DS_CONFIG, "zero_stage": 0})
    engine = prepare(model, optimizer, config, total_samples=DS_TOTAL, micro_batch_size=DS_MICRO * WORLD)
    return run_fixed_k_schedule(engine, 0, WORLD, DS_MICRO * WORLD, torch.float32)


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_deepspeed_zero_matches_one_process_on_the_global_batch(deepspeed_ranks, deepspeed_reference, stage):
    reference = deepspeed_reference
    expected_stepped = [j == k - 1 for k in DS_K_PER_STEP for j in range(k)]
    assert reference["stepped"] == expected_stepped
    for result in (r[f"stage{stage}"] for r in deepspeed_ranks):
        # the boundary follows k when it changes between effective batches (not DeepSpeed's counter)
        assert result["stepped"] == expected_stepped
        assert result["gas"] == DS_K_PER_STEP
        assert result["lrs"] == pytest.approx(reference["lrs"], rel=1e-9)  # eqs. 10-11 on the same samples
        assert result["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-4)  # pre-clip norm
        assert max(reference["grad_norms"]) > DS_CONFIG["clip_norm"]  # clipping (eq. 12) was active
        assert max_abs_difference(result["params"], reference["params"]) < DEEPSPEED_FP32_TOL
        assert result["effective_batch_size"] == DS_MICRO * WORLD * DS_K_PER_STEP[-1]
        assert result["loss_scale"] == 1.0
    expected = {0: "none: ZeRO stage 0 (DeepSpeed data parallel over 2 processes)",
                1: "ZeRO-1 over 2 processes (optimizer state partitioned)",
                2: "ZeRO-2 over 2 processes (optimizer state and gradients partitioned)"}[stage]
    assert deepspeed_ranks[0][f"stage{stage}"]["zero_partitioning"] == expected
    initial = params_as_lists(mlp(torch.float32))
    assert max_abs_difference(reference["params"], initial) > 100 * DEEPSPEED_FP32_TOL  # training moved them


@pytest.mark.distributed
def test_deepspeed_bf16_zero2_stays_near_the_fp32_result(deepspeed_ranks, deepspeed_reference):
    reference = deepspeed_reference
    for result in (r["bf16"] for r in deepspeed_ranks):
        assert result["param_dtype"] == "torch.bfloat16"  # DeepSpeed holds the module in bf16
        assert result["stepped"] == [j == k - 1 for k in DS_K_PER_STEP for j in range(k)]
        assert 0 < max_abs_difference(result["params"], reference["params"]) < DEEPSPEED_BF16_TOL


@pytest.mark.distributed
def test_adaptive_k_reaches_deepspeed_and_is_the_same_on_every_rank(deepspeed_ranks):
    rank0, rank1 = (r["adaptive"] for r in deepspeed_ranks)
    assert rank0["ks"] == rank1["ks"] and len(set(rank0["ks"])) > 1
    assert rank0["gas"] == rank0["ks"]  # DeepSpeed's gradient_accumulation_steps follows k
    assert rank0["b_simple"] == rank1["b_simple"] and math.isfinite(rank0["b_simple"])


def sgd_step_on_replica_means(model, step, ratios):
    """One SGD (lr 1) step on ½ Σ_r ratio_r · G_r, G_r the mean gradient over replica r's items."""
    total = 0
    for rank, sizes in enumerate(DS_UNEQUAL):
        parts = [micro_batch(step, rank, m, n, torch.float32) for m, n in enumerate(sizes)]
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        total = total + ratios[rank] / len(DS_UNEQUAL) * F.cross_entropy(model(x), y)
    total.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= p.grad
            p.grad = None


@pytest.mark.distributed
def test_deepspeed_item_weighting_is_exact_in_direction_and_reports_its_size_error(deepspeed_ranks):
    ratios = [r["unequal"]["ratios"] for r in deepspeed_ranks]
    # rank 0's first step: 8 items where k·n̄ = 2·3 expected; afterwards n̄ is the running mean 4
    assert ratios == [[pytest.approx(8 / 6), 1.0], [1.0, 1.0]]
    documented, exact = mlp(torch.float32), mlp(torch.float32)
    for step in range(2):
        sgd_step_on_replica_means(documented, step, [ratios[0][step], ratios[1][step]])
        sgd_step_on_replica_means(exact, step, [1.0, 1.0])
    for result in deepspeed_ranks:
        assert max_abs_difference(result["unequal"]["params"], params_as_lists(documented)) < DEEPSPEED_FP32_TOL
        assert max_abs_difference(result["unequal"]["params"], params_as_lists(exact)) > 1e-3


SINGLE_PROCESS_SCRIPT = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from trainopt_core import OptimizationConfig, prepare
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01), OptimizationConfig(k=2, zero_stage=2),
                     total_samples=100, micro_batch_size=2, backend="deepspeed")
    for _ in range(4):
        engine.backward(F.mse_loss(engine.model(torch.randn(2, 4)), torch.zeros(2, 2)))
        engine.step()
    print("partitioning:", engine.zero_partitioning)
    print("steps:", engine.optimizer_steps, "world:", torch.distributed.get_world_size())
    try:
        engine.backward(model(torch.randn(2, 4)).sum())
    except ValueError as err:
        print("bare module forward:", err)
    engine.close()
    print("group after close:", torch.distributed.is_initialized())
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01), OptimizationConfig(zero_stage=2),
                     total_samples=100, micro_batch_size=2, backend="deepspeed")
    engine.backward(F.mse_loss(engine.model(torch.randn(2, 4)), torch.zeros(2, 2)))
    engine.step()
    print("second engine steps:", engine.optimizer_steps)
    engine.close()
    # fp32 at ZeRO-0: a non-finite gradient is skipped before it reaches the weights
    import math
    from trainopt_core.precision import NonFiniteTrainingError
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    engine = prepare(mlp, torch.optim.AdamW(mlp.parameters(), lr=1e-2),
                     OptimizationConfig(precision="fp32", zero_stage=0, max_nonfinite_steps=2),
                     micro_batch_size=4, backend="deepspeed")
    poison = {"on": False}
    mlp[0].weight.register_hook(lambda g: g * math.inf if poison["on"] else g)

    def step(bad):
        poison["on"] = bad
        with engine.autocast():
            loss = F.cross_entropy(engine.model(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
        engine.backward(loss)
        return engine.step()

    print("first:", step(False))
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    print("poisoned:", step(True), "skipped:", engine.skipped_steps)
    print("weights kept:", all(torch.equal(before[k], v) for k, v in mlp.state_dict().items()))
    print("then:", step(False), step(True))
    try:
        step(True)
    except NonFiniteTrainingError as error:
        print("stopped:", str(error)[:80])
    engine.close()
    # fp32 at ZeRO-2: DeepSpeed's ZeRO optimizer finds the non-finite norm and skips the step itself
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    engine = prepare(mlp, torch.optim.AdamW(mlp.parameters(), lr=1e-2),
                     OptimizationConfig(precision="fp32", zero_stage=2, max_nonfinite_steps=2),
                     micro_batch_size=4, backend="deepspeed")
    mlp[0].weight.register_hook(lambda g: g * math.inf if poison["on"] else g)
    print("zero2 first:", step(False))
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    try:
        print("zero2 poisoned:", step(True), "skipped:", engine.skipped_steps)
        print("zero2 weights kept:", all(torch.equal(before[k], v) for k, v in mlp.state_dict().items()))
        step(True)
    except NonFiniteTrainingError as error:
        print("zero2 stopped:", str(error)[:120])
    engine.close()
    from deepspeed.accelerator import get_accelerator
    try:
        engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01), OptimizationConfig(precision="fp16"),
                         total_samples=100, micro_batch_size=2, backend="deepspeed")
        print("fp16 loss scale:", engine.loss_scale, bool(get_accelerator().is_fp16_supported()))
    except ValueError as err:
        print("fp16 refused:", err, bool(get_accelerator().is_fp16_supported()))
""")


@pytest.mark.slow
def test_deepspeed_engine_runs_one_process_without_a_launcher(tmp_path):
    pytest.importorskip("deepspeed")
    # an empty extensions folder: DeepSpeed's CPU backend would compile its shared-memory op there
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", SINGLE_PROCESS_SCRIPT], capture_output=True, text=True,
                            timeout=180, env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    # the op only its inference all-reduce uses is neither compiled nor loaded
    assert not list(tmp_path.iterdir()) and "shm_comm" not in out + result.stderr
    assert "partitioning: ZeRO-2 requested; 1 process: nothing partitioned" in out
    assert "steps: 2 world: 1" in out
    assert "bare module forward: backward() without a forward through engine.model" in out
    assert "group after close: False" in out
    # a second engine in the same process, after the first closed its group (DeepSpeed's cached
    # groups released with it)
    assert "second engine steps: 1" in out
    # fp32 ZeRO-0: a non-finite gradient dropped before DeepSpeed's step (before, DeepSpeed wrote it
    # into the weights and the engine raised afterwards), counted, and two in a row stop the run
    assert "first: True" in out and "poisoned: False skipped: 1" in out and "weights kept: True" in out
    assert "then: True False" in out and "stopped: non-finite gradients at optimizer step 5" in out
    # ZeRO-2: DeepSpeed (0.19, the version checked) skipped the step itself; counted as a skip
    # (before, the engine raised that DeepSpeed had applied it), and two in a row stop the run
    import deepspeed
    from packaging.version import Version

    if Version(deepspeed.__version__) < Version("0.19"):
        pytest.skip(f"DeepSpeed {deepspeed.__version__}: whether its ZeRO optimizer skips a bf16/fp32 step was "
                    "checked on 0.19")
    assert "zero2 first: True" in out and "zero2 poisoned: False skipped: 1" in out
    assert "zero2 weights kept: True" in out
    assert "zero2 stopped: non-finite gradients at optimizer step 3" in out and "DeepSpeed ZeRO-2" in out
    # fp16 needs an accelerator with fp16: refused with the alternative named, or run at 2^16
    assert ("fp16 refused:" in out and "allowed 'fp32' or 'bf16'" in out and out.rstrip().endswith("False")) or \
        ("fp16 loss scale: 65536.0 True" in out)


BATCH_NORM_BF16_SCRIPT = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from trainopt_core import OptimizationConfig, prepare
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    engine = prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01), OptimizationConfig(precision="bf16"),
                     total_samples=100, micro_batch_size=4, backend="deepspeed")
    norm = model[1]
    for _ in range(3):
        with engine.autocast():
            loss = F.cross_entropy(engine.model(torch.randn(4, 3, 8, 8) + 2.0), torch.zeros(4, dtype=torch.long))
        engine.backward(loss)
        engine.step()
    print("cast:", engine.batch_norm_stats_cast, norm.weight.dtype, norm.running_mean.dtype, norm.running_var.dtype)
    print("stats moved:", bool(norm.running_mean.abs().sum() > 0), int(norm.num_batches_tracked))
    model.eval()
    with torch.no_grad(), engine.autocast():
        logits = engine.model(torch.randn(4, 3, 8, 8))
    print("evaluation:", tuple(logits.shape), bool(torch.isfinite(logits.float()).all()))
    engine.close()
""")


@pytest.mark.slow
def test_deepspeed_bf16_trains_and_evaluates_a_batch_norm_model(run_deepspeed_script):
    # DeepSpeed casts parameters to bf16, not buffers: without the engine's cast the first forward
    # fails in batch_norm with "expected scalar type BFloat16 but found Float"
    out = run_deepspeed_script(BATCH_NORM_BF16_SCRIPT)
    assert "cast: 1 torch.bfloat16 torch.bfloat16 torch.bfloat16" in out
    assert "stats moved: True 3" in out
    assert "evaluation: (4, 4) True" in out


def test_deepspeed_config_carries_every_setting_of_the_optimization_config():
    config = OptimizationConfig.optimized().replace(initial_loss_scale=2.0**12, loss_scale_growth_interval=500)
    ds = deepspeed_config(config, micro_batch_size=32, k=4, num_parameters=4_000_000)
    assert ds["train_micro_batch_size_per_gpu"] == 32 and ds["gradient_accumulation_steps"] == 4
    assert ds["gradient_clipping"] == 1.0
    assert ds["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 4_000_000, "allgather_bucket_size": 4_000_000}
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                          "hysteresis": 1, "min_loss_scale": 1}
    assert "bf16" not in ds
    bf16 = deepspeed_config(config.replace(precision="bf16", clip_norm=None, zero_stage=1), micro_batch_size=8, k=1,
                            num_parameters=4_000_000)
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16
    assert bf16["gradient_clipping"] == 0.0 and bf16["zero_optimization"]["stage"] == 1
    with pytest.raises(ValueError, match="initial_loss_scale=1000.0"):
        deepspeed_config(config.replace(initial_loss_scale=1000.0), micro_batch_size=8, k=1, num_parameters=10)
    with pytest.raises(ValueError, match="k=0"):
        deepspeed_config(config, micro_batch_size=8, k=0, num_parameters=10)
    with pytest.raises(ValueError, match="num_parameters=1.5"):
        deepspeed_config(config, micro_batch_size=8, k=1, num_parameters=1.5)


def test_torch_native_engine_states_that_it_partitions_nothing():
    model = torch.nn.Linear(3, 1)
    engine = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(zero_stage=2),
                     total_samples=10, micro_batch_size=2, backend="auto")  # one process: auto keeps torch
    assert type(engine).__name__ == "TrainingEngine"
    assert engine.zero_partitioning == "none: single process (ZeRO-2 requested)"
    assert _torch_zero_partitioning(0, 4) == "none: ZeRO stage 0, optimizer state replicated on 4 processes"
    with pytest.warns(UserWarning, match="stay replicated on all 4 processes"):
        assert _torch_zero_partitioning(1, 4) == "none: torch-native engine (use backend='deepspeed' for ZeRO-1)"
    with pytest.raises(ValueError, match="backend='zero'"):
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), OptimizationConfig(),
                total_samples=10, micro_batch_size=2, backend="zero")
