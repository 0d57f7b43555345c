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
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

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

CONFIGS = ("baseline", "optimized", "auto")
# what a stage costs on one H100 at the gpu profile's sizes (seconds, from the campaign's own
# estimates; the budget check uses them to leave a stage for the resuming call)
STAGE_COST_S = {"tests": 40, "runs:cifar10": 120, "runs:wikitext2": 150, "plan:cifar10": 120, "loops": 60,
                "plan:wikitext2": 150, "profile:cifar10": 20, "profile:wikitext2": 25}
STAGES = ("tests", "runs:cifar10", "runs:wikitext2", "plan:cifar10", "loops", "plan:wikitext2",
          "profile:cifar10", "profile:wikitext2")
# the goals the summary measures against (issue: GPU levers)
# each task's model, as the summary names it (the data set is named by the runs' data source)
MODELS = {"cifar10": "ResNet-50", "wikitext2": "GPT-2 124M"}
GOALS = {"gpt2_auto_mfu": 0.30, "gpt2_auto_mfu_stretch": 0.40, "resnet_auto_speedup": 2.0, "planning_s": 60.0,
         "engine_vs_hand": 0.99}
LOOP_NAMES = ("hand loop", "hand loop + skip check", "trainopt engine", "accelerate", "fabric")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the results (created)")
    parser.add_argument("--resume", help="the --out folder of an earlier call: its finished stages are kept")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu with --profile smoke (a rehearsal)")
    parser.add_argument("--profile", default="gpu", help="gpu (default), or smoke with --device cpu")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated, from " + ",".join(STAGES))
    parser.add_argument("--plan-timing", default=None, help="WINDOWS,STEPS: plan()'s timing windows and steps per "
                        "window at the paper's sizes (default: plan()'s own, sized to the baseline's step on CUDA)")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="seconds this call may take; a stage that would not fit is left for --resume")
    args = parser.parse_args(argv)
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
                        "loops": None, "tests": None, "profiles": {}}
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
            throughput_windows=summary["n"], unit=prof.item_unit,
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
            entry.update(planning_s=planned["planning_s"], planning_stage_s=planned.get("stage_s"),
                         compile_s=planned.get("compile_s"), plan_choice=planned["chosen"],
                         plan_notes=planned.get("notes"))
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
    chosen = result.chosen
    items_per_sample = float(prof.seq_len - 1) if task == "wikitext2" else 1.0  # a GPT-2 item: a predicted token
    candidates = []
    for row in result.rows:
        entry = {key: row.get(key) for key in ("candidate", "speedup", "speedup_ci_low", "speedup_ci_high",
                                               "peak_memory_bytes", "compile_s", "rejected_because")}
        entry["mfu"] = entry["break_even_samples"] = None
        if row.get("seconds_per_sample"):
            cfg = OptimizationConfig(precision=row["precision"], tf32=bool(row.get("tf32")))
            entry["mfu"] = _mfu(bundle.training_flops_per_item, items_per_sample / row["seconds_per_sample"], cfg,
                                device, bundle.flops_workload)[0]
            entry["break_even_samples"] = compile_break_even(row, chosen)
        candidates.append(entry)
    return dict(profile=profile, planning_s=result.planning_s, stage_s=result.stage_s, compile_s=result.compile_s,
                choice=chosen["candidate"], speedup=chosen["speedup"],
                speedup_ci=[chosen["speedup_ci_low"], chosen["speedup_ci_high"]], candidates=candidates,
                notes=result.notes, run_samples=result.run_samples)


