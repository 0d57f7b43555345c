"""One training run -> one JSON run record (SPEC §6).

A complete record made under the same conditions (`records.run_conditions`: machine, device,
backend, world size, data, torch, profile settings) is reused instead of re-running, and a
record is written only when the run finished, so an interrupted run never leaves something that
looks complete. With in-run checkpoints on (`reproduction.resume`), the rerun of an interrupted
run continues from its last checkpoint; a run stopped by non-finite training leaves a record
with status "failed" and the error. A run records what is deterministic for its seed -- quality, samples and steps
to target, peak memory -- and its own clock beside it; the seconds per sample the tables use
come from interleaved timing windows (`reproduction.throughput`).

Runs that would repeat a finished run of the same seed are not trained again: a ZeRO rung on
one process computes exactly what its ZeRO-0 twin did (`records.computation_hash`), and on the
CPU a configuration that differs from a finished one only by activation checkpointing trains
bit-identically to it (`records.quality_hash`). The first takes the whole record; the second
takes the quality curve and measures its own memory and speed in a few optimizer steps
(`quality_from` names the run; it has no whole-run clock). Both are in `reproduction.twins`;
the run's in-run checkpoints in `reproduction.resume`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import measure
from ..compose import prepare
from ..config import OptimizationConfig
from .. import precision as mp
from ..precision import NonFiniteTrainingError
from . import autoplan, progress, resume, twins
from .profiles import TIMING_ONLY_SETTINGS, TaskProfile, epochs_text, get_profile
from .records import (RECORD_SCHEMA, computation_hash, condition_differences, load_record, quality_hash, record_path,
                      run_conditions, write_record)
from .tasks import Task, build_task

# ------------------------------------------------------------------ configuration for a run
# how the note of a run asked for reduced precision but run in fp32 (a CPU without bf16) begins
REDUCED_PRECISION_OFF = "precision fp16 -> fp32"


def asked_for_reduced_precision(record: dict) -> bool:
    """Whether `record`'s configuration asks for reduced precision: it ran one, or it asked for
    fp16 on a CPU without bf16 instructions and ran fp32 (`resolve_config` notes that)."""
    return record["config"].get("precision", "fp32") != "fp32" or any(
        note.startswith(REDUCED_PRECISION_OFF) for note in record.get("notes", []))


def resolve_config(config: str | OptimizationConfig, profile: TaskProfile, device: torch.device, *,
                   plans_dir: str | os.PathLike | None = None, data_policy: str = "auto",
                   data_dir=None) -> tuple[OptimizationConfig, list[str]]:
    """The configuration as run on this device, and notes on what the profile changed.

    ``"auto"`` is planned on this machine (`reproduction.autoplan`): the plan record in
    `plans_dir` is reused when made under the same conditions, else measured and written."""
    notes = []
    if config == autoplan.AUTO:
        if plans_dir is None:
            raise ValueError("config='auto' needs plans_dir: it is planned on this machine and the plan is kept there")
        cfg, planned = autoplan.auto_config(profile.task, profile, device, plans_dir=plans_dir,
                                            data_policy=data_policy, data_dir=data_dir)
        notes.append(f"auto: planned on this machine by trainopt_core.plan(base=the baseline) "
                     f"({planned['plan']['chosen']}{'; fell back to the fp32 baseline' if planned['plan'].get('fell_back') else ''}; "
                     f"plan record {autoplan.plan_path('plans', profile.task).as_posix()}), with the baseline's "
                     f"LR schedule, clipping and effective batch")
        return cfg, notes
    cfg = OptimizationConfig.preset(config) if isinstance(config, str) else config
    if device.type == "cpu" and cfg.precision == "fp16" and profile.cpu_reduced_precision != "fp16":
        reduced = profile.cpu_reduced_precision
        if reduced == "bf16" and not measure.cpu_computes_bf16_natively():
            cfg = cfg.replace(precision="fp32")
            notes.append(f"{REDUCED_PRECISION_OFF} on this CPU ({measure.cpu_isa()}): it has no bf16 instructions "
                         f"(AVX-512 BF16 or AMX), so bf16 autocast would be emulated, several times slower than "
                         f"fp32, and fp16 autocast is slow on any CPU; mixed precision is off")
        else:
            cfg = cfg.replace(precision=reduced)
            notes.append(f"precision fp16 -> {reduced} on CPU (fp16 autocast is slow there)")
    return cfg, notes


def micro_batch_size(cfg: OptimizationConfig, profile: TaskProfile) -> int:
    """The baseline batch ÷ `cfg.batch_splits`."""
    return max(1, profile.baseline_batch_size // cfg.batch_splits)


# ------------------------------------------------------------------ the run
@dataclass
class RunOptions:
    data_policy: str = "auto"
    data_dir: str | None = None
    device: str | None = None
    progress: bool = True
    rerun: bool = False
    backend: str = "torch"                # "torch" (single process / DDP) or "deepspeed"
    max_steps: int | None = None          # cut a run short (benchmarks, tests); such a record is not written
    # in-run checkpoints every this many optimizer steps (default: the profile's
    # checkpoint_every_minutes; reproduction.resume); 0 turns them off
    checkpoint_every_steps: int | None = None


def run(
    task: str,
    config: str | OptimizationConfig,
    *,
    profile: str = "quick",
    seed: int = 0,
    out_dir: str | os.PathLike = "reports/quick/runs",
    options: RunOptions | None = None,
    **option_overrides,
) -> dict:
    """Train `task` with `config` under `profile` and return (and write) its run record."""
    options = options or RunOptions()
    for key, value in option_overrides.items():
        if not hasattr(options, key):
            raise ValueError(f"unknown run option {key!r}: allowed {list(RunOptions.__dataclass_fields__)}")
        setattr(options, key, value)
    prof = get_profile(task, profile)
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if config == autoplan.AUTO and world_size > 1:
        raise ValueError("config='auto' is planned for one process: run it without a process group "
                         f"(world size here {world_size})")
    plans_dir = autoplan.plans_dir_for(out_dir)
    cfg, notes = resolve_config(config, prof, device, plans_dir=plans_dir, data_policy=options.data_policy,
                                data_dir=options.data_dir)
    path = record_path(Path(out_dir), task, cfg, profile, seed)
    # an `auto` record carries the plan it ran
    planned = {} if config != autoplan.AUTO else dict(plan=autoplan.plan_summary(autoplan.load_plan_record(plans_dir, task)))
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    torch.manual_seed(seed)
    bundle = build_task(prof, data_policy=options.data_policy, data_dir=options.data_dir, device=device, seed=seed)
    conditions = run_conditions(device=device, backend=options.backend, world_size=world_size,
                                data_source=bundle.data_source, data_policy=options.data_policy,
                                profile_settings=prof.to_dict())
    computation = computation_hash(cfg, world_size=world_size, backend=options.backend)
    if not options.rerun:
        existing = load_record(path)
        if existing is not None and not condition_differences(existing, conditions, ignore_settings=TIMING_ONLY_SETTINGS):
            return existing  # made here, under these conditions: reused
        twin = twins.finished_twin(Path(out_dir), task, profile, seed, conditions, lambda made: (
            made.get("computation_hash") == computation and not made.get("computed_as")))
        if twin is not None and options.max_steps is None:
            record = dict(twins.as_twin_of(twin, cfg, resolved_notes=notes), **planned)
            if rank == 0:
                write_record(path, record)
            return record
        curve = dict(world_size=world_size, backend=options.backend, device_type=device.type)
        same_curve = quality_hash(cfg, **curve)
        quality_twin = None if same_curve is None else twins.finished_twin(
            Path(out_dir), task, profile, seed, conditions,
            lambda made: not made.get("quality_from") and twins.quality_hash_of(made, **curve) == same_curve)
        if quality_twin is None and same_curve is not None and cfg.checkpointing is not None and options.max_steps is None:
            quality_twin = _train_curve(task, cfg, profile=profile, seed=seed, out_dir=Path(out_dir), options=options)
        if quality_twin is not None and options.max_steps is None:
            probe = run(task, cfg, profile=profile, seed=seed, out_dir=out_dir, options=dataclasses.replace(
                options, max_steps=prof.throughput_warmup_steps + twins.PROBE_MEASURED_STEPS, rerun=True, progress=False))
            record = dict(twins.with_quality_of(quality_twin, probe, resolved_notes=notes), **planned)
            if rank == 0:
                write_record(path, record)
            return record

    total_samples = bundle.run_samples(prof.epochs)
    if total_samples > prof.epochs * bundle.num_train_samples:
        notes.append(cycled_note(bundle, prof))
    engine, micro = build_engine(bundle, prof, cfg, device=device, backend=options.backend,
                                 ddp=world_size > 1 and options.backend == "torch")
    model = engine.model  # the DeepSpeed engine's forward must go through its wrapper
    if cfg.zero_stage > 0:
        notes.append(f"ZeRO-{cfg.zero_stage}: {engine.zero_partitioning}")

    history, steps = [], []
    throughput = measure.ThroughputMeter(warmup_steps=prof.throughput_warmup_steps, device=device)
    memory = measure.PeakMemory(device)
    tracked_step = prof.throughput_warmup_steps  # the optimizer step whose memory is broken down
    train_time_s, next_eval_samples = 0.0, 0
    batches = resume.CountedBatches(bundle.train_batches(micro, seed=seed))
    # a checkpoint resumes only the run that wrote it: world size, micro-batch and the rest follow
    # from these (conditions hold the machine, backend, world size and profile settings)
    checkpoints = resume.RunCheckpoints(path, prof, options, rank=rank, world_size=world_size, identity=dict(
        task=task, config=cfg.computation_fields(), seed=seed, profile=profile, conditions=conditions,
        code=measure.manifest.code_commit()))
    carried = checkpoints.newest()
    if carried is not None:
        history, steps, train_time_s, next_eval_samples = (
            carried["history"], carried["steps"], carried["train_time_s"], carried["next_eval_samples"])
        checkpoints.restore_training_state(carried, bundle.model, engine)
        resume.restore_position(carried, throughput, batches)
        notes.append(f"resumed from its in-run checkpoint after optimizer step {carried['step']} "
                     f"(a previous attempt was interrupted; wall-clock fields cover the attempts' training)")
    bar = tqdm(total=total_samples, initial=samples_shown(engine.samples_consumed, total_samples),
               desc=f"{task} {cfg.name} seed {seed}", unit="sample", disable=not options.progress or rank != 0, leave=False)
    energy = measure.EnergyMeter(device)
    energy.start()
    wall_start = time.perf_counter() - (carried["wall_s"] if carried else 0.0)
    try:
        while engine.samples_consumed < total_samples:
            if options.max_steps is not None and engine.optimizer_steps >= options.max_steps:
                break
            if engine.samples_consumed >= next_eval_samples:  # evaluation time is not training time
                with memory.evaluation():
                    history.append(_evaluate(bundle, engine, model, train_time_s, steps))
                next_eval_samples += prof.eval_every_samples
            tracking = engine.optimizer_steps == tracked_step and memory.tracks_live_tensors
            # a step in CUDA graphs: the allocator's peak only (the breakdown would slow the graphs' replay)
            tracker = (memory.track_step(model, engine.optimizer, breakdown=not cfg.cuda_graphs) if tracking
                       else contextlib.nullcontext())
            with memory.training_step(), tracker:  # the training step's peak; evaluation is measured apart
                start = time.perf_counter()
                step_items, step_loss = one_optimizer_step(engine, bundle, model, batches)
                step_s = measure.elapsed_s(start, device)
            train_time_s += step_s
            if tracking:
                memory.add_tracked(tracker)  # slowed by the tracker: not a throughput sample
            else:
                throughput.add_step(step_items, step_s)
            steps.append(dict(step=engine.optimizer_steps, time_s=round(train_time_s, 4), loss=step_loss,
                              **step_record_fields(engine)))
            shown = samples_shown(engine.samples_consumed, total_samples)
            bar.update(shown - bar.n)
            progress.detail(f"{cfg.name}: {shown:,} of {total_samples:,} samples trained")
            # Not before the step whose memory is broken down has run: resumed in a fresh process,
            # that step would be the process's first, and the record's memory must not depend on
            # where the run was killed (on a CPU it no longer does, DDP's buckets included: docs/verdicts.md).
            if engine.optimizer_steps > tracked_step and checkpoints.due(engine.optimizer_steps):
                checkpoints.save(engine.optimizer_steps, bundle.model, engine, dict(
                    rng=resume.rng_state(), micro_batches=batches.drawn,
                    history=history, steps=steps, train_time_s=train_time_s, next_eval_samples=next_eval_samples,
                    throughput={key: getattr(throughput, key) for key in resume.THROUGHPUT_STATE},
                    memory=resume.memory_summary(memory, carried), energy_j=resume.energy_so_far(energy, carried),
                    wall_s=time.perf_counter() - wall_start))
        with memory.evaluation():
            history.append(_evaluate(bundle, engine, model, train_time_s, steps))
    except NonFiniteTrainingError as error:
        bar.close()
        engine.close()
        if rank == 0 and options.max_steps is None:
            write_record(path, dict(schema=RECORD_SCHEMA, status="failed", error=str(error), task=task,
                                    config_name=cfg.name, config=cfg.to_dict(), seed=seed, profile=profile,
                                    conditions=conditions, history=history, steps=steps, notes=notes))
        raise
    bar.close()
    energy_j, energy_source = resume.energy_so_far(energy, carried), energy.energy_source
    wall_s = time.perf_counter() - wall_start
    engine.close()
    summary = resume.memory_summary(memory, carried)

    times = [h["time_s"] for h in history]
    qualities = [h["quality"] for h in history]
    reach = dict(target=prof.target, higher_is_better=prof.higher_is_better)
    items_per_s = throughput.items_per_s()
    peak_flops, peak_source = config_peak_flops(cfg, device, bundle.flops_workload)
    flops_item = bundle.training_flops_per_item
    metrics = dict(
        # Deterministic for a seed: where the quality curve crosses the target.
        samples_to_target=measure.time_to_target([h["samples"] for h in history], qualities, **reach),
        steps_to_target=measure.time_to_target([h["step"] for h in history], qualities, **reach),
        # Noisy: this run's own clock. The tables' time to target is samples to target × the
        # seconds per sample of the interleaved timing windows (reproduction.throughput).
        time_to_target_wall_s=measure.time_to_target(times, qualities, **reach),
        throughput=items_per_s,  # during this run (not interleaved with the configurations compared)
        throughput_unit=prof.item_unit,
        peak_memory_bytes=summary["peak"],  # the training step's peak, evaluation excluded
        evaluation_peak_memory_bytes=summary["evaluation_peak"],  # CUDA; None on CPU
        memory_source=memory.source,
        memory_breakdown_bytes=summary["breakdown"],
        target=prof.target,
        final_quality=qualities[-1],
        quality_name=prof.quality_name,
        flops_per_item=flops_item,
        peak_flops_per_s=peak_flops,
        peak_flops_source=peak_source,
        flops_utilization=measure.model_flops_utilization(flops_item, items_per_s, peak_flops),  # recompute excluded
        energy_j=energy_j,
        energy_source=energy_source,
        zero_bucket_sizes=engine.zero_bucket_sizes,  # DeepSpeed ZeRO-1/2 buckets, sized to the model
        skipped_steps=engine.skipped_steps,
        optimizer_steps=engine.optimizer_steps,
        train_time_s=train_time_s,
        wall_s=wall_s,
    )
    record = dict(
        schema=RECORD_SCHEMA,
        status="complete" if options.max_steps is None else "truncated",
        task=task,
        config_name=cfg.name,
        config=cfg.to_dict(),
        config_hash=cfg.config_hash(),
        computation_hash=computation,
        profile=profile,
        profile_settings=prof.to_dict(),
        seed=seed,
        conditions=conditions,
        world_size=world_size,
        micro_batch_size=micro,
        data_source=bundle.data_source,
        model_name=bundle.model_name,
        num_parameters=sum(p.numel() for p in model.parameters()),
        notes=notes,
        manifest=measure.run_manifest(profile=profile, device=device),
        history=history,
        steps=steps,
        metrics=metrics,
    )
    record.update(planned)
    if rank == 0 and options.max_steps is None:
        write_record(path, record)
        if planned:
            _drop_superseded_auto_records(Path(out_dir), path, task, profile, seed)
    checkpoints.finished()
    return record


def _drop_superseded_auto_records(out_dir: Path, kept: Path, task: str, profile: str, seed: int) -> None:
    """Removes this seed's `auto` records that ran another plan (planned under other conditions,
    or before a rerun of the plan): `auto` is whatever this machine's current plan chose."""
    for stale in out_dir.glob(f"{task}__auto__{profile}__*__seed{seed}.json"):
        if stale != kept:
            stale.unlink(missing_ok=True)


