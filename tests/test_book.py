"""The static book: it builds with warnings as errors, its pages load nothing from another host,
and a headless Chromium (Playwright, Debian's browser), with every outside request the page makes
blocked, finds the page's plotly figures drawn, its equations typeset and its widgets rendered,
with no JavaScript error, each page under 1.5 MB and its first figure drawn within 2 s (best of
up to 3 fresh loads), every plotly slider changing its figure when moved, and no ipywidget on a
chapter's page (its callbacks cannot run there: it would look live and do nothing).

    .venv/bin/python -m pytest -m book tests/test_book.py
    PIPELIB_BOOK_BUILT=1 ...   reuse the book already in _build/html (e.g. made by `make book`)
    PIPELIB_BOOK_BUILT=DIR ... reuse the book built in DIR (its html folder)

The browser needs Debian's `chromium` (apt-get install chromium) and Playwright for Python
(the dev extra; its own browser download is not used): without them the browser test is
skipped, except under CI=true, where it fails. Timings are printed (`-s`).
"""
from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
BUILD_HTML = ROOT / "_build" / "html"
PROBE = ROOT / "tests" / "fixtures" / "book_probe.ipynb"
# the venv's jupyter-book: notebooks then run on the venv's kernel (jupyter_client replaces the
# kernelspec's `python` by the interpreter that runs jupyter-book)
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"

# Pages of the real book the browser opens, one line each (add chapters as they come). The
# probe page (tests/fixtures/book_probe.ipynb, built as a one-page book with the same
# _config.yml) is always opened too: it holds an equation, a figure and a widget, so the
# plumbing is checked whatever the chapters contain.
BOOK_PAGES = [
    "book/intro.html",
    "notebooks/01_hardware.html",
    "notebooks/02_deep_learning.html",
    "notebooks/03_transformers.html",
    "notebooks/04_parallel_computing.html",
    "notebooks/05_point_to_point.html",
    "notebooks/06_collectives.html",
    "notebooks/10_pipelines_naive.html",
    "notebooks/11_gpipe.html",
    "notebooks/12_one_f_one_b.html",
    "notebooks/13_zero_bubble.html",
]

# cell tags that keep a cell's outputs out of the book (myst-nb)
HIDDEN_OUTPUT = {"remove-output", "remove_output", "remove-cell", "remove_cell"}
# Page weight and speed, measured in Chromium from a local server
MAX_PAGE_BYTES = 1_500_000
MAX_FIRST_FIGURE_S = 2.0

# <script src="http..."> <link href="//..."> and the like, in any attribute order
OUTSIDE_TAG = re.compile(
    r"<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href)\s*=\s*"
    r"[\"']?(?:https?:)?//[^\s\"'>]+",
    re.I,
)
OUTSIDE_CSS = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"']?)(?:https?:)?//[^\s\"')]+", re.I)
SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc=\"([^\"]+)\"", re.I)


def _jupyter_book_build(source: Path, log: Path) -> float:
    """Build `source` into source/_build/html with warnings as errors; return seconds."""
    assert JUPYTER_BOOK.exists(), f"{JUPYTER_BOOK} missing: run `make venv`"
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(
            [str(JUPYTER_BOOK), "build", str(source), "--warningiserror", "--nitpick",
             "--keep-going", "--all"],
            stdout=out, stderr=subprocess.STDOUT, cwd=source, timeout=3600,
        )
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, (
        f"jupyter-book build {source} failed (exit {proc.returncode}, {seconds:.0f} s); "
        f"full log in {log}:\n{text[-6000:]}"
    )
    return seconds


@pytest.fixture(scope="session")
def book_assets():
    """The offline JavaScript in book/_vendor/static (a no-op when already fetched)."""
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "book_assets.sh"), sys.executable],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"tools/book_assets.sh failed:\n{proc.stdout}\n{proc.stderr}"


