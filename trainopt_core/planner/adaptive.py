"""With adaptive accumulation, the starting k by goodput: samples/s × statistical efficiency,
the efficiency from the gradient noise scale B_simple of the probe batch at the initial
weights, the samples/s from the chosen candidate's micro-batch and optimizer-step seconds."""
from __future__ import annotations

import copy
import math
import statistics

from ..noise_scale import goodput, probe_noise_scale
from ..config import OptimizationConfig
from .search import Search
from .space import Candidate


def smallest_k(adaptive_accumulation: bool, world_size: int) -> int:
    """The fewest micro-batches per step a plan may choose: eq. 7 needs two micro-batch gradients
    per step under adaptive accumulation -- on one process two micro-batches, on more the
    replicas' (one each)."""
    return 2 if adaptive_accumulation and world_size == 1 else 1


def measure_goodput(search: Search, chosen: Candidate, *, k_max: int) -> dict:
    """The noise scale of the probe batch at the initial weights and the chosen candidate's
    micro-batch and optimizer-step seconds (medians over windows × steps_per_window steps), then
    k by goodput (`goodput_choice`).

    On W > 1 processes the noise scale pools every process's share of the batch, and the times
    are the slowest process's. A micro-batch's seconds are then those of the first k - 1 (no
    gradient exchange under DDP), and the step's fixed part -- paid once per optimizer step,
    whatever k -- is the boundary plus what the last micro-batch took beyond them: the
    all-reduce. A chosen k = 1 has no first micro-batches, so it is timed in steps of two
    micro-batches of its size (`Search.twin_trial`). Under ZeRO-2, which reduces every
    micro-batch's gradients, the exchange is in every micro-batch's time and accumulation
    cannot spread it."""
    search._say("adaptive accumulation: the gradient noise scale, then micro-batch and optimizer-step time")
    world = search.ranks.world_size
    probe = probe_noise_scale(copy.deepcopy(search.model), search.batch, search.loss_fn,
                              loss_takes_model=search.loss_takes_model, across_processes=world > 1)
    trial = search.twin_trial(chosen) if world > 1 and chosen.k == 1 else search.trial(chosen)
    windows, steps_per_window = search.timing()
    count = search.steps_that_fit(chosen, windows * steps_per_window, least=3)  # within the time budget
    parts = [trial.split_step(search.device) for _ in range(count)]
    if world > 1:
        micro_s = statistics.median(first for first, _, _ in parts) / (trial.candidate.k - 1)
        optimizer_s = statistics.median(boundary + last - micro_s for _, last, boundary in parts)
        micro_s, optimizer_s = search.ranks.max([micro_s, max(optimizer_s, 0.0)])
    else:
        micro_s = statistics.median(first + last for first, last, _ in parts) / chosen.k
        optimizer_s = statistics.median(boundary for _, _, boundary in parts)
    good = goodput_choice(search.rows[chosen], probe.to_dict(), optimizer_s=optimizer_s, micro_s=micro_s,
                          batch_size=search.size, k_max=k_max, world_size=world)
    good["timed_with_k"] = trial.candidate.k
    return good


def goodput_choice(chosen: dict, noise_scale: dict, *, optimizer_s: float, micro_s: float | None,
                   batch_size: int, k_max: int, world_size: int = 1) -> dict:
    """Goodput (`noise_scale.goodput`) of k = k_min..k_max micro-batches of the chosen split's
    b = batch_size / k_min, relative to k_min's; the best k, and the best at either end of the
    noise scale's interval. Without a measured `micro_s` it comes from the chosen row's timed
    seconds per sample (a step of k_min micro-batches minus the optimizer's part).
    `batch_size` is one process's; on `world_size` processes a step takes world_size · k · b
    samples, which is the batch the statistical efficiency weighs against B_simple."""
    k_min = chosen["k"]
    b = batch_size / k_min
    if micro_s is None:
        micro_s = max(chosen["seconds_per_sample"] * batch_size - optimizer_s, 0.0) / k_min
    ks = range(k_min, max(k_max, k_min) + 1)

    def table(b_simple: float) -> list[dict]:
        rows = [goodput(k, micro_batch_size=world_size * b, micro_s=micro_s, optimizer_s=optimizer_s,
                        b_simple=b_simple, reference_batch=world_size * batch_size) for k in ks]
        for row in rows:
            row["relative_goodput"] = row["goodput"] / rows[0]["goodput"]
        return rows

    def best(rows: list[dict]) -> int:
        return max(rows, key=lambda row: row["goodput"])["k"]

    rows = table(noise_scale["b_simple"])
    phi = noise_scale["b_simple"]
    closed_form = (math.inf if math.isinf(phi) or not micro_s > 0
                   else math.sqrt(phi * optimizer_s / (world_size * b * micro_s)))
    return {"noise_scale": noise_scale, "micro_batch_size": b, "batch_size": batch_size, "world_size": world_size,
            "micro_s": micro_s, "optimizer_s": optimizer_s, "k_min": k_min, "k_max": max(k_max, k_min), "k": best(rows),
            "k_at_interval": [best(table(noise_scale["ci_low"])), best(table(noise_scale["ci_high"]))],
            "closed_form_k": closed_form, "rows": rows, "measured_on": chosen["candidate"]}


def adaptive_config(config: OptimizationConfig, good: dict) -> OptimizationConfig:
    return config.replace(adaptive=True, k=good["k"], k_min=good["k_min"], k_max=good["k_max"])


def size_text(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:.3g}"


def explain_goodput(good: dict) -> list[str]:
    noise = good["noise_scale"]
    rows = {row["k"]: row for row in good["rows"]}
    chosen = rows[good["k"]]
    world = good.get("world_size", 1)
    processes, width = ("", "") if world == 1 else (
        f", on each of {world} processes, the gradient all-reduce counted in the optimizer step", f"{world}·")
    if good.get("timed_with_k", good["k_min"]) != good["k_min"]:
        processes += f"; timed in steps of {good['timed_with_k']} micro-batches to tell the all-reduce apart"
    lines = [f"Adaptive accumulation: gradient noise scale B_simple {size_text(noise['b_simple'])} samples "
             f"(95 % interval {size_text(noise['ci_low'])}-{size_text(noise['ci_high'])}) at the initial weights, from "
             f"{noise['micro_batches']} micro-batches of {noise['micro_batch_size']:.3g};",
             f"  a micro-batch of {good['micro_batch_size']:.3g} takes {good['micro_s'] * 1e3:.3g} ms and the "
             f"optimizer step {good['optimizer_s'] * 1e3:.3g} ms (on {good['measured_on']}{processes}), so goodput "
             f"(samples/s × statistical efficiency) peaks at k* = sqrt(B_simple·t_opt/({width}b·t_micro)) = "
             f"{size_text(good['closed_form_k'])};",
             f"  starting k = {good['k']} in [{good['k_min']}, {good['k_max']}] (effective batch "
             f"{chosen['effective_batch']:.3g}; {good['k_at_interval'][0]} to {good['k_at_interval'][1]} across the "
             "interval); eq. 6 moves k as the noise scale changes in training."]
    if len(rows) > 1:
        last = rows[good["k_max"]]
        lines.append(f"  k = {good['k_max']} would give {last['relative_goodput']:.2f}x k = {good['k_min']}'s goodput "
                     f"({last['samples_per_s'] / rows[good['k_min']]['samples_per_s']:.2f}x its samples/s, "
                     f"{last['statistical_efficiency']:.2f} of its statistical efficiency).")
    return lines
