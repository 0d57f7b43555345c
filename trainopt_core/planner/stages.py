"""The stages of one `plan()` call, in order (the package docstring says what each measures):
precision × split, the ZeRO stage (more than one process), checkpointing (where memory counts),
speed options -- each a first estimate of its candidates -- then the race among what can still
win (`race`), then the choice (`choice.choose`) and the returned `Plan`. Each stage reads and
extends one `Planning`: the measurements (`search`), the notes, where the time went, and the
best candidate so far."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..compose import deepspeed_available
from ..config import OptimizationConfig
from .adaptive import adaptive_config, measure_goodput
from .choice import DROPPED, choose, cost_at, helps, pareto_front, tie_margin, wholly_below
from .memory_model import predict, zero_saving_bytes
from .result import Plan
from .search import MIN_RACE_ROUNDS, Search  # MIN_RACE_ROUNDS: every raced candidate's, else the race focuses (`_focus`)
from .timing import BRACKETED
from .space import (COMPILE_ON_CPU, Candidate, attention_kernels, base_candidate, candidate_of, changes_between,
                    checkpointed_twins, configured, fewest_splits_that_fit, native_reduced_precisions, precision_splits,
                    speed_option_changes,
                    splits, with_expandable_segments, zero_twins)

MAX_CHECKPOINTED = 6      # checkpointed candidates measured at most (the fastest twins first)
MAX_ZERO = 4              # ZeRO candidates measured at most (the best's twins first)
# Compiling took 18-61 s from a cold cache on 2-core CPUs (COMPILE_ON_CPU) and 39.5 s for ResNet-50 on
# an H100: a run shorter than this cannot earn a compile back, so it is not tried there
COMPILE_FLOOR_S = 10.0
RACE_MAX_ROUNDS = 20      # the race ends where every survivor has this many windows (without a time budget, its end)
MIN_ROUNDS_TO_DROP = 3    # shared rounds before a candidate can be dropped on its paired ratio (t = 4.3 at 3)
# shared rounds before the best is taken as unable to replace yours (its interval over yours not
# reaching past the margin): a few short windows read a true 1.16x as under 1.05x in a smoke plan
MIN_ROUNDS_TO_KEEP = 8


@dataclass
class Planning:
    """One plan() call as its stages pass it on: what was asked, what is measured, the best so far."""

    search: Search
    memory_budget_bytes: float | None
    weights: tuple[float, float, float]
    min_k: int
    world: int
    ks: tuple | None
    speed_options: bool
    try_compile: bool
    run_samples: int | None
    adaptive_accumulation: bool
    k_max: int
    base: OptimizationConfig | None
    started: float
    notes: list[str] = field(default_factory=list)
    stage_s: dict = field(default_factory=dict)  # planning seconds by stage
    lap_started: float = 0.0
    best: Candidate | None = None
    stage1: list[Candidate] = field(default_factory=list)  # precision × split, every candidate measured
    first: list[Candidate] = field(default_factory=list)   # those of them timed in the first round
    zero_ran: list[Candidate] = field(default_factory=list)
    never_tried: list[Candidate] = field(default_factory=list)  # checkpointed candidates over MAX_CHECKPOINTED

    @property
    def rows(self) -> dict:
        return self.search.rows

    def lap(self, stage: str) -> None:
        """Adds the seconds since the last lap to `stage` (where planning time goes)."""
        now = time.perf_counter()
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + now - (self.lap_started or self.started)
        self.lap_started = now

    def out_of_time(self, stage: str) -> bool:
        """True (and said) when the time budget is spent before `stage` starts."""
        spent = not self.search.ranks.all(self.search.time_budget.left_s() > 0)
        if spent:
            self.search.time_budget.cut(f"{stage} not tried")
        return spent

    def choose_again(self) -> None:
        self.best = self.search.best(weights=self.weights, min_k=self.min_k)

    def over_budget(self, c: Candidate) -> bool:
        """Measured over the memory budget, or pruned / out of memory under one."""
        row = self.rows[c]
        if self.memory_budget_bytes is None:
            return False
        if row["peak_memory_bytes"] is None:
            return (row["rejected_because"] or "").startswith(("pruned", "out of memory"))
        return row["peak_memory_bytes"] > self.memory_budget_bytes and not row["rejected_because"]

    def does_not_fit(self, c: Candidate) -> bool:
        """Over the budget, or out of memory with or without one."""
        return self.over_budget(c) or (self.rows[c]["rejected_because"] or "").startswith("out of memory")

    def timed_and_fitting(self, candidates) -> list[dict]:
        return [self.rows[c] for c in candidates if self.rows[c]["speedup"] and not self.rows[c]["rejected_because"]]


def precision_and_split(p: Planning) -> None:
    """Stage 1: every precision the device computes natively × splits of the batch (on a GPU the
    fewest that fit first), the caller's configuration among them; near ties timed once more."""
    search, device, size = p.search, p.search.device, p.search.size
    missing = [name for name in ("bf16", "fp16") if name not in native_reduced_precisions(device)]
    if device.type == "cpu" and "bf16" in missing:
        p.notes.append("bf16 is not a candidate: this CPU has neither AVX-512 BF16 nor AMX, so bf16 autocast would be "
                       "emulated, several times slower than fp32 (fp16 is not one on any CPU): the candidates are fp32.")
    elif device.type == "cuda" and "bf16" in missing:
        p.notes.append("bf16 is not a candidate: this GPU does not compute it (torch.cuda.is_bf16_supported() is "
                       "False); fp16 with loss scaling is.")
    if p.base is not None:  # the caller's configuration, measured whatever the time budget, timed with the first
        yours = base_candidate(p.base, size, search.num_blocks, p.world, device)
        p.first += search.measure_memory([Candidate(), yours], always=True)
        search.rows[yours]["yours"] = True
    if p.ks is None and device.type == "cuda":
        # a GPU step's time follows its kernel launches more than its samples: the fewest
        # micro-batches that fit first, a precision split further only where its split does not fit
        ladder = splits(size, None, p.min_k)
        p.stage1 = fewest_splits_that_fit(precision_splits(size, device, ladder[:1], min_k=p.min_k), ladder,
                                          lambda cs: p.first.extend(search.measure_memory(cs)), p.does_not_fit)
        p.notes.append(f"Splits tried on the GPU: k={ladder[0]} first, a further split only where the fewer did not "
                       f"fit ({', '.join(sorted({f'k={c.k}' for c in p.stage1}))} measured).")
    else:
        p.stage1 = precision_splits(size, device, p.ks, min_k=p.min_k)
        if p.base is not None:  # what matters most first: the splits of yours, in its precision
            p.stage1.sort(key=lambda c: c != Candidate() and c.precision != yours.precision)
        p.first += search.measure_memory(p.stage1)
    p.first = list(dict.fromkeys(p.first))
    search.time(p.first)  # a first estimate: the race (the last stage) gives rounds to those that can win
    p.choose_again()
    p.lap("precision x split")


