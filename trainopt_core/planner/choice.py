"""The choice: eq. 3 (C = w1·T + w2·M + w3·E, each over the fp32 baseline's) among the measured
candidates within the memory budget, never one slower than the baseline unless the budget forces
it, with what each other candidate lost by and whether only within the timing noise."""
from __future__ import annotations

import re

import math
from typing import Sequence

from ..measure.costs import cost
from .._errors import fail
from .space import Candidate


def pareto_front(rows: Sequence[dict]) -> list[dict]:
    """The rows no other row beats on both time (higher speedup) and peak memory, by memory."""
    ordered = sorted(rows, key=lambda r: (r["peak_memory_bytes"], -r["speedup"]))
    front, best_speedup = [], -math.inf
    for row in ordered:
        if row["speedup"] > best_speedup:
            front.append(row)
            best_speedup = row["speedup"]
    return front


def speedup_interval(row: dict) -> str:
    low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    return "n/a" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def check_weights(weights: Sequence[float]) -> tuple[float, float, float]:
    weights = tuple(weights)
    if len(weights) != 3 or not all(isinstance(w, (int, float)) and w >= 0 and math.isfinite(w) for w in weights) \
            or weights[0] + weights[1] <= 0:
        fail("weights", weights, "three finite numbers >= 0 (time, memory, energy) with time + memory > 0")
    return tuple(float(w) for w in weights)


def helps(row: dict, best: dict, budget: float | None, base_s: float | None = None,
          run_samples: int | None = None) -> bool:
    fits = budget is None or row["peak_memory_bytes"] <= budget
    return fits and not row["rejected_because"] and (over_run(row, row["speedup"], base_s, run_samples)
                                                     > over_run(best, best["speedup"], base_s, run_samples))


def run_compile_s(row: dict) -> float | None:
    """The compiling a run of the row's configuration pays: compiled again from the compile cache
    the plan filled (`run_compile_s`, timed after planning's own compile) where measured, else the
    plan's own, cold compile (`compile_s`; plans made before the warm one was timed)."""
    return row.get("run_compile_s") if row.get("run_compile_s") is not None else row.get("compile_s")


def over_run(row: dict, speedup: float | None, base_s: float | None, run_samples: int | None) -> float | None:
    """`speedup` (over the fp32 baseline's seconds per sample `base_s`) with the compiling the run
    pays (`run_compile_s`) spread over a run of `run_samples` samples; unchanged for a row that did
    not compile or when the run's length is not known."""
    if speedup is None or not speedup > 0 or not run_samples or not run_compile_s(row) or not base_s:
        return speedup
    return base_s / (base_s / speedup + run_compile_s(row) / run_samples)


def compiling_words(row: dict) -> str:
    """What compiling costs the run, as the notes say it."""
    if row.get("run_compile_s") is None:
        return f"compiling took {row['compile_s']:.1f} s"
    return (f"compiling takes the run {row['run_compile_s']:.1f} s (from the compile cache the plan filled; "
            f"{row['compile_s']:.1f} s cold)")


# how a row dropped from the race (`stages.race`) says so
DROPPED = "dropped from the race"


def measured_part(row: dict, keep_dropped: bool = False) -> dict:
    """A row without what `choose` decides (so a choice can be made again). A candidate dropped
    from the race stays dropped while planning (`keep_dropped`); `Plan.rechoose` under another
    budget or weights lets it compete again on its intervals (it lost to a candidate that may not
    fit the new budget)."""
    out = dict(row, feasible=False, chosen=False, cost=None, cost_ci_low=None, cost_ci_high=None, speedup_over_run=None,
               cost_vs_yours_high=None)
    kept = ("pruned", "out of memory", "quality", "failed", "not measured", "not timed") + ((DROPPED,) if keep_dropped else ())
    if out["rejected_because"] and not out["rejected_because"].startswith(kept):
        out["rejected_because"] = None
    return out


def costs_apart(cost: float, other: float) -> str:
    """Two eq. 3 costs as "A vs B", at the fewest decimals (3 or more) that tell them apart, so
    that "higher" shows in the numbers (0.3152 vs 0.3148, not 0.315 vs 0.315)."""
    decimals = 3
    while decimals < 17 and cost != other and f"{cost:.{decimals}f}" == f"{other:.{decimals}f}":
        decimals += 1
    return f"{cost:.{decimals}f} vs {other:.{decimals}f}"


