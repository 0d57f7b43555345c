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
with the same interface, both from one `EngineArguments` (engine_arguments.py). Both record in
`engine.zero_partitioning` what was partitioned. The LRs are `engine_lr.EngineLRs`'; resuming
(state_dict, load_state_dict, start_at) is `engine_state.ResumableEngine`'s.
"""
from __future__ import annotations

import math
import numbers

import torch

from . import precision as mp
from ._caller import warn_at_caller
from ._errors import MAX_COUNT, fail
from .accumulation import GradientNoiseMonitor, NoiseEstimate, gather_noise_inputs, next_k
from .config import OptimizationConfig
from .engine_arguments import EngineArguments, is_count
from .engine_lr import EngineLRs
from .engine_state import ENGINE_STATE_FORMAT, ResumableEngine  # noqa: F401 (ENGINE_STATE_FORMAT: re-exported)
from .schedule import clip_gradients

ITEMS_ALLOWED = ("a finite number > 0 (the items the loss is a mean over), a tensor of one element, or None "
                 "(micro_batch_size)")


def item_count(num_items, default: int) -> float:
    """A backward's `num_items` (`default` where None) as a float, or the ValueError naming it."""
    if isinstance(num_items, torch.Tensor):
        check_item_tensor(num_items)
    value = float(num_items) if isinstance(num_items, torch.Tensor) else num_items
    if value is None:
        return float(default)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value > 0 and math.isfinite(value)):
        fail("num_items", value, ITEMS_ALLOWED)
    return float(value)


def check_item_tensor(num_items: torch.Tensor) -> None:
    """ValueError naming `num_items` where the tensor holds other than one number (a per-sample
    count, where the loss's items are wanted: ``mask.sum()``, not ``mask.sum(dim=1)``)."""
    if num_items.numel() != 1 or num_items.is_complex():
        raise ValueError(f"num_items=<a {num_items.dtype} tensor of shape {tuple(num_items.shape)}> is invalid: "
                         f"allowed {ITEMS_ALLOWED}; the count of all items the loss averages over, e.g. mask.sum()")