def zero_stage(p: Planning) -> None:
    """On more than one process: partitioned optimizer state (and gradients) against DDP, on the
    best and on what is over the budget -- first those that ZeRO-2's saving would bring within it
    (their measured peak, else the memory model's prediction), the fastest of them first."""
    search, rows = p.search, p.rows
    if search.ranks.world_size == 1:
        return
    if not deepspeed_available():
        p.notes.append("ZeRO stages not tried: DeepSpeed is not installed (pip install 'trainopt[deepspeed]').")
        return
    if p.out_of_time("ZeRO stages"):
        return
    saving = zero_saving_bytes(search.calibration, 2, search.ranks.world_size) if search.calibration else 0

    def fits_with_zero(c: Candidate) -> bool:
        peak = rows[c]["peak_memory_bytes"] or rows[c]["predicted_memory_bytes"] or math.inf
        return peak - saving <= p.memory_budget_bytes

    over = sorted((c for c in p.stage1 if p.over_budget(c)),
                  key=lambda c: (not fits_with_zero(c), -(rows[c]["speedup"] or 0), c.precision == "fp32", c.k))
    twins = ([p.best] if p.best else []) + over
    if p.weights[1] > 0:
        twins += [candidate_of(r) for r in pareto_front(p.timed_and_fitting(p.first))]
    p.zero_ran = search.measure_memory([z for twin in dict.fromkeys(twins) for z in zero_twins(twin)], limit=MAX_ZERO)
    if p.zero_ran:
        search.time([p.best] + p.zero_ran if p.best else p.zero_ran)
        p.choose_again()
    p.lap("ZeRO stage")