def reworded_costs(reason: str | None, cost: float | None, chosen_cost: float | None) -> str | None:
    """A stored reason's "(A vs B)" costs written again by `costs_apart` from the row's and the
    choice's stored costs: a plan made before its digits were chosen so says "0.3155 vs 0.3148",
    not "0.315 vs 0.315". Other reasons, or rows without both costs, are returned as they were."""
    if not reason or cost is None or chosen_cost is None:
        return reason
    pair = re.search(r"\((\d+\.\d+) vs (\d+\.\d+)\)", reason)
    if pair is None or (float(pair[1]), float(pair[2])) != (round(cost, 3), round(chosen_cost, 3)):
        return reason  # not this row's stored pair (another wording): left as it was
    return reason[:pair.start()] + f"({costs_apart(cost, chosen_cost)})" + reason[pair.end():]


def _cost_interval(row: dict) -> str:
    if row.get("cost_ci_low") is None or row.get("cost_ci_high") is None:
        return f"{row['cost']:.3f} (one window: no interval)"
    return f"{row['cost_ci_low']:.3f}-{row['cost_ci_high']:.3f}"


def cost_intervals_overlap(row: dict, best: dict) -> bool:
    """Whether two rows' eq. 3 cost intervals (from their speedups' 95 % intervals) overlap."""
    if any(r.get(end) is None for r in (row, best) for end in ("cost_ci_low", "cost_ci_high")):
        return False
    return row["cost_ci_low"] <= best["cost_ci_high"] and best["cost_ci_low"] <= row["cost_ci_high"]


# The one rule that chooses among tied candidates, so that noise does not: the fewer changes from
# the base (yours, else the fp32 baseline: the simpler configuration), then the lower peak memory
# (bit-identical from sitting to sitting), then the name.
TIE_RULE = "fewer changes from the base, then lower peak memory, then the name"
# What a candidate must clear, beyond its timing interval, to replace the base (yours, or the fp32
# baseline in the reproduction's `auto`): the same candidates' ratios move between sittings of one
# kind of machine by about this much (1.7-6.5 % SD on 2-core CPUs: docs/verdicts.md's floors; GPU
# windows agree to about 1 %), so a base kept or replaced inside it would flip from sitting to sitting.
TIE_MARGIN = {"cpu": 0.05, "cuda": 0.01}


def tie_margin(device: str | None) -> float:
    """`TIE_MARGIN` for a device ("cpu", "cuda:0", ...; unknown: the CPU's)."""
    kind = str(device or "cpu").split(":")[0]
    return TIE_MARGIN.get(kind, TIE_MARGIN["cpu"])


def tied_with(row: dict, lowest: dict, fast_end_cost: float | None = None) -> bool:
    """Whether `row` ties with `lowest` (the lowest point cost): the timing cannot tell it slower.
    Where the two were timed in the same rounds, `fast_end_cost` is `row`'s eq. 3 cost at the fast
    end of its speed over `lowest`'s paired round by round, and it ties unless that is above
    `lowest`'s cost (the race's rule for dropping a candidate); otherwise its point cost lies inside
    `lowest`'s 95 % interval."""
    if row is lowest:
        return True
    if fast_end_cost is not None:
        return fast_end_cost <= lowest["cost"]
    return row["cost"] <= (lowest.get("cost_ci_high") or lowest["cost"])


def tie_broken(lowest: dict, candidates: Sequence[dict], base: dict, fast_end=None) -> tuple[dict, list[dict]]:
    """(the choice, the tie) among `candidates`: the rows tied with `lowest` (`tied_with`; itself
    included; `fast_end(row, lowest)` gives a row's cost at the fast end of its paired interval, or
    None), `TIE_RULE` choosing among them."""
    from .space import candidate_of, changes_between

    tied = [row for row in candidates
            if tied_with(row, lowest, None if fast_end is None or row is lowest else fast_end(row, lowest))]
    origin = candidate_of(base)
    chosen = min(tied, key=lambda row: (len(changes_between(origin, candidate_of(row))), row["peak_memory_bytes"],
                                        row["candidate"]))
    return chosen, tied


