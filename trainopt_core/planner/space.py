"""The search space of `plan()`: candidates (precision, split, checkpointing, speed options,
and the ZeRO stage on more than one process) and what each one changes in an `OptimizationConfig`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from ..checkpointing import resolve_segments
from ..config import OptimizationConfig
from .._errors import fail
from ..measure.manifest import cpu_computes_bf16_natively

# why try_compile defaults to off on a CPU (quick models, one process; interleaved windows)
COMPILE_ON_CPU = ("on 2-core CPUs compiling took 18-53 s from a cold cache (the quick GPT-2's step; the ResNet's "
                  "40-61 s), more than a quick run earns back: the compiled GPT-2 step ran 0.88-1.00x the eager one "
                  "on AMD AVX-512 machines, 1.06-1.11x at k=1 on an AVX2 one and 1.16-1.18x on an Intel AMX one, "
                  "where it pays back after about 2,500 sequences from a warm cache (the quick run trains on 1,600); "
                  "the ResNet's compiled bf16 step ran 1.5-1.7x its eager twin, paying back after 76,000-95,000 "
                  "samples from a cold cache (benchmarks/bench_compile.py)")


def native_reduced_precisions(device: torch.device) -> tuple[str, ...]:
    """The reduced precisions `device` computes natively: CUDA fp16 always, bf16 where the GPU
    supports it; a CPU bf16 where it has AVX-512 BF16 or AMX (else bf16 autocast is emulated and
    slow, and fp16 on a CPU is always slow)."""
    if device.type == "cuda":
        return ("bf16", "fp16") if torch.cuda.is_bf16_supported() else ("fp16",)
    if device.type == "cpu":
        return ("bf16",) if cpu_computes_bf16_natively() else ()
    return ()


@dataclass(frozen=True)
class Candidate:
    """One point of the search space; `config()` is the OptimizationConfig that runs it."""

    precision: str = "fp32"
    k: int = 1
    checkpointing: int | None = None
    checkpoint_policy: str = "full"
    optimizer_impl: str = "default"
    memory_format: str = "contiguous"
    compile: bool = False
    zero_stage: int = 0  # on more than one process: 0 DDP, 1-2 DeepSpeed ZeRO

    @property
    def name(self) -> str:
        parts = [self.precision, f"k={self.k}"]
        if self.checkpointing is not None:
            parts.append(f"checkpointing {self.checkpointing} segments" + (
                f" {self.checkpoint_policy}" if self.checkpoint_policy != "full" else ""))
        if self.optimizer_impl != "default":
            parts.append(f"{self.optimizer_impl} optimizer")
        if self.memory_format != "contiguous":
            parts.append(self.memory_format)
        if self.compile:
            parts.append("compiled")
        if self.zero_stage:
            parts.append(f"ZeRO-{self.zero_stage}")
        return ", ".join(parts)

    def replace(self, **changes) -> "Candidate":
        return dataclasses.replace(self, **changes)

    def config(self) -> OptimizationConfig:
        return OptimizationConfig(name="auto", **dataclasses.asdict(self))


def precision_splits(batch_size: int, device: torch.device, ks: Sequence[int] | None, min_k: int = 1) -> list[Candidate]:
    precisions = ("fp32",) + native_reduced_precisions(device)
    splits = ks if ks is not None else [k for k in (1, 2, 4, 8) if batch_size % k == 0 and k >= min_k]
    for k in splits:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or batch_size % k:
            fail("ks", tuple(splits), f"integers >= 1 dividing the batch size {batch_size}")
    if not any(k >= min_k for k in splits):
        fail("ks", tuple(splits), f"at least one k >= {min_k} (adaptive accumulation needs >= 2 micro-batches "
             f"per step on one process), dividing the batch size {batch_size}")
    candidates = [Candidate(p, k) for p in precisions for k in splits]
    if Candidate() not in candidates:
        candidates.insert(0, Candidate())  # the baseline is always measured
    return sorted(candidates, key=lambda c: c != Candidate())


def checkpointed_twins(twin: Candidate, num_blocks: int) -> list[Candidate]:
    """`twin` with ⌈√L⌉ segments, with every block its own segment, and every block selective."""
    sqrt = resolve_segments(num_blocks, "sqrt")
    options = [(sqrt, "full")] + ([(num_blocks, "full")] if num_blocks != sqrt else []) + [(num_blocks, "selective")]
    return [twin.replace(checkpointing=segments, checkpoint_policy=policy) for segments, policy in options]


def zero_twins(twin: Candidate) -> list[Candidate]:
    """`twin` with its optimizer state partitioned over the processes (ZeRO-1), and its
    gradients too (ZeRO-2)."""
    return [twin.replace(zero_stage=stage) for stage in (1, 2)]


def speed_option_changes(best: Candidate, model: torch.nn.Module, optimizer_factory, device: torch.device,
                         try_compile: bool) -> list[dict]:
    """The speed options to try on `best`: the optimizer's fused kernels (foreach where it has
    none), channels-last for a model with convolutions, torch.compile where `try_compile` (the
    last two not at a ZeRO stage)."""
    options = []
    probe = optimizer_factory([torch.nn.Parameter(torch.zeros(1, device=device))])
    # the fused kernel where the optimizer has one for this device, else foreach (fused does the
    # same update in fewer passes, so trying both would spend planning time on the slower)
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    fused = "fused" in probe.defaults and device.type in _get_fused_kernels_supported_devices()
    impl = "fused" if fused else "foreach" if "foreach" in probe.defaults else None
    if impl and best.optimizer_impl == "default":
        options.append({"optimizer_impl": impl})
    # not under DeepSpeed (ZeRO): its parameter broadcast views each weight as bytes, which a
    # channels-last weight refuses, and its engine is not compiled here
    if best.memory_format == "contiguous" and any(p.dim() == 4 for p in model.parameters()) and not best.zero_stage:
        options.append({"memory_format": "channels_last"})
    if try_compile and not best.compile and not best.zero_stage:
        options.append({"compile": True})
    return options


def changes_between(base: Candidate, other: Candidate) -> dict:
    return {key: value for key, value in dataclasses.asdict(other).items() if getattr(base, key) != value}


def candidate_of(row: dict) -> Candidate:
    """The candidate of a plan's row (a row stored before a field existed has its default)."""
    return Candidate(**{f.name: row.get(f.name, f.default) for f in dataclasses.fields(Candidate)})