def checkpointing(p: Planning) -> None:
    """Stage 2, where memory counts (a budget, or a weight on memory): ⌈√L⌉ segments, every block,
    every block selective, on the candidates over the budget (or on the time-memory front)."""
    search, rows, budget = p.search, p.rows, p.memory_budget_bytes
    if not search.num_blocks:
        if budget is not None:
            p.notes.append("Checkpointing not tried: the model has no known block sequence (give it checkpoint_blocks).")
        return
    if (budget is None and p.weights[1] == 0) or p.out_of_time("checkpointing"):
        return
    twins = [c for c in p.stage1 + p.zero_ran if p.over_budget(c)]
    if p.best is not None and p.weights[1] == 0:
        # something fits already, and checkpointing only adds recompute: only a twin faster
        # than the best fitting candidate can give a faster one
        twins = [c for c in twins if rows[c]["speedup"] is not None and rows[c]["speedup"] > rows[p.best]["speedup"]]
    if p.weights[1] > 0:
        twins += [candidate_of(r) for r in pareto_front(p.timed_and_fitting(p.first + p.zero_ran))]
    # measured twins first: under a budget the fastest (the cheapest way to fit), weighing
    # memory without one the smallest (checkpointing extends the low-memory end); then the
    # unmeasured ones, reduced precision and fewer splits first
    measured = [c for c in dict.fromkeys(twins) if rows[c]["speedup"] is not None]
    measured.sort(key=lambda c: -rows[c]["speedup"] if budget is not None else rows[c]["peak_memory_bytes"])
    unmeasured = sorted((c for c in dict.fromkeys(twins) if rows[c]["speedup"] is None),
                        key=lambda c: (c.precision == "fp32", c.k))
    checkpointed = [c for twin in measured + unmeasured for c in checkpointed_twins(twin, search.num_blocks)]
    if p.best is None and search.calibration is not None:
        # nothing fits yet: the twins the memory model expects smallest first, so that the few
        # measured are those likeliest to fit (fastest first, the k=1/2/4 twins took every slot
        # and the k=8 twins that fit were never built)
        checkpointed.sort(key=lambda c: predict(search.calibration, c, search.size, search.ranks.world_size))
    ran = search.measure_memory(checkpointed, limit=MAX_CHECKPOINTED)
    p.never_tried = [c for c in checkpointed if c not in rows]
    if ran:
        search.time([p.best] + ran if p.best else ran)
        p.choose_again()
    p.lap("checkpointing")