def _tie_reason(chosen: dict, other: dict, base: dict) -> str:
    """What decided the tie rule between `chosen` and `other`, in words."""
    from .space import candidate_of, changes_between

    origin = candidate_of(base)
    mine, theirs = (len(changes_between(origin, candidate_of(row))) for row in (chosen, other))
    if mine != theirs:
        return f"{mine} vs {theirs} changes from the base"
    if chosen["peak_memory_bytes"] != other["peak_memory_bytes"]:
        return (f"the same changes from the base, its peak memory {chosen['peak_memory_bytes'] / 2**20:,.1f} MiB vs "
                f"{other['peak_memory_bytes'] / 2**20:,.1f} MiB"
                + (" (apart in bytes)" if round(chosen['peak_memory_bytes'] / 2**20, 1)
                   == round(other['peak_memory_bytes'] / 2**20, 1) else ""))
    return "the same changes from the base and peak memory: by name"


def wholly_below(row: dict, other: dict, margin: float = 0.0) -> bool:
    """Whether `row`'s eq. 3 cost interval lies wholly below `other`'s by more than `margin` (a
    fraction: its high end times 1 + margin below). Against the caller's configuration, where the
    two were timed in the same rounds, `row`'s interval is the one paired with it round by round
    (`cost_vs_yours_high`, at yours' point cost); otherwise each row's own interval (a row timed in
    one window, without one, counts as its point)."""
    if other.get("yours") and row.get("cost_vs_yours_high") is not None:
        return row["cost_vs_yours_high"] * (1.0 + margin) < other["cost"]
    high = row["cost_ci_high"] if row.get("cost_ci_high") is not None else row["cost"]
    low = other["cost_ci_low"] if other.get("cost_ci_low") is not None else other["cost"]
    return high * (1.0 + margin) < low


def baseline_row(rows) -> dict:
    return next(row for row in rows if row["candidate"] == Candidate().name)


def choose(rows: list[dict], budget: float | None, weights: tuple, min_k: int = 1,
           run_samples: int | None = None, margin: float = 0.0, paired=None) -> list[str]:
    """Marks the chosen row (eq. 3 among feasible timed rows with k >= `min_k`) and why each
    other measured row lost; returns notes. ValueError when no measured candidate fits the budget.
    Without a row marked ``yours`` the choice is the lowest eq. 3 cost by point estimate. With one
    (the caller's configuration, `plan(base=...)`), `keep_or_replace_yours` decides.
    With `run_samples`, a compiled row's time is its seconds per sample plus its compile seconds
    spread over the run (`speedup_over_run`): eq. 3's T is the run's time, compiling included."""
    base = baseline_row(rows)

    def speed(row: dict, key: str = "speedup") -> float | None:
        return over_run(row, row[key], base.get("seconds_per_sample"), run_samples)

    for row in rows:
        if run_samples and run_compile_s(row) and row["speedup"] is not None:
            row["speedup_over_run"] = speed(row)
    feasible, base_fits = _feasible(rows, budget, min_k)
    notes, forced_by_k = _reject_slower(feasible, base, base_fits, speed, min_k, run_samples)
    feasible = [row for row in feasible if row["feasible"]]
    _eq3_costs(feasible, base, weights, speed)
    yours = next((row for row in feasible if row.get("yours")), None)
    with_energy = all(row["energy_j_per_sample"] is not None for row in feasible + [base])

    def fast_end(row: dict, lowest: dict) -> float | None:
        """`row`'s eq. 3 cost at the fast end of its speed over `lowest`'s, paired round by round
        (`paired(row name, lowest name)`: the planner's rounds), or None where not paired."""
        found = paired(row["candidate"], lowest["candidate"]) if paired else None
        if not found or found.get("ci_high") is None or not lowest.get("speedup"):
            return None
        return cost_at(row, lowest["speedup"] * found["ci_high"], base, weights, run_samples, with_energy)

    if yours is None:
        best, tied = tie_broken(min(feasible, key=lambda row: row["cost"]), feasible, base, fast_end)
    else:
        _costs_against_yours(feasible, yours, base, weights, run_samples, with_energy)
        best, tied = keep_or_replace_yours(feasible, yours, notes, margin, fast_end)
    best["chosen"] = True
    notes += _why_the_others_lost(feasible, best, yours, tied, yours or base, margin)
    if len(tied) > 1:
        notes.append(f"Tied (the timing cannot tell any from the lowest cost{', paired round by round' if paired else ''}): "
                     f"{'; '.join(repr(row['candidate']) for row in sorted(tied, key=lambda row: row['cost']))}; "
                     f"chosen by the tie rule ({TIE_RULE}): {best['candidate']!r}.")
    if base in feasible and base is not best and cost_intervals_overlap(base, best):
        notes.append(f"The choice's speedup interval ({speedup_interval(best)}) reaches 1x: this timing cannot tell it "
                     "from the fp32 baseline.")
    if speed(best) < 1.0 and not forced_by_k:
        if not base_fits:
            notes.append(f"The chosen configuration runs at {speed(best):.2f}x the fp32 baseline's speed: "
                         "the budget forces it.")
        else:  # slower only by its point estimate: its interval reaches 1x
            notes.append(f"The chosen configuration runs at {speed(best):.2f}x the fp32 baseline's speed by its point "
                         f"estimate, but its interval ({speedup_interval(best)}) reaches 1x: a candidate is rejected "
                         "as slower only when its whole interval is.")
    if best.get("speedup_over_run") is not None:
        notes.append(f"The choice compiles: {best['speedup']:.2f}x the baseline per step, {best['speedup_over_run']:.2f}x "
                     f"over the run's {run_samples:,} samples, where {compiling_words(best)} "
                     "(a recompile later in the run, for a new input shape or evaluation mode, is not counted; "
                     "evaluating under torch.compiler.set_stance('force_eager') avoids one).")
    return notes