def compile_break_even(row: dict, chosen: dict) -> float | None:
    """The run length (samples) from which a compiled candidate's faster steps repay its compiling,
    against an uncompiled choice: compile seconds / seconds saved per sample. None where that does
    not apply (not compiled, the choice compiled, or the compiled steps not faster)."""
    if not row.get("compile_s") or chosen.get("compile_s") or not chosen.get("seconds_per_sample"):
        return None
    saved = chosen["seconds_per_sample"] - row["seconds_per_sample"]
    return row["compile_s"] / saved if saved > 0 else None


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
                                     vs_hand=None if ratio is None else ratio["mean"],
                                     vs_hand_ci=None if ratio is None else [ratio["ci_low"], ratio["ci_high"]])
    for name, key in (("accelerate", "accelerate"), ("fabric", "fabric"), ("hand loop + skip check", "skip_check")):
        if name in rates:
            ratio = measure.paired_ratio(rates["trainopt engine"], rates[name])
            result["loops"]["trainopt engine"][f"vs_{key}"] = ratio["mean"]
            result["loops"]["trainopt engine"][f"vs_{key}_ci"] = [ratio["ci_low"], ratio["ci_high"]]
    return result


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


# ----------------------------------------------------------------------------- summary
def _verdict(low, high, bar) -> str:
    """met / not met / inside the interval, for a value's 95 % interval against a bar."""
    if low is None or high is None:
        return "not measured"
    if low >= bar:
        return "met"
    if high < bar:
        return "not met"
    return "inconclusive (the bar is inside the 95 % interval)"


def goals(summary: dict) -> list[dict]:
    """The campaign's goals, each with what was measured and whether it was met."""
    rows = []
    gpt2 = summary["tasks"].get("wikitext2", {}).get("configs", {}).get("auto")
    if gpt2:
        low, high = (gpt2["mfu"] * c / gpt2["throughput"] if c else None for c in gpt2["throughput_ci"])
        for key, label in (("gpt2_auto_mfu", "GPT-2 auto MFU >= 30 %"),
                           ("gpt2_auto_mfu_stretch", "GPT-2 auto MFU >= 40 % (stretch)")):
            rows.append(dict(goal=label, measured=f"{100 * gpt2['mfu']:.1f} % [{100 * low:.1f}, {100 * high:.1f}]",
                             verdict=_verdict(low, high, GOALS[key])))
    resnet = summary["tasks"].get("cifar10", {}).get("configs", {}).get("auto")
    if resnet:
        low, high = resnet["speedup_ci"]
        rows.append(dict(goal=f"ResNet auto >= 2x the fp32 baseline ({summary['tasks']['cifar10']['profile']} profile)",
                         measured=f"{resnet['speedup']:.2f}x [{low:.2f}, {high:.2f}]",
                         verdict=_verdict(low, high, GOALS["resnet_auto_speedup"])))
    gpt2_plan = summary["plans"].get("wikitext2", {})
    # the fastest step, not the highest MFU: each candidate's MFU is against its own precision's
    # peak, so the fp32 baseline's is the highest
    fastest = max((row for row in gpt2_plan.get("candidates", []) if row.get("mfu") is not None),
                  key=lambda row: row["speedup"], default=None)
    if fastest is not None and fastest["candidate"] != gpt2_plan["choice"]:
        # the interval: the speedup's relative interval (both are the same windows' rates)
        low, high = (fastest["mfu"] * c / fastest["speedup"] if c else None
                     for c in (fastest["speedup_ci_low"], fastest["speedup_ci_high"]))
        even = fastest.get("break_even_samples")
        rows.append(dict(goal="GPT-2 MFU >= 30 % in plan()'s fastest step (paper sizes), where the run is long "
                              "enough to choose it",
                         measured=f"{100 * fastest['mfu']:.1f} % [{100 * low:.1f}, {100 * high:.1f}], "
                                  f"{fastest['candidate']}" + ("" if even is None else
                                  f"; repays its compiling from {even:,.0f} samples (this run: "
                                  f"{gpt2_plan['run_samples']:,})"),
                         verdict=_verdict(low, high, GOALS["gpt2_auto_mfu"])))
    for task, plan in summary["plans"].items():
        if "error" in plan:
            continue
        low, high = plan["speedup_ci"]
        rows.append(dict(goal=f"{task} plan at the paper's sizes: auto's speedup (paper run length)",
                         measured=f"{plan['speedup']:.2f}x [{low:.2f}, {high:.2f}], chose {plan['choice']}",
                         verdict="reported"))
    for label, plans in (("gpu profile", {t: e["configs"]["auto"] for t, e in summary["tasks"].items()
                                          if "configs" in e}),
                         ("paper sizes", {t: p for t, p in summary["plans"].items() if "error" not in p})):
        for task, plan in plans.items():
            compile_s = plan.get("compile_s") or 0.0
            rows.append(dict(goal=f"planning <= 60 s ({task}, {label})",
                             measured=f"{plan['planning_s']:.1f} s, of which compiling {compile_s:.1f} s",
                             verdict="met" if plan["planning_s"] <= GOALS["planning_s"] else
                             f"not met ({plan['planning_s'] - compile_s:.1f} s without compiling)"))
    loops = (summary.get("loops") or {}).get("loops", {})
    engine = loops.get("trainopt engine")
    if engine:
        low, high = engine["vs_hand_ci"]
        rows.append(dict(goal="trainopt engine >= 0.99x the hand-written loop",
                         measured=f"{engine['vs_hand']:.3f}x [{low:.3f}, {high:.3f}]",
                         verdict=_verdict(low, high, GOALS["engine_vs_hand"])))
        if "vs_skip_check" in engine:
            low, high = engine["vs_skip_check_ci"]
            rows.append(dict(goal="(where the engine's time goes) engine vs a hand loop with the same check for "
                             "non-finite steps", measured=f"{engine['vs_skip_check']:.3f}x [{low:.3f}, {high:.3f}]",
                             verdict="reported"))
        for name in ("accelerate", "fabric"):
            if f"vs_{name}" in engine:
                low, high = engine[f"vs_{name}_ci"]
                rows.append(dict(goal=f"trainopt engine >= {name}", measured=f"{engine[f'vs_{name}']:.3f}x [{low:.3f}, "
                                 f"{high:.3f}]", verdict=_verdict(low, high, 1.0)))
    return rows


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.0f} MiB"


