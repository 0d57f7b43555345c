"""Choose the configuration by measured cost on this machine: eq. 3 under a memory budget.

The paper's fixed recipe is not the fastest everywhere (on a CPU √L checkpointing recomputes
far more than the 0.12 of a step it assumes), and the paper names the fix: adaptive policies
that disable an optimization when its overhead exceeds its benefit. `plan()` does that by
measurement, on the user's model, batch and device, in three stages, each timed in interleaved
windows together with the fp32 baseline (so every speedup is a paired ratio to the baseline
measured in the same windows):

1. Precision × split: fp32, plus bf16 where the device computes it natively, plus fp16 on
   CUDA; × splits of the effective batch into k micro-batches. Where other candidates are within
   the timing noise of the best (their eq. 3 cost intervals overlap), the best and the closest
   two are timed once more together before stage 3 builds on the best.
   On more than one process (a torch.distributed group; each process plans on its share of
   the batch and every candidate trains data parallel) the ZeRO stages come next: ZeRO-1 and
   ZeRO-2 (DeepSpeed) on the best so far and on the candidates over the budget (with w2 > 0
   also on the time-memory Pareto front), against DDP's stage 0.
2. Memory (only when it counts: a budget, or w2 > 0): activation checkpointing -- ⌈√L⌉ segments,
   every block its own segment, and every block with the selective policy (matmul outputs kept,
   cheap ops recomputed) -- on the stage-1 candidates it could help: those over the budget, or
   with w2 > 0 those on the time-memory Pareto front. Checkpointing only adds recompute, so a
   candidate that already fits is not checkpointed.
3. Speed options on the best so far: the optimizer's fused kernels (foreach where it has none), channels-last
   weights for CNNs, torch.compile where it is tried (on CUDA into CUDA graphs), and on CUDA the
   attention kernels of a model that calls torch's SDPA; then the options that helped, together.
   On a CUDA GPU with a memory budget the chosen configuration also gets the caching allocator's
   expandable segments (a process-wide setting, so not a timed candidate).
4. With adaptive accumulation only (`adaptive_accumulation=True`): k sets the effective batch
   k·b of the chosen micro-batch b, so it is chosen by goodput -- samples/s × statistical
   efficiency, the efficiency from the gradient noise scale B_simple of the batch (measured with
   its 95 % interval, `noise_scale.probe_noise_scale`), the samples/s from the chosen
   candidate's timed micro-batch and optimizer-step seconds.

Before a candidate is timed, the memory model (eq. 8: activations scale with the micro-batch;
eq. 19: checkpointing keeps a fraction of them), calibrated on one tracked fp32 step, prunes it
when its prediction exceeds the budget by more than `PRUNE_MARGIN`. Each measured candidate gets
one tracked step (peak memory; an out-of-memory error makes it infeasible, caught in-process)
and a forward-pass check at the initial weights (its probe-batch loss is finite and equal to
fp32's within the precision's tolerance; computed in eval mode, where dropout and BatchNorm's
micro-batch statistics do not move it). That check catches a precision whose forward pass goes
wrong (an overflow, inf/nan, a loss far from fp32's); it cannot catch one that computes the first
loss right and trains worse (bf16 logits near 1,000, spaced 8 apart, give log C at the initial
weights as fp32 does and then learn far less): how a configuration trains is what the runs'
quality curves measure. Eq. 3 (C = w1·T + w2·M + w3·E, each over the baseline's) chooses among candidates within the
budget, never one slower than the fp32 baseline unless the budget rules the baseline out (the
plan then says so). Given the run's length (`run_samples`), T is the run's: a compiled
candidate's compiling step is spread over the run's samples, so compiling is chosen only where
the run earns it back.

The stages are `plan()` below; the parts, one per module:

    space.py      the candidates and what each changes in an OptimizationConfig
    search.py     measuring them: a copy per candidate (released and built again where the
                  device's memory is short), memory, probe-batch loss, interleaved timing
                  windows paired with the baseline's, in groups that fit
    trial.py      one candidate's copy: built through prepare(), its probe loss, its steps
    ranks.py      on more than one process: every measurement agreed before it decides
    memory_model.py  eqs. 8/19 calibrated on the baseline's step, which prune before building
    choice.py     eq. 3 under the budget, and why each other candidate lost
    adaptive.py   k by goodput for adaptive accumulation
    result.py     Plan: the table, explain(), the figures, rechoose()
"""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import torch

