"""What a GPU campaign (scripts/gpu_campaign.py) measured, as its goals, its summary.md, and the GPU
lines of README.md and reports/README.md.

Every number a goal quotes has its point and its 95 % interval from one statistic: a rate's mean
over the interleaved windows with that mean's interval, or a paired ratio (the geometric mean of
the per-window ratios) with its interval. A plan candidate's MFU is its paired speedup over the
fp32 baseline times the baseline's rate, so its interval is the speedup's.

The README and the reports index quote, for each GPU, its newest campaign made at a clean commit
(`newest_clean_campaigns`: its manifest names the commit and no uncommitted changes), between
marker lines that `write_gpu_blocks` rewrites; tests/test_gpu_campaign.py checks they agree.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

GOALS = {"gpt2_auto_mfu": 0.30, "gpt2_auto_mfu_stretch": 0.40, "resnet_auto_speedup": 2.0, "planning_s": 60.0,
         "engine_vs_hand": 0.99, "task_vs_reference": 0.90}
# each task's model, as the summary names it (the data set is named by the runs' data source)
MODELS = {"cifar10": "ResNet-50", "wikitext2": "GPT-2 124M"}
README_BLOCK = ("<!-- gpu:start -->\n", "<!-- gpu:end -->")
INDEX_BLOCK = ("<!-- gpu-campaigns:start -->\n", "<!-- gpu-campaigns:end -->")


# ----------------------------------------------------------------------------- plan() at the paper's sizes
def compile_break_even(row: dict, chosen: dict) -> float | None:
    """The run length (samples) from which a compiled candidate's faster steps repay its compiling,
    against an uncompiled choice: the compiling the run pays (`choice.run_compile_s`: from the
    plan's compile cache where timed, else the plan's own) / seconds saved per sample. None where
    that does not apply (not compiled, the choice compiled, or the compiled steps not faster)."""
    from ..planner.choice import run_compile_s

    if not run_compile_s(row) or chosen.get("compile_s") or not chosen.get("seconds_per_sample"):
        return None
    saved = chosen["seconds_per_sample"] - row["seconds_per_sample"]
    return run_compile_s(row) / saved if saved > 0 else None


def chosen_row(plan: dict) -> dict:
    """The chosen candidate's row of a plan as `Plan.to_dict()` holds it."""
    return next(row for row in plan["rows"] if row["candidate"] == plan["chosen"])


def plan_candidates(plan: dict, flops_per_item: float, items_per_sample: float, peak_of) -> list[dict]:
    """The rows of a plan (`Plan.to_dict()`) as the campaign reports them. A timed row's MFU is
    its speedup over the fp32 baseline (paired windows) times the baseline's rate (items/s:
    `items_per_sample` / its seconds per sample) times `flops_per_item`, over `peak_of(row)`, the
    peak FLOP/s of the row's precision; its interval is the speedup's, scaled the same way."""
    from ..planner.choice import baseline_row, reworded_costs

    base = baseline_row(plan["rows"])
    chosen = chosen_row(plan)
    base_rate = items_per_sample / base["seconds_per_sample"]
    candidates = []
    for row in plan["rows"]:
        entry = {key: row.get(key) for key in ("candidate", "speedup", "speedup_ci_low", "speedup_ci_high",
                                               "seconds_per_sample", "peak_memory_bytes", "compile_s",
                                               "rejected_because")}
        entry["rejected_because"] = reworded_costs(row.get("rejected_because"), row.get("cost"), chosen.get("cost"))
        entry["mfu"] = entry["mfu_ci"] = entry["break_even_samples"] = None
        if row.get("speedup") and row.get("seconds_per_sample"):
            per_speedup = flops_per_item * base_rate / peak_of(row)
            entry["mfu"] = per_speedup * row["speedup"]
            if row.get("speedup_ci_low") is not None:
                entry["mfu_ci"] = [per_speedup * row["speedup_ci_low"], per_speedup * row["speedup_ci_high"]]
            entry["break_even_samples"] = compile_break_even(row, chosen)
        candidates.append(entry)
    return candidates