def _train_curve(task: str, cfg: OptimizationConfig, *, profile: str, seed: int, out_dir: Path,
                 options: RunOptions) -> dict:
    """The run record of `cfg` without its activation checkpointing, trained (or reused) in
    ``<out_dir>/curves/``. Where `records.quality_hash` holds, the two train bit-identically, so
    the un-checkpointed run, which is faster, gives the curve and the checkpointed configuration
    measures only its own memory and speed (a short probe)."""
    curve_cfg = cfg.replace(name=f"{cfg.name}{twins.CURVE_SUFFIX}", checkpointing=None, checkpoint_policy="full")
    return run(task, curve_cfg, profile=profile, seed=seed, out_dir=out_dir / twins.CURVE_RUNS, options=options)


# the run record's per-step field -> the engine's stats() key (records keep their schema-2 names)
_STEP_FIELDS = dict(lr="last_lr", k="next_k_micro_batches", effective_batch_size="last_effective_batch_samples",
                    loss_scale="loss_scale", skipped_steps="skipped_steps", grad_norm="last_grad_norm",
                    sigma_sq="sigma_sq", grad_sq="grad_sq", grad_sq_half_width="grad_sq_half_width",
                    b_simple="b_simple_items", noise_significant="noise_significant", k_reason="k_reason",
                    sigma_target="sigma_target", samples_consumed="samples_consumed")