def speed_options(p: Planning) -> None:
    """Stage 3 on the best so far and on the candidates within its timing noise (at most
    `NEAR_TIES` in all, the best first: the speed options do not build on a point estimate alone):
    the optimizer's fused kernels, channels-last and, on CUDA, attention kernels; the options that
    helped each, together; then torch.compile on the finalist only (compiling every option and then
    their combination took 47-72 s of a GPU plan)."""
    search, best = p.search, p.best
    if not p.speed_options or best is None or p.out_of_time("speed options"):
        return
    compile_now = p.try_compile
    best_s = search.rows[best]["seconds_per_sample"]
    if p.try_compile and p.run_samples and best_s and p.run_samples * best_s < COMPILE_FLOOR_S:
        # the whole run takes less than compiling would: no compiled candidate can earn it back
        compile_now = False
        p.notes.append(f"torch.compile not tried: the whole run ({p.run_samples:,} samples) takes about "
                       f"{p.run_samples * best_s:.1f} s at the best candidate's speed, under the {COMPILE_FLOOR_S:.0f} s "
                       "that compiling a model takes at the least.")
    # attention kernels: a lever where the device offers them (CUDA), for a model that calls SDPA
    uses_sdpa = bool(attention_kernels(best, search.device)) and search.trial(Candidate()).calls_sdpa()

    def options_of(c: Candidate, compiled: bool = False) -> list[dict]:
        return [option for option in speed_option_changes(c, search.model, search.optimizer_factory, search.device,
                                                          compile_now and compiled, search.optimizer_takes_model,
                                                          uses_sdpa)
                if bool(option.get("compile")) == compiled]

    contenders = [best] + [c for c in search.near_ties(weights=p.weights, min_k=p.min_k) if c != best]
    tried = {c: [c.replace(**option) for option in options_of(c)] for c in contenders}
    unzeroed = best.replace(zero_stage=0)
    if best.zero_stage and _measured_and_fits(p, unzeroed):
        # channels-last and compile do not run under DeepSpeed: tried on the best's DDP twin,
        # which fits too, lest a ZeRO stage chosen inside the noise shut them out
        tried[best] += [unzeroed.replace(**option) for option in options_of(unzeroed) if option not in options_of(best)]
    # each measured, then given its first estimate beside the baseline (and yours), the best's options
    # first: under load the budget then times what it measured (measuring them all first left a busy
    # plan with five measured and none timed)
    ran = []
    for candidate in dict.fromkeys(c for options in tried.values() for c in options):
        measured = search.measure_memory([candidate])
        if measured:
            search.time(measured)
            ran += measured
    if ran:
        for contender, options in tried.items():
            _combine(p, contender, [c for c in ran if c in options])
        p.choose_again()
    if len(contenders) > 1:
        p.notes.append("Speed options tried on the best so far and on the candidates within its timing noise: "
                       + "; ".join(c.name for c in contenders) + ".")
    if compile_now:
        _compile_finalist(p, options_of)
    p.lap("speed options")
    if not p.try_compile:
        p.notes.append(f"torch.compile not tried (try_compile=False, the default off CUDA: {COMPILE_ON_CPU}).")


def _measured_and_fits(p: Planning, c: Candidate) -> bool:
    row = p.search.rows.get(c)
    return bool(row) and row["speedup"] is not None and not p.over_budget(c)


def _combine(p: Planning, contender: Candidate, ran: list[Candidate]) -> None:
    """The speed options that helped `contender`, together."""
    search = p.search
    base_s = search.rows[Candidate()]["seconds_per_sample"]
    helped = [c for c in ran if helps(search.rows[c], search.rows[contender], p.memory_budget_bytes, base_s,
                                      p.run_samples)]
    if len(helped) > 1:
        together = contender.replace(**{key: value for c in helped for key, value in changes_between(contender, c).items()})
        # timed with the baseline only: every speedup is paired with the baseline's windows,
        # so it compares with the options' own (re-timing them cost ~6 s of a ResNet plan)
        built = search.measure_memory([together])
        if built:
            search.time(built)


def _compile_finalist(p: Planning, options_of) -> None:
    """torch.compile on the best eager candidate so far, the finalist (on a ZeRO finalist, its DDP
    twin where that fits: compile does not run under DeepSpeed), timed beside it."""
    finalist = p.best
    if finalist is not None and finalist.zero_stage:
        finalist = finalist.replace(zero_stage=0) if _measured_and_fits(p, finalist.replace(zero_stage=0)) else None
    if finalist is None:
        return
    ran = p.search.measure_memory([finalist.replace(**option) for option in options_of(finalist, compiled=True)])
    if ran:
        p.search.time([finalist] + ran)
        p.choose_again()


