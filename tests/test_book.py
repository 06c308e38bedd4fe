"""The static book: it builds with warnings as errors, its pages load nothing from another host,
and a headless Chromium, with every outside request blocked, finds the page's plotly figures
drawn, its equations typeset and its widgets rendered.

    .venv/bin/python -m pytest -m book tests/test_book.py
    PIPELIB_BOOK_BUILT=1 ...   reuse the book already in _build/html (e.g. made by `make book`)

The browser needs Debian's `chromium` (apt-get install chromium): without it the browser test
is skipped, except under CI=true, where it fails.
"""
from __future__ import annotations

import http.server
import os
import re
import shutil
import socketserver
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

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Requests Chromium makes on its own (updates, clock, sign-in), whatever the page: not the book's.
CHROMIUM_OWN_HOSTS = {
    "update.googleapis.com", "clients2.google.com", "accounts.google.com",
    "optimizationguide-pa.googleapis.com", "safebrowsing.googleapis.com",
    "clientservices.googleapis.com", "redirector.gvt1.com", "edgedl.me.gvt1.com",
    # Chromium 150 preconnects to its default search engine and sign-in, even for a data: URL
    "www.google.com", "android.clients.google.com",
}

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
    The copy's config does not execute notebooks, except a chapter whose outputs hold a widget:
    the build runs that one again (nbval does not record widget state, which the page needs).
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
                      for cell in nb.cells for out in cell.get("outputs", []))
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
    chapter runs again in the build, into _build/html. PIPELIB_BOOK_BUILT=1 reuses _build/html.
    """
    if os.environ.get("PIPELIB_BOOK_BUILT") == "1":
        assert (BUILD_HTML / "index.html").is_file(), (
            f"PIPELIB_BOOK_BUILT=1 but {BUILD_HTML}/index.html does not exist: run `make book`"
        )
        return BUILD_HTML
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

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    served: list = []

    def log_request(self, code="-", size="-"):
        self.served.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, *args):
        pass


class _Trap(socketserver.StreamRequestHandler):
    """The proxy every outside request is sent to: it records the request and refuses it."""
    seen: list = []

    def handle(self):
        line = self.rfile.readline(8192).decode("latin1").strip()
        if line:
            self.seen.append(line)
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def _host(request_line: str) -> str:
    # "CONNECT host:443 HTTP/1.1" or "GET http://host/path HTTP/1.1"
    target = request_line.split()[1] if len(request_line.split()) > 1 else request_line
    target = target.split("://", 1)[-1]
    return target.split("/", 1)[0].rsplit(":", 1)[0]


@pytest.fixture
def browser_page(request) -> tuple[Path, str]:
    which, page = request.param
    return request.getfixturevalue("probe_book" if which == "probe" else "built_book"), page


@pytest.fixture
def local_servers(browser_page):
    """An http server for the built book and a trap proxy, both on 127.0.0.1, free ports."""
    html_dir, _ = browser_page

    class Handler(_QuietHandler):
        served = []

        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(html_dir), **kw)

    class Trap(_Trap):
        seen = []

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    trap = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Trap)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (web, trap)]
    for t in threads:
        t.start()
    yield web.server_address[1], trap.server_address[1], Handler.served, Trap.seen
    for s in (web, trap):
        s.shutdown()
        s.server_close()


@pytest.fixture(scope="session")
def chromium():
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} not found: apt-get install chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: the browser check is required)")
        pytest.skip(message)
    return CHROMIUM


@pytest.mark.parametrize(
    "browser_page",
    [("probe", "book_probe.html")] + [("book", page) for page in BOOK_PAGES],
    indirect=True, ids=lambda p: p[1].removesuffix(".html"),
)
def test_browser_draws_figures_math_and_widgets(chromium, browser_page, local_servers, tmp_path):
    html_dir, page = browser_page
    port, trap_port, served, outside = local_servers
    source = (html_dir / page).read_text()
    n_figures = source.count('class="plotly-graph-div"')
    n_math = len(re.findall(r'class="math notranslate', source))
    n_widgets = source.count('type="application/vnd.jupyter.widget-view+json"')
    assert n_figures >= 1, f"{page} has no plotly figure to check"
    if page == "book_probe.html":
        assert n_math >= 1 and n_widgets >= 1, "the probe page lost its equation or its widget"

    shots = ROOT / "_build" / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    screenshot = shots / (page.replace("/", "_").removesuffix(".html") + ".png")
    cmd = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dns-prefetch-disable",
        "--disable-features=NetworkTimeServiceQuerying,NetworkPrediction,PreconnectToSearch,MediaRouter",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
        # whatever still asks for an outside host goes to the trap, which records and refuses it
        f"--proxy-server=http://127.0.0.1:{trap_port}",
        "--hide-scrollbars", "--window-size=1280,4000", "--virtual-time-budget=10000",
        f"--screenshot={screenshot}", "--dump-dom", f"http://127.0.0.1:{port}/{page}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    dom = proc.stdout
    assert proc.returncode == 0 and "</html>" in dom, (
        f"chromium failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    )
    (shots / screenshot.name.replace(".png", ".dom.html")).write_text(dom)

    drawn = dom.count('<div class="plot-container plotly"')
    assert drawn >= n_figures and 'class="main-svg"' in dom, (
        f"{drawn} of {n_figures} plotly figures drawn on {page}: plotly.min.js missing or "
        "loaded after the figures' inline scripts (book/_ext/offline_assets.py)"
    )
    typeset = dom.count("<mjx-container")
    assert typeset >= n_math, f"{typeset} of {n_math} equations typeset by MathJax on {page}"
    rendered = dom.count('class="widget-subarea"')
    assert rendered >= n_widgets and (n_widgets == 0 or "jupyter-widgets" in dom), (
        f"{rendered} of {n_widgets} widgets rendered from saved state on {page}"
    )

    missing = sorted({path for path, code in served if code >= 400 and path != "/favicon.ico"})
    assert not missing, f"{page} asked the book for files it does not have: {missing}"
    asked = [line for line in outside if _host(line) not in CHROMIUM_OWN_HOSTS]
    assert not asked, f"{page} tried to reach other hosts (blocked): {asked}"
    assert screenshot.is_file()