def samples_shown(consumed: int, total: int) -> int:
    """Samples trained as the progress lines count them: never past the run's length. The last
    optimizer step takes a whole effective batch and may pass it (304 of 256 samples); the record
    keeps the true count."""
    return min(consumed, total)


def step_record_fields(engine) -> dict:
    """What a run record logs per optimizer step, under its field names: the LR and effective
    batch (samples) of the step just taken, the k chosen for the next one, the noise estimate."""
    stats = engine.stats()
    return {field: stats[key] for field, key in _STEP_FIELDS.items()}


def cycled_note(bundle, prof) -> str:
    """What a run whose epoch is the paper's training set says of the stand-in it cycled."""
    total = bundle.run_samples(prof.epochs)
    return (f"the paper's run length with a stand-in: {epochs_text(prof.epochs)} x {bundle.epoch_samples:,} samples (the "
            f"paper's training set) = {total:,} samples, {total / bundle.num_train_samples:.1f} passes over the "
            f"stand-in's {bundle.num_train_samples:,} distinct samples")


def build_engine(bundle: Task, prof: TaskProfile, cfg: OptimizationConfig, *, device, backend: str = "torch",
                 micro: int | None = None, total_samples: int | None = None, ddp: bool = False):
    """The task's model (DDP-wrapped when `ddp`), the paper's AdamW with the profile's LR, betas
    and weight decay, and the engine, as every measurement builds them. Returns (engine,
    micro-batch size); call `engine.model`. Defaults: `micro_batch_size(cfg, prof)` and the
    profile's epochs of training samples for the LR schedule."""
    model = bundle.model.to(device)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=prof.lr, betas=prof.betas, weight_decay=prof.weight_decay)
    micro = micro or micro_batch_size(cfg, prof)
    total_samples = total_samples or bundle.run_samples(prof.epochs)
    engine = prepare(model, optimizer, cfg, total_samples=total_samples, micro_batch_size=micro, device=device,
                     backend=backend)
    return engine, micro