def race(p: Planning) -> None:
    """The last stage, a race (F-Race's way, with paired rounds): every candidate still in it is
    timed once per round together with the fp32 baseline and yours (`plan(base=...)`); after each
    round a candidate whose speed over the best's (the lowest eq. 3 cost), paired round by round
    over at least `MIN_ROUNDS_TO_DROP` shared rounds, has a 95 % interval wholly on the slow side
    -- its eq. 3 cost above the best's even at the interval's fast end -- is dropped. The race goes
    on while a round fits in the time budget, more than one candidate survives besides the baseline
    and yours, or the best against yours is not decided (replaced beyond the margin, or cannot be),
    and no survivor has `RACE_MAX_ROUNDS` windows. The baseline and yours are never dropped: every
    speedup is paired with the baseline, and yours is kept or replaced on its own pairing.

    The stages before it measure a candidate only where `MIN_RACE_ROUNDS` rounds are left for the
    race after it (`Search.race_reserve_s`): a candidate measured with no rounds left to race it
    could not replace the base, and the rounds it took could have decided one that can."""
    search = p.search
    yours = search.yours()
    pinned = [Candidate()] + ([yours] if yours is not None and yours != Candidate() else [])
    raced, why_stopped = 0, None
    while True:
        rows = search.chosen_rows(p.weights, p.min_k)
        if rows is None:
            return
        feasible = {candidate_of(row): row for row in rows if row["feasible"]}
        lowest = min(feasible, key=lambda c: feasible[c]["cost"])
        _drop_the_slow(p, feasible, lowest, pinned)
        racing = [c for c in feasible if not (p.rows[c]["rejected_because"] or "").startswith(DROPPED)]
        if _settled(feasible, racing, lowest, yours, pinned, tie_margin(search.device.type)):
            why_stopped = "decided"
            break
        _focus(p, feasible, racing, pinned)
        racing = [c for c in racing if not (p.rows[c]["rejected_because"] or "").startswith(DROPPED)]
        timed = list(dict.fromkeys(pinned + racing))
        if min(p.rows[c]["timed_windows"] for c in racing) >= RACE_MAX_ROUNDS:
            why_stopped = f"every survivor had {RACE_MAX_ROUNDS} windows"
            break
        if not search.ranks.all(search.time_budget.allows(search.round_s(timed))):
            why_stopped = "the time budget had no room for another round"
            break
        search.time(timed, rounds=1)
        raced += 1
    out = [(c, p.rows[c]["timed_windows"], "shared rounds" in p.rows[c]["rejected_because"])
           for c in p.rows if (p.rows[c]["rejected_because"] or "").startswith(DROPPED)]
    slower = [f"{c.name} (after {n})" for c, n, paired in out if paired]
    aside = [f"{c.name} (after {n})" for c, n, paired in out if not paired]
    survivors = [c for c in racing if c not in pinned or c == lowest]
    p.notes.append(f"Raced {raced} round(s) after the first estimates ({why_stopped}); "
                   + (f"dropped as slower beyond the noise: {'; '.join(slower)}; " if slower else "none dropped as slower; ")
                   + (f"set aside for the budget's last rounds: {'; '.join(aside)}; " if aside else "")
                   + "still in the race: " + "; ".join(f"{c.name} ({p.rows[c]['timed_windows']} windows)"
                                                      for c in dict.fromkeys(survivors + pinned)) + ".")
    p.lap("race")