def check_loss(loss) -> None:
    """ValueError naming `loss` where it is no tensor of one element (a per-sample loss, before its mean)."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = f"<a tensor of shape {tuple(loss.shape)}>" if isinstance(loss, torch.Tensor) else repr(loss)
        raise ValueError(f"loss={shape} is invalid: allowed a tensor of one element, the mean loss over the "
                         "micro-batch's items (reduce a per-sample loss with .mean() or reduction='mean')")


class TrainingEngine(ResumableEngine):
    """Gradient accumulation, LR schedule, clipping and mixed precision around a user's loop."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: OptimizationConfig,
                 arguments: EngineArguments):
        self.model, self.optimizer = model, optimizer
        self.device = arguments.device
        # precision "auto" becomes what it chose here (prepare() has resolved it already)
        self.config = config = config if config.precision != "auto" else mp.resolve_precision(config, self.device)
        self.world_size, self.micro_batch_size = arguments.world_size, arguments.micro_batch_size
        config.validate_for_run(device=self.device, world_size=self.world_size)
        self.total_samples, self.total_steps = arguments.total_samples, arguments.total_steps
        self.parameters = [p for group in optimizer.param_groups for p in group["params"]]
        # eq. 11's base batch; the schedule over samples (eqs. 10-11 as the paper states them) or,
        # given total_steps, over optimizer steps
        base_batch = config.base_batch_size or self.micro_batch_size * config.lr_batch_splits * self.world_size
        self.lrs = EngineLRs(optimizer, config, base_batch_size=base_batch,
                             schedule_arguments=arguments.schedule_arguments())
        self.scaler = mp.make_grad_scaler(self.device, config)
        self.monitor = GradientNoiseMonitor(self.parameters, window=config.noise_window) if config.adaptive else None
        # eq. 6's sigma_target: the configured one, or calibrated at the first significant estimate
        self.sigma_target: float | None = config.sigma_target
        self.k_reason = "start" if config.adaptive else "fixed"
        self.zero_partitioning = self._zero_partitioning(config.zero_stage, self.world_size)
        # Under DDP the replicas' item counts are summed before the all-reducing backward, so
        # eq. 4's item weighting and the effective batch are global and equal on every rank.
        self._replicas_synced = (
            self.world_size > 1
            and isinstance(model, torch.nn.parallel.DistributedDataParallel)
            and torch.distributed.is_initialized()
        )
        self.k = config.k
        self._start_counters()
        self._loss_scale = float(self.scaler.get_scale()) if self.scaler is not None else 1.0
        # the LR the first step will use, so `engine.lr` is meaningful before any step
        self._apply_lr(self.effective_batch_size, self.effective_batch_size)
        self._set_grad_sync()

    def _start_counters(self) -> None:
        """The run's counters at its start: no sample consumed, no step taken."""
        self.samples_consumed = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.consecutive_skipped_steps = 0
        self.consecutive_nonfinite_losses = 0
        self.zero_bucket_sizes: dict[str, int] | None = None  # DeepSpeed ZeRO buckets (elements), else None
        self.effective_batch_size = self.micro_batch_size * self.k * self.world_size
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
        # whether load_state_dict() or start_at() placed the run (a resumed optimizer without it warns)
        self._position_restored = False

    # ------------------------------------------------------------------ loop API
    @property
    def k(self) -> int:
        """Micro-batches per optimizer step (adaptive accumulation sets it at each step boundary)."""
        return self._k

    @k.setter
    def k(self, value: int) -> None:
        most = MAX_COUNT // (self.micro_batch_size * self.world_size)  # the effective batch stays a count
        if not is_count(value) or value > most:
            fail("k", value, f"an integer >= 1 (micro-batches per optimizer step), at most {most}")
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
        for name, value in (("total_samples", total_samples), ("total_steps", total_steps)):
            if value is not None and not is_count(value, minimum=0):
                fail(name, value, "None (prepare()'s horizon) or an integer >= 0, at most 2**53")
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
        check_loss(loss)
        if isinstance(num_items, torch.Tensor):
            check_item_tensor(num_items)
            # read at the step's boundary (one sync per step, not one per micro-batch), a nan or 0 refused there
            items = num_items.detach().to(device=self.device, dtype=torch.float64).reshape(())
        else:
            items = item_count(num_items, self.micro_batch_size)
        samples = self._sample_count(num_samples)
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

    def _sample_count(self, num_samples: int | None) -> int:
        """backward()'s `num_samples` (default micro_batch_size), or the ValueError naming it."""
        if num_samples is not None and not is_count(num_samples):
            fail("num_samples", num_samples, "None (micro_batch_size) or an integer >= 1 (the samples of this "
                 "micro-batch), at most 2**53")
        return int(num_samples if num_samples is not None else self.micro_batch_size)

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
        grads = self._unscaled_clipped_gradients()
        step_samples = self._global_step_samples if self._replicas_synced else self._step_samples * self.world_size
        self.effective_batch_size = step_samples
        self._apply_lr(self.samples_consumed + step_samples, step_samples)
        # a non-finite loss whose gradients are finite (`loss + inf` from a bad regularizer term)
        # is no step either: skipped and counted like non-finite gradients, in every precision
        loss_finite = self._losses_were_finite()
        self.consecutive_nonfinite_losses = 0 if loss_finite else self.consecutive_nonfinite_losses + 1
        grads_bad = mp.gradients_non_finite(self._grad_norm, grads)
        stepped = self._optimizer_step(loss_finite, grads_bad)
        self._count_step(stepped, step_samples)
        self._stop_on_nonfinite_steps(grads_bad)
        return stepped

    def _unscaled_clipped_gradients(self) -> list[torch.Tensor]:
        """The step's gradients as eq. 4's item-weighted mean, unscaled (fp16) and clipped (eq.
        12); the pre-clip norm kept. Reads item counts given as tensors: one device sync per step."""
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
        return grads

    def _optimizer_step(self, loss_finite: bool, grads_bad: bool) -> bool:
        """The optimizer's step where the loss and the gradients were finite; whether it stepped."""
        stepped = loss_finite and not grads_bad
        if self.scaler is not None:
            # GradScaler skips the optimizer step exactly when the unscaled gradients hold an
            # inf/nan (`grads_bad` reads the same from the gradients, not from the scale backing
            # off: a scale that has underflowed to 0 stays 0 while every step is skipped)
            if loss_finite:
                self.scaler.step(self.optimizer)
            self.scaler.update()
            self._loss_scale = float(self.scaler.get_scale())
        elif stepped:
            # no loss scaler (bf16/fp32): the same found-inf test decides, and such a step is
            # skipped and counted instead of writing inf/nan into the weights and optimizer state
            self.optimizer.step()
        return stepped

    def _count_step(self, stepped: bool, step_samples: int) -> None:
        """After a step, taken or skipped: the counters, the next k, the gradients cleared."""
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

    def _stop_on_nonfinite_steps(self, grads_bad: bool) -> None:
        """Raise where the run may not go on: fp16's loss scale collapsed, or more non-finite steps
        in a row than OptimizationConfig.max_nonfinite_steps allows."""
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

    def _nonfinite_loss_error(self, consecutive: int) -> mp.NonFiniteTrainingError:
        return mp.NonFiniteTrainingError(
            f"non-finite loss at optimizer step {self.optimizer_steps} in {self.config.precision} (torch engine; "
            f"its gradients were finite), {consecutive} consecutive step(s) skipped; allowed at most "
            f"OptimizationConfig.max_nonfinite_steps={self.config.max_nonfinite_steps} in a row. {mp.NON_FINITE_CAUSES}.")

    # ------------------------------------------------------------------ internals
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
        return self.lrs.multiplier(steps_taken=self.optimizer_steps, samples_after_step=samples_after_step,
                                   effective_batch_size=effective_batch_size)

    def _apply_lr(self, samples_after_step: float, effective_batch_size: int) -> None:
        self._lr_multiplier = self._multiplier(samples_after_step, effective_batch_size)
        self.lrs.apply(self._lr_multiplier)

    def _update_k(self) -> None:
        """Eq. 6 after a step, on the micro-batch norms of every replica (the same on all ranks)."""
        grad_sq, micro = gather_noise_inputs(float(self._grad_norm) ** 2, self.monitor.micro_norms(),
                                             world_size=self.world_size, device=self.device)
        self.k, self.sigma_target, self.k_reason = next_k(
            self.monitor.finish_step(grad_sq, micro), k=self.k, sigma_target=self.sigma_target,
            rule=self.config.k_rule, k_min=self.config.k_min, k_max=self.config.k_max)

    # ------------------------------------------------------------------ state
    @property
    def schedule(self):
        """The LR schedule (`schedule.LRSchedule` over samples or `StepLRSchedule` over steps)."""
        return self.lrs.schedule

    @property
    def base_lrs(self) -> list[float]:
        """η_base of eqs. 10-11, one per parameter group: the LRs the schedule multiplies."""
        return self.lrs.base_lrs

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