def keep_or_replace_yours(feasible: list[dict], yours: dict, notes: list[str],
                          margin: float = 0.0, fast_end=None) -> tuple[dict, list[dict]]:
    """The rule for the caller's configuration ("yours", `plan(base=...)`): it is replaced whenever
    a candidate's eq. 3 cost interval lies wholly below its own -- by the lowest-cost of those, or,
    where others of them are within its noise, by `TIE_RULE` among them -- and otherwise kept:
    every candidate not worse than yours is then within its timing noise (a lower point cost inside
    overlapping intervals is a tie, and a tie keeps yours). With a `margin` (`TIE_MARGIN`: how far
    the same ratios move between sittings of one kind of machine) the interval must lie below
    yours by more than it. Among those below, the tie (`tied_with`) is the lowest cost's and those
    the timing cannot tell from it. Returns (the choice, its tie)."""
    below = [row for row in feasible if row is not yours and wholly_below(row, yours, margin)]
    if below:
        return tie_broken(min(below, key=lambda row: row["cost"]), below, yours, fast_end)
    tied = sorted((row for row in feasible if row is not yours and row["cost"] < yours["cost"]),
                  key=lambda row: row["cost"])
    if tied:
        beyond = f" by more than {100 * margin:g} %" if margin else ""
        notes.append(f"Kept your configuration ({yours['candidate']}, eq. 3 cost {_cost_interval(yours)}): no candidate's "
                     f"cost interval lies wholly below it{beyond}; "
                     + "; ".join(f"{row['candidate']} ({_cost_interval(row)})" for row in tied)
                     + f" {'has' if len(tied) == 1 else 'have'} a lower point cost within its timing noise, and a tie "
                       "keeps yours.")
    return yours, [yours]


def _feasible(rows: list[dict], budget: float | None, min_k: int) -> tuple[list[dict], bool]:
    """The timed rows within the budget with k >= `min_k`, marked feasible (the others say why
    not), and whether the fp32 baseline fits the budget; ValueError naming the smallest peak when
    no row is feasible."""
    for row in rows:
        if row["peak_memory_bytes"] is None or row["rejected_because"] or row["speedup"] is None:
            continue
        if budget is not None and row["peak_memory_bytes"] > budget:
            row["rejected_because"] = f"over the budget: peak {row['peak_memory_bytes'] / 2**20:.1f} MiB"
        else:
            row["feasible"] = True
    base_fits = baseline_row(rows)["feasible"]
    for row in rows:
        if row["feasible"] and row["k"] < min_k:
            row["feasible"] = False
            row["rejected_because"] = (f"adaptive accumulation is planned with k >= {min_k} micro-batches per step "
                                       "(the baseline is the reference)")
    feasible = [row for row in rows if row["feasible"]]
    if not feasible:
        smallest = min((r for r in rows if r["peak_memory_bytes"] is not None),
                       key=lambda r: r["peak_memory_bytes"], default=None)
        fail("memory_budget_bytes", budget, "a budget some candidate fits; the smallest measured peak was "
             + ("none" if smallest is None else f"{smallest['peak_memory_bytes']} bytes ({smallest['candidate']})"))
    return feasible, base_fits


