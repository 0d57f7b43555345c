"""The GPU campaign: everything a GPU session measures, in one resumable command of about 9 minutes.

Stages, in order (each written to `--out` as soon as it finishes, so a second call with
`--resume` goes on where the first stopped; a stage that would not fit in what is left of
`--budget-s` is left for that call):

1. `tests`: the GPU tests (`pytest -m gpu tests/test_gpu.py`).
2. `runs:<task>`: the `gpu` profile (the paper's models and batches on the labeled stand-ins, in
   short runs) -- baseline, optimized and `auto` (planned here, by `plan()`) trained, then timed
   side by side in interleaved windows: throughput with its 95 % CI and the paired ratio to the
   baseline, training-step and evaluation peak memory, NVML energy, model FLOPs utilization
   against the datasheet peak of the precision each ran in, planning seconds by stage and what
   the plan chose; and √L checkpointing's recompute overhead.
3. `plan:<task>`: `plan()` at the paper's sizes over the paper profile's run length, where the
   GPU levers (TF32, CUDA graphs, compile, the fewest micro-batches that fit) are candidates.
4. `loops`: the same GPT-2 training step (bf16 autocast, clipping, warmup + cosine LR, AdamW)
   timed interleaved under a hand-written loop, trainopt's engine, HF Accelerate and Lightning
   Fabric (those two where installed).
5. `profile:<task>`: where the `auto` step's time goes (torch.profiler, self time per op).

`--out` receives at most 8 files: summary.json (one entry per task x configuration, the loops,
the plans, the goals), summary.md (the same as tables, the goals first), environment.json (the
hardware manifest), gpu_tests.txt, profiles.txt, and records.tar.gz (every run, timing and plan
record). `--device cpu --profile smoke` rehearses the plumbing at smoke sizes (the tests' own run).

    python scripts/gpu_campaign.py --out DIR [--resume DIR] [--budget-s 540]
    python scripts/gpu_campaign.py --rerender DIR   # a finished campaign's summary again, from its records
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

print("[campaign] importing torch and trainopt_core (seconds; longer on a first run) ...", file=sys.stderr,
      flush=True)  # a sign of life before the imports

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainopt_core import OptimizationConfig, measure, prepare  # noqa: E402
from trainopt_core import precision as mp  # noqa: E402
from trainopt_core.planner.space import candidate_of  # noqa: E402
from trainopt_core.reproduction import autoplan, runner  # noqa: E402
from trainopt_core.reproduction.profiles import get_profile  # noqa: E402
from trainopt_core.reproduction.tasks import build_task  # noqa: E402
from trainopt_core.reproduction.throughput import measure_throughput  # noqa: E402
from trainopt_core.reporting.gpu_campaign import (chosen_row, compile_break_even, goals,  # noqa: E402,F401
                                                   plan_candidates, summary_markdown)

CONFIGS = ("baseline", "optimized", "auto")
# what a stage costs on one H100 at the gpu profile's sizes, in seconds: the longest each took in
# two campaigns on an H100 80GB on 2026-11-27 (reports/gpu/nvidia-h100/), plus about a fifth; the
# budget check uses them to leave a stage for the resuming call
STAGE_COST_S = {"tests": 25, "runs:cifar10": 100, "runs:wikitext2": 125, "reference": 130, "plan:cifar10": 80,
                "loops": 25, "plan:wikitext2": 100, "profile:cifar10": 10, "profile:wikitext2": 15}
STAGES = ("tests", "runs:cifar10", "runs:wikitext2", "reference", "plan:cifar10", "loops", "plan:wikitext2",
          "profile:cifar10", "profile:wikitext2")
REFERENCE = "benchmarks/gpt2_reference.py"  # the minimal plain-PyTorch GPT-2 the task is measured against
LOOP_NAMES = ("hand loop", "hand loop + skip check", "trainopt engine", "accelerate", "fabric")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the results (created)")
    parser.add_argument("--rerender", help="a finished campaign's folder: rewrite its summary from its records, "
                        "nothing measured")
    parser.add_argument("--resume", help="the --out folder of an earlier call: its finished stages are kept")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu with --profile smoke (a rehearsal)")
    parser.add_argument("--profile", default="gpu", help="gpu (default), or smoke with --device cpu")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated, from " + ",".join(STAGES))
    parser.add_argument("--plan-timing", default=None, help="WINDOWS,STEPS: plan()'s timing windows and steps per "
                        "window at the paper's sizes (default: plan()'s own, sized to the baseline's step on CUDA)")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="seconds this call may take; a stage that would not fit is left for --resume")
    args = parser.parse_args(argv)
    if args.rerender:
        if not (Path(args.rerender) / "records.tar.gz").is_file():
            parser.error(f"--rerender {args.rerender}: no records.tar.gz there (allowed: a campaign's --out folder)")
        return args
    if not args.out:
        parser.error("--out is required (the folder for the results)")
    args.stages = [s for s in args.stages.split(",") if s]
    for stage in args.stages:
        if stage not in STAGES:
            parser.error(f"--stages: {stage!r} is invalid; allowed {', '.join(STAGES)}")
    if not args.budget_s > 0:
        parser.error(f"--budget-s={args.budget_s} is invalid: allowed a number of seconds > 0")
    if args.profile not in ("gpu", "smoke"):
        parser.error(f"--profile {args.profile!r} is invalid: allowed gpu or smoke")
    if args.resume and not (Path(args.resume) / "summary.json").is_file():
        parser.error(f"--resume {args.resume}: no summary.json there (allowed: the --out folder of an earlier call)")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False); "
                     "a rehearsal of the plumbing is --device cpu --profile smoke")
    if device.type != "cuda" and args.profile != "smoke":
        parser.error(f"--device {args.device} is allowed with --profile smoke only (the GPU sizes take hours on a CPU)")
    args.paper_profile = "paper" if args.profile == "gpu" else "smoke"
    return args


# ----------------------------------------------------------------------------- state
class Campaign:
    """The summary so far, the records' folder, and writing both to `out` after every stage."""

    def __init__(self, out: Path, work: Path, resume: Path | None, budget_s: float):
        self.out, self.work, self.budget_s = out, work, budget_s
        self.started = time.perf_counter()
        self.summary = {"stages_done": [], "stages_left": [], "stage_s": {}, "tasks": {}, "plans": {},
                        "loops": None, "reference": None, "tests": None, "profiles": {}}
        if resume is not None:
            self.summary = json.loads((resume / "summary.json").read_text())
            archive = resume / "records.tar.gz"
            if archive.is_file():
                with tarfile.open(archive) as tar:
                    tar.extractall(work, filter="data")
            for name in ("gpu_tests.txt", "profiles.txt"):
                if (resume / name).is_file() and resume.resolve() != out.resolve():
                    shutil.copy(resume / name, out / name)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def fits(self, stage: str, device: torch.device) -> bool:
        cost = STAGE_COST_S[stage] if device.type == "cuda" else 0.0
        return self.elapsed() + cost <= self.budget_s

    def finish(self, stage: str, seconds: float) -> None:
        if stage not in self.summary["stages_done"]:
            self.summary["stages_done"].append(stage)
        self.summary["stage_s"][stage] = round(seconds, 1)
        self.save()

    def save(self) -> None:
        self.summary["goals"] = goals(self.summary)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))
        (self.out / "summary.md").write_text(summary_markdown(self.summary))
        with tarfile.open(self.out / "records.tar.gz", "w:gz") as tar:
            for path in sorted(self.work.rglob("*.json")):
                tar.add(path, arcname=str(path.relative_to(self.work)))