# ----------------------------------------------------------------------------- goals
def _verdict(low, high, bar) -> str:
    """met / not met / inside the interval, for a value's 95 % interval against a bar."""
    if low is None or high is None:
        return "not measured"
    if low >= bar:
        return "met"
    if high < bar:
        return "not met"
    return "inconclusive (the bar is inside the 95 % interval)"


def _percent(point, interval) -> str:
    return f"{100 * point:.1f} % [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def fastest_plan_step(plan: dict) -> dict | None:
    """The timed candidate of a plan with the highest speedup (not the highest MFU: each
    candidate's MFU is against its own precision's peak, so the fp32 baseline's is the highest)."""
    return max((row for row in plan.get("candidates", []) if row.get("mfu") is not None),
               key=lambda row: row["speedup"], default=None)


def goals(summary: dict) -> list[dict]:
    """The campaign's goals, each with what was measured and whether it was met."""
    rows = []
    gpt2 = summary["tasks"].get("wikitext2", {}).get("configs", {}).get("auto")
    if gpt2:  # the mean rate's MFU with the mean's interval
        mfu, (low, high) = gpt2["mfu"], (gpt2["mfu"] * c / gpt2["throughput"] if c else None for c in gpt2["throughput_ci"])
        said = f"{100 * mfu:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"
        over_run, per_step = gpt2.get("plan_speedup_over_run"), gpt2.get("plan_speedup")
        if over_run and per_step:  # a compiled choice: its compiling, spread over the run it was planned for
            scale = over_run / per_step
            mfu, low, high = mfu * scale, low * scale, high * scale
            said = (f"{100 * mfu:.1f} % [{100 * low:.1f}, {100 * high:.1f}] over the run of "
                    f"{gpt2['plan_run_samples']:,} samples with its compiling ({said} per step)")
        for key, label in (("gpt2_auto_mfu", "GPT-2 auto MFU >= 30 %"),
                           ("gpt2_auto_mfu_stretch", "GPT-2 auto MFU >= 40 % (stretch)")):
            rows.append(dict(goal=label, measured=said, verdict=_verdict(low, high, GOALS[key])))
    rows += _reference_goals(summary.get("reference"))
    resnet = summary["tasks"].get("cifar10", {}).get("configs", {}).get("auto")
    if resnet:
        low, high = resnet["speedup_ci"]
        rows.append(dict(goal=f"ResNet auto >= 2x the fp32 baseline ({summary['tasks']['cifar10']['profile']} profile)",
                         measured=f"{resnet['speedup']:.2f}x [{low:.2f}, {high:.2f}]",
                         verdict=_verdict(low, high, GOALS["resnet_auto_speedup"])))
    gpt2_plan = summary["plans"].get("wikitext2", {})
    fastest = fastest_plan_step(gpt2_plan)
    if fastest is not None and fastest["candidate"] != gpt2_plan["choice"]:
        low, high = fastest["mfu_ci"] or (None, None)
        even = fastest.get("break_even_samples")
        rows.append(dict(goal="GPT-2 MFU >= 30 % in plan()'s fastest step (paper sizes), where the run is long "
                              "enough to choose it",
                         measured=f"{_percent(fastest['mfu'], (low, high))}, {fastest['candidate']}" + (
                             "" if even is None else f"; repays its compiling from {even:,.0f} samples (this run: "
                                                     f"{gpt2_plan['run_samples']:,})"),
                         verdict=_verdict(low, high, GOALS["gpt2_auto_mfu"])))
    for task, plan in summary["plans"].items():
        if "error" in plan:
            continue
        low, high = plan["speedup_ci"]
        over_run = plan.get("speedup_over_run")  # a compiled choice: its compiling spread over the run
        rows.append(dict(goal=f"{task} plan at the paper's sizes: the choice's speedup over the fp32 baseline",
                         measured=f"{plan['speedup']:.2f}x [{low:.2f}, {high:.2f}] per step" + (
                             "" if over_run is None else f", {over_run:.2f}x over the run's {plan['run_samples']:,} "
                                                         "samples with compiling") + f"; chose {plan['choice']}",
                         verdict="reported"))
    rows += _planning_goals(summary)
    rows += _loop_goals((summary.get("loops") or {}).get("loops", {}))
    return rows