def _drop_the_slow(p: Planning, feasible: dict, lowest: Candidate, pinned: list) -> None:
    """Marks dropped (in the search's rows) each candidate but the pinned whose eq. 3 cost, at the
    fast end of its speed's interval paired with `lowest`'s round by round, is above `lowest`'s."""
    search, best = p.search, feasible[lowest]
    for candidate, row in feasible.items():
        if candidate == lowest or candidate in pinned:
            continue
        paired = search.paired_between(candidate, lowest)
        if paired is None or paired["n"] < MIN_ROUNDS_TO_DROP or paired["ci_high"] is None:
            continue
        fast_end = cost_at(row, best["speedup"] * paired["ci_high"], search.rows[Candidate()], p.weights,
                           p.run_samples, energy=all(r["energy_j_per_sample"] is not None for r in feasible.values()))
        if fast_end > best["cost"]:
            search.rows[candidate]["rejected_because"] = (
                f"{DROPPED} after {paired['n']} shared rounds: {paired['mean']:.3f}x the speed of {lowest.name}, paired "
                f"round by round, 95 % interval {paired['ci_low']:.3f}-{paired['ci_high']:.3f}; its eq. 3 cost even at "
                f"the interval's fast end ({fast_end:.3f}) is above {lowest.name}'s ({best['cost']:.3f})")


def _focus(p: Planning, feasible: dict, racing: list, pinned: list) -> None:
    """Where what is left of the time budget cannot give every candidate in the race
    `MIN_RACE_ROUNDS` more rounds, the race goes on with the current choice and the lowest-cost
    others that it can, the rest dropped and said so: the budget goes to those that can still win."""
    search = p.search
    # the current choice first (the tie rule's, among those the timing cannot tell from the lowest
    # cost), then by cost: the focus never sets aside what the plan would choose now
    chosen = next((c for c in racing if feasible[c].get("chosen")), None)
    contenders = sorted((c for c in racing if c not in pinned), key=lambda c: (c != chosen, feasible[c]["cost"]))
    left = search.time_budget.left_s()
    if len(contenders) <= 1 or left == float("inf"):
        return
    fits = lambda count: MIN_RACE_ROUNDS * search.round_s(list(dict.fromkeys(pinned + contenders[:count]))) <= left  # noqa: E731
    if fits(len(contenders)):
        return
    keep = next((count for count in range(len(contenders), 0, -1) if fits(count)), 1)
    kept = contenders[:keep]
    for candidate in contenders[keep:]:
        search.rows[candidate]["rejected_because"] = (
            f"{DROPPED} after {search.rows[candidate]['timed_windows']} windows to give the budget's last rounds to "
            f"the current choice and the lowest-cost others ({'; '.join(c.name for c in kept)}): its eq. 3 cost "
            f"{feasible[candidate]['cost']:.3f}")
    search.time_budget.cut(f"set aside to race {keep}", [c.name for c in contenders[keep:]])


def _settled(feasible: dict, racing: list, lowest: Candidate, yours, pinned: list, margin: float) -> bool:
    """Whether more rounds cannot change the choice: no candidate but the best (and the pinned)
    survives, and, with yours, the best either replaces it beyond the margin or cannot (its speed
    over yours' interval reaches no further than the margin, over `MIN_ROUNDS_TO_KEEP` rounds)."""
    if any(c != lowest and c not in pinned for c in racing):
        return False
    if yours is None or lowest == yours:
        return True
    best, mine = feasible[lowest], feasible.get(yours)
    if mine is None:
        return True
    if wholly_below(best, mine, margin):
        return True
    high, rounds = best.get("vs_yours_ci_high"), best.get("vs_yours_rounds") or 0
    return high is not None and high <= 1.0 + margin and rounds >= MIN_ROUNDS_TO_KEEP


