"""The chapters live in JupyterLab, driven by a real browser (Playwright + Debian's Chromium).

A JupyterLab server on 127.0.0.1 (free port, a token, its own config, runtime, settings and
IPython dirs under tmp; a copy of notebooks/, so nothing in the checkout is saved over) opens a
chapter in Chromium, runs Lab's "Run All Cells" command, waits until the kernel is idle and every
code cell has an execution count, and fails on:

- any JavaScript error on the page (`pageerror`, console errors) or any error output in a cell;
- a timeline figure whose bars do not start at distinct times across at least half its time axis
  (read from the drawn plot, `gd._fullData`): what JupyterLab draws comes from the figure's
  plotly JSON, not from the HTML the static book uses;
- in chapter 13: the schedule explorer's figure not changing when a control moves, or its
  "Run on cluster" button failing after Run All stopped the chapter's cluster.

Nothing is left behind: every process the server started (kernels, ipyparallel controllers and
engines, watchdogs) carries a marker in its environment and is killed at the end.

    .venv/bin/python -m pytest -m book tests/test_lab.py
    PIPELIB_LAB_CHAPTERS=04,12 ...   which chapters (default: LAB_CHAPTERS below)

Chromium comes from Debian (/usr/bin/chromium; Playwright's own browser download is not used).
Without it the test is skipped, except under CI=true, where it fails.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
LAB_MARK = "PIPELIB_LAB_TEST"

# Chapters run in full under Lab: 13 (the engine cluster, its pipeline timelines, the schedule
# explorer widget and its "Run on cluster" after the chapter stopped its cluster), about 35 s on
# 2 cores. Every chapter from 13 on whose code uses ipywidgets is added automatically. Chapters 04
# (the cluster's first figures) and 12 (1F1B's timelines) ran here too until CI's time went to
# the late chapters and issue 26's runs; PIPELIB_LAB_CHAPTERS=04,12 still runs them.
LAB_CHAPTERS = ["13"]
WIDGET_USE = re.compile(r"ipywidgets|\bexplorer\(")
CELL_TIMEOUT_S = 600

# Console messages JupyterLab itself logs on a healthy page; anything else fails the test.
LAB_OWN_CONSOLE = (
    # the server answers 404 to Lab's probe for a workspace that does not exist yet
    re.compile(r"Failed to load resource: the server responded with a status of 404.*"),
)


def _chapters() -> list[Path]:
    wanted = os.environ.get("PIPELIB_LAB_CHAPTERS")
    numbers = [n.strip() for n in wanted.split(",")] if wanted else list(LAB_CHAPTERS)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not wanted:  # and every chapter from 13 on whose code uses ipywidgets
        for nb in notebooks:
            code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                           if c["cell_type"] == "code")
            if nb.name[:2] >= "13" and WIDGET_USE.search(code) and nb.name[:2] not in numbers:
                numbers.append(nb.name[:2])
    return [nb for nb in notebooks if nb.name[:2] in numbers]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marked(mark: str) -> list:
    """Every live process whose environment carries this test's marker."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(LAB_MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _kill_marked(mark: str, grace: float = 5.0) -> list[int]:
    from pipelib.runtime.watchdog import terminate

    terminate(_marked(mark), grace)
    return [p.pid for p in _marked(mark)]


