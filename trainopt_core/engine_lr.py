"""The LRs an engine sets (eqs. 10-11): each parameter group's η_base, the schedule that multiplies
it, and -- for a resumed run -- whether the LR the optimizer holds is the one it was built with.

An optimizer loaded from a checkpoint *before* `prepare()` holds the checkpoint's (decayed) LR. A
checkpoint saved by trainopt or by torch's LR schedulers records each group's 'initial_lr'; one
saved by a plain loop does not, and then the LR the optimizer was built with is lost. Whether that
happened is read from the param groups, not from the optimizer's state (a stateless optimizer,
SGD without momentum, holds none): groups that recorded no 'initial_lr' when prepare() saw them,
and that no `load_state_dict` has replaced since, hold an LR that may be a checkpoint's.
"""
from __future__ import annotations

from ._errors import fail
from .schedule import lrs_may_be_a_checkpoints, make_schedule, remember_base_lrs, scaled_base_lrs, set_lr


class EngineLRs:
    """η_base per parameter group and the configured schedule over it (`schedule.make_schedule`)."""

    def __init__(self, optimizer, config, *, base_batch_size: int, schedule_arguments: dict):
        self.optimizer, self.config = optimizer, config
        self._schedule_arguments = dict(base_batch_size=base_batch_size, **schedule_arguments)
        # a state loaded before prepare() replaced the LR the optimizer was built with by its own
        self.may_be_a_checkpoints = lrs_may_be_a_checkpoints(optimizer)
        self._recorded_at_prepare = all("initial_lr" in group for group in optimizer.param_groups)
        self._groups_at_prepare = list(optimizer.param_groups)
        min_lr = schedule_arguments.get("min_lr")
        if (self.may_be_a_checkpoints and config.schedule != "constant" and min_lr is not None
                and min_lr > optimizer.param_groups[0]["lr"]):
            fail("min_lr", min_lr, f"an LR up to the optimizer's ({optimizer.param_groups[0]['lr']:.3g}), which is a "
                 "checkpoint's: its state was loaded before prepare(); load it after prepare(), then "
                 "engine.start_at(steps=iter_num)")
        self.use(remember_base_lrs(optimizer))

    def use(self, base_lrs: list[float]) -> None:
        """The LRs the schedule multiplies (η_base of eqs. 10-11), one per group; the schedule is
        rebuilt on them (a `min_lr` is a fraction of the first) and each group records its own as
        'initial_lr', so a checkpoint of the optimizer carries it."""
        self.schedule = make_schedule(self.config, base_lr=base_lrs[0], **self._schedule_arguments)
        self.base_lrs = list(base_lrs)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = base_lr

    def known(self) -> None:
        """The base LRs are now given (by the user, or by an engine state): no longer a guess."""
        self.may_be_a_checkpoints = False
        self._recorded_at_prepare = True

    def multiplier(self, *, steps_taken: int, samples_after_step: float, effective_batch_size: int) -> float:
        """The schedule's factor for the step about to be taken (a step-based schedule's position
        is that step's index, a sample-based one's the samples consumed once it is taken)."""
        position = steps_taken if self.schedule.unit == "steps" else samples_after_step
        return self.schedule.lr_multiplier(position, effective_batch_size)

    def apply(self, multiplier: float) -> None:
        set_lr(self.optimizer, self.base_lrs, multiplier)

    def loaded_before_prepare(self) -> bool:
        """Whether the LRs the optimizer held at prepare() may be a checkpoint's: loaded with its
        state, or param groups without 'initial_lr' that no load_state_dict replaced since (the
        checkpoint, if there is one, was loaded before prepare(); stateful or not)."""
        unreplaced = len(self._groups_at_prepare) == len(self.optimizer.param_groups) and all(
            now is then for now, then in zip(self.optimizer.param_groups, self._groups_at_prepare))
        return self.may_be_a_checkpoints or (not self._recorded_at_prepare and unreplaced)

    def for_resume(self, lr) -> list[float] | None:
        """start_at()'s `lr` as one base LR per group (None: keep these), refusing to guess where
        the optimizer's LR may be a checkpoint's (`loaded_before_prepare`)."""
        if lr is not None:
            return scaled_base_lrs(lr, self.base_lrs)
        if self.loaded_before_prepare():
            fail("lr", None, "the LR the optimizer was built with, e.g. engine.start_at(steps=iter_num, "
                 "lr=learning_rate): the optimizer's state was loaded before prepare() (or not at all) and its param "
                 f"groups record no 'initial_lr', so the LR they hold ({self.base_lrs[0]:.4g}) may be a checkpoint's, "
                 "not the one the schedule decays from (or load the optimizer's state after prepare(), which keeps "
                 "the one it was built with)")
        return None