def _reject_slower(feasible: list[dict], base: dict, base_fits: bool, speed, min_k: int,
                   run_samples) -> tuple[list[str], bool]:
    """Marks infeasible what runs slower than the fp32 baseline: its whole speedup interval below 1
    (under load a point estimate below 1 is often noise; nothing is decided inside it). Returns
    notes, and whether k >= `min_k` forces a slower choice."""
    if not base_fits:
        return ["The budget rules out the fp32 baseline (peak "
                f"{base['peak_memory_bytes'] / 2**20:.1f} MiB): the plan may be slower than it."], False
    # slower: the whole speedup interval below 1 (a row timed in one window, without one: its point)
    slower = [row for row in feasible if row is not base
              and (speed(row, "speedup_ci_high") if row.get("speedup_ci_high") is not None else speed(row)) < 1.0]
    if len(slower) == len(feasible):  # only with adaptive accumulation (the baseline is feasible otherwise)
        fastest = max(feasible, key=speed)
        return [f"Every split with k >= {min_k} runs slower than the fp32 baseline: with adaptive accumulation the "
                f"plan runs at {speed(fastest):.2f}x its speed at best."], True
    for row in slower:
        row["feasible"] = False
        row["rejected_because"] = (f"slower than the fp32 baseline ({_below_one(row['speedup'])}, its 95 % interval "
                                   f"{speedup_interval(row)} below 1x)" if row.get("speedup_ci_high") is not None else
                                   f"slower than the fp32 baseline ({_below_one(row['speedup'])})")
        if row.get("speedup_over_run") is not None:
            row["rejected_because"] = (f"slower than the fp32 baseline over the run ({_below_one(row['speedup_over_run'])}: "
                                       f"{row['speedup']:.2f}x per step, but {compiling_words(row)}, "
                                       f"spread over {run_samples:,} samples)")
    return [], False


def _below_one(speedup: float) -> str:
    """A speedup below 1 in as many digits as show it below 1 (0.996 is not "1.00x")."""
    return f"{speedup:.2f}x" if round(speedup, 2) < 1.0 else f"{speedup:.3f}x" if round(speedup, 3) < 1.0 else f"{speedup:.4f}x"


def _eq3_costs(feasible: list[dict], base: dict, weights: tuple, speed) -> None:
    """Eq. 3's cost of each feasible row, with an interval from its speedup's 95 % interval; time
    enters as 1/speedup (paired with the baseline in the same windows), energy per sample."""
    with_energy = all(row["energy_j_per_sample"] is not None for row in feasible + [base])
    reference = {"time_to_target_s": 1.0, "peak_memory_bytes": base["peak_memory_bytes"],
                 "energy_j": base["energy_j_per_sample"] if with_energy else None}

    def eq3(row: dict, speedup: float) -> float:
        return cost(1.0 / speedup, row["peak_memory_bytes"], row["energy_j_per_sample"] if with_energy else None,
                    baseline=reference, weights=weights)["cost"]

    for row in feasible:
        row["cost"] = eq3(row, speed(row))
        ends = (speed(row, "speedup_ci_low"), speed(row, "speedup_ci_high"))
        if all(end is not None and end > 0 for end in ends):
            row["cost_ci_low"], row["cost_ci_high"] = sorted(eq3(row, end) for end in ends)


def cost_at(row: dict, speedup: float, base: dict, weights: tuple, run_samples, energy: bool) -> float:
    """`row`'s eq. 3 cost were its speedup over the fp32 baseline (`base`) `speedup` (its compiling
    spread over the run where `run_samples` is given); energy counted where `energy`."""
    reference = {"time_to_target_s": 1.0, "peak_memory_bytes": base["peak_memory_bytes"],
                 "energy_j": base["energy_j_per_sample"] if energy else None}
    speed = over_run(row, speedup, base.get("seconds_per_sample"), run_samples)
    return cost(1.0 / speed, row["peak_memory_bytes"], row["energy_j_per_sample"] if energy else None,
                baseline=reference, weights=weights)["cost"]