def finish(p: Planning) -> Plan:
    """The notes on how the timing went, eq. 3's choice (`choice.choose`), the configuration that
    runs it and, with adaptive accumulation, k by goodput."""
    search = p.search
    if search.split_rounds:
        room = ("that fit" if search.capacity_bytes is None
                else f"that fit in {search.capacity_bytes / 2**20:,.0f} MiB of device memory")
        ran_out = (f", {search.out_of_memory_splits} of them halved after running out of memory"
                   if search.out_of_memory_splits else "")
        p.notes.append(f"Timed in groups {room}, each group with the baseline ({search.split_rounds} round(s) split"
                       f"{ran_out}); {search.rebuilt} candidate cop{'y was' if search.rebuilt == 1 else 'ies were'} "
                       "built again after being released for room.")
    alone = [row["candidate"] for row in search.rows.values() if BRACKETED in (row.get("paired_with") or "")]
    if alone:
        room = "" if search.capacity_bytes is None else f" in {search.capacity_bytes / 2**20:,.0f} MiB"
        p.notes.append(f"Timed alone, their copies and the baseline's not fitting{room} together: "
                       f"{'; '.join(alone)}. Each was built once the baseline's copy was released and timed "
                       "between baseline windows timed alone before and after it, each of its windows paired with the "
                       "geometric mean of the two baseline windows around it; every other candidate was interleaved "
                       "with the baseline"
                       + ("." if search.split_rounds else f" ({search.rebuilt} copies built again after being "
                                                          "released for room)."))
    if search.timing_note:
        p.notes.append(search.timing_note)
    rows = list(search.rows.values())
    search.pair_with_yours()
    try:
        p.notes += choose(rows, p.memory_budget_bytes, p.weights, min_k=p.min_k, run_samples=p.run_samples,
                          margin=tie_margin(search.device.type), paired=search.paired_by_name)
    except ValueError as error:
        if not p.never_tried:
            raise
        raise ValueError(f"{error}; not tried (at most {MAX_CHECKPOINTED} checkpointed candidates are measured): "
                         + "; ".join(c.name for c in p.never_tried)) from error
    chosen = next(row for row in rows if row.get("chosen"))
    yours = next((row for row in rows if row.get("yours")), None)
    if all(row["speedup"] is None for row in rows if row["candidate"] != Candidate().name and not row.get("yours")):
        if yours is None or yours["candidate"] == Candidate().name:
            p.notes.insert(0, "Fell back to the fp32 baseline: within the planning time budget nothing else could be "
                              "timed beside it, so nothing was compared (time_budget_s; planned on a busy machine?)."
                              + (" It is your configuration, kept." if yours is not None else ""))
        else:  # a plan that compared nothing keeps yours: never the baseline in its place on a timing this thin
            if chosen is not yours:
                chosen["chosen"], yours["chosen"] = False, True
                chosen["rejected_because"] = "not chosen: the plan fell back, and a plan that fell back keeps yours"
                yours["rejected_because"], chosen = None, yours
            p.notes.insert(0, f"Fell back to your configuration ({yours['candidate']}): within the planning time budget "
                              "no other candidate could be timed beside it and the fp32 baseline, so nothing was "
                              "compared and yours is kept (time_budget_s; planned on a busy machine?).")
    budget_note = search.time_budget.note()
    if budget_note:
        noisy = [row["candidate"] for row in rows if "timing noise" in (row["rejected_because"] or "")]
        p.notes.append(budget_note + (" Within the choice's timing noise: " + "; ".join(repr(n) for n in noisy) + "."
                                      if noisy else " No candidate is within the choice's timing noise."))
    config, good = configured(candidate_of(chosen), p.base, p.world), None
    if config.zero_stage:
        p.notes.append(f"The chosen configuration runs ZeRO-{config.zero_stage}: build it with prepare(..., "
                       "backend='deepspeed') on the plain module.")
    config = with_expandable_segments(config, search.device, p.memory_budget_bytes, p.notes)
    if p.adaptive_accumulation:
        good = measure_goodput(search, candidate_of(chosen), k_max=p.k_max)
        config = adaptive_config(config, good)
        p.lap("goodput")
    return Plan(config=config, chosen=chosen, baseline=search.rows[Candidate()], rows=rows,
                memory_budget_bytes=p.memory_budget_bytes, weights=p.weights,
                planning_s=time.perf_counter() - p.started, compile_s=search.compile_s, notes=p.notes,
                energy_source=search.energy_source, goodput=good, run_samples=p.run_samples, stage_s=p.stage_s,
                base=p.base, world_size=p.world, device=str(search.device))