def _reference_goals(reference: dict | None) -> list[dict]:
    """The task's step against the minimal plain-PyTorch GPT-2: eager (the goal), compiled and `auto` (reported)."""
    if not reference or "ratios" not in reference:
        return []
    rows, precision = [], reference["precision"]
    for key, ratio in reference["ratios"].items():
        task_row, reference_row = key.split(" / ")
        low, high = ratio["ci"]
        rows_of = reference["rows"]
        measured = (f"{ratio['mean']:.2f}x [{low:.2f}, {high:.2f}] ({rows_of[task_row]['throughput']:,.0f} vs "
                    f"{rows_of[reference_row]['throughput']:,.0f} tok/s)")
        if task_row == f"task {precision} eager":
            rows.append(dict(goal=f"GPT-2 task >= 0.9x the minimal plain-PyTorch GPT-2 ({reference['reference']}), "
                                  f"{precision} eager", measured=measured,
                             verdict=_verdict(low, high, GOALS["task_vs_reference"])))
        else:
            rows.append(dict(goal=f"GPT-2 {task_row} vs the reference {reference_row.removeprefix('reference ')}",
                             measured=measured, verdict="reported"))
    return rows


def _planning_goals(summary: dict) -> list[dict]:
    rows = []
    for label, plans in (("gpu profile", {t: e["configs"]["auto"] for t, e in summary["tasks"].items()
                                          if "configs" in e}),
                         ("paper sizes", {t: p for t, p in summary["plans"].items() if "error" not in p})):
        for task, plan in plans.items():
            compile_s = plan.get("compile_s") or 0.0
            rows.append(dict(goal=f"planning <= 60 s ({task}, {label})",
                             measured=f"{plan['planning_s']:.1f} s, of which compiling {compile_s:.1f} s",
                             verdict="met" if plan["planning_s"] <= GOALS["planning_s"] else
                             f"not met ({plan['planning_s'] - compile_s:.1f} s without compiling)"))
    return rows


def _loop_goals(loops: dict) -> list[dict]:
    engine = loops.get("trainopt engine")
    if not engine:
        return []
    low, high = engine["vs_hand_ci"]
    rows = [dict(goal="trainopt engine >= 0.99x the hand-written loop",
                 measured=f"{engine['vs_hand']:.3f}x [{low:.3f}, {high:.3f}]",
                 verdict=_verdict(low, high, GOALS["engine_vs_hand"]))]
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


# ----------------------------------------------------------------------------- summary.md
def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.0f} MiB"


def _ci(interval, digits=0) -> str:
    return "" if not interval or interval[0] is None else f" [{interval[0]:,.{digits}f}, {interval[1]:,.{digits}f}]"


def summary_markdown(summary: dict) -> str:
    lines = ["# GPU campaign (scripts/gpu_campaign.py)", ""]
    lines += [f"Device: {summary.get('device', '?')}. Data: labeled stand-ins (synthetic images, NOT CIFAR-10; stand-in "
              "text, NOT WikiText-2). Intervals: 95 % over the interleaved timing windows of this one session.", ""]
    lines += ["## Goals", "", "| goal | measured | verdict |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {g['verdict']} |" for g in summary.get("goals", [])]
    for task, entry in summary["tasks"].items():
        lines += _task_lines(task, entry)
    if summary.get("reference"):
        lines += _reference_lines(summary["reference"])
    for task, plan in summary["plans"].items():
        lines += _plan_lines(task, plan)
    if summary.get("loops"):
        lines += _loops_lines(summary["loops"])
    if summary.get("tests"):
        lines += ["", f"GPU tests: {summary['tests']['result']} (exit {summary['tests']['exit_code']})"]
    lines += ["", f"Stages done: {', '.join(summary['stages_done']) or 'none'}; left: "
              f"{', '.join(summary['stages_left']) or 'none'}. Seconds per stage: "
              + ", ".join(f"{k} {v:.0f}" for k, v in summary["stage_s"].items()), ""]
    return "\n".join(lines)


