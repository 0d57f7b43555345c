"""The search space of `plan()`: candidates (precision, split, checkpointing, speed options,
and the ZeRO stage on more than one process) and what each one changes in an `OptimizationConfig`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from ..checkpointing import resolve_segments
from ..config import OptimizationConfig, expandable_segments_supported, tf32_supported
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
    compile_mode: str = "default"  # "reduce-overhead": compiled into CUDA graphs
    tf32: bool = False  # fp32 matmuls and convolutions on TF32 tensor cores
    sdpa_backend: str = "auto"  # the kernel of torch's scaled_dot_product_attention
    compile_scope: str = "model"  # "blocks": each repeated block compiled on its own (regional)

    @property
    def name(self) -> str:
        parts = [self.precision + (" TF32" if self.tf32 else ""), f"k={self.k}"]
        if self.checkpointing is not None:
            parts.append(f"checkpointing {self.checkpointing} segments" + (
                f" {self.checkpoint_policy}" if self.checkpoint_policy != "full" else ""))
        if self.optimizer_impl != "default":
            parts.append(f"{self.optimizer_impl} optimizer")
        if self.memory_format != "contiguous":
            parts.append(self.memory_format)
        if self.sdpa_backend != "auto":
            parts.append(f"{self.sdpa_backend} attention")
        if self.compile:
            how = [what for what, on in (("blocks", self.compile_scope == "blocks"),
                                         ("CUDA graphs", self.compile_mode == "reduce-overhead")) if on]
            parts.append("compiled" + (f" ({', '.join(how)})" if how else ""))
        if self.zero_stage:
            parts.append(f"ZeRO-{self.zero_stage}")
        return ", ".join(parts)

    def replace(self, **changes) -> "Candidate":
        return dataclasses.replace(self, **changes)

    def config(self) -> OptimizationConfig:
        return OptimizationConfig(name="auto", **dataclasses.asdict(self))


def splits(batch_size: int, ks: Sequence[int] | None, min_k: int = 1) -> list[int]:
    """The micro-batch splits to try: `ks`, or the powers of two up to 8 that divide the batch
    (at least `min_k`), fewest first."""
    chosen = list(ks) if ks is not None else [k for k in (1, 2, 4, 8) if batch_size % k == 0 and k >= min_k]
    for k in chosen:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or batch_size % k:
            fail("ks", tuple(chosen), f"integers >= 1 dividing the batch size {batch_size}")
    if not any(k >= min_k for k in chosen):
        fail("ks", tuple(chosen), f"at least one k >= {min_k} (adaptive accumulation needs >= 2 micro-batches "
             f"per step on one process), dividing the batch size {batch_size}")
    return chosen


def precisions(device: torch.device) -> list[tuple[str, bool]]:
    """(precision, tf32) pairs stage 1 tries on `device`: fp32, fp32 with TF32 where the GPU has
    TF32 tensor cores, and the reduced precisions it computes natively."""
    return ([("fp32", False)] + ([("fp32", True)] if tf32_supported(device) else [])
            + [(p, False) for p in native_reduced_precisions(device)])


def precision_splits(batch_size: int, device: torch.device, ks: Sequence[int] | None, min_k: int = 1) -> list[Candidate]:
    candidates = [Candidate(p, k, tf32=tf32) for p, tf32 in precisions(device) for k in splits(batch_size, ks, min_k)]
    if Candidate() not in candidates:
        candidates.insert(0, Candidate())  # the baseline is always measured
    return sorted(candidates, key=lambda c: c != Candidate())


def fewest_splits_that_fit(first: list[Candidate], ladder: Sequence[int], measure, does_not_fit) -> list[Candidate]:
    """Stage 1 on a GPU, where a step's time follows its kernel launches more than its samples:
    `first` (every precision at the fewest micro-batches, `ladder[0]`) measured, then each
    precision whose split does not fit (`does_not_fit`: over the budget or out of memory) split
    once more along `ladder`, until every precision has a split that fits or the ladder ends.
    `measure(candidates)` measures new candidates. Returns every candidate measured."""
    measure(first)
    stage1 = list(first)
    for fewer, more in zip(ladder, ladder[1:]):
        further = [c.replace(k=more) for c in stage1 if c.k == fewer and does_not_fit(c)]
        if not further:
            break
        measure(further)
        stage1 += further
    return stage1


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
                         try_compile: bool, optimizer_takes_model: bool = False,
                         uses_sdpa: bool = False) -> list[dict]:
    """The speed options to try on `best`: the optimizer's fused kernels (foreach where it has
    none), channels-last for a model with convolutions, torch.compile where `try_compile` -- on
    CUDA into CUDA graphs (mode "reduce-overhead") -- (the last two not at a ZeRO stage), and on
    CUDA, for a model that calls torch's scaled_dot_product_attention (`uses_sdpa`), its attention
    kernels forced (`attention_kernels`)."""
    options = []
    # built, never stepped: only its options are read
    probe = optimizer_factory(model if optimizer_takes_model else [torch.nn.Parameter(torch.zeros(1, device=device))])
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
        # one compiled mode per device. CUDA: CUDA graphs (inductor's code, replayed as graphs: a
        # launch-bound step stops paying for its launches; a graph inductor cannot capture runs
        # its compiled code as mode "default" would). Not beside a default-mode copy: two modes'
        # copies of one model in one process share dynamo's cache, and on an H200 (torch 2.11)
        # either ran the other's code -- the CUDA-graphs copy at 1.00x [0.92, 1.08] eager fp16 in
        # a plan with a default-mode copy, 2x timed apart.
        option = {"compile": True, "compile_mode": "reduce-overhead"} if device.type == "cuda" else {"compile": True}
        if repeats_one_block(model):
            # one block repeated (a transformer's): compiled once for all, about half the whole
            # model's compiling at the same step (benchmarks/bench_compile_scope.py). Blocks of
            # several shapes (a ResNet's stages) compile the whole: each shape would compile apart,
            # and the blocks' seams cost the ResNet's step 0.58x against 1.44x compiled whole.
            option["compile_scope"] = "blocks"
        options.append(option)
    if uses_sdpa and best.sdpa_backend == "auto":
        options += [{"sdpa_backend": kernel} for kernel in attention_kernels(best, device)]
    return options


def repeats_one_block(model: torch.nn.Module) -> bool:
    """Whether the model's repeated blocks (`checkpointing.block_sequence`) are one block repeated:
    the same class with parameters of the same names and shapes, so one compiled code serves them all."""
    from ..checkpointing import block_sequence, has_block_sequence

    if not has_block_sequence(model):
        return False
    blocks = block_sequence(model)
    signatures = {(type(block), tuple((name, tuple(p.shape)) for name, p in block.named_parameters())) for block in blocks}
    return len(blocks) > 1 and len(signatures) == 1


def attention_kernels(best: Candidate, device: torch.device) -> tuple[str, ...]:
    """The attention kernels to force on `best` on `device`: on a CUDA GPU, flash and cuDNN
    attention for fp16/bf16 (PyTorch's own order takes flash where it can and tries cuDNN's last;
    forcing flash shows whether the model's call could take it, e.g. not with an explicit mask),
    memory-efficient attention for fp32 (flash and cuDNN run fp16/bf16 only). None elsewhere."""
    if device.type != "cuda":
        return ()
    return ("flash", "cudnn") if best.precision in ("fp16", "bf16") else ("efficient",)


def calls_sdpa(forward) -> bool:
    """Whether running `forward()` calls torch.nn.functional.scaled_dot_product_attention (as
    transformers' "sdpa" attention does)."""
    from torch.overrides import TorchFunctionMode

    class _Seen(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = False

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen = self.seen or func is torch.nn.functional.scaled_dot_product_attention
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Seen() as mode:
        forward()
    return mode.seen


def base_candidate(base: OptimizationConfig, batch_size: int, num_blocks: int, world_size: int,
                   device: torch.device) -> Candidate:
    """The caller's own configuration (`plan(base=...)`) as a candidate: its precision ("auto"
    resolved for `device`), its split of the batch, checkpointing (⌈√L⌉ resolved on the model's
    `num_blocks`; none without known blocks), speed options and, on more than one process, ZeRO stage."""
    from ..precision import choose_precision

    precision = choose_precision(device)[0] if base.precision == "auto" else base.precision
    k = base.batch_splits
    if batch_size % k:
        fail("base", f"an OptimizationConfig splitting the batch into k={k}",
             f"a k that divides the batch of {batch_size} samples plan() was given (the effective batch)")
    segments = None
    if base.checkpointing is not None and num_blocks:
        segments = resolve_segments(num_blocks, base.checkpointing if base.checkpointing == "sqrt"
                                    else min(base.checkpointing, num_blocks))
    return Candidate(precision=precision, k=k, checkpointing=segments,
                     checkpoint_policy=base.checkpoint_policy if segments else "full",
                     optimizer_impl=base.optimizer_impl, memory_format=base.memory_format, compile=base.compile,
                     zero_stage=base.zero_stage if world_size > 1 else 0, compile_mode=base.compile_mode, tf32=base.tf32,
                     sdpa_backend=base.sdpa_backend, compile_scope=base.compile_scope)


def configured(candidate: Candidate, base: OptimizationConfig | None, world_size: int = 1) -> OptimizationConfig:
    """The configuration that runs `candidate`: with a `base` (the caller's), the base with what
    the plan chooses replaced and everything else kept -- LR schedule, warmup, clipping, loss
    scaling, adaptive k's rule, and on one process its ZeRO stage, which only more processes try."""
    if base is None:
        return candidate.config()
    chosen = dataclasses.asdict(candidate)
    if world_size == 1:
        del chosen["zero_stage"]
    # an adaptive base's k, k_min and k_max are set after, by goodput (adaptive.adaptive_config)
    unadapted = dict(adaptive=False, k_min=1, k_max=1) if base.adaptive else {}
    return base.replace(**unadapted, **chosen)


def changes_between(base: Candidate, other: Candidate) -> dict:
    return {key: value for key, value in dataclasses.asdict(other).items() if getattr(base, key) != value}


def candidate_of(row: dict) -> Candidate:
    """The candidate of a plan's row (a row stored before a field existed has its default)."""
    return Candidate(**{f.name: row.get(f.name, f.default) for f in dataclasses.fields(Candidate)})


# what the allocator's expandable segments did on a GPU (benchmarks/probes/expandable_segments/)
EXPANDABLE_MEASURED = ("on an H200 the process reserved up to 61 % more than its tensors' peak with the default "
                       "allocator, 3-8 % more with expandable segments (reports/gpu/nvidia-h200/)")


def with_expandable_segments(config: OptimizationConfig, device: torch.device, memory_budget_bytes: float | None,
                             notes: list[str]) -> OptimizationConfig:
    """The plan's configuration with CUDA's expandable segments on where a memory budget is given
    and the device supports them (`expandable_segments_supported`), and a note saying why: the
    budget is checked against the step's allocated peak, and with expandable segments the memory
    the process reserves stays near it. Not a timed candidate: the allocator's setting is
    process-wide, so it would hold for every candidate timed after it. Without a budget, on CUDA,
    a note says it was left off; elsewhere it is not offered."""
    if not expandable_segments_supported(device) or config.expandable_segments:
        return config
    if memory_budget_bytes is None:
        notes.append("Expandable segments left off (no memory budget): " + EXPANDABLE_MEASURED + "; with a budget, "
                     "plan() turns them on.")
        return config
    notes.append("Expandable segments on (OptimizationConfig.expandable_segments; prepare() sets them for the "
                 "process): the budget is checked against the step's allocated peak, and " + EXPANDABLE_MEASURED + ".")
    return config.replace(expandable_segments=True)