# ----------------------------------------------------------------------------- stages
def run_tests(out: Path) -> dict:
    """The GPU tests; their output in gpu_tests.txt."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-rA", "-q",
                             "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    (out / "gpu_tests.txt").write_text(result.stdout + result.stderr)
    lines = result.stdout.strip().splitlines()
    return {"exit_code": result.returncode, "result": lines[-1] if lines else result.stderr[-500:]}


def _mfu(flops_per_item: float, items_per_s: float | None, cfg: OptimizationConfig, device, workload: str):
    """(utilization, peak, source) of a rate against the peak of the precision `cfg` ran in."""
    peak, source = runner.config_peak_flops(cfg, device, workload)
    return measure.model_flops_utilization(flops_per_item, items_per_s, peak), peak, source


def run_task(task: str, profile: str, work: Path, device: torch.device) -> dict:
    """The profile's three configurations of `task`: trained, timed interleaved, overhead measured."""
    from trainopt_core.reporting.analysis.profiling import measure_recompute_overhead

    runs_dir, timing_dir = work / profile / "runs", work / profile / "timing"
    prof = get_profile(task, profile)
    records = {}
    for name in CONFIGS:
        started = time.perf_counter()
        records[name] = runner.run(task, name, profile=profile, out_dir=runs_dir, device=str(device), progress=False)
        print(f"[campaign] {task} {name}: trained in {time.perf_counter() - started:.0f} s", flush=True)
    timing = measure_throughput(task, list(CONFIGS), profile=profile, seeds=1, out_dir=timing_dir, device=str(device),
                                progress=False)
    try:
        overhead = measure_recompute_overhead(task, profile=profile, device=device, out_dir=work / profile / "analysis")
    except Exception as error:  # reported, the rest goes on
        overhead = {"error": f"{type(error).__name__}: {error}"}
    base_rates = timing["results"]["baseline"]["items_per_s"]
    entries = {}
    for name, record in records.items():
        metrics, timed = record["metrics"], timing["results"][name]
        cfg = OptimizationConfig.from_dict(record["config"])
        summary = timed["summary"]
        ratio = measure.paired_ratio(timed["items_per_s"], base_rates) if name != "baseline" else None
        mfu, peak, source = _mfu(metrics["flops_per_item"], summary["mean"], cfg, device,
                                 "convolution" if task == "cifar10" else "matmul")
        samples = record["history"][-1]["samples"]
        entry = dict(
            config=_config_name(cfg), precision=cfg.precision, tf32=cfg.tf32,
            throughput=summary["mean"], throughput_ci=[summary["ci_low"], summary["ci_high"]],
            throughput_windows=summary["n"], window_rates=list(timed["items_per_s"]), unit=prof.item_unit,
            speedup=None if ratio is None else ratio["mean"],
            speedup_ci=None if ratio is None else [ratio["ci_low"], ratio["ci_high"]],
            mfu=mfu, peak_flops_per_s=peak, peak_flops_source=source,
            training_step_peak_bytes=metrics["peak_memory_bytes"],
            evaluation_peak_bytes=metrics["evaluation_peak_memory_bytes"],
            energy_j=metrics["energy_j"], energy_source=metrics["energy_source"],
            energy_j_per_sample=None if metrics["energy_j"] is None else metrics["energy_j"] / samples,
            run_samples=samples, run_wall_s=metrics["wall_s"], skipped_steps=metrics["skipped_steps"],
            micro_batch_size=record["micro_batch_size"], final_quality=metrics["final_quality"],
            quality_name=metrics["quality_name"], data_source=record["data_source"],
        )
        if name == "auto":
            planned = record["plan"]
            chosen = chosen_row(planned)
            entry.update(planning_s=planned["planning_s"], planning_stage_s=planned.get("stage_s"),
                         compile_s=planned.get("compile_s"), plan_choice=planned["chosen"],
                         plan_notes=planned.get("notes"), plan_run_samples=planned.get("run_samples"),
                         plan_speedup=chosen.get("speedup"), plan_speedup_over_run=chosen.get("speedup_over_run"),
                         run_compile_s=chosen.get("run_compile_s"))
        entries[name] = entry
    return {"profile": profile, "configs": entries, "recompute_overhead": overhead,
            "machine_probes": {k: v["summary"]["mean"] for k, v in timing["machine_probes"].items()}}


