"""Resuming an engine: its state in a checkpoint (`state_dict` / `load_state_dict`), a run placed
from a checkpoint that holds none (`start_at`), and the warning for a resumed optimizer whose
engine starts at step 0. A mixin of `TrainingEngine` (trainopt_core/engine.py): it reads and sets
the engine's counters, its `lrs` (`engine_lr.EngineLRs`), scaler and noise monitor.
"""
from __future__ import annotations

import torch

from ._caller import warn_at_caller
from ._errors import MAX_COUNT
from .engine_arguments import is_count

ENGINE_STATE_FORMAT = "trainopt-engine-state/1"
# the counters a state restores as they were saved (consecutive_nonfinite_losses: 0 in states saved before it)
COUNTERS = ("k_reason", "sigma_target", "samples_consumed", "optimizer_steps", "skipped_steps",
            "consecutive_skipped_steps", "effective_batch_size")


class ResumableEngine:
    """state_dict(), load_state_dict() and start_at() of the engines."""

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
            **{name: getattr(self, name) for name in COUNTERS},
            "consecutive_nonfinite_losses": self.consecutive_nonfinite_losses,
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
        self._check_state(state)
        self.k = state["k"]
        for name in COUNTERS:
            setattr(self, name, state[name])
        self.consecutive_nonfinite_losses = state.get("consecutive_nonfinite_losses", 0)
        self.lrs.known()
        self.lrs.use(list(state["base_lrs"]))  # whatever LR the optimizer holds
        self._lr_multiplier = state["lr_multiplier"]
        self.lrs.apply(self._lr_multiplier)
        self._grad_norm = None if state["grad_norm"] is None else torch.tensor(state["grad_norm"])
        self._loss_scale = state["loss_scale"]
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if self.monitor is not None and state["monitor"] is not None:
            self.monitor.load_state_dict(state["monitor"])
        self._position_restored = True
        self._set_grad_sync()

    def _check_state(self, state: dict) -> None:
        """ValueError where `state` is no engine state of this engine's configuration, world size
        and micro-batch size; RuntimeError mid-way through an effective batch."""
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

    def start_at(self, *, steps: int, samples: int | None = None, lr: float | list[float] | None = None) -> None:
        """Place a run resumed from a checkpoint that holds no engine state (one saved before
        adopting trainopt, which knows only its iteration number): the next optimizer step is
        step `steps` (counted from 0, so a script's ``iter_num``), with `samples` samples
        (sequences, images) consumed before it -- default ``steps`` × the effective batch in
        samples. The LR schedule, `done()` and `every()` go on from there: the next step's LR is
        the schedule's at that step, whatever LR the loaded optimizer carries. Call it after
        loading the model and optimizer, before the first backward.

        `lr`: the LR the optimizer was built with, which the schedule multiplies (the first
        group's; the other groups keep their ratio to it), or a list, one per group. Needed when
        the optimizer was loaded before prepare() from a checkpoint that records no
        'initial_lr' (torch's LR schedulers and trainopt record it; a plain loop's does not),
        stateful or not: its LR is then the checkpoint's (decayed), and the one it was built with
        is lost; start_at() then refuses to guess and names `lr`."""
        for name, value in (("steps", steps), ("samples", samples)):
            if (value is not None or name == "steps") and not is_count(value, minimum=0):
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 0, at most 2**53")
        base_lrs = self.lrs.for_resume(lr)
        if self._micro_index:
            raise RuntimeError(f"engine.start_at() after {self._micro_index} of {self.k} micro-batches: allowed only "
                               "between optimizer steps, before the first backward of the resumed run")
        if base_lrs is not None:
            self.lrs.use(base_lrs)
            self.lrs.known()
        self.optimizer_steps = steps
        self.samples_consumed = steps * self.effective_batch_size if samples is None else samples
        if self.samples_consumed > MAX_COUNT:
            raise ValueError(f"steps={steps!r} is invalid: {steps} steps of {self.effective_batch_size} samples pass "
                             f"2**53 samples; allowed fewer, or samples= the samples consumed")
        self._apply_lr(self.samples_consumed + self.effective_batch_size, self.effective_batch_size)
        self._position_restored = True

    def _resumed_without_position(self) -> bool:
        """At the first step: resumed state (`_holds_resumed_state`), but nothing placed the engine's run."""
        return self.optimizer_steps == 0 and not self._position_restored and self._holds_resumed_state()

    def _holds_resumed_state(self) -> bool:
        return bool(self.optimizer.state)

    def _warn_resumed_without_position(self) -> None:
        start_at = ("engine.start_at(steps=iter_num, lr=learning_rate) with the LR the optimizer was built with (its "
                    "state, loaded before prepare(), holds the checkpoint's)" if self.lrs.may_be_a_checkpoints
                    else "engine.start_at(steps=iter_num)")
        warn_at_caller(
            f"the optimizer holds state ({len(self.optimizer.state)} parameters' moments: a resumed optimizer?) but "
            "the engine starts at step 0: its LR schedule restarts its warmup and its sample count from 0. Resume "
            "the engine too: save engine.state_dict() in your checkpoint and call engine.load_state_dict() before "
            f"the first step, or -- for a checkpoint saved before adopting trainopt -- {start_at}.")
