"""Choose the configuration by measured cost on this machine: eq. 3 under a memory budget.

The paper's fixed recipe is not the fastest everywhere (on a CPU √L checkpointing recomputes
far more than the 0.12 of a step it assumes), and the paper names the fix: adaptive policies
that disable an optimization when its overhead exceeds its benefit. `plan()` does that by
measurement, on the user's model, batch and device, in stages, each giving its candidates a first
estimate (two short windows interleaved with the fp32 baseline's, so every speedup is a paired
ratio to the baseline measured in the same windows), then a race among those that can still win:

1. Precision × split: fp32, plus bf16 where the device computes it natively, plus fp16 on
   CUDA; × splits of the effective batch into k micro-batches.
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
   weights for CNNs, and on CUDA the attention kernels of a model that calls torch's SDPA; then
   the options that helped, together; then torch.compile where it is tried (on CUDA into CUDA
   graphs), on the finalist only.
   On a CUDA GPU with a memory budget the chosen configuration also gets the caching allocator's
   expandable segments (a process-wide setting, so not a timed candidate).
4. The race: every candidate still in it timed once per round beside the baseline and the
   caller's configuration (never dropped); after each round a candidate slower than the best
   beyond the noise -- its speed over the best's, paired round by round, with a 95 % interval
   wholly on the slow side -- is dropped; it goes on while a round fits in the time budget and the
   choice is not decided (`stages.race`). The stages before it measure a candidate only where the
   race keeps its last rounds (`search.MIN_RACE_ROUNDS`). The caller's configuration is replaced
   only by one faster beyond the noise and the kind's margin (`choice.TIE_MARGIN`).
5. With adaptive accumulation only (`adaptive_accumulation=True`): k sets the effective batch
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

`plan()` below checks its arguments (arguments.py) and runs the stages (stages.py); the parts,
one per module:

    arguments.py  plan()'s arguments checked, each refusal naming the argument
    stages.py     the stages above, each a function of one `Planning`, then the returned Plan
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

import time
from typing import Callable, Sequence

import torch

from .arguments import check_arguments
from .choice import pareto_front
from .contention import threads_the_cpu_can_run
from .result import Plan
from .search import Search
from .space import COMPILE_ON_CPU, Candidate, native_reduced_precisions
from .stages import (COMPILE_FLOOR_S, MAX_CHECKPOINTED, MAX_ZERO, Planning, checkpointing, finish, precision_and_split,
                     race, speed_options as speed_options_stage, zero_stage)
from ..config import OptimizationConfig

TIME_BUDGET_S = 60.0  # plan()'s default planning time budget (the reproduction's profiles set their own)


def plan(model: torch.nn.Module, optimizer_factory: Callable, batch: Sequence[torch.Tensor],
         loss_fn: Callable, *, loss_takes_model: bool = False, device: torch.device | str | None = None,
         memory_budget_bytes: float | None = None, weights: Sequence[float] = (1.0, 0.0, 0.0),
         ks: Sequence[int] | None = None, speed_options: bool = True, try_compile: bool | None = None,
         adaptive_accumulation: bool = False, k_max: int = 8, run_samples: int | None = None,
         windows: int | None = None, steps_per_window: int | None = None, planning_memory_bytes: float | None = None,
         progress: bool = False, base: OptimizationConfig | None = None, optimizer_takes_model: bool = False,
         time_budget_s: float | None = TIME_BUDGET_S) -> Plan:
    """Measure candidate configurations on `batch` and choose one (module docstring).

    `model` is left untouched (each candidate runs on a copy). `optimizer_factory(parameters)`
    builds the optimizer -- or, with `optimizer_takes_model`, `optimizer_factory(model)` (a
    model's own ``configure_optimizers(...)``, say). `base`: the caller's configuration. It is
    measured among the candidates and replaced whenever a candidate's eq. 3 cost interval lies
    wholly below its own by more than the kind's margin (`choice.TIE_MARGIN`), by the lowest-cost of
    those; otherwise kept (a tie keeps it, as does a plan that could time nothing else; it is
    rejected as slower than fp32 only when its whole speedup interval is:
    `choice.keep_or_replace_yours`), and the returned configuration is `base` with only what the plan
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
    torch.compile on the finalist, the best eager candidate; its compile time is reported apart (`Plan.compile_s`, and each compiled row's
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
    `windows` × `steps_per_window` steps give each candidate its first estimate (None: sized to
    the fp32 baseline's step and said in a note -- off CUDA 2 windows of one step where a step
    takes >= 0.1 s, as many as fill 0.1 s otherwise; on CUDA windows of >= 0.25 s, 5 of them for
    steps under 0.1 s, else 3); the race then adds one window a round. `planning_memory_bytes`: what the
    candidates' copies may hold on the device at once (default: on CUDA 90 % of what is free when
    planning starts; elsewhere no limit). Each copy holds its weights, gradients and optimizer
    state; copies are released least recently used first to make room, and candidates are timed
    in groups that fit, each group with the baseline (a note says so); a group that runs out of
    memory all the same is timed again in halves. A candidate whose copy does not fit beside the
    baseline's is timed alone, between baseline windows timed alone before and after it (its
    row's `paired_with` and a note say so): none that fits the device alone is rejected for
    memory. `time_budget_s`: seconds planning may take
    (None: no limit). Each piece of work -- measuring a candidate, a round of timing windows, a
    round of re-timing, a stage -- starts only where the seconds the last such piece took fit in
    what is left, so planning ends within about one such piece of the budget; what was left out
    (candidates not measured, fewer windows, near ties not timed again, stages not tried) and which
    candidates are within the choice's timing noise are said in a note (`budget.py`).
    `progress` prints each candidate measured and each timing group, and a line at least every
    10 s while windows are timed.

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
    resolved = check_arguments(model, optimizer_factory, batch, loss_fn, loss_takes_model=loss_takes_model,
                               device=device, memory_budget_bytes=memory_budget_bytes, weights=weights, ks=ks,
                               speed_options=speed_options, try_compile=try_compile,
                               adaptive_accumulation=adaptive_accumulation, k_max=k_max, run_samples=run_samples,
                               windows=windows, steps_per_window=steps_per_window,
                               planning_memory_bytes=planning_memory_bytes, progress=progress, base=base,
                               optimizer_takes_model=optimizer_takes_model, time_budget_s=time_budget_s)
    device = resolved.device
    search = Search(model, optimizer_factory, batch, loss_fn, device, memory_budget_bytes, windows, steps_per_window,
                    progress, loss_takes_model, run_samples, planning_memory_bytes, optimizer_takes_model, time_budget_s)
    planning = Planning(search=search, memory_budget_bytes=memory_budget_bytes, weights=resolved.weights,
                        min_k=resolved.min_k, world=resolved.world, ks=resolved.ks, speed_options=speed_options,
                        try_compile=resolved.try_compile, run_samples=run_samples,
                        adaptive_accumulation=adaptive_accumulation, k_max=k_max, base=base, started=started)
    if search.energy_source is None and resolved.weights[2] > 0:
        planning.notes.append(f"Energy weight {resolved.weights[2]} not used: {search.energy_unavailable}.")
    with threads_the_cpu_can_run(device, planning.notes):
        for stage in (precision_and_split, zero_stage, checkpointing, speed_options_stage, race):
            stage(planning)
        return finish(planning)


__all__ = ["COMPILE_FLOOR_S", "COMPILE_ON_CPU", "Candidate", "MAX_CHECKPOINTED", "MAX_ZERO", "Plan", "TIME_BUDGET_S",
           "native_reduced_precisions", "pareto_front", "plan"]