def _config_name(cfg: OptimizationConfig) -> str:
    """How plan() names a configuration, with adaptive accumulation's range where k adapts."""
    name = candidate_of(cfg.to_dict()).name
    return name.replace(f"k={cfg.k}", f"k={cfg.k} (adaptive {cfg.k_min}-{cfg.k_max})", 1) if cfg.adaptive else name


def plan_at_paper_size(task: str, profile: str, work: Path, device: torch.device, timing=None) -> dict:
    """`plan()` on the profile's model and batch over its run length; the plan record is kept."""
    prof = get_profile(task, profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
    options = {} if timing is None else dict(windows=timing[0], steps_per_window=timing[1])
    result = autoplan.plan_task(bundle, prof, device, progress=True, **options)
    record = dict(kind="plan", task=task, profile=profile, plan=result.to_dict(), explanation=result.explain(),
                  manifest=measure.run_manifest(profile=profile, device=device))
    path = work / "plans_at_paper_size" / profile / f"plan__{task}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))
    items_per_sample = float(prof.seq_len - 1) if task == "wikitext2" else 1.0  # a GPT-2 item: a predicted token

    def peak_of(row):
        cfg = OptimizationConfig(precision=row["precision"], tf32=bool(row.get("tf32")))
        return runner.config_peak_flops(cfg, device, bundle.flops_workload)[0]

    chosen = result.chosen
    candidates = plan_candidates(result.to_dict(), bundle.training_flops_per_item, items_per_sample, peak_of)
    return dict(profile=profile, planning_s=result.planning_s, stage_s=result.stage_s, compile_s=result.compile_s,
                choice=chosen["candidate"], speedup=chosen["speedup"],
                speedup_ci=[chosen["speedup_ci_low"], chosen["speedup_ci_high"]],
                speedup_over_run=chosen.get("speedup_over_run"), run_compile_s=chosen.get("run_compile_s"),
                candidates=candidates,
                notes=result.notes, run_samples=result.run_samples)


def compare_loops(profile: str, device: torch.device, windows: int, steps: int) -> dict:
    """One GPT-2 training step under each loop, timed in interleaved windows."""
    prof = get_profile("wikitext2", profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
    batch = tuple(None if t is None else t.to(device) for t in next(bundle.train_batches(prof.baseline_batch_size, seed=0)))
    precision = "bf16" if device.type == "cpu" or torch.cuda.is_bf16_supported() else "fp16"
    dtype = mp.DTYPES[precision]
    total_steps, warmup = 1_000, 50
    lr = prof.lr

    def lr_at(step: int) -> float:  # warmup + cosine to 0.1 lr, as the engine's step schedule
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = min((step - warmup) / max(total_steps - warmup, 1), 1.0)
        return 0.1 * lr + 0.9 * lr * 0.5 * (1 + math.cos(math.pi * progress))

    def fresh():
        torch.manual_seed(0)
        model = copy.deepcopy(bundle.model).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=prof.betas, weight_decay=prof.weight_decay)
        return model, optimizer

    def manual_loop(model, optimizer, autocast, backward, clip, skip_check=False):
        """A step written without trainopt's engine: autocast, backward, clip 1.0, the LR, AdamW.
        `skip_check`: before the optimizer step, read whether the loss and the gradient norm are
        finite and skip the step if not -- what the engine does, and the one device sync per step
        it costs (the loop without it never waits for the GPU)."""
        state = {"step": 0}

        def step():
            with autocast():
                loss, _ = bundle.loss(model, *batch)
            backward(loss)
            norm = clip()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(state["step"])
            if skip_check and not bool(torch.isfinite(loss.detach()) & torch.isfinite(norm)):
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                return float(batch[0].numel())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            return float(batch[0].numel())

        return step

    steps_fns, notes = {}, {}
    # 1. hand-written
    model_h, opt_h = fresh()
    steps_fns["hand loop"] = manual_loop(model_h, opt_h, lambda: torch.autocast(device.type, dtype=dtype),
                                         lambda loss: loss.backward(),
                                         lambda: torch.nn.utils.clip_grad_norm_(model_h.parameters(), 1.0))
    # 1b. hand-written, with the engine's check for non-finite steps (where the engine's time goes)
    model_c, opt_c = fresh()
    steps_fns["hand loop + skip check"] = manual_loop(
        model_c, opt_c, lambda: torch.autocast(device.type, dtype=dtype), lambda loss: loss.backward(),
        lambda: torch.nn.utils.clip_grad_norm_(model_c.parameters(), 1.0), skip_check=True)
    # 2. trainopt
    model_e, opt_e = fresh()
    cfg = OptimizationConfig(precision=precision, k=1, schedule="cosine", clip_norm=1.0, min_lr_ratio=0.1)
    engine = prepare(model_e, opt_e, cfg, micro_batch_size=len(batch[0]), device=device, total_steps=total_steps,
                     warmup_steps=warmup, min_lr=0.1 * lr)

    def trainopt():
        with engine.autocast():
            loss, items = bundle.loss(model_e, *batch)
        engine.backward(loss, num_items=items)
        engine.step()
        return float(batch[0].numel())

    steps_fns["trainopt engine"] = trainopt
    # 3. HF Accelerate
    try:
        from accelerate import Accelerator

        accelerator = Accelerator(mixed_precision=precision, cpu=device.type == "cpu")
        model_a, opt_a = accelerator.prepare(*fresh())
        steps_fns["accelerate"] = manual_loop(model_a, opt_a, accelerator.autocast, accelerator.backward,
                                              lambda: accelerator.clip_grad_norm_(model_a.parameters(), 1.0))
    except ImportError as error:
        notes["accelerate"] = f"not installed: {error}"
    # 4. Lightning Fabric
    try:
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cuda" if device.type == "cuda" else "cpu", devices=1,
                        precision="bf16-mixed" if precision == "bf16" else "16-mixed")
        model_f, opt_f = fabric.setup(*fresh())
        steps_fns["fabric"] = manual_loop(model_f, opt_f, fabric.autocast, fabric.backward,
                                          lambda: fabric.clip_gradients(model_f, opt_f, max_norm=1.0))
    except ImportError as error:
        notes["fabric"] = f"not installed: {error}"
    rates = measure.interleaved_windows(steps_fns, windows=windows, steps_per_window=steps, warmup_steps=3,
                                        device=device)
    engine.close()
    hand_rates = rates["hand loop"]
    result = {"precision": precision, "batch": list(batch[0].shape), "windows": windows, "steps_per_window": steps,
              "unit": "tok/s", "loops": {}, "notes": notes,
              "what": "one GPT-2 optimizer step over the baseline batch: autocast, backward, clip 1.0, "
                      "warmup + cosine LR, AdamW (torch's default kernels), the same batch every step"}
    for name, values in rates.items():
        summary = measure.summarize(values)
        ratio = None if name == "hand loop" else measure.paired_ratio(values, hand_rates)
        result["loops"][name] = dict(throughput=summary["mean"], throughput_ci=[summary["ci_low"], summary["ci_high"]],
                                     window_rates=list(values),
                                     vs_hand=None if ratio is None else ratio["mean"],
                                     vs_hand_ci=None if ratio is None else [ratio["ci_low"], ratio["ci_high"]])
    for name, key in (("accelerate", "accelerate"), ("fabric", "fabric"), ("hand loop + skip check", "skip_check")):
        if name in rates:
            ratio = measure.paired_ratio(rates["trainopt engine"], rates[name])
            result["loops"]["trainopt engine"][f"vs_{key}"] = ratio["mean"]
            result["loops"]["trainopt engine"][f"vs_{key}_ci"] = [ratio["ci_low"], ratio["ci_high"]]
    return result