def _staged_from_nbval(executed: dict) -> Path | None:
    """A copy of the book whose chapters carry the outputs nbval computed in this session.

    None unless every chapter of the toc ran under nbval in this session (notebooks/conftest.py).
    The copy's config does not execute notebooks, except a chapter whose outputs hold a widget
    the page shows: the build runs that one again (nbval does not record widget state, which the
    page needs). A widget in a `remove-output` cell (live in JupyterLab, hidden in the book)
    needs no state.
    """
    import nbformat
    import yaml

    chapters = [f for f in _toc_files() if (ROOT / f"{f}.ipynb").is_file()]
    if not chapters or any((ROOT / f"{f}.ipynb").resolve() not in executed for f in chapters):
        return None
    stage = ROOT / "_build" / "staged"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "notebooks").mkdir(parents=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    (stage / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(ROOT / "_toc.yml", stage / "_toc.yml")
    (stage / "book").symlink_to(ROOT / "book")
    for f in chapters:
        nb = nbformat.read(str(executed[(ROOT / f"{f}.ipynb").resolve()]), as_version=4)
        widgets = any("application/vnd.jupyter.widget-view+json" in out.get("data", {})
                      for cell in nb.cells for out in cell.get("outputs", [])
                      if not HIDDEN_OUTPUT & set(cell.get("metadata", {}).get("tags", [])))
        if widgets:
            nb = nbformat.read(str(ROOT / f"{f}.ipynb"), as_version=4)
            nb.metadata["mystnb"] = {"execution_mode": "force"}
        (stage / f"{f}.ipynb").parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(stage / f"{f}.ipynb"))
    return stage


@pytest.fixture(scope="session")
def built_book(book_assets, request) -> Path:
    """The whole book, built once per session with warnings as errors.

    After nbval ran every chapter in this session (`pytest tests notebooks`, as `make test`
    does), the book is built from those executed chapters in _build/staged; otherwise every
    chapter runs again in the build, into _build/html. PIPELIB_BOOK_BUILT=1 reuses _build/html,
    PIPELIB_BOOK_BUILT=DIR the html folder DIR.
    """
    built = os.environ.get("PIPELIB_BOOK_BUILT")
    if built:
        html = BUILD_HTML if built == "1" else Path(built)
        assert (html / "index.html").is_file(), (
            f"PIPELIB_BOOK_BUILT={built} but {html}/index.html does not exist: run `make book`"
        )
        return html
    (ROOT / "_build").mkdir(exist_ok=True)
    stage = _staged_from_nbval(getattr(request.config, "pipelib_executed", {}))
    source = stage or ROOT
    seconds = _jupyter_book_build(source, ROOT / "_build" / "book-build.log")
    how = "from the chapters nbval ran" if stage else "running every chapter"
    print(f"\nbook built in {seconds:.0f} s, {how}")
    return source / "_build" / "html"


@pytest.fixture(scope="session")
def probe_book(book_assets, tmp_path_factory) -> Path:
    """A one-page book from tests/fixtures/book_probe.ipynb with the book's own _config.yml."""
    src = tmp_path_factory.mktemp("probe_book")
    shutil.copy(ROOT / "_config.yml", src / "_config.yml")
    (src / "book").symlink_to(ROOT / "book")  # extension and vendored assets, same paths
    shutil.copy(PROBE, src / "book_probe.ipynb")
    (src / "_toc.yml").write_text("format: jb-book\nroot: book_probe\n")
    seconds = _jupyter_book_build(src, src / "build.log")
    print(f"\nprobe book built in {seconds:.0f} s")
    return src / "_build" / "html"


def _toc_files() -> list[str]:
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    stack = list(toc.get("parts", [])) + list(toc.get("chapters", []))
    while stack:
        entry = stack.pop()
        if "file" in entry:
            files.append(entry["file"])
        stack += entry.get("chapters", []) + entry.get("sections", [])
    return files


def test_book_builds_every_page_of_the_toc(built_book):
    assert (built_book / "index.html").is_file()
    missing = [f for f in _toc_files() if not (built_book / f"{f}.html").is_file()]
    assert not missing, f"pages listed in _toc.yml but not built: {missing}"


def test_index_links_every_written_chapter(built_book):
    """The intro's chapter list: a link for each chapter of the toc, none for a chapter to come."""
    intro = (built_book / "book" / "intro.html").read_text()
    chapters = intro[intro.index('id="chapters"'):]
    targets = re.findall(r'<a class="reference internal" href="([^"#]+)', chapters)
    linked = {Path(t).stem for t in targets}
    written = {Path(f).name for f in _toc_files() if f.startswith("notebooks/")}
    assert written <= linked, f"chapters not linked from the intro: {sorted(written - linked)}"
    dangling = [t for t in targets if not (built_book / "book" / t).resolve().is_file()]
    assert not dangling, f"links to pages that do not exist: {dangling}"
    for line in re.findall(r"<li>(.*?)</li>", chapters, re.S):
        if "(coming)" in line:
            assert "<a " not in line, f"a chapter still to come is a link: {line}"


def test_notebooks_run_on_the_venv_kernel(probe_book):
    """The kernel that executes the book's notebooks is the interpreter running the build."""
    page = (probe_book / "book_probe.html").read_text()
    match = re.search(r"kernel prefix: (\S+)", page)
    assert match, "the probe page lost its `kernel prefix` output"
    assert Path(match.group(1)).resolve() == Path(sys.prefix).resolve(), (
        f"notebooks ran on {match.group(1)}, not on {sys.prefix}: check `jupyter kernelspec list`"
    )


def _pages(html_dir: Path) -> list[Path]:
    return [p for p in html_dir.rglob("*.html") if "_static" not in p.relative_to(html_dir).parts]


@pytest.mark.parametrize("which", ["book", "probe"])
def test_pages_load_nothing_from_another_host(which, request):
    html_dir = request.getfixturevalue("built_book" if which == "book" else "probe_book")
    assert not (ROOT / "_static").exists(), (
        "a root _static/ folder makes Jupyter Book 1 add every .js in it to every page: "
        "put files under book/_vendor/static (tools/book_assets.sh) or book/_ext/static"
    )
    problems = []
    for page in _pages(html_dir):
        text = page.read_text(errors="replace")
        rel = page.relative_to(html_dir)
        problems += [f"{rel}: {m.group(0)}" for m in OUTSIDE_TAG.finditer(text)]
        for src in SCRIPT_SRC.findall(text):
            if "_static/mathjax/" in src and "tex-chtml.js" not in src:
                problems.append(f"{rel}: MathJax component injected as a page script: {src}")
    for css in (html_dir / "_static").rglob("*.css"):
        text = css.read_text(errors="replace")
        problems += [f"{css.relative_to(html_dir)}: {m}" for m in OUTSIDE_CSS.findall(text)]
    assert not problems, "the built book must work offline:\n" + "\n".join(problems[:50])


# ---- browser --------------------------------------------------------------------------------

@pytest.fixture
def browser_page(request) -> tuple[Path, str]:
    which, page = request.param
    return request.getfixturevalue("probe_book" if which == "probe" else "built_book"), page


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def local_server(browser_page):
    """An http server for the built book on 127.0.0.1, a free port."""
    html_dir, _ = browser_page

    class Handler(_QuietHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(html_dir), **kw)

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    yield web.server_address[1]
    web.shutdown()
    web.server_close()


# Installed before any page script: the time the first plotly figure is drawn (ms from the
# start of navigation), whatever draws it.
FIRST_FIGURE_JS = """
window.__firstFigure = null;
new MutationObserver((_, obs) => {
  if (document.querySelector('.js-plotly-plot .main-svg')) {
    window.__firstFigure = performance.now();
    obs.disconnect();
  }
}).observe(document, {childList: true, subtree: true});
"""


def _is_local(url: str) -> bool:
    if url.startswith(("data:", "blob:", "about:")):
        return True
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost")


@pytest.mark.parametrize(
    "browser_page",
    [("probe", "book_probe.html")] + [("book", page) for page in BOOK_PAGES],
    indirect=True, ids=lambda p: p[1].removesuffix(".html"),
)
def test_browser_draws_figures_math_and_widgets(chromium, browser_page, local_server):
    html_dir, page_name = browser_page
    port = local_server
    source = (html_dir / page_name).read_text()
    size = (html_dir / page_name).stat().st_size
    n_figures = source.count('class="plotly-graph-div"')
    n_math = len(re.findall(r'class="math notranslate', source))
    n_widgets = source.count('type="application/vnd.jupyter.widget-view+json"')
    if page_name.startswith("notebooks/") or page_name == "book_probe.html":
        assert n_figures >= 1, f"{page_name} has no plotly figure to check"
    if page_name == "book_probe.html":
        assert n_math >= 1 and n_widgets >= 1, "the probe page lost its equation or its widget"

    context = chromium.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors, outside, missing = [], [], []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: errors.append(f"console.error: {m.text} ({m.location.get('url')})")
            if m.type == "error" and not m.location.get("url", "").endswith("/favicon.ico") else None)
    page.on("response", lambda r: missing.append(r.url) if r.status >= 400
            and not r.url.endswith("/favicon.ico") else None)

    def route(r):  # only the page's own requests: Chromium's background ones never come here
        if _is_local(r.request.url):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.add_init_script(FIRST_FIGURE_JS)
    try:
        page.goto(f"http://127.0.0.1:{port}/{page_name}", wait_until="load", timeout=60_000)
        first_figure_s = 0.0
        if n_figures:
            page.wait_for_function("() => window.__firstFigure !== null", timeout=30_000)
            first_figure_s = page.evaluate("window.__firstFigure") / 1000
        page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length "
                               f">= {n_figures}", timeout=30_000)
        if n_math:
            page.wait_for_function("() => window.MathJax && MathJax.startup && "
                                   "MathJax.startup.promise.then(() => true)", timeout=30_000)
            page.wait_for_function(f"() => document.querySelectorAll('mjx-container').length >= {n_math}",
                                   timeout=30_000)
        if n_widgets:
            page.wait_for_function(f"() => document.querySelectorAll('.widget-subarea').length "
                                   f">= {n_widgets}", timeout=30_000)
        page.wait_for_timeout(500)  # late errors (widget callbacks, typesetting)
        dead_controls = _plotly_sliders_that_do_nothing(page)
        shots = ROOT / "_build" / "browser"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shots / (page_name.replace("/", "_").removesuffix(".html") + ".png"),
                        full_page=True)
        drawn = page.evaluate("() => document.querySelectorAll('.js-plotly-plot .main-svg').length")
    finally:
        context.close()

    print(f"\n{page_name}: {size / 1e6:.2f} MB, first figure at {first_figure_s:.2f} s, "
          f"{n_figures} figures, {n_math} equations, {n_widgets} widgets")
    assert not errors, f"JavaScript errors on {page_name}:\n" + "\n".join(errors[:20])
    assert not dead_controls, f"plotly sliders on {page_name} that change nothing: {dead_controls}"
    if page_name.startswith("notebooks/"):
        # a widget's Python callbacks cannot run in a static page: it would look live and do
        # nothing. Tag its cell `remove-output` (it stays live in JupyterLab) and show a
        # plotly-native control over precomputed states (pipelib.pipeline.explorer_sweep).
        assert n_widgets == 0, f"{page_name} shows {n_widgets} ipywidgets that cannot compute here"
    assert drawn >= n_figures, f"{drawn} of {n_figures} plotly figures drawn on {page_name}"
    assert not missing, f"{page_name} asked the book for files it does not have: {missing}"
    assert not outside, f"{page_name} tried to reach other hosts (blocked): {outside}"
    assert size <= MAX_PAGE_BYTES, (
        f"{page_name} weighs {size / 1e6:.2f} MB (> {MAX_PAGE_BYTES / 1e6} MB): smaller figures "
        "(pipelib.viz), or a widget state saved in the page")
    if page_name == "book_probe.html":  # a test fixture, not a page of the book: no timing
        return
    tries = [first_figure_s]
    while tries[-1] > MAX_FIRST_FIGURE_S and len(tries) < 3:  # the machine may be busy a moment
        tries.append(_first_figure_s(chromium, f"http://127.0.0.1:{port}/{page_name}"))
    if len(tries) > 1:
        print(f"{page_name}: first figure at {' / '.join(f'{t:.2f}' for t in tries)} s in "
              f"{len(tries)} fresh loads")
    assert min(tries) <= MAX_FIRST_FIGURE_S, (
        f"{page_name}: first figure drawn after {', '.join(f'{t:.2f}' for t in tries)} s "
        f"in {len(tries)} fresh loads (> {MAX_FIRST_FIGURE_S} s)")


