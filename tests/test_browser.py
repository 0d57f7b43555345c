"""The notebooks as a reader meets them: JupyterLab in a real browser (Chromium via Playwright).

Starts JupyterLab on 127.0.0.1 as the README says, with `scripts/explore.sh`, in a temporary
checkout whose notebooks have their parameters set to the smoke profile, a stand-in and a
temporary reports folder. Opens notebook 01 and the explorer from the working copies in lab/,
checks that opening does not mark them modified, runs all their cells from the Run menu, and
checks that no cell failed and every figure is an image. In the explorer it changes two controls
(precision, k) and checks that the panel redrew each time, then saves it: the saved copy is
lab/'s and the checkout's notebooks/ is as it was. Screenshots go to ``reports/screenshots/`` (or
``$TRAINOPT_SCREENSHOTS``). Stops what it started.

Needs a Chromium binary (Debian: ``apt-get install chromium``) and the Playwright client (the
``dev`` extra); `.ci/run` installs both. Skipped where either is missing.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import copy_smoke_runs
from trainopt_core.distributed import find_free_port

REQUIRED = os.environ.get("TRAINOPT_REQUIRE_BROWSER") == "1"  # .ci/run: fail, never skip
try:
    from playwright import sync_api
except ImportError:
    if REQUIRED:
        raise
    pytest.skip("the Playwright client is not installed (dev extra)", allow_module_level=True)
CHROMIUM = next((path for path in (os.environ.get("TRAINOPT_CHROMIUM"), shutil.which("chromium"),
                                   shutil.which("chromium-browser"), shutil.which("google-chrome")) if path), None)
if CHROMIUM is None and REQUIRED:
    raise RuntimeError("TRAINOPT_REQUIRE_BROWSER=1 but no Chromium binary (apt-get install chromium)")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")]

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = Path(os.environ.get("TRAINOPT_SCREENSHOTS", ROOT / "reports" / "screenshots"))
RUN_TIMEOUT_MS = 8 * 60 * 1000


def _copy_notebook(name: str, folder: Path, reports: Path) -> Path:
    """The notebook with its parameters cell set to the smoke profile, one seed, the stand-ins
    and `reports`; everything else as committed (metadata included)."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values = dict(profile='"smoke"', seeds="1", tasks='["wikitext2"]', reports_dir=json.dumps(str(reports)),
                  data_policy='"standin"')
    cell.source = "\n".join(re.sub(r"^(\w+) = .*$", lambda m: f"{m[1]} = {values[m[1]]}" if m[1] in values else m[0],
                                   line) for line in cell.source.splitlines())
    path = folder / name
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory, smoke_reports):
    """`scripts/explore.sh` in a temporary checkout (the script and the notebooks), serving on
    127.0.0.1; (url, token, its lab/ folder, the checkout)."""
    checkout = tmp_path_factory.mktemp("checkout")
    reports = checkout / "reports"
    (checkout / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "explore.sh", checkout / "scripts")
    (checkout / "notebooks").mkdir()
    for name in ("01_main_results.ipynb", "explorer.ipynb"):
        _copy_notebook(name, checkout / "notebooks", reports)
    folder = checkout / "lab"
    # the runs the explorer reads (notebook 01 reuses them), so either test can run alone: the
    # session's shared smoke runs of baseline, optimized and auto (with its plan, which the
    # explorer re-chooses from)
    copy_smoke_runs(smoke_reports, reports, tasks=("wikitext2",))
    settings = checkout / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # every cell in the page (no virtual scrolling), so each output can be checked; no news pop-up
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    apputils = settings.parent / "apputils-extension"
    apputils.mkdir()
    (apputils / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = find_free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(checkout / "user-settings"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # this environment's jupyter
    env.pop("MPLBACKEND", None)  # the kernel's own default, as a user has it
    log = checkout / "jupyterlab.log"
    server = subprocess.Popen(
        ["bash", str(checkout / "scripts" / "explore.sh"), "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}"],  # as root, the script adds --allow-root
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield url, token, folder, checkout
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def _open(browser, lab, name: str):
    url, token, _, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    page.goto(f"{url}/lab/tree/{name}?reset&token={token}")  # reset: only this notebook open
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")  # the kernel is up
    return page


def _assert_opened_unmodified(page, name: str) -> None:
    """JupyterLab marks a notebook modified when the kernel's language_info differs from the
    stored one: checked where this Python is the notebooks' (tests/test_notebooks.py skips its
    metadata check on another Python version for the same reason)."""
    stored = nbformat.read(ROOT / "notebooks" / name, as_version=4).metadata["language_info"].get("version")
    if stored == platform.python_version():
        assert not _is_dirty(page, name), "opening the notebook marked it modified"


def _is_dirty(page, name: str) -> bool:
    return page.locator(f".lm-TabBar-tab.jp-mod-dirty:has-text('{name}')").count() > 0


def _run_all(page) -> None:
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
    page.wait_for_function(
        """() => { const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];
                   return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent)); }""",
        timeout=RUN_TIMEOUT_MS)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")


def _errors(page) -> list[str]:
    """The tracebacks among the cells' outputs."""
    texts = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    return [text[:400] for text in texts if "Traceback" in text]


def _shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_notebook_01_opens_unmodified_runs_and_shows_its_figures_as_images(lab, browser):
    page = _open(browser, lab, "01_main_results.ipynb")
    page.wait_for_timeout(2000)  # JupyterLab updates the kernel metadata shortly after the kernel starts
    _assert_opened_unmodified(page, "01_main_results.ipynb")
    _run_all(page)
    _shot(page, "01_main_results")
    assert _errors(page) == []
    images = page.locator(".jp-OutputArea-output img[src^='data:image/png'], .jp-OutputArea-output img[src^='blob:']")
    assert images.count() >= 1  # the quality-vs-time figure of the task
    assert "<Figure size" not in page.locator(".jp-Notebook").inner_text()
    page.close()


def _steps_to_a_budget_some_candidate_fits(checkout: Path) -> int:
    """Slider steps (5 % of the fp32 baseline's peak each) to the first budget at or above the
    smallest peak the smoke plan measured: under a busy machine's time budget the plan may not
    have measured the splits that fit 50 %."""
    from trainopt_core.reporting import plans as planning

    plan = planning.load_plans(checkout / "reports" / "smoke" / "plans", ["wikitext2"])["wikitext2"]
    smallest = min(row["peak_memory_bytes"] for row in plan.rows if row["peak_memory_bytes"] is not None)
    return max(1, math.ceil(100 * smallest / plan.baseline["peak_memory_bytes"] / 5))


def test_explorer_panel_redraws_when_two_controls_change(lab, browser):
    page = _open(browser, lab, "explorer.ipynb")
    page.wait_for_timeout(2000)
    _assert_opened_unmodified(page, "explorer.ipynb")
    _run_all(page)
    assert _errors(page) == []
    panel = page.locator(".widget-vbox .widget-output").first  # the components panel (the re-plan panel follows)
    panel.wait_for()
    panel.scroll_into_view_if_needed()
    page.wait_for_function("el => el.textContent.includes('memory: activations')", arg=panel.element_handle())
    _shot(page, "explorer_1_as_opened")
    before = panel.text_content()
    assert "NOT WikiText-2" in before  # the stand-in is labeled in the panel
    # the default view (optimized: checkpointed, its curve its twin's on the interleaved-timing
    # axis) draws its quality curve, and the rendered default view below the panel does too
    assert panel.locator("img").count() >= 1, "the panel's default view has no quality-curve figure"
    precision = page.locator(".widget-dropdown:has(.widget-label:text-is('precision')) select")
    # the default is what the optimized runs ran (fp32 on a CPU without bf16 instructions): choose another
    precision.select_option("bf16" if precision.input_value() == "fp32" else "fp32")
    page.wait_for_function("([el, old]) => el.textContent !== old && el.textContent.includes('memory: activations')",
                           arg=[panel.element_handle(), before])
    after_precision = panel.text_content()
    _shot(page, "explorer_2_precision_changed")
    handle = page.locator(".widget-hslider:has(.widget-label:text-is('k')) .noUi-handle").first
    handle.click()  # focus the slider's handle, then down to k = 3 with the keyboard: with adaptive k
    for _ in range(3):  # the batch splits into k_min = min(k, 4) micro-batches, so eq. 8 moves
        page.keyboard.press("ArrowLeft")
    page.wait_for_function("([el, old]) => el.textContent !== old && el.textContent.includes('memory: activations')",
                           arg=[panel.element_handle(), after_precision])
    _shot(page, "explorer_3_k_lowered")
    assert panel.text_content() != after_precision != before
    # the re-plan panel: a memory budget chooses again from the plan's measurements
    replan = page.locator(".widget-vbox .widget-output").last
    replan.scroll_into_view_if_needed()
    page.wait_for_function("el => el.textContent.includes('no memory budget')", arg=replan.element_handle())
    unbudgeted = replan.text_content()
    budget = page.locator(".widget-hslider:has(.widget-label:text-matches('memory budget')) .noUi-handle").first
    budget.click()
    for _ in range(_steps_to_a_budget_some_candidate_fits(lab[3])):  # from 0, in steps of 5 % of the fp32 peak
        page.keyboard.press("ArrowRight")
    page.wait_for_function("([el, old]) => el.textContent !== old && el.textContent.includes('a memory budget of')",
                           arg=[replan.element_handle(), unbudgeted])
    _shot(page, "explorer_4_replanned_with_a_budget")
    # saved (as JupyterLab's autosave does every two minutes): into lab/, never into notebooks/
    _, _, folder, checkout = lab
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.jp-mod-dirty')")
    saved = nbformat.read(folder / "explorer.ipynb", as_version=4)
    assert any(c.get("outputs") for c in saved.cells if c.cell_type == "code"), "the save did not reach lab/"
    as_written = checkout / "as_written"
    as_written.mkdir()
    for source in (checkout / "notebooks").glob("*.ipynb"):
        expected = _copy_notebook(source.name, as_written, checkout / "reports").read_bytes()
        assert source.read_bytes() == expected, f"notebooks/{source.name} changed while exploring"
    page.close()