def _reference_module():
    """benchmarks/gpt2_reference.py, imported from its file (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpt2_reference", ROOT / REFERENCE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _task_step(bundle, prof, cfg: OptimizationConfig, tokens: torch.Tensor, device: torch.device):
    """(step, engine): one optimizer step of the task's GPT-2 (a fresh copy) through trainopt's
    engine under `cfg`, on `tokens`; the step returns the tokens it processed and never waits for
    the device (as the reference's does not)."""
    own = dataclasses.replace(bundle, model=copy.deepcopy(bundle.model))
    engine, _ = runner.build_engine(own, prof, cfg, device=device, micro=len(tokens))

    def step() -> float:
        with engine.autocast():
            loss, items = own.loss(engine.model, tokens, None)
        engine.backward(loss, num_items=items)
        engine.step()
        return float(tokens.numel())

    return step, engine


def compare_with_reference(profile: str, work: Path, device: torch.device, windows: int, steps: int,
                           compiled: bool = True) -> dict:
    """The task's GPT-2 step beside a minimal plain-PyTorch GPT-2 of the same shapes, batch and
    dropout (benchmarks/gpt2_reference.py), eager and, with `compiled`, compiled (torch.compile's
    default mode), and the task's `auto`, timed in interleaved windows. Throughput counts the
    tokens each step processes."""
    prof = get_profile("wikitext2", profile)
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
    tokens = next(bundle.train_batches(prof.baseline_batch_size, seed=0))[0].to(device)
    precision = "bf16" if device.type == "cpu" or torch.cuda.is_bf16_supported() else "fp16"
    eager = OptimizationConfig(precision=precision, k=1, clip_norm=1.0,
                               optimizer_impl="fused" if device.type == "cuda" else "default")
    auto, _ = runner.resolve_config("auto", prof, device, plans_dir=work / profile / "plans")
    compiles = (False, True) if compiled else (False,)
    workloads, configs = _reference_workloads(bundle, prof, tokens, precision, compiles, device)
    engines = []
    for name, cfg in [(_reference_row("task", precision, c), eager.replace(compile=c)) for c in compiles] + [
            ("task auto", auto)]:
        workloads[name], engine = _task_step(bundle, prof, cfg, tokens, device)
        engines.append(engine)
        configs[name] = _config_name(cfg)
    peaks = {}
    for name, step in workloads.items():  # one step each: compiles, and its peak with every copy resident
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        step()
        peaks[name] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    rates = measure.interleaved_windows(workloads, windows=windows, steps_per_window=steps, warmup_steps=1,
                                        device=device)
    for engine in engines:
        engine.close()
    pairs = [(_reference_row("task", precision, c), _reference_row("reference", precision, c)) for c in compiles]
    pairs.append(("task auto", _reference_row("reference", precision, False)))
    rows, ratios = {}, {}
    for name, values in rates.items():
        summary = measure.summarize(values)
        rows[name] = dict(throughput=summary["mean"], throughput_ci=[summary["ci_low"], summary["ci_high"]],
                          window_rates=list(values), config=configs[name], peak_bytes=peaks[name])
    for mine, theirs in pairs:
        ratio = measure.paired_ratio(rates[mine], rates[theirs])
        ratios[f"{mine} / {theirs}"] = dict(mean=ratio["mean"], ci=[ratio["ci_low"], ratio["ci_high"]])
    return {"precision": precision, "batch": list(tokens.shape), "windows": windows, "steps_per_window": steps,
            "unit": "tok/s", "rows": rows, "ratios": ratios, "reference": REFERENCE, "compiled": compiled,
            "what": f"one GPT-2 optimizer step over the baseline batch, the same batch every step: the task's model "
                    f"through trainopt's engine ({_config_name(eager)}, clipping 1.0; and `auto`) beside the minimal "
                    f"plain-PyTorch GPT-2 of {REFERENCE} (the same shapes and dropout, vocabulary "
                    f"{bundle.model.config.padded_vocab_size}, the full logits' cross-entropy, clipping 1.0, AdamW"
                    f"{' fused' if device.type == 'cuda' else ''})"}


def _reference_workloads(bundle, prof, tokens: torch.Tensor, precision: str, compiles, device: torch.device):
    """({name: step}, {name: what it runs}): the reference GPT-2 of the task's shapes and dropout,
    one fresh copy per compile setting, training on `tokens` (targets: the next token)."""
    reference = _reference_module()
    size = bundle.model.config
    shape = reference.GPTConfig(block_size=size.n_positions, vocab_size=size.padded_vocab_size, n_layer=size.n_layer,
                                n_head=size.n_head, n_embd=size.n_embd, dropout=size.resid_pdrop)
    workloads, configs = {}, {}
    for compile_it in compiles:
        name = _reference_row("reference", precision, compile_it)
        torch.manual_seed(0)
        workloads[name] = reference.make_train_step(reference.GPT(shape).to(device), tokens, tokens.roll(-1, dims=1),
                                                    device=device, dtype=mp.DTYPES[precision], lr=prof.lr,
                                                    compile=compile_it)
        configs[name] = f"{REFERENCE}, {precision}" + (", torch.compile" if compile_it else "")
    return workloads, configs


def _reference_row(who: str, precision: str, compiled: bool) -> str:
    return f"{who} {precision} {'compiled' if compiled else 'eager'}"


def profile_auto_step(task: str, profile: str, work: Path, device: torch.device, steps: int = 3) -> str:
    """torch.profiler's self-time table of `steps` optimizer steps of the profile's `auto`."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    prof = get_profile(task, profile)
    cfg, _ = runner.resolve_config("auto", prof, device, plans_dir=work / profile / "plans")
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=device, seed=0)
    engine, micro = runner.build_engine(bundle, prof, cfg, device=device)
    batches = bundle.train_batches(micro, seed=0)
    for _ in range(3):  # warm-up: kernels chosen, anything compiled
        runner.one_optimizer_step(engine, bundle, engine.model, batches)
    measure.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as profiler:
        for _ in range(steps):
            runner.one_optimizer_step(engine, bundle, engine.model, batches)
        measure.synchronize(device)
    engine.close()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    return f"## {task}: auto ({_config_name(cfg)}), {steps} optimizer steps, sorted by {key}\n\n{table}\n"


# ----------------------------------------------------------------------------- a committed campaign, again
def _flops_per_item(task: str, profile: str) -> float:
    """The training FLOPs per item of `task`'s model at `profile`'s size (the full GPT-2 vocabulary),
    as its task computes them, without building its data."""
    from trainopt_core.reproduction import models
    from trainopt_core.reproduction.data import GPT2_VOCAB_SIZE
    from trainopt_core.reproduction.tasks import gpt2_training_flops_per_predicted_token

    prof = get_profile(task, profile)
    if task == "cifar10":
        return models.training_flops_per_item(models.resnet_cifar(**prof.model), (3, 32, 32))
    config = models.gpt2_config(vocab_size=GPT2_VOCAB_SIZE, **prof.model)
    return gpt2_training_flops_per_predicted_token(config, prof.seq_len)


def rerender(folder: Path) -> None:
    """Rewrite a finished campaign's summary.json and summary.md with this code from its records:
    each paper-size plan's candidates from its plan record (MFU against the datasheet peaks of the
    GPU it names), then the goals and the Markdown."""
    from trainopt_core.measure.flops import datasheet_peak_flops

    summary = json.loads((folder / "summary.json").read_text())
    with tempfile.TemporaryDirectory() as scratch, tarfile.open(folder / "records.tar.gz") as tar:
        tar.extractall(scratch, filter="data")
        for task, entry in summary["plans"].items():
            if "error" in entry:
                continue
            plan = json.loads(next(Path(scratch).glob(f"plans_at_paper_size/*/plan__{task}.json")).read_text())["plan"]
            prof = get_profile(task, entry["profile"])
            workload = "convolution" if task == "cifar10" else "matmul"

            def peak_of(row):
                with mp.tf32_allowed() if row.get("tf32") else contextlib.nullcontext():
                    return datasheet_peak_flops(summary["device"], row["precision"], workload=workload)[0]

            entry["candidates"] = plan_candidates(plan, _flops_per_item(task, entry["profile"]),
                                                  float(prof.seq_len - 1) if task == "wikitext2" else 1.0, peak_of)
            chosen = chosen_row(plan)
            entry.update(speedup_over_run=chosen.get("speedup_over_run"), run_compile_s=chosen.get("run_compile_s"))
    summary["goals"] = goals(summary)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (folder / "summary.md").write_text(summary_markdown(summary))


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rerender:
        rerender(Path(args.rerender))
        print(f"rewrote {args.rerender}/summary.json and summary.md from its records")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        campaign = Campaign(out, work, Path(args.resume) if args.resume else None, args.budget_s)
        manifest = measure.run_manifest(profile=args.profile, device=device)
        (out / "environment.json").write_text(json.dumps(manifest, indent=1, default=str))
        campaign.summary["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        todo = [s for s in args.stages if s not in campaign.summary["stages_done"]]
        campaign.summary["stages_left"] = list(todo)
        for stage in todo:
            if not campaign.fits(stage, device):
                print(f"[campaign] {stage}: left for --resume ({campaign.elapsed():.0f} s of {args.budget_s:.0f} s "
                      f"used, the stage takes about {STAGE_COST_S[stage]} s)", flush=True)
                continue
            print(f"[campaign] {stage} at {campaign.elapsed():.0f} s", flush=True)
            started = time.perf_counter()
            kind, _, task = stage.partition(":")
            try:
                if kind == "tests":
                    campaign.summary["tests"] = run_tests(out)
                elif kind == "runs":
                    campaign.summary["tasks"][task] = run_task(task, args.profile, work, device)
                elif kind == "plan":
                    timing = None if not args.plan_timing else tuple(int(v) for v in args.plan_timing.split(","))
                    campaign.summary["plans"][task] = plan_at_paper_size(task, args.paper_profile, work, device, timing)
                elif kind == "loops":
                    windows, steps = (6, 3) if device.type == "cuda" else (2, 1)
                    campaign.summary["loops"] = compare_loops(args.profile, device, windows, steps)
                elif kind == "reference":
                    windows, steps = (4, 3) if device.type == "cuda" else (2, 1)
                    # a CPU rehearsal does not compile: that takes minutes there
                    campaign.summary["reference"] = compare_with_reference(args.profile, work, device, windows, steps,
                                                                           compiled=device.type == "cuda")
                elif kind == "profile":
                    text = profile_auto_step(task, args.profile, work, device)
                    with open(out / "profiles.txt", "a") as handle:
                        handle.write(text)
                    campaign.summary["profiles"][task] = "profiles.txt"
            except Exception as error:  # a failed stage is reported; the others still run
                import traceback

                traceback.print_exc()
                failure = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
                if kind == "runs":
                    campaign.summary["tasks"][task] = failure
                elif kind == "plan":
                    campaign.summary["plans"][task] = failure
                elif kind == "reference":
                    campaign.summary["reference"] = failure
                else:
                    campaign.summary.setdefault("failed", {})[stage] = failure["error"]
            campaign.summary["stages_left"].remove(stage)
            campaign.finish(stage, time.perf_counter() - started)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        campaign.save()
    print((out / "summary.md").read_text(), flush=True)
    failed = (campaign.summary.get("failed") or any("error" in e for e in campaign.summary["tasks"].values())
              or "error" in (campaign.summary.get("reference") or {}))
    return 1 if failed or (campaign.summary.get("tests") or {}).get("exit_code", 0) not in (0, 5) else 0


if __name__ == "__main__":
    sys.exit(main())