# what a plotly figure shows: enough to tell that a slider step changed it
FIGURE_STATE_JS = """gd => JSON.stringify([gd.layout.title && gd.layout.title.text,
  (gd._fullData || []).map(t => [t.x && Array.from(t.x), t.base && Array.from(t.base), t.y && Array.from(t.y)])])"""


def _plotly_sliders_that_do_nothing(page) -> list[str]:
    """Click the start of every plotly slider (the static book's controls); list those that
    leave their figure as it was."""
    dead = []
    figures = page.locator(".js-plotly-plot")
    for i in range(figures.count()):
        gd = figures.nth(i)
        rail = gd.locator(".slider-rail-touch-rect")
        if rail.count() == 0:
            continue
        rail.first.scroll_into_view_if_needed()
        before = gd.evaluate(FIGURE_STATE_JS)
        box = rail.first.bounding_box()
        page.mouse.click(box["x"] + 3, box["y"] + box["height"] / 2)
        try:
            page.wait_for_function(f"([gd, before]) => ({FIGURE_STATE_JS})(gd) !== before",
                                   arg=[gd.element_handle(), before], timeout=5_000)
        except Exception:  # playwright's TimeoutError
            dead.append(gd.evaluate("gd => gd.layout.title && gd.layout.title.text") or f"figure {i}")
    return dead


def _first_figure_s(browser, url: str) -> float:
    """Seconds from navigation to the first drawn plotly figure, in a fresh browser context."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    try:
        page = context.new_page()
        page.add_init_script(FIRST_FIGURE_JS)
        page.goto(url, wait_until="load", timeout=60_000)
        page.wait_for_function("() => window.__firstFigure !== null", timeout=30_000)
        return page.evaluate("window.__firstFigure") / 1000
    finally:
        context.close()
