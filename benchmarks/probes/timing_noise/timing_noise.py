"""How many timing windows this machine needs for throughput ratios that agree between reruns.

Builds `--instances` independent copies (model, optimizer, engine, batches) of each of two
configurations in one process and times them all interleaved, as the reproduction does. It
prints each copy's median rate (copies of one configuration differing would mean a per-instance
effect that one copy per configuration cannot sample), the spread of the per-window log ratio
between the configurations, and -- assuming windows independent with that spread -- how many
windows per configuration two reproductions need so that all `--ratios` ratios agree within
±`--tolerance` with probability `--probability`.

    python benchmarks/probes/timing_noise/timing_noise.py --task wikitext2 [--configs baseline,+mixed_precision]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings

import torch

from trainopt_core.measure.timing import interleaved_windows
from trainopt_core.reproduction.profiles import get_profile
from trainopt_core.reproduction.throughput import _Workload


def windows_needed(log_ratio_sd: float, *, tolerance: float, ratios: int, probability: float) -> int:
    """Fewest windows n with P(every one of `ratios` ratio differences within ±tolerance) >=
    `probability`, each difference normal with sd √2·log_ratio_sd/√n (mean of n log ratios)."""
    if log_ratio_sd == 0:
        return 2  # no noise: the fewest windows that have a spread at all
    for n in range(2, 100_000):
        sd = math.sqrt(2) * log_ratio_sd / math.sqrt(n)
        within = math.erf(math.log(1 + tolerance) / (sd * math.sqrt(2)))
        if within ** ratios >= probability:
            return n
    return math.inf


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="wikitext2", choices=("cifar10", "wikitext2"))
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--configs", default="baseline,+mixed_precision")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--ratios", type=int, default=24)
    parser.add_argument("--probability", type=float, default=0.95)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    prof = get_profile(args.task, args.profile)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    first, second = args.configs.split(",")
    loads = {f"{config}#{i}": _Workload(args.task, prof, config, device=device, backend="torch", data_policy="auto",
                                        data_dir=None, seed=0)
             for config in (first, second) for i in range(args.instances)}
    rates = interleaved_windows({name: load.step for name, load in loads.items()}, windows=args.windows,
                                steps_per_window=prof.timing_steps_per_window,
                                warmup_steps=prof.throughput_warmup_steps, device=device)
    print(f"{args.task} ({args.profile}), {args.windows} windows x {prof.timing_steps_per_window} steps, {device}")
    for name, values in rates.items():
        print(f"  {name:24s} median {statistics.median(values):9.1f} {prof.item_unit}")
    sds = []
    for i in range(args.instances):
        for j in range(args.instances):
            logs = [math.log(a / b) for a, b in zip(rates[f"{second}#{i}"], rates[f"{first}#{j}"])]
            sds.append(statistics.stdev(logs))
            print(f"  {second}#{i} / {first}#{j}: median ratio {math.exp(statistics.median(logs)):.3f}, "
                  f"per-window log-ratio sd {sds[-1]:.3f}")
    sd = statistics.median(sds)
    needed = windows_needed(sd, tolerance=args.tolerance, ratios=args.ratios, probability=args.probability)
    print(f"median per-window log-ratio sd {sd:.3f}: two reproductions need >= {needed} windows per configuration "
          f"for all {args.ratios} ratios within ±{100 * args.tolerance:.0f} % with probability {args.probability}")
    for load in loads.values():
        load.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
