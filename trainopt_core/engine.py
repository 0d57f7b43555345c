"""The torch-native engine: the components of paper §III around an existing training loop.

    engine = trainopt_core.prepare(model, optimizer, config,
                                   total_samples=epochs * len(train_set), micro_batch_size=32)
    for x, y in batches:
        with engine.autocast():
            loss = F.cross_entropy(model(x), y)
        engine.backward(loss, num_items=len(y))
        engine.step()          # steps only at the accumulation boundary; returns whether it did

The loss handed to `backward` is a mean over its `num_items` items (images, or non-padding
tokens). The engine weights each micro-batch by its item count so the step's gradient is the
mean over *all items of the effective batch* (eq. 4 with unequal micro-batches), not a mean
of per-micro-batch means -- under DDP over all items of all replicas.

`prepare()` (trainopt_core/compose.py) builds this engine, or with `backend="deepspeed"` the
`DeepSpeedTrainingEngine` (trainopt_core/distributed/deepspeed_engine.py, ZeRO stage 0/1/2)
with the same interface. Both record in `engine.zero_partitioning` what was partitioned.
"""
from __future__ import annotations

import math
import numbers

import torch

from . import precision as mp
from ._caller import warn_at_caller
from ._errors import fail
from .accumulation import GradientNoiseMonitor, NoiseEstimate, gather_noise_inputs, next_k
from .config import OptimizationConfig
from .schedule import (clip_gradients, lrs_may_be_a_checkpoints, make_schedule, remember_base_lrs,
                       scaled_base_lrs, set_lr)

ENGINE_STATE_FORMAT = "trainopt-engine-state/1"


def item_count(num_items, default: int) -> float:
    """A backward's `num_items` (`default` where None) as a float, or the ValueError naming it."""
    value = float(num_items) if isinstance(num_items, torch.Tensor) else num_items
    if value is None:
        return float(default)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value > 0 and math.isfinite(value)):
        fail("num_items", value, "a finite number > 0 (the items the loss is a mean over), a tensor of one, or None "
             "(micro_batch_size)")
    return float(value)