def _api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{base}{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebooks/; killed with all it started."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    shutil.copytree(ROOT / "notebooks", root / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "conftest.py"))
    settings = tmp / "settings"
    for plugin, values in {
        # no "Would you like to get notified about official Jupyter news?" pop-up, no fetch
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                        "checkForUpdates": False},
        "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    }.items():
        f = settings / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    config = tmp / "config"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    mark, token, port = secrets.token_hex(8), secrets.token_hex(16), _free_port()
    env = {**os.environ, LAB_MARK: mark, "JUPYTER_CONFIG_DIR": str(config),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_DATA_DIR": str(tmp / "data"),
           "IPYTHONDIR": str(tmp / "ipython"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "lab.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log = (tmp / 'lab.log').read_text()[-3000:]
                    raise AssertionError(f"JupyterLab did not start:\n{log}") from None
                time.sleep(0.5)
        yield dict(base=base, token=token, root=root, log=tmp / "lab.log")
    finally:
        try:  # a kernel that exits stops its cluster (pipelib's watchdog) within seconds
            for k in _api(base, token, "/api/kernels"):
                _api(base, token, f"/api/kernels/{k['id']}", method="DELETE")
        except Exception:
            pass
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        left = _kill_marked(mark)
        log.close()
        assert not left, f"processes started by JupyterLab still alive: {left}"


# the notebook panel of a path (window.jupyterapp: LabApp.expose_app_in_browser), not the
# current widget: Lab may restore other documents around it
PANEL_JS = """path => {
  const app = window.jupyterapp;
  if (!app) return null;
  for (const w of app.shell.widgets('main'))
    if (w.context && w.context.path === path && w.sessionContext) return w;
  return null;
}"""

# what a notebook panel holds, read in the page
STATE_JS = f"""path => {{
  const w = ({PANEL_JS})(path);
  if (!w || !w.content) return null;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  const cells = w.content.widgets.filter(c => c.model.type === 'code');
  const errors = [];
  cells.forEach((c, i) => {{
    for (const o of c.model.outputs.toJSON()) {{
      if (o.output_type === 'error')
        errors.push(`code cell ${{i}}: ${{o.ename}}: ${{o.evalue}}`);
    }}
  }});
  return {{status: kernel ? kernel.status : 'none', cells: cells.length,
          done: cells.filter(c => c.model.executionCount !== null).length, errors,
          queued: cells.filter(c => c.promptNode && c.promptNode.textContent.includes('*')).length}};
}}"""

# every drawn plotly figure of the notebook: title, and the bars' starts against the time axis
FIGURES_JS = """() => Array.from(document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot')).map(gd => {
  const bars = (gd._fullData || []).filter(t => t.type === 'bar' && t.orientation === 'h');
  const starts = [];
  for (const t of bars) {
    const n = (t.x || []).length;
    const many = Array.isArray(t.base) || ArrayBuffer.isView(t.base);
    for (let i = 0; i < n; i++) starts.push(many ? Number(t.base[i]) : Number(t.base || 0));
  }
  const xa = gd._fullLayout && gd._fullLayout.xaxis;
  const title = gd.layout && gd.layout.title ? (gd.layout.title.text || gd.layout.title) : '';
  return {title: String(title), timeline: bars.length > 0 && bars.some(t => t.base !== undefined),
          starts, range: xa ? xa.range.map(Number) : null};
})"""


def _timeline_problems(figures: list[dict]) -> list[str]:
    """Timelines whose bars pile up: fewer than 3 distinct starts, or spread over < half the axis."""
    bad = []
    for f in figures:
        if not f["timeline"]:
            continue
        starts = [s for s in f["starts"] if s == s]  # drop NaN
        lo, hi = f["range"] or (0, 0)
        spread = (max(starts) - min(starts)) if starts else 0.0
        distinct = len({round(s, 9) for s in starts})
        if distinct < 3 or not hi > lo or spread < 0.5 * (hi - lo):
            bad.append(f"{f['title']!r}: {distinct} distinct bar starts spanning {spread:.3g} of "
                       f"the axis [{lo:.3g}, {hi:.3g}] (bars piled up: the figure's plotly JSON "
                       "lost its arrays, see pipelib/viz/display.py)")
    return bad


def _open(chromium, lab, chapter: Path):
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: errors.append(f"console.error: {m.text}")
            if m.type == "error" and not any(p.fullmatch(m.text) for p in LAB_OWN_CONSOLE) else None)
    outside: list[str] = []

    def route(r):
        host = r.request.url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        if host in ("127.0.0.1", "localhost") or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    # ?reset: an empty workspace, not the documents the previous chapter left open
    page.goto(f"{lab['base']}/lab/tree/notebooks/{chapter.name}?reset&token={lab['token']}")
    path = f"notebooks/{chapter.name}"
    page.wait_for_function(f"""path => {{ const w = ({PANEL_JS})(path); if (!w) return false;
        const s = w.sessionContext.session;
        return !!(s && s.kernel && s.kernel.status === 'idle'); }}""", arg=path, timeout=120_000)
    return page, errors, outside


def _run_all(page, path: str, timeout_s: float) -> dict:
    page.evaluate(f"""path => {{ const w = ({PANEL_JS})(path);
        window.jupyterapp.shell.activateById(w.id);
        window.jupyterapp.commands.execute('notebook:run-all-cells');  // not awaited: polled
        return true; }}""", path)
    deadline, state, idle_since = time.monotonic() + timeout_s, None, None
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        state = page.evaluate(STATE_JS, path)
        if state["errors"]:
            return state
        finished = (state["status"] == "idle" and state["done"] == state["cells"]
                    and state["queued"] == 0)
        if finished:  # idle twice in a row, a second apart: no cell is about to start
            if idle_since is not None:
                return state
            idle_since = time.monotonic()
        else:
            idle_since = None
    raise AssertionError(f"Run All did not finish within {timeout_s:.0f} s: {state}")


def _explorer_moves(page) -> None:
    """Move the schedule explorer's schedule dropdown; its figure must change; run on cluster."""
    select = page.locator(".jp-OutputArea .widget-dropdown select").filter(
        has=page.locator("option", has_text="zb_h1")).first
    select.scroll_into_view_if_needed()
    box = select.locator("xpath=ancestor::div[contains(@class,'widget-vbox')][1]")
    def titles():
        return box.evaluate(
            "el => Array.from(el.querySelectorAll('.js-plotly-plot')).map(g => g.layout.title.text)")
    before = titles()
    assert before and "zb_h1" in before[0], f"the explorer's figures are not drawn: {before}"
    select.select_option("gpipe")
    page.wait_for_function("el => { const g = el.querySelector('.js-plotly-plot');"
                           " return g && g.layout.title.text.startsWith('gpipe'); }",
                           arg=box.element_handle(), timeout=30_000)
    assert titles() != before
    # Run All ran the last cell, cluster.stop(): the button starts it again, then measures
    box.locator("button", has_text="Run on cluster").click()
    page.wait_for_function("el => /measured step|color:#b00020/.test(el.innerHTML)",
                           arg=box.element_handle(), timeout=120_000)
    report = box.inner_text()
    assert "measured step" in report, f"Run on cluster failed after Run All: {report[-500:]}"


@pytest.mark.parametrize("chapter", _chapters(), ids=lambda p: p.stem)
def test_chapter_runs_all_cells_in_jupyterlab(chromium, lab, chapter):
    t0 = time.monotonic()
    page, errors, outside = _open(chromium, lab, chapter)
    try:
        opened = time.monotonic() - t0
        state = _run_all(page, f"notebooks/{chapter.name}", timeout_s=CELL_TIMEOUT_S)
        ran = time.monotonic() - t0 - opened
        assert not state["errors"], f"{chapter.name}: error outputs:\n" + "\n".join(state["errors"])
        page.wait_for_timeout(1500)  # outputs render after the kernel goes idle
        figures = page.evaluate(FIGURES_JS)
        # chapters 10-17 draw a timeline; 01-09 and 18-19 (checkpoints, launchers) have none to draw
        assert any(f["timeline"] for f in figures) or not "10" <= chapter.name[:2] <= "17", (
            f"{chapter.name}: no timeline figure drawn (of {len(figures)} figures)")
        bad = _timeline_problems(figures)
        assert not bad, f"{chapter.name}: timelines drawn wrong in JupyterLab:\n" + "\n".join(bad)
        shots = os.environ.get("PIPELIB_LAB_SHOTS")  # a folder: every figure as JupyterLab drew it
        if shots:
            os.makedirs(shots, exist_ok=True)
            plots = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot")
            for i in range(plots.count()):
                plots.nth(i).scroll_into_view_if_needed()
                plots.nth(i).screenshot(path=os.path.join(shots, f"{chapter.stem}-{i}.png"))
        if "explorer(" in chapter.read_text():
            _explorer_moves(page)
        assert not errors, f"{chapter.name}: JavaScript errors in JupyterLab:\n" + "\n".join(errors[:20])
        assert not outside, f"{chapter.name}: the page asked other hosts: {outside[:10]}"
        print(f"\n{chapter.name}: opened in {opened:.0f} s, Run All {ran:.0f} s, "
              f"{len(figures)} figures ({sum(f['timeline'] for f in figures)} timelines), "
              f"total {time.monotonic() - t0:.0f} s")
    finally:
        try:  # stop this chapter's kernel (and with it any cluster it left running)
            page.evaluate(f"path => ({PANEL_JS})(path).sessionContext.shutdown()",
                          f"notebooks/{chapter.name}")
        except Exception:
            pass
        page.close()