def _task_lines(task: str, entry: dict) -> list[str]:
    source = next((c.get("data_source") for c in entry.get("configs", {}).values()), None)
    lines = ["", f"## {MODELS.get(task, task)}" + (f" on {source}" if source else "")
             + f": {entry.get('profile', '')} profile", ""]
    if "error" in entry:
        return lines + [f"failed: {entry['error']}"]
    lines += ["| configuration | runs as | throughput [95 % CI] | vs baseline | MFU | step peak | eval peak | "
              "energy/sample |", "|---|---|---|---|---|---|---|---|"]
    for name, c in entry["configs"].items():
        ratio = "1" if c["speedup"] is None else f"{c['speedup']:.2f}x{_ci(c['speedup_ci'], 2)}"
        energy = "n/a" if c["energy_j_per_sample"] is None else f"{c['energy_j_per_sample']:.3g} J"
        mfu = "n/a" if c["mfu"] is None else f"{100 * c['mfu']:.1f} %"
        lines.append(f"| {name} | {c['config']} | {c['throughput']:,.0f}{_ci(c['throughput_ci'])} {c['unit']} | {ratio} "
                     f"| {mfu} | {_mib(c['training_step_peak_bytes'])} | {_mib(c['evaluation_peak_bytes'])} | {energy} |")
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
    return lines


def _reference_lines(reference: dict) -> list[str]:
    lines = ["", "## GPT-2: the task beside a minimal plain-PyTorch GPT-2", ""]
    if "error" in reference:
        return lines + [f"failed: {reference['error']}"]
    lines += [reference["what"] + f" ({reference['precision']}, batch {reference['batch']}, {reference['windows']} "
              f"windows of {reference['steps_per_window']} steps).", "",
              "| step | runs as | throughput [95 % CI] | peak allocated (all copies resident) |", "|---|---|---|---|"]
    for name, row in reference["rows"].items():
        lines.append(f"| {name} | {row['config']} | {row['throughput']:,.0f}{_ci(row['throughput_ci'])} tok/s | "
                     f"{_mib(row['peak_bytes'])} |")
    if not reference.get("compiled"):
        lines += ["", "Compiled steps: not timed (a CPU rehearsal)."]
    return lines


def _plan_lines(task: str, plan: dict) -> list[str]:
    lines = ["", f"## plan() at the paper's sizes: {MODELS.get(task, task)}", ""]
    if "error" in plan:
        return lines + [f"failed: {plan['error']}"]
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in (plan.get("stage_s") or {}).items())
    over_run = ("" if plan.get("speedup_over_run") is None else
                f" ({plan['speedup_over_run']:.2f}x over the run with its compiling)")
    lines += [f"Chose **{plan['choice']}**, {plan['speedup']:.2f}x{_ci(plan['speedup_ci'], 2)} the fp32 baseline per "
              f"step{over_run}; planning {plan['planning_s']:.1f} s ({stages}, compiling included), compiling "
              f"{plan['compile_s'] or 0:.1f} s; run length "
              f"{plan['run_samples']:,} samples. MFU: the speedup times the fp32 baseline's rate, its interval the "
              "speedup's.", "",
              "| candidate | speedup [95 % CI] | MFU [95 % CI] | peak | compile | repays compiling from | rejected because |",
              "|---|---|---|---|---|---|---|"]
    for row in plan["candidates"]:
        speed = "n/a" if row["speedup"] is None else (
            f"{row['speedup']:.2f}x{_ci((row['speedup_ci_low'], row['speedup_ci_high']), 2)}")
        compile_s = "" if row["compile_s"] is None else f"{row['compile_s']:.1f} s"
        mfu = "" if row.get("mfu") is None else (f"{100 * row['mfu']:.1f} %" if not row.get("mfu_ci") else
                                                 _percent(row["mfu"], row["mfu_ci"]))
        even = "" if row.get("break_even_samples") is None else f"{row['break_even_samples']:,.0f} samples"
        lines.append(f"| {row['candidate']} | {speed} | {mfu} | {_mib(row['peak_memory_bytes'])} | {compile_s} | "
                     f"{even} | {(row['rejected_because'] or '').replace('|', '/')} |")
    return lines + [""] + [f"- {note}" for note in plan["notes"]]