def _costs_against_yours(feasible: list[dict], yours: dict, base: dict, weights: tuple, run_samples,
                         with_energy: bool) -> None:
    """Each row's eq. 3 cost at the slow end of its speed paired with yours round by round
    (`vs_yours_ci_low`, set by the planner where the two were timed in the same rounds), yours'
    speed at its point: `cost_vs_yours_high`, what `wholly_below` compares with yours' cost."""
    for row in feasible:
        row["cost_vs_yours_high"] = None
        if row is yours or row.get("vs_yours_ci_low") is None or not yours.get("speedup"):
            continue
        row["cost_vs_yours_high"] = cost_at(row, yours["speedup"] * row["vs_yours_ci_low"], base, weights, run_samples,
                                            with_energy)


def _why_the_others_lost(feasible: list[dict], best: dict, yours: dict | None, tied: list[dict],
                         origin: dict, margin: float = 0.0) -> list[str]:
    """Each feasible row but the choice gets the reason it lost, true of its numbers (`origin`: the
    base the tie rule counts changes from); returns the note naming those within the choice's
    timing noise."""
    within_noise = []
    lowest = min(tied, key=lambda row: row["cost"])
    for row in feasible:
        if row is best:
            continue
        noisy = cost_intervals_overlap(row, best)
        if row is yours:
            row["rejected_because"] = (f"replaced: {best['candidate']}'s eq. 3 cost interval {_cost_interval(best)} lies "
                                       f"wholly below yours ({_cost_interval(row)})")
        elif any(row is other for other in tied):
            row["rejected_because"] = (f"tied with the choice (eq. 3 costs {costs_apart(row['cost'], best['cost'])}, "
                                       f"95 % intervals {_cost_interval(row)} vs {_cost_interval(best)}): the tie rule "
                                       f"({TIE_RULE}) chose {best['candidate']}, {_tie_reason(best, row, origin)}")
        elif row["cost"] >= best["cost"]:
            row["rejected_because"] = (f"{'higher' if row['cost'] > best['cost'] else 'the same'} eq. 3 cost "
                                       f"({costs_apart(row['cost'], best['cost'])})")
            if noisy:
                row["rejected_because"] += (f"; within the timing noise: 95 % intervals {_cost_interval(row)} vs "
                                            f"{_cost_interval(best)} overlap")
        elif best is yours and (noisy or not margin):
            row["rejected_because"] = (f"lower point cost than yours ({costs_apart(row['cost'], best['cost'])}) but "
                                       f"within its timing noise: intervals {_cost_interval(row)} vs {_cost_interval(best)} "
                                       "overlap; a tie keeps yours")
        elif best is yours:
            row["rejected_because"] = (f"lower point cost than yours ({costs_apart(row['cost'], best['cost'])}) but not "
                                       f"by more than {100 * margin:g} % beyond its timing noise (the same ratios move "
                                       "about that much between sittings of one kind of machine); a tie keeps yours")
        elif yours is not None and not wholly_below(row, yours, margin):
            row["rejected_because"] = (f"lower point cost than the choice ({costs_apart(row['cost'], best['cost'])}) "
                                       f"but its interval {_cost_interval(row)} is not wholly below yours "
                                       f"({_cost_interval(yours)}), as the choice's is: within your configuration's "
                                       "timing noise")
        else:  # the tie rule chose among the lowest-cost candidate's tie, which this row is not in
            row["rejected_because"] = (f"lower point cost than the choice ({costs_apart(row['cost'], best['cost'])}) "
                                       f"but not tied with the lowest-cost candidate, "
                                       f"{lowest['candidate']}, whose tie the rule ({TIE_RULE}) chose from")
        if noisy:
            within_noise.append(row["candidate"])
    if not within_noise:
        return []
    return ["Within the timing noise of the choice (eq. 3 cost intervals overlap): "
            f"{'; '.join(repr(name) for name in within_noise)}; a plan made again may choose one of them where its "
            "timing moves them into or out of the choice's tie."]