class TrainingEngine:
    """Gradient accumulation, LR schedule, clipping and mixed precision around a user's loop."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: OptimizationConfig,
        *,
        total_samples: int | None = None,
        micro_batch_size: int,
        device: torch.device | str | None = None,
        world_size: int = 1,
        total_steps: int | None = None,
        warmup_steps: int | None = None,
        warmup_samples: int | None = None,
        min_lr: float | None = None,
    ):
        if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size!r} is invalid: allowed an integer >= 1")
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device) if device is not None else model_device(model)
        # precision "auto" becomes what it chose here (prepare() has resolved it already)
        self.config = config = config if config.precision != "auto" else mp.resolve_precision(config, self.device)
        self.world_size = world_size
        config.validate_for_run(device=self.device, world_size=world_size)
        self.micro_batch_size = micro_batch_size
        self.parameters = [p for group in optimizer.param_groups for p in group["params"]]

        base_batch = config.base_batch_size or micro_batch_size * config.lr_batch_splits * world_size
        # over samples (eqs. 10-11 as the paper states them) or, given total_steps, over optimizer steps
        self._schedule_args = dict(base_batch_size=base_batch, total_samples=total_samples, total_steps=total_steps,
                                   warmup_steps=warmup_steps, warmup_samples=warmup_samples, min_lr=min_lr)
        # a state loaded into the optimizer before prepare() replaced the LR it was built with by its own
        self._base_lrs_unknown = lrs_may_be_a_checkpoints(optimizer)
        if (self._base_lrs_unknown and config.schedule != "constant" and min_lr is not None
                and min_lr > optimizer.param_groups[0]["lr"]):
            fail("min_lr", min_lr, f"an LR up to the optimizer's ({optimizer.param_groups[0]['lr']:.3g}), which is a "
                 "checkpoint's: its state was loaded before prepare(); load it after prepare(), then "
                 "engine.start_at(steps=iter_num)")
        self._use_base_lrs(remember_base_lrs(optimizer))
        self.total_samples, self.total_steps = total_samples, total_steps
        self.scaler = mp.make_grad_scaler(self.device, config)
        self.monitor = GradientNoiseMonitor(self.parameters, window=config.noise_window) if config.adaptive else None
        # eq. 6's sigma_target: the configured one, or calibrated at the first significant estimate
        self.sigma_target: float | None = config.sigma_target
        self.k_reason = "start" if config.adaptive else "fixed"

        self.zero_partitioning = self._zero_partitioning(config.zero_stage, world_size)
        # Under DDP the replicas' item counts are summed before the all-reducing backward, so
        # eq. 4's item weighting and the effective batch are global and equal on every rank.
        self._replicas_synced = (
            world_size > 1
            and isinstance(model, torch.nn.parallel.DistributedDataParallel)
            and torch.distributed.is_initialized()
        )
        self.k = config.k
        self.samples_consumed = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.consecutive_skipped_steps = 0
        self.zero_bucket_sizes: dict[str, int] | None = None  # DeepSpeed ZeRO buckets (elements), else None
        self.effective_batch_size = micro_batch_size * self.k * world_size
        self._micro_index = 0
        self._step_items = 0.0
        self._step_samples = 0
        self._global_step_samples = 0
        # (items, samples) summed over replicas: one buffer for the run, so that no free of it
        # waits on the collective's thread (a tracked step's peak would then vary by its 16 bytes)
        self._replica_totals: torch.Tensor | None = None
        self._expected_items = 0.0
        self._grad_norm: torch.Tensor | None = None
        # whether every micro-batch loss of this step was finite (on the device: read once, at the step)
        self._losses_finite: torch.Tensor | None = None
        self.consecutive_nonfinite_losses = 0
        # whether load_state_dict() or start_at() placed the run (a resumed optimizer without it warns)
        self._position_restored = False
        self._loss_scale = float(self.scaler.get_scale()) if self.scaler is not None else 1.0
        # the LR the first step will use, so `engine.lr` is meaningful before any step
        self._apply_lr(micro_batch_size * self.k * world_size, self.effective_batch_size)
        self._set_grad_sync()

    # ------------------------------------------------------------------ loop API
    @property
    def k(self) -> int:
        """Micro-batches per optimizer step (adaptive accumulation sets it at each step boundary)."""
        return self._k

    @k.setter
    def k(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail("k", value, "an integer >= 1 (micro-batches per optimizer step)")
        self._k = value

    @property
    def is_accumulation_boundary(self) -> bool:
        """True when the next backward completes the effective batch."""
        return self._micro_index + 1 >= self.k

    def micro_steps(self) -> range:
        """The micro-batches of the next optimizer step, for a loop written per optimizer step:

            for _ in engine.micro_steps():        # k of them; k may change between steps
                with engine.autocast():
                    loss = loss_fn(model(x), y)   # the mean over the micro-batch: no "/ k"
                engine.backward(loss, num_items=n)
                engine.step()

        Call it at a step boundary (k is fixed until the step is taken)."""
        if self._micro_index:
            raise RuntimeError(f"micro_steps() after {self._micro_index} of {self.k} micro-batches: allowed "
                               "only at a step boundary (after step() took the previous step)")
        return range(self.k)

    def done(self, *, total_samples: int | None = None, total_steps: int | None = None) -> bool:
        """Whether training has reached its end: `total_samples` samples consumed or `total_steps`
        optimizer steps taken (default: the schedule's horizon given to prepare()). With adaptive
        k a loop that stops after a fixed number of iterations drifts from the schedule; stop on
        this instead. Steps are counted, not indexed: a script whose loop runs
        ``while iter_num <= max_iters`` takes max_iters + 1 steps, so it stops on
        ``done(total_steps=max_iters + 1)``."""
        if total_samples is None and total_steps is None:
            total_samples, total_steps = self.total_samples, self.total_steps
        if total_samples is not None and self.samples_consumed >= total_samples:
            return True
        return total_steps is not None and self.optimizer_steps >= total_steps

    def every(self, *, samples: int | None = None, steps: int | None = None) -> bool:
        """True right after the optimizer step that crossed a multiple of `samples` samples (or
        completed a multiple of `steps` steps): evaluate or log on it, and the spacing stays in
        samples (or steps) when k adapts. False mid-way through an effective batch."""
        if (samples is None) == (steps is None):
            raise ValueError(f"samples={samples!r}, steps={steps!r} is invalid: allowed exactly one, an integer >= 1")
        every = samples if samples is not None else steps
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"{'samples' if samples is not None else 'steps'}={every!r} is invalid: allowed an integer >= 1")
        if self._micro_index or self.optimizer_steps == 0:
            return False
        if steps is not None:
            return self.optimizer_steps % steps == 0
        before = self.samples_consumed - self.effective_batch_size  # the last step's first sample
        return self.samples_consumed // samples > before // samples

    def autocast(self):
        """Context for the forward pass: autocast in the configured precision, and -- under DDP --
        gradient all-reduce only on the micro-batch that completes the effective batch."""
        self._set_grad_sync()
        if self.config.compile_mode == "reduce-overhead":
            # CUDA graphs: each micro-batch's forward starts a new replay, so a graph's outputs
            # (the previous micro-batch's, consumed by its backward) may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        return mp.autocast(self.device, self.config.precision, tf32=self.config.tf32,
                           sdpa_backend=self.config.sdpa_backend)

    def _set_grad_sync(self) -> None:
        # DistributedDataParallel decides at *forward* time whether the following backward
        # all-reduces (its forward calls reducer.prepare_for_backward only when this flag is
        # set; `no_sync()` is the same flag). Set for the next forward after every backward and
        # step, so a loop that skips `autocast()` (fp32) still syncs only at the boundary.
        if hasattr(self.model, "require_backward_grad_sync"):
            self.model.require_backward_grad_sync = self.is_accumulation_boundary

    def backward(self, loss: torch.Tensor, num_items: float | torch.Tensor | None = None, *,
                 num_samples: int | None = None) -> None:
        """Backward of one micro-batch.

        `loss` is the mean over `num_items` items (images, tokens: whatever the loss averages
        over; default: micro_batch_size). A tensor (e.g. ``mask.sum()``) stays on its device:
        the engine reads it once per optimizer step, not per micro-batch (a Python number read
        from a CUDA tensor would wait for the GPU every micro-batch). `num_samples` (default:
        micro_batch_size) counts samples -- sequences, images -- for the schedule's progress
        and eq. 11.
        """
        if isinstance(num_items, torch.Tensor):
            items = num_items.detach().to(device=self.device, dtype=torch.float64).reshape(())
        else:
            items = item_count(num_items, self.micro_batch_size)
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                        or num_samples < 1):
            raise ValueError(f"num_samples={num_samples!r} is invalid: allowed None (micro_batch_size) or an "
                             "integer >= 1 (the samples of this micro-batch)")
        samples = int(num_samples if num_samples is not None else self.micro_batch_size)
        if self._micro_index == 0:
            self._expected_items = items * self.k
        # Eq. 4 with item weighting: grad of Σ_j (n_j / E) · mean_loss_j, corrected to 1/Σ n_j at
        # the boundary when the micro-batches were not all of the first one's size.
        factor = items / self._expected_items
        if self._replicas_synced and self.is_accumulation_boundary:
            factor = self._weight_items_across_replicas(items, samples)
        if self.monitor is not None:
            self.monitor.begin_micro_batch(self.device, 1.0 / (factor * self._loss_scale), items)
        if isinstance(factor, torch.Tensor):
            factor = factor.to(torch.float32)
        self._note_loss(loss)
        scaled = loss * factor
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        with mp.kernel_settings(tf32=self.config.tf32, sdpa_backend=self.config.sdpa_backend):
            scaled.backward()
        self._micro_index += 1
        self._step_items += items
        self._step_samples += samples
        self._set_grad_sync()

    def _weight_items_across_replicas(self, items: float, samples: int) -> float:
        """Before the backward that all-reduces (DDP): rescale this replica's accumulated gradient
        so that DDP's average over replicas is the mean over all N items of the global effective
        batch (eq. 4): replica r contributes world_size · S_r / N, S_r its items' gradient sum.
        Returns the weight of the boundary micro-batch's mean loss."""
        if self._replica_totals is None:
            self._replica_totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        totals = self._replica_totals
        totals[0] = self._step_items + items
        totals[1] = float(self._step_samples + samples)
        torch.distributed.all_reduce(totals)
        global_items, global_samples = totals.tolist()
        self._global_step_samples = int(round(global_samples))
        per_item = self.world_size / global_items
        # earlier micro-batches were weighted n_j / E locally; the gradients are still local here
        rescale = per_item * float(self._expected_items)
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if grads and rescale != 1.0:
            torch._foreach_mul_(grads, rescale)
        return float(items) * per_item

    def step(self) -> bool:
        """At the accumulation boundary: unscale → clip → optimizer step → LR update → zero_grad →
        choose the next k. Returns whether the optimizer stepped (False between boundaries and
        for fp16 steps skipped because of inf/nan gradients; `skipped_steps` counts those).

        fp16: raises RuntimeError after the step's bookkeeping when the loss scale has collapsed
        (`precision.check_loss_scale`: backed off below `precision.MIN_LOSS_SCALE` = 2^-24 by
        consecutive skipped steps, or 0/inf/nan); `skipped_steps` and `optimizer_steps` then
        include the step that raised."""
        if self._micro_index < self.k:
            return False
        if self._resumed_without_position():
            self._warn_resumed_without_position()
        # item counts given as tensors are read here: one device sync per optimizer step
        self._step_items, self._expected_items = float(self._step_items), float(self._expected_items)
        if not (self._step_items > 0 and math.isfinite(self._step_items)):
            raise ValueError(f"num_items summed to {self._step_items!r} over the effective batch: allowed a finite "
                             "number > 0")
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not self._replicas_synced and self._step_items != self._expected_items and grads:
            torch._foreach_mul_(grads, self._expected_items / self._step_items)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        self._grad_norm = clip_gradients(self.parameters, self.config.clip_norm)  # eq. 12, unscaled

        step_samples = self._global_step_samples if self._replicas_synced else self._step_samples * self.world_size
        self.effective_batch_size = step_samples
        self._apply_lr(self.samples_consumed + step_samples, step_samples)
        # a non-finite loss whose gradients are finite (`loss + inf` from a bad regularizer term)
        # is no step either: skipped and counted like non-finite gradients, in every precision
        loss_finite = self._losses_were_finite()
        self.consecutive_nonfinite_losses = 0 if loss_finite else self.consecutive_nonfinite_losses + 1
        if self.scaler is not None:
            # GradScaler skips the optimizer step exactly when the unscaled gradients hold an
            # inf/nan; read that from the gradients, not from the scale backing off (a scale that
            # has underflowed to 0 stays 0 while every step is skipped).
            grads_bad = mp.gradients_non_finite(self._grad_norm, grads)
            stepped = loss_finite and not grads_bad
            if loss_finite:
                self.scaler.step(self.optimizer)
            self.scaler.update()
            self._loss_scale = float(self.scaler.get_scale())
        else:
            # no loss scaler (bf16/fp32): the same found-inf test decides, and such a step is
            # skipped and counted instead of writing inf/nan into the weights and optimizer state
            grads_bad = mp.gradients_non_finite(self._grad_norm, grads)
            stepped = loss_finite and not grads_bad
            if stepped:
                self.optimizer.step()
        if stepped:
            self.consecutive_skipped_steps = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skipped_steps += 1
        if self.monitor is not None:
            self._update_k()
        self.optimizer.zero_grad(set_to_none=True)
        self.samples_consumed += step_samples
        self.optimizer_steps += 1
        self._micro_index = 0
        self._step_items = 0.0
        self._step_samples = 0
        self._set_grad_sync()
        allowed = self.config.max_nonfinite_steps
        if self.scaler is not None:  # fp16: the loss scale handles non-finite gradients
            mp.check_loss_scale(self._loss_scale, consecutive_skips=self.consecutive_skipped_steps)
            if self.consecutive_nonfinite_losses >= allowed:
                raise self._nonfinite_loss_error(self.consecutive_nonfinite_losses)
        elif self.consecutive_skipped_steps >= allowed:  # bf16/fp32
            if not grads_bad:  # this step's gradients were finite: its loss was not
                raise self._nonfinite_loss_error(self.consecutive_skipped_steps)
            raise mp.nonfinite_steps_error(
                step=self.optimizer_steps, grad_norm=self.last_grad_norm, consecutive=self.consecutive_skipped_steps,
                allowed=allowed, precision=self.config.precision, backend="torch engine")
        return stepped

    def _nonfinite_loss_error(self, consecutive: int) -> mp.NonFiniteTrainingError:
        return mp.NonFiniteTrainingError(
            f"non-finite loss at optimizer step {self.optimizer_steps} in {self.config.precision} (torch engine; "
            f"its gradients were finite), {consecutive} consecutive step(s) skipped; allowed at most "
            f"OptimizationConfig.max_nonfinite_steps={self.config.max_nonfinite_steps} in a row. {mp.NON_FINITE_CAUSES}.")

    def start_at(self, *, steps: int, samples: int | None = None, lr: float | list[float] | None = None) -> None:
        """Place a run resumed from a checkpoint that holds no engine state (one saved before
        adopting trainopt, which knows only its iteration number): the next optimizer step is
        step `steps` (counted from 0, so a script's ``iter_num``), with `samples` samples
        (sequences, images) consumed before it -- default ``steps`` × the effective batch in
        samples. The LR schedule, `done()` and `every()` go on from there: the next step's LR is
        the schedule's at that step, whatever LR the loaded optimizer carries. Call it after
        loading the model and optimizer, before the first backward.

        `lr`: the LR the optimizer was built with, which the schedule multiplies (the first
        group's; the other groups keep their ratio to it), or a list, one per group. Needed only
        when the optimizer's state was loaded before prepare(): its LR is then the checkpoint's
        (decayed), and without the 'initial_lr' that torch's LR schedulers record, the one it was
        built with is lost; start_at() then refuses to guess and names `lr`."""
        for name, value in (("steps", steps), ("samples", samples)):
            if (value is not None or name == "steps") and (isinstance(value, bool) or not isinstance(value, int)
                                                           or value < 0):
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 0")
        base_lrs = self._given_base_lrs(lr)
        if self._micro_index:
            raise RuntimeError(f"engine.start_at() after {self._micro_index} of {self.k} micro-batches: allowed only "
                               "between optimizer steps, before the first backward of the resumed run")
        if base_lrs is not None:
            self._use_base_lrs(base_lrs)
            self._base_lrs_unknown = False
        self.optimizer_steps = steps
        self.samples_consumed = steps * self.effective_batch_size if samples is None else samples
        self._apply_lr(self.samples_consumed + self.effective_batch_size, self.effective_batch_size)
        self._position_restored = True

    # ------------------------------------------------------------------ internals
    def _given_base_lrs(self, lr) -> list[float] | None:
        """start_at()'s `lr` as one base LR per parameter group (None: keep the engine's)."""
        if lr is not None:
            return scaled_base_lrs(lr, self.base_lrs)
        if self._base_lrs_unknown:
            fail("lr", None, f"the LR the optimizer was built with, e.g. engine.start_at(steps=iter_num, "
                 f"lr=learning_rate): its state was loaded before prepare(), so the LR it holds "
                 f"({self.base_lrs[0]:.3g}) is the checkpoint's, not the one the schedule decays from "
                 "(or load the optimizer's state after prepare(), which keeps the one it was built with)")
        return None

    def _use_base_lrs(self, base_lrs: list[float]) -> None:
        """The LRs the schedule multiplies (η_base of eqs. 10-11), one per group; the schedule is
        rebuilt on them (a `min_lr` is a fraction of the first) and each group records its own as
        'initial_lr', so a checkpoint of the optimizer carries it."""
        self.schedule = make_schedule(self.config, base_lr=base_lrs[0], **self._schedule_args)
        self.base_lrs = list(base_lrs)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = base_lr

    def _resumed_without_position(self) -> bool:
        """At the first step: resumed state (`_holds_resumed_state`), but nothing placed the engine's run."""
        return self.optimizer_steps == 0 and not self._position_restored and self._holds_resumed_state()

    def _holds_resumed_state(self) -> bool:
        return bool(self.optimizer.state)

    def _warn_resumed_without_position(self) -> None:
        start_at = ("engine.start_at(steps=iter_num, lr=learning_rate) with the LR the optimizer was built with (its "
                    "state, loaded before prepare(), holds the checkpoint's)" if self._base_lrs_unknown
                    else "engine.start_at(steps=iter_num)")
        warn_at_caller(
            f"the optimizer holds state ({len(self.optimizer.state)} parameters' moments: a resumed optimizer?) but "
            "the engine starts at step 0: its LR schedule restarts its warmup and its sample count from 0. Resume "
            "the engine too: save engine.state_dict() in your checkpoint and call engine.load_state_dict() before "
            f"the first step, or -- for a checkpoint saved before adopting trainopt -- {start_at}.")

    def _note_loss(self, loss: torch.Tensor) -> None:
        """Keeps, on the device, whether this step's micro-batch losses were all finite."""
        finite = torch.isfinite(loss.detach()).all()
        self._losses_finite = finite if self._losses_finite is None else self._losses_finite & finite

    def _losses_were_finite(self) -> bool:
        """Whether the losses noted since the last step were finite (one device sync), and forget them."""
        finite, self._losses_finite = self._losses_finite, None
        return True if finite is None else bool(finite)

    def _zero_partitioning(self, zero_stage: int, world_size: int) -> str:
        return _torch_zero_partitioning(zero_stage, world_size)

    def _multiplier(self, samples_after_step: float, effective_batch_size: int) -> float:
        """The schedule's factor for the step about to be taken (a step-based schedule's position
        is that step's index, a sample-based one's the samples consumed once it is taken)."""
        position = self.optimizer_steps if self.schedule.unit == "steps" else samples_after_step
        return self.schedule.lr_multiplier(position, effective_batch_size)

    def _apply_lr(self, samples_after_step: float, effective_batch_size: int) -> None:
        self._lr_multiplier = self._multiplier(samples_after_step, effective_batch_size)
        set_lr(self.optimizer, self.base_lrs, self._lr_multiplier)

    def _update_k(self) -> None:
        """Eq. 6 after a step, on the micro-batch norms of every replica (the same on all ranks)."""
        grad_sq, micro = gather_noise_inputs(float(self._grad_norm) ** 2, self.monitor.micro_norms(),
                                             world_size=self.world_size, device=self.device)
        self.k, self.sigma_target, self.k_reason = next_k(
            self.monitor.finish_step(grad_sq, micro), k=self.k, sigma_target=self.sigma_target,
            rule=self.config.k_rule, k_min=self.config.k_min, k_max=self.config.k_max)

    # ------------------------------------------------------------------ state
    @property
    def lr(self) -> float:
        """The LR (of the first parameter group) the latest optimizer step used; before the
        first step, the LR the first step will use. A loop that logs "the LR of iteration it"
        before taking that step wants `next_lr`."""
        return self.optimizer.param_groups[0]["lr"]

    @property
    def next_lr(self) -> float:
        """The LR (first parameter group) the next optimizer step will use, with full micro-batches
        at the current k: what a per-iteration loop computes before its step."""
        batch = self.micro_batch_size * self.k * self.world_size
        return self.base_lrs[0] * self._multiplier(self.samples_consumed + batch, batch)

    @property
    def loss_scale(self) -> float:
        return self._loss_scale

    @property
    def last_grad_norm(self) -> float | None:
        """Pre-clip global norm of the last step's unscaled gradient."""
        return None if self._grad_norm is None else float(self._grad_norm)

    @property
    def noise(self) -> NoiseEstimate | None:
        """Gradient-noise estimate pooled over the last `noise_window` steps (adaptive only)."""
        return None if self.monitor is None else self.monitor.pooled

    @property
    def b_simple(self) -> float | None:
        """The gradient noise scale B_simple = σ²/|G|², in `num_items` units (adaptive only)."""
        return None if self.noise is None else self.noise.b_simple

    def stats(self) -> dict:
        """The engine's state between optimizer steps, each key saying what it counts:

        - ``optimizer_steps`` (steps taken, skipped ones included), ``samples_consumed`` (samples:
          sequences, images), ``skipped_steps`` (non-finite steps not applied);
        - ``last_*`` -- the step just taken: ``last_lr`` (the LR it used, first parameter
          group), ``last_effective_batch_samples``, ``last_grad_norm`` (pre-clip global L2
          norm of the unscaled gradient);
        - ``next_*`` -- the step to come: ``next_k_micro_batches`` (chosen at the boundary),
          ``next_effective_batch_samples`` (full micro-batches), ``next_lr``;
        - ``loss_scale`` (fp16's dynamic scale; 1.0 otherwise);
        - gradient noise pooled over the last `noise_window` steps (adaptive k; else None):
          ``sigma_sq`` (eq. 7's per-item gradient variance, squared-gradient units),
          ``grad_sq`` (|G|², unbiased) and its 95 % half-width, ``b_simple_items`` (the noise
          scale σ²/|G|² in `num_items` units: tokens when items are tokens),
          ``noise_significant``, ``k_reason``, ``sigma_target``."""
        noise = self.noise
        next_batch = self.micro_batch_size * self.k * self.world_size
        return {
            "optimizer_steps": self.optimizer_steps,
            "samples_consumed": self.samples_consumed,
            "skipped_steps": self.skipped_steps,
            "last_lr": self.lr,
            "last_effective_batch_samples": self.effective_batch_size,
            "last_grad_norm": self.last_grad_norm,
            "next_k_micro_batches": self.k,
            "next_effective_batch_samples": next_batch,
            "next_lr": self.next_lr,
            "loss_scale": self.loss_scale,
            "sigma_sq": None if noise is None else noise.sigma_sq,
            "grad_sq": None if noise is None else noise.grad_sq,
            "grad_sq_half_width": None if noise is None or math.isnan(noise.grad_sq_half_width) else noise.grad_sq_half_width,
            "b_simple_items": None if noise is None or math.isinf(noise.b_simple) else noise.b_simple,
            "noise_significant": None if noise is None else noise.significant,
            "k_reason": self.k_reason,
            "sigma_target": self.sigma_target,
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """What the engine holds: k and why, the calibrated sigma_target, the noise monitor's
        pooled window, the fp16 loss scaler, the sample/step/skip counters (the LR schedule's
        position is `samples_consumed`) and the base LRs. A resumed loop continues exactly when
        it also restores the model, the optimizer, the random generators
        (`trainopt_core.rng_state()`: dropout masks, shuffling, augmentation) and its own data
        position (how many batches it had drawn). Save them together between optimizer steps
        (after a `step()` that returned at a boundary):

            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "engine": engine.state_dict(), "rng": trainopt_core.rng_state(),
                        "batches_drawn": batches_drawn}, path)
            # restart: build model, optimizer and engine as before, then
            model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
            engine.load_state_dict(state["engine"]); trainopt_core.set_rng_state(state["rng"])
            # and skip the first state["batches_drawn"] batches of the same data order

        A plain dict of Python numbers (and the scaler's dict), so torch.save and
        `torch.load(weights_only=True)` take it."""
        if self._micro_index:
            raise RuntimeError(
                f"engine.state_dict() after {self._micro_index} of {self.k} micro-batches of an effective "
                "batch: allowed only between optimizer steps (after step() returned at a boundary)")
        return {
            "format": ENGINE_STATE_FORMAT,
            "config": self.config.computation_fields(),
            "world_size": self.world_size,
            "micro_batch_size": self.micro_batch_size,
            "k": self.k,
            "k_reason": self.k_reason,
            "sigma_target": self.sigma_target,
            "samples_consumed": self.samples_consumed,
            "optimizer_steps": self.optimizer_steps,
            "skipped_steps": self.skipped_steps,
            "consecutive_skipped_steps": self.consecutive_skipped_steps,
            "consecutive_nonfinite_losses": self.consecutive_nonfinite_losses,
            "effective_batch_size": self.effective_batch_size,
            "lr_multiplier": self._lr_multiplier,
            "base_lrs": list(self.base_lrs),
            "grad_norm": self.last_grad_norm,
            "loss_scale": self._loss_scale,
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "monitor": None if self.monitor is None else self.monitor.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict()`'s output into an engine built with the same configuration,
        world size and micro-batch size (else ValueError naming what differs)."""
        if not isinstance(state, dict) or state.get("format") != ENGINE_STATE_FORMAT:
            raise ValueError(f"engine state format {state.get('format') if isinstance(state, dict) else state!r} "
                             f"is invalid: allowed {ENGINE_STATE_FORMAT!r} (a dict from engine.state_dict())")
        if self._micro_index:
            raise RuntimeError("engine.load_state_dict() mid-way through an effective batch: allowed only between steps")
        mine = self.config.computation_fields()
        differ = sorted(key for key in mine.keys() | state["config"].keys()
                        if key != "name" and mine.get(key) != state["config"].get(key))
        if differ:
            raise ValueError(
                "engine state saved under another configuration: " + ", ".join(
                    f"{key}={state['config'].get(key)!r} there, {mine.get(key)!r} here" for key in differ))
        for key in ("world_size", "micro_batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"engine state saved with {key}={state[key]!r}; this engine has {getattr(self, key)!r}")
        self.k = state["k"]
        self.k_reason = state["k_reason"]
        self.sigma_target = state["sigma_target"]
        self.samples_consumed = state["samples_consumed"]
        self.optimizer_steps = state["optimizer_steps"]
        self.skipped_steps = state["skipped_steps"]
        self.consecutive_skipped_steps = state["consecutive_skipped_steps"]
        self.consecutive_nonfinite_losses = state.get("consecutive_nonfinite_losses", 0)  # states saved before it
        self.effective_batch_size = state["effective_batch_size"]
        self._base_lrs_unknown = False
        self._use_base_lrs(list(state["base_lrs"]))  # whatever LR the optimizer holds
        self._lr_multiplier = state["lr_multiplier"]
        set_lr(self.optimizer, self.base_lrs, self._lr_multiplier)
        self._grad_norm = None if state["grad_norm"] is None else torch.tensor(state["grad_norm"])
        self._loss_scale = state["loss_scale"]
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if self.monitor is not None and state["monitor"] is not None:
            self.monitor.load_state_dict(state["monitor"])
        self._position_restored = True
        self._set_grad_sync()

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.remove()


def model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _torch_zero_partitioning(zero_stage: int, world_size: int) -> str:
    """What the torch-native engine partitions: nothing (it never pretends to run ZeRO)."""
    if world_size == 1:
        return "none: single process" + (f" (ZeRO-{zero_stage} requested)" if zero_stage else "")
    if zero_stage == 0:
        return f"none: ZeRO stage 0, optimizer state replicated on {world_size} processes"
    warn_at_caller(
        f"OptimizationConfig.zero_stage={zero_stage} with the torch-native engine: optimizer state "
        f"and gradients stay replicated on all {world_size} processes; use prepare(..., "
        "backend='deepspeed') for ZeRO partitioning.")
    return f"none: torch-native engine (use backend='deepspeed' for ZeRO-{zero_stage})"