def _loops_lines(loops: dict) -> list[str]:
    lines = ["", "## The same GPT-2 step under each loop", "", loops["what"] + f" ({loops['precision']}, batch "
             f"{loops['batch']}, {loops['windows']} windows of {loops['steps_per_window']} steps).", "",
             "| loop | throughput [95 % CI] | vs hand loop |", "|---|---|---|"]
    for name, row in loops["loops"].items():
        ratio = "1" if row["vs_hand"] is None else f"{row['vs_hand']:.3f}x{_ci(row['vs_hand_ci'], 3)}"
        lines.append(f"| {name} | {row['throughput']:,.0f}{_ci(row['throughput_ci'])} tok/s | {ratio} |")
    return lines + [f"- {name}: {note}" for name, note in loops["notes"].items()]


# ----------------------------------------------------------------------------- README.md and reports/README.md
def newest_clean_campaigns(reports_root: str | Path) -> dict[str, Path]:
    """{GPU folder name: its newest campaign folder} under ``<reports_root>/gpu/<gpu>/campaign*/``,
    among those whose manifest (environment.json) names a commit without uncommitted changes;
    newest by the manifest's date."""
    newest: dict[str, tuple[str, Path]] = {}
    for summary in sorted(Path(reports_root).glob("gpu/*/campaign*/summary.json")):
        manifest = summary.parent / "environment.json"
        made = json.loads(manifest.read_text()) if manifest.is_file() else {}
        git = made.get("git") or {}
        if not git.get("commit") or git.get("dirty") is not False:
            continue
        gpu, key = summary.parents[1].name, (made.get("date_utc", ""), summary.parent.name)
        if gpu not in newest or key > newest[gpu][0]:
            newest[gpu] = (key, summary.parent)
    return {gpu: folder for gpu, (_, folder) in sorted(newest.items())}


def _made(folder: Path) -> str:
    made = json.loads((folder / "environment.json").read_text())
    return f"commit {made['git']['commit'][:7]}, {made.get('date_utc', '')[:10]}"


def gpu_campaign_lines(reports_root: str | Path) -> list[str]:
    """The reports index's GPU section: the goals of each GPU's newest clean-commit campaign, with
    a link to its GPU folder's report, between `INDEX_BLOCK`'s marker lines (none: no lines)."""
    root = Path(reports_root)
    newest = newest_clean_campaigns(root)
    if not newest:
        return []
    lines = [INDEX_BLOCK[0].rstrip("\n"), "## GPU campaigns", "",
             "The paper's models and batches on one GPU (`scripts/gpu_campaign.py`, the `gpu` profile's short runs on "
             "the labeled stand-ins): the goals each GPU's newest campaign at a clean commit measured against; the "
             "folder's README has the rest.", ""]
    for gpu, folder in newest.items():
        summary = json.loads((folder / "summary.json").read_text())
        lines += [f"### {summary.get('device', gpu)}: [gpu/{gpu}/](gpu/{gpu}/README.md)", "",
                  f"From `gpu/{gpu}/{folder.name}/` ({_made(folder)}).", "",
                  "| goal | measured | verdict |", "|---|---|---|"]
        lines += [f"| {g['goal']} | {g['measured']} | {g['verdict']} |" for g in goals(summary)] + [""]
    return lines + [INDEX_BLOCK[1], ""]


def _ratio(point, interval, digits=2) -> str:
    return f"{point:.{digits}f}×" + ("" if not interval or interval[0] is None else
                                     f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]")