def config_peak_flops(cfg: OptimizationConfig, device, workload: str) -> tuple[float, str]:
    """The peak FLOP/s a run of `cfg` is measured against (`measure.peak_flops`), read under the
    TF32 flags its steps ran with."""
    with mp.tf32_allowed() if cfg.tf32 else contextlib.nullcontext():
        return measure.peak_flops(device, cfg.precision, workload=workload)


def one_optimizer_step(engine, bundle: Task, model, batches) -> tuple[float, float]:
    """Micro-batches until the engine reaches its accumulation boundary; (items, mean loss)."""
    steps_before = engine.optimizer_steps
    items, loss_sum, micro_batches = 0.0, 0.0, 0
    while engine.optimizer_steps == steps_before:
        x, y = next(batches)
        with engine.autocast():
            loss, num_items = bundle.loss(model, x, y)
        engine.backward(loss, num_items=num_items, num_samples=len(x))
        engine.step()
        items += num_items
        loss_sum = loss_sum + loss.detach().float()  # stays on the device: no sync per micro-batch
        micro_batches += 1
    return items, float(loss_sum) / micro_batches


def _evaluate(bundle: Task, engine, model, train_time_s: float, steps: list[dict]) -> dict:
    recent = [s["loss"] for s in steps[-20:]]
    # A compiled model evaluates eagerly: evaluation mode and the evaluation's batch shapes would
    # each compile the model again, a cost the plan's compile time does not count. Eager is the
    # reference computation; without a compiled model this changes nothing.
    with torch.compiler.set_stance("force_eager"):
        quality = bundle.evaluate(model, engine)
    return dict(
        time_s=round(train_time_s, 4),
        samples=engine.samples_consumed,
        step=engine.optimizer_steps,
        train_loss=sum(recent) / len(recent) if recent else None,
        quality=quality,
        lr=engine.lr,
        k=engine.k,
        loss_scale=engine.loss_scale,
        effective_batch_size=engine.effective_batch_size,
        b_simple=engine.stats()["b_simple_items"],
    )