def summary_markdown(summary: dict) -> str:
    lines = ["# GPU campaign (scripts/gpu_campaign.py)", ""]
    device = summary.get("device", "?")
    lines += [f"Device: {device}. Data: labeled stand-ins (synthetic images, NOT CIFAR-10; stand-in text, NOT "
              "WikiText-2). Intervals: 95 % over the interleaved timing windows of this one session.", ""]
    lines += ["## Goals", "", "| goal | measured | verdict |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {g['verdict']} |" for g in summary.get("goals", [])]
    for task, entry in summary["tasks"].items():
        source = next((c.get("data_source") for c in entry.get("configs", {}).values()), None)
        lines += ["", f"## {MODELS.get(task, task)}" + (f" on {source}" if source else "")
                  + f": {entry.get('profile', '')} profile", ""]
        if "error" in entry:
            lines += [f"failed: {entry['error']}"]
            continue
        lines += ["| configuration | runs as | throughput [95 % CI] | vs baseline | MFU | step peak | eval peak | "
                  "energy/sample |", "|---|---|---|---|---|---|---|---|"]
        for name, c in entry["configs"].items():
            ci = c["throughput_ci"]
            ci_text = "" if ci[0] is None else f" [{ci[0]:,.0f}, {ci[1]:,.0f}]"
            ratio = "1" if c["speedup"] is None else (f"{c['speedup']:.2f}x [{c['speedup_ci'][0]:.2f}, "
                                                       f"{c['speedup_ci'][1]:.2f}]")
            energy = "n/a" if c["energy_j_per_sample"] is None else f"{c['energy_j_per_sample']:.3g} J"
            mfu = "n/a" if c["mfu"] is None else f"{100 * c['mfu']:.1f} %"
            lines.append(f"| {name} | {c['config']} | {c['throughput']:,.0f}{ci_text} {c['unit']} | {ratio} | {mfu} | "
                         f"{_mib(c['training_step_peak_bytes'])} | {_mib(c['evaluation_peak_bytes'])} | {energy} |")
        auto = entry["configs"].get("auto", {})
        if auto.get("planning_s") is not None:
            stages = ", ".join(f"{k} {v:.1f} s" for k, v in (auto.get("planning_stage_s") or {}).items())
            lines += ["", f"auto's plan: {auto['plan_choice']}; planning {auto['planning_s']:.1f} s ({stages}); "
                          f"compiling {auto.get('compile_s') or 0:.1f} s"]
        overhead = entry.get("recompute_overhead", {})
        if "recompute_overhead" in overhead:
            lines += ["", f"√L recompute overhead: {100 * overhead['recompute_overhead']:.1f} % "
                          f"({overhead['segments']} segments of {overhead['blocks']} blocks, {overhead['precision']})"]
        elif "error" in overhead:
            lines += ["", f"√L recompute overhead: failed: {overhead['error']}"]
    for task, plan in summary["plans"].items():
        lines += ["", f"## plan() at the paper's sizes: {MODELS.get(task, task)}", ""]
        if "error" in plan:
            lines += [f"failed: {plan['error']}"]
            continue
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in (plan.get("stage_s") or {}).items())
        lines += [f"Chose **{plan['choice']}**, {plan['speedup']:.2f}x [{plan['speedup_ci'][0]:.2f}, "
                  f"{plan['speedup_ci'][1]:.2f}] the fp32 baseline; planning {plan['planning_s']:.1f} s ({stages}), "
                  f"compiling {plan['compile_s'] or 0:.1f} s; run length {plan['run_samples']:,} samples.", "",
                  "| candidate | speedup [95 % CI] | MFU | peak | compile | repays compiling from | rejected because |",
                  "|---|---|---|---|---|---|---|"]
        for row in plan["candidates"]:
            speed = "n/a" if row["speedup"] is None else (
                f"{row['speedup']:.2f}x" + ("" if row["speedup_ci_low"] is None else
                                          f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"))
            compile_s = "" if row["compile_s"] is None else f"{row['compile_s']:.1f} s"
            mfu = "" if row.get("mfu") is None else f"{100 * row['mfu']:.1f} %"
            even = "" if row.get("break_even_samples") is None else f"{row['break_even_samples']:,.0f} samples"
            lines.append(f"| {row['candidate']} | {speed} | {mfu} | {_mib(row['peak_memory_bytes'])} | {compile_s} | "
                         f"{even} | {(row['rejected_because'] or '').replace('|', '/')} |")
        lines += [""] + [f"- {note}" for note in plan["notes"]]
    loops = summary.get("loops")
    if loops:
        lines += ["", "## The same GPT-2 step under each loop", "", loops["what"] + f" ({loops['precision']}, batch "
                  f"{loops['batch']}, {loops['windows']} windows of {loops['steps_per_window']} steps).", "",
                  "| loop | throughput [95 % CI] | vs hand loop |", "|---|---|---|"]
        for name, row in loops["loops"].items():
            ratio = "1" if row["vs_hand"] is None else f"{row['vs_hand']:.3f}x [{row['vs_hand_ci'][0]:.3f}, " \
                                                       f"{row['vs_hand_ci'][1]:.3f}]"
            ci = row["throughput_ci"]
            ci_text = "" if ci[0] is None else f" [{ci[0]:,.0f}, {ci[1]:,.0f}]"
            lines.append(f"| {name} | {row['throughput']:,.0f}{ci_text} tok/s | {ratio} |")
        lines += [f"- {name}: {note}" for name, note in loops["notes"].items()]
    if summary.get("tests"):
        lines += ["", f"GPU tests: {summary['tests']['result']} (exit {summary['tests']['exit_code']})"]
    lines += ["", f"Stages done: {', '.join(summary['stages_done']) or 'none'}; left: "
              f"{', '.join(summary['stages_left']) or 'none'}. Seconds per stage: "
              + ", ".join(f"{k} {v:.0f}" for k, v in summary["stage_s"].items()), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
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
                else:
                    campaign.summary.setdefault("failed", {})[stage] = failure["error"]
            campaign.summary["stages_left"].remove(stage)
            campaign.finish(stage, time.perf_counter() - started)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        campaign.save()
    print((out / "summary.md").read_text(), flush=True)
    failed = campaign.summary.get("failed") or any("error" in e for e in campaign.summary["tasks"].values())
    return 1 if failed or (campaign.summary.get("tests") or {}).get("exit_code", 0) not in (0, 5) else 0


if __name__ == "__main__":
    sys.exit(main())
