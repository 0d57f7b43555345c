"""The planner's timing: candidates stepped in interleaved windows, each window paired with the
fp32 baseline's window of the same round, in groups whose copies fit in the device's memory
together, within the planning time budget (`budget.TimeBudget`).

A timing call runs its windows one round at a time (every candidate of the group once, the order
rotated each round). Every round has a number, and each candidate's rate is kept by round
(`round_rates`), so any two candidates timed in the same rounds can be compared pair by pair
(`paired_between`): the race (`stages.race`) drops a candidate on its ratio to the best over the
rounds both ran, not on two intervals each widened by the baseline's noise. A candidate not timed
before gets at least two windows (an interval needs two); every further round runs only where the
last one's seconds fit in what is left of the budget. What the budget cut short is said in the
plan's notes.

Windows are short: on a CPU one step where a step takes >= `CPU_WINDOW_S` (enough steps to reach it
otherwise), so that the budget buys many paired rounds, not a few long ones -- two windows give an
interval with one degree of freedom (t = 12.7), useless below ~2x; twelve give t = 2.2.

`Timing` is the timing half of `search.Search`, which builds the copies and measures memory."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..measure.energy import EnergyMeter
from ..measure.stats import paired_ratio, summarize
from ..measure.timing import Timer, interleaved_windows
from . import budget as clock
from .space import Candidate

# plan()'s default timing on CUDA, sized to the fp32 baseline's step: windows of at least
# WINDOW_TARGET_S (2 to MAX_STEPS_PER_WINDOW steps), and 5 windows instead of 3 for steps under
# SHORT_STEP_S. On an H200, 3 windows of 2 steps of ResNet-50's 27 ms step left its candidates'
# intervals 0.6-1.8x wide and chose fp32 TF32 with CUDA graphs (1.72x); 5 windows of 10 steps
# narrowed them to +-5-10 % and chose bf16 with them (2.72x). GPT-2 124M's steps (0.2-0.65 s)
# keep 3 windows of 2 steps, whose intervals were already +-1 %.
WINDOW_TARGET_S, SHORT_STEP_S, MAX_STEPS_PER_WINDOW = 0.25, 0.1, 20
# off CUDA: windows of at least CPU_WINDOW_S (one step where a step takes that long), and two
# windows for a first estimate; the race (stages.race) adds rounds to the candidates that can still win
CPU_WINDOW_S, FIRST_WINDOWS = 0.1, 2
PROGRESS_EVERY_S = 10.0  # with progress on, a line at least this often while windows are timed
# how a candidate's windows were paired with the baseline's (a row's `paired_with`)
INTERLEAVED = "interleaved with the baseline's windows"
BRACKETED = ("timed alone, each window paired with the geometric mean of the baseline's windows timed alone "
             "before and after it")
NOT_TIMED = "not timed: the planning time budget (time_budget_s) had no room for its first windows"


def sized_timing(step_s: float, windows: int | None, steps_per_window: int | None,
                 device_type: str = "cuda") -> tuple[int, int]:
    """(windows, steps per window) for a device whose baseline step takes `step_s`; a value the
    caller gave is kept. CUDA: windows of >= `WINDOW_TARGET_S` (at least 2 steps), 5 of them for
    steps under `SHORT_STEP_S`, else 3. Elsewhere: windows of >= `CPU_WINDOW_S` (one step where a
    step takes that long), `FIRST_WINDOWS` of them for a first estimate."""
    if device_type != "cuda":
        steps = steps_per_window or min(max(1, math.ceil(CPU_WINDOW_S / max(step_s, 1e-9))), MAX_STEPS_PER_WINDOW)
        return windows or FIRST_WINDOWS, steps
    steps = steps_per_window or min(max(2, math.ceil(WINDOW_TARGET_S / max(step_s, 1e-9))), MAX_STEPS_PER_WINDOW)
    return windows or (5 if step_s < SHORT_STEP_S else 3), steps


class Timing:
    """Interleaved timing of a `Search`'s candidates, paired with the baseline, within memory and
    the time budget. Reads the search's copies (`trials`, `_ensure`), rows and ranks."""

    def _say(self, message: str) -> None:
        if self.progress:
            print(f"[plan {self.time_budget.elapsed_s():6.1f} s] {message}", flush=True)
            self.said_at = clock.now()

    def _window_done(self) -> None:  # interleaved_windows' progress: a line now and then
        if self.progress and clock.now() - self.said_at >= PROGRESS_EVERY_S:
            self._say(f"timing: {self.windows_done} window(s) of this group done")
        self.windows_done += 1

    def yours(self) -> Candidate | None:
        """The caller's configuration (`plan(base=...)`), None without one."""
        return next((c for c, row in self.rows.items() if row.get("yours")), None)

    def round_s(self, candidates: Sequence[Candidate], paced: bool = True) -> float:
        """The expected seconds of one round of windows of `candidates`: their steps' seconds
        (measured on their first steps; an unmeasured one's as the slowest's), scaled (`paced`)
        by how long the last round took against that."""
        known = [s for s in self.step_s.values() if s > 0] or [0.0]
        steps = self.steps_per_window or 2
        return (self.pace if paced else 1.0) * steps * sum(self.step_s.get(c, max(known)) for c in candidates)

    def fits_beside_baseline(self, candidate: Candidate) -> bool:
        """Whether the copies of `candidate` and the baseline fit in the capacity together: what
        both hold between steps plus the larger step's peak."""
        baseline = Candidate()
        if self.capacity_bytes is None or candidate == baseline:
            return True
        need = self.held_bytes[baseline] + self.held_bytes[candidate] + max(self.step_bytes[baseline],
                                                                             self.step_bytes[candidate])
        return need <= self.capacity_bytes

    def timing_groups_of(self, candidates: Sequence[Candidate]) -> list[list[Candidate]]:
        """`candidates` (the baseline first) in groups that fit in the capacity together -- what
        they hold between steps plus the largest step's peak -- each group led by the baseline.
        One group without a capacity. (A candidate that does not fit beside the baseline alone is
        not in any: it is timed between baseline windows, `_time_in_brackets`.)"""
        baseline, others = candidates[0], list(candidates[1:])
        if self.capacity_bytes is None or not others:
            return [list(candidates)]
        groups, group = [], [baseline]
        for candidate in others:
            together = group + [candidate]
            need = sum(self.held_bytes[c] for c in together) + max(self.step_bytes[c] for c in together)
            if need > self.capacity_bytes and len(group) > 1:
                groups.append(group)
                group = [baseline, candidate]
            else:
                group = together
        return groups + [group]

    def timing(self) -> tuple[int, int]:
        """(windows, steps per window); where `plan()` left them to the device (None), sized once
        to the fp32 baseline's step, the median of 3 timed after its warm-up, and agreed on by
        every process."""
        if self.windows is None or self.steps_per_window is None:
            baseline = Candidate()
            self._ensure([baseline])
            seconds = []
            for _ in range(3):
                with Timer(self.device) as timer:
                    self.trials[baseline].step()
                seconds.append(timer.elapsed_s)
            step_s = sorted(seconds)[1]
            sized = sized_timing(step_s, self.windows, self.steps_per_window, self.device.type)
            self.windows, self.steps_per_window = (int(v) for v in self.ranks.min(list(sized)))
            rule = (f"windows of >= {WINDOW_TARGET_S} s; 5 windows for steps under {SHORT_STEP_S} s"
                    if self.device.type == "cuda" else
                    f"windows of >= {CPU_WINDOW_S} s, {FIRST_WINDOWS} for a first estimate, then raced")
            self.timing_note = (f"Timing: {self.windows} windows of {self.steps_per_window} step"
                                f"{'' if self.steps_per_window == 1 else 's'}, sized to the fp32 "
                                f"baseline's {1000 * step_s:.0f} ms step ({rule}).")
            self._say(self.timing_note)
        return self.windows, self.steps_per_window

    def time(self, candidates: Sequence[Candidate], rounds: int | None = None) -> None:
        """Times `candidates` (and the baseline) in interleaved windows; each row gets seconds
        per sample and its speedup over the baseline paired window by window, and energy per
        sample where a counter is readable (once per candidate). A candidate timed in several
        rounds keeps the windows of all of them (`timed_windows` counts them): a later round
        adds to its evidence instead of replacing it. Candidates all timed before are timed again
        only where a round of them fits in the time budget. A candidate whose copy does not fit
        beside the baseline's (or runs out of memory beside it) is timed alone between baseline
        windows (`_time_in_brackets`). `rounds`: at most this many rounds (default `windows`; the
        race times one round at a time)."""
        baseline = Candidate()
        self.rounds_wanted = rounds
        # the caller's configuration (`plan(base=...)`) in every timing too: each candidate pairs with it
        names = [baseline] + [c for c in dict.fromkeys([self.yours()] + list(candidates))
                              if c is not None and c != baseline and c in self.held_bytes]
        if all(self.windows_timed.get(c) for c in names) and len(names) > 1 and not self.ranks.all(
                self.time_budget.allows(self.round_s(names))):
            self.time_budget.cut("not timed again", [c.name for c in names[1:]])
            return
        names = self._first_windows_that_fit(names)
        if names == [baseline]:  # nothing to pair with it: its speedup is 1 by definition, its seconds its step's
            row = self.rows[baseline]
            if row["speedup"] is None:
                row.update(speedup=1.0, speedup_ci_low=1.0, speedup_ci_high=1.0,
                           seconds_per_sample=self.step_s[baseline] / self.size)
            return
        alone = [c for c in names if not self.fits_beside_baseline(c)]
        groups = self.timing_groups_of([c for c in names if c not in alone])
        split = len(groups) > 1
        while groups:  # the group whose copies are still built first: fewer copies built again
            group = min(groups, key=lambda g: sum(c not in self.trials for c in g))
            groups.remove(group)
            if len(group) == 1 or self._timed_within_memory(group):
                continue
            # out of memory after all (steps' peaks together, the allocator's fragmentation): every
            # copy released (the one that failed may have stopped inside its step, its gradients half
            # accumulated), the group timed again in halves, each with the baseline, and a candidate
            # that runs out of memory beside the baseline alone timed without it
            split = True
            self.out_of_memory_splits += 1
            self._release_copies(keep=())
            others = group[1:]
            if len(others) > 1:
                groups += [[baseline] + others[:len(others) // 2], [baseline] + others[len(others) // 2:]]
            else:
                alone += others
        if alone:
            self._time_in_brackets(alone)
        self.split_rounds += split

    def _first_windows_that_fit(self, names: list[Candidate]) -> list[Candidate]:
        """`names` (the baseline first) without the candidates never timed whose first windows (two
        rounds: an interval needs two) do not fit in what is left of the budget beside those before
        them, in `names`' order -- what matters most first; each left out says so (`NOT_TIMED`).
        The windows a timing call always takes are then within the budget, even on a busy machine."""
        if self.time_budget.budget_s is None:
            return names
        least, kept = min(2, self.windows or 2), [names[0]]
        for candidate in names[1:]:
            # the caller's configuration (`plan(base=...)`) always: a plan keeps or replaces it by measurement
            if self.windows_timed.get(candidate) or self.rows[candidate].get("yours") or self.ranks.all(
                    self.time_budget.allows(least * self.round_s(kept + [candidate]))):
                kept.append(candidate)
            else:
                self.rows[candidate]["rejected_because"] = NOT_TIMED
                self.time_budget.cut("not timed", [candidate.name])
        return kept

    def _timed_within_memory(self, group: list[Candidate]) -> bool:
        """Times the group; False if it ran out of memory (the baseline alone doing so is raised)."""
        try:
            self._time_group(group)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error) or len(group) == 1:
                raise
            self._say(f"out of memory timing {len(group)} candidates: {str(error).splitlines()[0][:120]}")
            return False
        return True

    def _least(self, names: Sequence[Candidate]) -> int:
        """The fewest windows a timing of `names` takes whatever the budget: two (for an interval)
        where one of them was never timed, else one."""
        return min(2, self._windows_now()) if any(not self.windows_timed.get(c) for c in names) else 1

    def _windows_now(self) -> int:
        """Rounds the timing call under way takes at most (`time(..., rounds=)`, else `windows`)."""
        return min(self.windows, self.rounds_wanted or self.windows)

    def _time_group(self, names: list[Candidate]) -> None:
        self._ensure(names)
        self.timing()  # the baseline's copy is built now: it is in every group
        self._say(f"timing {len(names)} candidates in up to {self.windows} interleaved windows")
        least = self._least(names)
        rates = self._rounds(names, least)
        # the budget had no room for their second window: no interval, left out
        short = [c for c in names[1:] if not self.windows_timed.get(c) and len(rates[c.name]) < least]
        if short:
            for candidate in short:
                self.rows[candidate]["rejected_because"] = NOT_TIMED
            self.time_budget.cut("not timed", [c.name for c in short])
            names = [c for c in names if c not in short]
        self._energy(names)
        self._record(names, rates, rates[names[0].name], INTERLEAVED)

    def _time_in_brackets(self, alone: list[Candidate]) -> None:
        """Times each candidate whose copy does not fit beside the baseline's without the two
        resident together: the baseline alone, then (its copy released) the candidate alone, then
        the baseline again, and so on, each candidate's window i paired with the geometric mean of
        window i of the baseline's windows before and after it. One that runs out of memory even
        alone is rejected as such."""
        baseline = Candidate()
        self._release_copies(keep=(baseline,))
        self._ensure([baseline])
        self.timing()
        before = self._rounds([baseline], 1)[baseline.name]
        self._record([baseline], {baseline.name: before}, before, BRACKETED)
        for candidate in alone:
            self._release_copies(keep=())
            self._say(f"timing {candidate.name} alone, between baseline windows (the two copies do not fit together)")
            try:
                self._ensure([candidate])
                own = self._rounds([candidate], self._least([candidate]))[candidate.name]
                self._energy([candidate])
            except (torch.OutOfMemoryError, RuntimeError) as error:
                if not is_out_of_memory(error):
                    raise
                self.rows[candidate]["rejected_because"] = "out of memory: even timed alone, no other copy resident"
                continue
            finally:
                self._release_copies(keep=())
            self._ensure([baseline])
            after = self._rounds([baseline], 1)[baseline.name]
            bracket = [math.sqrt(before[i % len(before)] * after[i % len(after)]) for i in range(len(own))]
            self._record([candidate], {candidate.name: own}, bracket, BRACKETED)
            self._record([baseline], {baseline.name: after}, after, BRACKETED)
            before = after

    def _rounds(self, names: list[Candidate], least: int) -> dict[str, list[float]]:
        """{name: items/s per window}: `least` rounds, then more up to `windows` while the last
        round's seconds fit in the budget (every process agreeing); each window's rate is the
        slowest process's (a data-parallel step ends with its last process). Where the machine
        slowed down since the estimate and a round that an interval needs (`least`) does not fit
        for all, it runs for those first in `names` that fit (the baseline always); the others end
        with fewer windows, which `_time_group` leaves out."""
        rates, self.windows_done = {c.name: [] for c in names}, 0
        active, expected = list(names), self.round_s(names)
        wanted = max(least, self._windows_now())
        for index in range(wanted):
            # past the windows an interval needs, the race's reserve kept (`Search.race_reserve_s`)
            reserve = self.race_reserve_s() if index >= least else 0.0
            if index >= 1 and not self.ranks.all(self.time_budget.allows(expected + reserve)):
                if index >= least:
                    self.time_budget.cut(f"timed in {index} of {wanted} windows", [c.name for c in active[1:]])
                    break
                active = self._prefix_that_fits(active)
                if len(active) == 1:
                    break
            order = active[index % len(active):] + active[:index % len(active)]  # rotated each round
            started, error = clock.now(), None
            try:
                got = interleaved_windows({c.name: self.trials[c].step for c in order}, windows=1,
                                          steps_per_window=self.steps_per_window, warmup_steps=0, device=self.device,
                                          progress=self._window_done)
            except (torch.OutOfMemoryError, RuntimeError) as caught:
                if not is_out_of_memory(caught):
                    raise
                error = caught
            if not self.ranks.all(error is None):  # on every process, or on none
                raise error or torch.OutOfMemoryError("out of memory on another process while timing")
            slowest = self.ranks.min([got[c.name][0] for c in active])
            self.round_number += 1
            for c, rate in zip(active, slowest):
                rates[c.name].append(rate)
                self.round_rates.setdefault(c, {})[self.round_number] = rate
            expected = clock.now() - started
            planned = self.round_s(active, paced=False)
            self.pace = expected / planned if planned > 0 else self.pace
            expected = self.round_s(active)
        return rates

    def paired_between(self, a: Candidate, b: Candidate) -> dict | None:
        """`a`'s speed over `b`'s, paired round by round over the rounds both were timed in
        (`paired_ratio`: the geometric mean with its 95 % interval, `n` rounds); None where they
        share fewer than two rounds (timed in other groups, or alone between baseline windows)."""
        mine, theirs = self.round_rates.get(a, {}), self.round_rates.get(b, {})
        common = sorted(set(mine) & set(theirs))
        if len(common) < 2:
            return None
        return paired_ratio([mine[i] for i in common], [theirs[i] for i in common])

    def _prefix_that_fits(self, names: list[Candidate]) -> list[Candidate]:
        """The baseline, yours (`plan(base=...)`: always timed) and the longest run of `names` after
        them whose round fits in the budget."""
        kept = [names[0]] + [c for c in names[1:] if self.rows[c].get("yours")]
        for candidate in [c for c in names[1:] if c not in kept]:
            if not self.ranks.all(self.time_budget.allows(self.round_s(kept + [candidate]))):
                break
            kept.append(candidate)
        return [c for c in names if c in kept]

    def _record(self, names: list[Candidate], rates: dict[str, list[float]], baseline_rates: list[float],
                paired: str) -> None:
        """Adds the windows to each candidate's, paired with `baseline_rates` window by window, and
        updates its row: seconds per sample, speedup and 95 % interval, how it was paired."""
        for candidate in names:
            own, paired_baseline = self.windows_timed.setdefault(candidate, ([], []))
            own += rates[candidate.name]
            paired_baseline += baseline_rates[:len(rates[candidate.name])]  # the rounds it was timed in
            row = self.rows[candidate]
            row.update(seconds_per_sample=summarize([1.0 / r for r in own])["median"], timed_windows=len(own))
            if row["rejected_because"] == NOT_TIMED:  # left out before, timed now
                row["rejected_because"] = None
            if candidate == Candidate():
                row.update(speedup=1.0, speedup_ci_low=1.0, speedup_ci_high=1.0)
                continue
            ratio = paired_ratio(own, paired_baseline)
            # the geometric mean of the paired ratios, the statistic its interval is about (the
            # median of bimodal windows fell outside the mean's interval)
            row.update(speedup=ratio["mean"], speedup_ci_low=ratio["ci_low"], speedup_ci_high=ratio["ci_high"])
            row["paired_with"] = paired if row.get("paired_with") in (None, paired) else f"{row['paired_with']}; {paired}"

    def _energy(self, names: list[Candidate]) -> None:
        """Energy per sample, once per candidate, where a counter is readable (copies built)."""
        for candidate in names:
            row = self.rows[candidate]
            if self.energy_source is not None and row["energy_j_per_sample"] is None:
                with EnergyMeter(self.device) as meter:
                    samples = sum(self.trials[candidate].step() for _ in range(self.steps_per_window))
                energy_j, samples = self.ranks.mean([meter.energy_j or 0.0, samples])  # every process's device
                row["energy_j_per_sample"] = None if meter.energy_j is None else energy_j / samples

    def steps_that_fit(self, candidate: Candidate, wanted: int, least: int) -> int:
        """How many of `wanted` steps of `candidate` fit in what is left of the budget (at least
        `least`; every process agreeing on the fewest)."""
        per_step = self.round_s([candidate]) / (self.steps_per_window or 2)
        fit = wanted if per_step <= 0 else int(min(wanted, max(self.time_budget.left_s(), 0.0) // per_step))
        count = int(self.ranks.min([max(least, fit)])[0])
        if count < wanted:
            self.time_budget.cut(f"timed in {count} of {wanted} steps", [candidate.name])
        return count


def is_out_of_memory(error: BaseException) -> bool:
    message = str(error).lower()
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in message or "can't allocate memory" in message


def release(device: torch.device) -> None:
    """Returns what the released copies held (on CUDA, the allocator's cached blocks too)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