def gpu_result_text(reports_root: str | Path, link_prefix: str = "reports/") -> str:
    """README.md's GPU sentences: what each GPU's newest clean-commit campaign measured."""
    paragraphs = []
    for gpu, folder in newest_clean_campaigns(reports_root).items():
        summary = json.loads((folder / "summary.json").read_text())
        configs = {task: entry.get("configs", {}) for task, entry in summary["tasks"].items()}
        said = [f"At the paper's sizes on one {summary.get('device', gpu)}, on the labeled stand-in data "
                f"(`{link_prefix}gpu/{gpu}/{folder.name}/`, {_made(folder)})"]
        optimized = [f"{MODELS[task]} {_ratio(c['optimized']['speedup'], c['optimized']['speedup_ci'])}"
                     for task, c in configs.items() if c.get("optimized", {}).get("speedup")]
        if optimized:
            said.append(f"the paper's recipe trained {' and '.join(optimized)} as fast as the fp32 baseline")
        auto = configs.get("wikitext2", {}).get("auto")
        if auto:
            said.append(f"`auto` trained GPT-2 {_ratio(auto['speedup'], auto['speedup_ci'])} as fast at "
                        f"{100 * auto['mfu']:.1f} % MFU")
        text = ": ".join(said[:2]) + "".join(f"; {part}" for part in said[2:]) + "."
        text += _reference_sentence(summary.get("reference")) + _plan_sentences(summary["plans"])
        paragraphs.append(f"{text} More in [the GPU report]({link_prefix}gpu/{gpu}/README.md).")
    return "\n\n".join(paragraphs)


def _reference_sentence(reference: dict | None) -> str:
    if not reference or "ratios" not in reference:
        return ""
    key = next(k for k in reference["ratios"] if k.startswith(f"task {reference['precision']} eager"))
    ratio = reference["ratios"][key]
    return (f" Its {reference['precision']} eager step ran at {_ratio(ratio['mean'], ratio['ci'])} the speed of a "
            f"minimal plain-PyTorch GPT-2 (`{reference['reference']}`).")


def _plan_sentences(plans: dict) -> str:
    text = ""
    fastest = fastest_plan_step(plans.get("wikitext2", {}))
    if fastest is not None and fastest["candidate"] != plans["wikitext2"]["choice"]:
        even = fastest.get("break_even_samples")
        text += (f" GPT-2's fastest step in `plan()`, {fastest['candidate']}, is "
                 f"{_ratio(fastest['speedup'], (fastest['speedup_ci_low'], fastest['speedup_ci_high']))} as fast as the "
                 f"fp32 baseline's at {_percent(fastest['mfu'], fastest['mfu_ci'])} MFU"
                 + ("" if even is None else f", but its compiling repays only from {even:,.0f} sequences") + ".")
    resnet = plans.get("cifar10")
    if resnet and "error" not in resnet:
        text += (f" For ResNet-50 over the paper's run length `plan()` chose {resnet['choice']}, "
                 f"{_ratio(resnet['speedup'], resnet['speedup_ci'])} per step" + (
                     "" if resnet.get("speedup_over_run") is None else
                     f", {resnet['speedup_over_run']:.2f}× over the run with its compiling") + ".")
    return text


def _replace_block(text: str, block: tuple[str, str], body: str, where: str) -> str:
    start, end = block
    if start not in text or end not in text:
        raise ValueError(f"{where} has no {start.strip()} ... {end} block")
    return re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: start + body + end, text, flags=re.S)


def readme_gpu_block(repo_root: str | Path) -> str:
    """README.md's GPU block as `write_gpu_blocks` writes it (markers included)."""
    return README_BLOCK[0] + gpu_result_text(Path(repo_root) / "reports") + "\n" + README_BLOCK[1]


def write_gpu_blocks(repo_root: str | Path) -> None:
    """Rewrite the GPU blocks of README.md and reports/README.md from the newest clean-commit campaigns."""
    root = Path(repo_root)
    readme = root / "README.md"
    body = gpu_result_text(root / "reports") + "\n"
    readme.write_text(_replace_block(readme.read_text(), README_BLOCK, body, "README.md"))
    index = root / "reports" / "README.md"
    lines = gpu_campaign_lines(root / "reports")
    body = "\n".join(lines[1:-2]) + "\n" if lines else ""
    index.write_text(_replace_block(index.read_text(), INDEX_BLOCK, body, "reports/README.md"))