from .._errors import fail
from .adaptive import adaptive_config, measure_goodput, smallest_k
from .choice import check_weights, choose, helps, over_run, pareto_front
from .memory_model import predict, zero_saving_bytes
from .result import Plan
from .search import CPU_TIMING, Search
from .space import (COMPILE_ON_CPU, Candidate, attention_kernels, base_candidate, candidate_of, changes_between,
                    checkpointed_twins, configured, fewest_splits_that_fit, native_reduced_precisions,
                    precision_splits, speed_option_changes, splits, with_expandable_segments, zero_twins)
from ..compose import deepspeed_available
from ..config import OptimizationConfig

MAX_CHECKPOINTED = 6      # checkpointed candidates measured at most (the fastest twins first)
MAX_ZERO = 4              # ZeRO candidates measured at most (the best's twins first)
# Compiling took 18-61 s from a cold cache on 2-core CPUs (COMPILE_ON_CPU) and 39.5 s for ResNet-50 on
# an H100: a run shorter than this cannot earn a compile back, so it is not tried there
COMPILE_FLOOR_S = 10.0


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def plan(model: torch.nn.Module, optimizer_factory: Callable, batch: Sequence[torch.Tensor],
         loss_fn: Callable, *, loss_takes_model: bool = False, device: torch.device | str | None = None,
         memory_budget_bytes: float | None = None, weights: Sequence[float] = (1.0, 0.0, 0.0),
         ks: Sequence[int] | None = None, speed_options: bool = True, try_compile: bool | None = None,
         adaptive_accumulation: bool = False, k_max: int = 8, run_samples: int | None = None,
         windows: int | None = None, steps_per_window: int | None = None, planning_memory_bytes: float | None = None,
         progress: bool = False, base: OptimizationConfig | None = None, optimizer_takes_model: bool = False) -> Plan:
    """Measure candidate configurations on `batch` and choose one (module docstring).

    `model` is left untouched (each candidate runs on a copy). `optimizer_factory(parameters)`
    builds the optimizer -- or, with `optimizer_takes_model`, `optimizer_factory(model)` (a
    model's own ``configure_optimizers(...)``, say). `base`: the caller's configuration. It is
    measured among the candidates, kept unless a candidate's eq. 3 cost interval lies wholly
    below its own (a tie keeps it; it is rejected as slower than fp32 only when its whole
    speedup interval is), and the returned configuration is `base` with only what the plan
    chooses replaced (precision, split, checkpointing, speed options; the ZeRO stage on more
    than one process): its LR schedule, warmup, clipping and loss scaling stay. Its k splits
    `batch`, which is then the script's effective batch (micro-batch × k).
    `batch` is (inputs..., targets), its first dimension the effective batch size;
    `loss_fn(model_output, targets)` returns the mean loss -- or, with `loss_takes_model`,
    `loss_fn(model, *micro_batch)` runs the model itself and returns the mean loss or (mean loss,
    items it averages) (a Hugging Face model called with labels, say). `memory_budget_bytes`: peak
    memory of a training step allowed (None: no budget); on a CUDA GPU it also turns on the
    allocator's expandable segments in the returned configuration (`with_expandable_segments`). `weights`: eq. 3's (w1, w2, w3) on
    time per sample, peak memory and energy per sample, each relative to the fp32 baseline (the
    energy term is dropped, and said, where no counter is readable). `ks`: the micro-batch splits
    to try (default the powers of two up to 8 that divide the batch). `speed_options`: also try
    the optimizer's foreach/fused kernels, channels-last (models with convolutions) and, where
    `try_compile` (default: on CUDA only -- `COMPILE_ON_CPU` says what it did on 2-core CPUs),
    torch.compile; its compile time is reported apart (`Plan.compile_s`, and each compiled row's
    `compile_s`: its first, compiling step). `run_samples`: how many samples the run will train on
    (None: unknown). Given, a compiled candidate is judged over the run -- eq. 3's T then counts
    its compile seconds spread over those samples (`speedup_over_run`) -- so compiling is chosen
    only where the run is long enough to earn it back.
    `adaptive_accumulation`: the plan is for variance-aware accumulation (`OptimizationConfig`
    with adaptive=True), where k sets the effective batch k·b of a fixed micro-batch b, so k is
    chosen by goodput -- samples/s × statistical efficiency -- not by samples/s alone. On one
    process the splits tried are then those with k >= 2 (eq. 7 needs two micro-batch gradients
    per step; on more processes the replicas give them, and k = 1 is tried too); the chosen
    split gives b = batch/k and k_min = k (the effective batch never falls below `batch`); the
    gradient noise scale B_simple of `batch` at the initial weights
    (`noise_scale.probe_noise_scale`, with its 95 % interval) and the chosen candidate's timed
    micro-batch and optimizer-step seconds give the goodput of each k in [k_min, `k_max`]; the
    best is the starting k (`Plan.goodput` has the table and k at the interval's two ends).
    `windows` × `steps_per_window` steps time each candidate (None: 3 × 2 off CUDA; on CUDA
    sized to the fp32 baseline's step -- windows of >= 0.25 s, 5 of them for steps under 0.1 s,
    else 3 -- and said in a note). `planning_memory_bytes`: what the
    candidates' copies may hold on the device at once (default: on CUDA 90 % of what is free when
    planning starts; elsewhere no limit). Each copy holds its weights, gradients and optimizer
    state; copies are released least recently used first to make room, and candidates are timed
    in groups that fit, each group with the baseline (a note says so); a group that runs out of
    memory all the same is timed again in halves. `progress` prints each stage.

    In a torch.distributed group of W > 1 processes, call it on every process, each with its
    share of the effective batch (`batch` is this process's): candidates train data parallel
    (DDP; ZeRO-1/2 through DeepSpeed where it is installed), the processes agree on every
    measurement (memory: the largest process's; speed: the slowest's), and every process
    returns the same plan. A chosen ZeRO stage runs with `prepare(..., backend="deepspeed")`
    (or "auto"); stage 0 on the DDP-wrapped model. With `adaptive_accumulation` the noise scale
    pools the micro-batches of every process's share, and the gradient all-reduce a step waits
    for counts in its fixed part, which accumulation spreads over k micro-batches (a chosen
    k = 1 is timed as steps of two micro-batches of its size, to tell the all-reduce apart).
    """
    started = time.perf_counter()
    if base is not None and not isinstance(base, OptimizationConfig):
        fail("base", type(base).__name__, "None or an OptimizationConfig (the script's own configuration)")
    if base is not None and base.adaptive and not adaptive_accumulation:
        fail("base", "an OptimizationConfig with adaptive=True", "with adaptive_accumulation=True (k is then chosen "
             "by goodput), or a base with adaptive=False")
    if not batch or len(batch) < (1 if loss_takes_model else 2) or not all(isinstance(t, torch.Tensor) for t in batch):
        fail("batch", type(batch).__name__, "a sequence (inputs..., targets) of tensors (with loss_takes_model, "
             "of at least one tensor)")
    size = len(batch[0])
    if any(len(t) != size for t in batch):
        fail("batch", [tuple(t.shape) for t in batch], "tensors with the same first dimension (the batch size)")
    if memory_budget_bytes is not None and not _positive_number(memory_budget_bytes):
        fail("memory_budget_bytes", memory_budget_bytes, "None (no budget) or a number of bytes > 0")
    weights = check_weights(weights)
    if run_samples is not None and (not isinstance(run_samples, int) or isinstance(run_samples, bool) or run_samples < 1):
        fail("run_samples", run_samples, "None (the run's length unknown) or an integer >= 1 (samples the run trains on)")
    for argument, value in (("windows", windows), ("steps_per_window", steps_per_window)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            fail(argument, value, "None (sized to the device) or an integer >= 1")
    if adaptive_accumulation and (not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 2):
        fail("k_max", k_max, "an integer >= 2 (the largest k adaptive accumulation may reach)")
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    min_k = smallest_k(adaptive_accumulation, world)
    if adaptive_accumulation and (size < 2 or size * world < 6):
        fail("batch", f"a batch of {size}" + (f" on each of {world} processes" if world > 1 else ""),
             "with adaptive_accumulation, >= 6 samples in all (>= 3 micro-batches for the noise scale's interval, "
             "split into >= 2), >= 2 on each process")
    if planning_memory_bytes is not None and not _positive_number(planning_memory_bytes):
        fail("planning_memory_bytes", planning_memory_bytes,
             "None (on CUDA 90 % of the free memory, elsewhere no limit) or a number of bytes > 0")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("device", str(device), "a device this machine has (torch.cuda.is_available() is False here; 'cpu')")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        fail("model", "a DistributedDataParallel", "the plain module (on more than one process every candidate is "
             "wrapped as it needs: DDP, or DeepSpeed at its ZeRO stage)")
    if try_compile is None:
        try_compile = device.type == "cuda"
    if device.type != "cuda":
        windows, steps_per_window = windows or CPU_TIMING[0], steps_per_window or CPU_TIMING[1]
    search = Search(model, optimizer_factory, batch, loss_fn, device, memory_budget_bytes, windows, steps_per_window,
                    progress, loss_takes_model, run_samples, planning_memory_bytes, optimizer_takes_model)
    notes = []
    stage_s, stage_started = {}, started

    def lap(stage: str) -> None:  # where planning time goes, by stage
        nonlocal stage_started
        now = time.perf_counter()
        stage_s[stage] = stage_s.get(stage, 0.0) + now - stage_started
        stage_started = now

    if search.energy_source is None and weights[2] > 0:
        notes.append(f"Energy weight {weights[2]} not used: {search.energy_unavailable}.")

    def over_budget(c: Candidate) -> bool:  # measured over it, or pruned / out of memory
        row = search.rows[c]
        if memory_budget_bytes is None:
            return False
        if row["peak_memory_bytes"] is None:
            return (row["rejected_because"] or "").startswith(("pruned", "out of memory"))
        return row["peak_memory_bytes"] > memory_budget_bytes and not row["rejected_because"]

    def does_not_fit(c: Candidate) -> bool:  # over the budget, or out of memory with or without one
        return over_budget(c) or (search.rows[c]["rejected_because"] or "").startswith("out of memory")

    # 1. precision × split
    if ks is None and device.type == "cuda":
        # a GPU step's time follows its kernel launches more than its samples: the fewest
        # micro-batches that fit first, a precision split further only where its split does not fit
        ladder = splits(size, None, min_k)
        first = []
        stage1 = fewest_splits_that_fit(precision_splits(size, device, ladder[:1], min_k=min_k), ladder,
                                        lambda cs: first.extend(search.measure_memory(cs)), does_not_fit)
        notes.append(f"Splits tried on the GPU: k={ladder[0]} first, a further split only where the fewer did not "
                     f"fit ({', '.join(sorted({f'k={c.k}' for c in stage1}))} measured).")
    else:
        stage1 = precision_splits(size, device, ks, min_k=min_k)
        first = search.measure_memory(stage1)
    if base is not None:  # the caller's configuration, timed with the first candidates
        yours = base_candidate(base, size, search.num_blocks, world, device)
        if yours not in search.rows:
            first += search.measure_memory([yours])
        search.rows[yours]["yours"] = True
    search.time(first)
    tied = search.near_ties(weights=weights, min_k=min_k)
    if tied:  # the speed options build on one of them: more windows for those within the noise first
        search.time(tied)
    best = search.best(weights=weights, min_k=min_k)
    lap("precision x split")
    rows = search.rows  # by candidate; the list of them is returned

    # 1b. the ZeRO stage, on more than one process: partitioned optimizer state (and gradients)
    # against DDP, on the best and on what is over the budget: first those that ZeRO-2's saving
    # would bring within it (their measured peak, else the memory model's prediction), the
    # fastest of them first
    zero_ran = []
    if search.ranks.world_size > 1 and not deepspeed_available():
        notes.append("ZeRO stages not tried: DeepSpeed is not installed (pip install 'trainopt[deepspeed]').")
    elif search.ranks.world_size > 1:
        saving = zero_saving_bytes(search.calibration, 2, search.ranks.world_size) if search.calibration else 0

        def fits_with_zero(c: Candidate) -> bool:
            peak = rows[c]["peak_memory_bytes"] or rows[c]["predicted_memory_bytes"] or math.inf
            return peak - saving <= memory_budget_bytes

        over = sorted((c for c in stage1 if over_budget(c)),
                      key=lambda c: (not fits_with_zero(c), -(rows[c]["speedup"] or 0), c.precision == "fp32", c.k))
        twins = ([best] if best else []) + over
        if weights[1] > 0:
            twins += [candidate_of(r) for r in pareto_front([rows[c] for c in first if rows[c]["speedup"]
                                                             and not rows[c]["rejected_because"]])]
        zero_ran = search.measure_memory([z for twin in dict.fromkeys(twins) for z in zero_twins(twin)],
                                         limit=MAX_ZERO)
        if zero_ran:
            search.time([best] + zero_ran if best else zero_ran)
            best = search.best(weights=weights, min_k=min_k)
        lap("ZeRO stage")

    # 2. checkpointing, where memory counts
    never_tried: list[Candidate] = []
    if search.num_blocks and (memory_budget_bytes is not None or weights[1] > 0):
        twins = [c for c in stage1 + zero_ran if over_budget(c)]
        if best is not None and weights[1] == 0:
            # something fits already, and checkpointing only adds recompute: only a twin faster
            # than the best fitting candidate can give a faster one
            bar = rows[best]["speedup"]
            twins = [c for c in twins if rows[c]["speedup"] is not None and rows[c]["speedup"] > bar]
        if weights[1] > 0:
            twins += [candidate_of(r) for r in pareto_front([rows[c] for c in first + zero_ran if rows[c]["speedup"]
                                                             and not rows[c]["rejected_because"]])]
        # measured twins first: under a budget the fastest (the cheapest way to fit), weighing
        # memory without one the smallest (checkpointing extends the low-memory end); then the
        # unmeasured ones, reduced precision and fewer splits first
        measured = [c for c in dict.fromkeys(twins) if rows[c]["speedup"] is not None]
        measured.sort(key=lambda c: -rows[c]["speedup"] if memory_budget_bytes is not None
                      else rows[c]["peak_memory_bytes"])
        unmeasured = sorted((c for c in dict.fromkeys(twins) if rows[c]["speedup"] is None),
                            key=lambda c: (c.precision == "fp32", c.k))
        checkpointed = [c for twin in measured + unmeasured for c in checkpointed_twins(twin, search.num_blocks)]
        if best is None and search.calibration is not None:
            # nothing fits yet: the twins the memory model expects smallest first, so that the few
            # measured are those likeliest to fit (fastest first, the k=1/2/4 twins took every slot
            # and the k=8 twins that fit were never built)
            checkpointed.sort(key=lambda c: predict(search.calibration, c, size, search.ranks.world_size))
        ran = search.measure_memory(checkpointed, limit=MAX_CHECKPOINTED)
        never_tried = [c for c in checkpointed if c not in search.rows]
        if ran:
            search.time([best] + ran if best else ran)
            best = search.best(weights=weights, min_k=min_k)
        lap("checkpointing")
    elif memory_budget_bytes is not None and not search.num_blocks:
        notes.append("Checkpointing not tried: the model has no known block sequence (give it checkpoint_blocks).")

    # 3. speed options on the best so far, then the ones that helped, together
    if speed_options and best is not None:
        compile_now = try_compile
        best_s = search.rows[best]["seconds_per_sample"]
        if try_compile and run_samples and best_s and run_samples * best_s < COMPILE_FLOOR_S:
            # the whole run takes less than compiling would: no compiled candidate can earn it back
            compile_now = False
            notes.append(f"torch.compile not tried: the whole run ({run_samples:,} samples) takes about "
                         f"{run_samples * best_s:.1f} s at the best candidate's speed, under the {COMPILE_FLOOR_S:.0f} s "
                         "that compiling a model takes at the least.")

        # attention kernels: a lever where the device offers them (CUDA), for a model that calls SDPA
        uses_sdpa = bool(attention_kernels(best, search.device)) and search.trial(Candidate()).calls_sdpa()

        def options_of(c: Candidate) -> list[dict]:
            return speed_option_changes(c, search.model, search.optimizer_factory, search.device, compile_now,
                                        optimizer_takes_model, uses_sdpa)

        options = options_of(best)
        tried = [best.replace(**option) for option in options]
        unzeroed = best.replace(zero_stage=0)
        unzeroed_row = search.rows.get(unzeroed)
        if best.zero_stage and unzeroed_row and unzeroed_row["speedup"] is not None and not over_budget(unzeroed):
            # channels-last and compile do not run under DeepSpeed: tried on the best's DDP twin,
            # which fits too, lest a ZeRO stage chosen inside the noise shut them out
            tried += [unzeroed.replace(**option) for option in options_of(unzeroed) if option not in options]
        ran = search.measure_memory(tried)
        if ran:
            search.time([best] + ran)
            base_s = search.rows[Candidate()]["seconds_per_sample"]
            helped = [c for c in ran if helps(search.rows[c], search.rows[best], memory_budget_bytes, base_s,
                                              run_samples)]
            compiled = [c for c in helped if c.compile]
            if len(compiled) > 1:  # one way of compiling: the faster over the run
                slower = min(compiled, key=lambda c: over_run(search.rows[c], search.rows[c]["speedup"], base_s,
                                                              run_samples))
                helped.remove(slower)
            if len(helped) > 1:
                together = best.replace(**{key: value for c in helped for key, value in changes_between(best, c).items()})
                # timed with the baseline only: every speedup is paired with the baseline's windows,
                # so it compares with the options' own (re-timing them cost ~6 s of a ResNet plan)
                built = search.measure_memory([together])
                if built:
                    search.time(built)
        lap("speed options")
        if not try_compile:
            notes.append(f"torch.compile not tried (try_compile=False, the default off CUDA: {COMPILE_ON_CPU}).")

    if search.split_rounds:
        room = ("that fit" if search.capacity_bytes is None
                else f"that fit in {search.capacity_bytes / 2**20:,.0f} MiB of device memory")
        ran_out = (f", {search.out_of_memory_splits} of them halved after running out of memory"
                   if search.out_of_memory_splits else "")
        notes.append(f"Timed in groups {room}, each group with the baseline ({search.split_rounds} round(s) split"
                     f"{ran_out}); {search.rebuilt} candidate cop{'y was' if search.rebuilt == 1 else 'ies were'} "
                     "built again after being released for room.")
    if search.timing_note:
        notes.append(search.timing_note)
    rows = list(search.rows.values())
    try:
        notes += choose(rows, memory_budget_bytes, weights, min_k=min_k, run_samples=run_samples)
    except ValueError as error:
        if not never_tried:
            raise
        raise ValueError(f"{error}; not tried (at most {MAX_CHECKPOINTED} checkpointed candidates are measured): "
                         + "; ".join(c.name for c in never_tried)) from error
    chosen = next(row for row in rows if row.get("chosen"))
    config, good = configured(candidate_of(chosen), base, world), None
    if config.zero_stage:
        notes.append(f"The chosen configuration runs ZeRO-{config.zero_stage}: build it with prepare(..., "
                     "backend='deepspeed') on the plain module.")
    config = with_expandable_segments(config, device, memory_budget_bytes, notes)
    if adaptive_accumulation:
        good = measure_goodput(search, candidate_of(chosen), k_max=k_max)
        config = adaptive_config(config, good)
        lap("goodput")
    return Plan(config=config, chosen=chosen, baseline=search.rows[Candidate()], rows=rows,
                memory_budget_bytes=memory_budget_bytes, weights=weights, planning_s=time.perf_counter() - started,
                compile_s=search.compile_s, notes=notes, energy_source=search.energy_source, goodput=good,
                run_samples=run_samples, stage_s=stage_s, base=base,
                world_size=world, device=str(device))


__all__ = ["COMPILE_ON_CPU", "Candidate", "Plan", "native_reduced_precisions", "pareto_front", "plan"]
