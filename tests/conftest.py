import os
import shutil
import sys
import uuid

import pytest
from leftovers import SESSION_VAR, cluster_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every process this test session starts (kernels, engines, book builds) inherits this mark, so
# the leftover check below sees only our own processes, not those of another run on the machine.
os.environ[SESSION_VAR] = uuid.uuid4().hex


@pytest.fixture(scope="session")
def cluster4():
    """One 4-engine simulated cluster shared by the cluster tests (start-up costs seconds)."""
    from pipelib.runtime.cluster import Cluster

    c = Cluster(4, timeout=30)  # generous: first runs on fresh engines import and count FLOPs
    yield c
    c.stop()


@pytest.fixture(scope="session")
def cpu2():
    """Two real CPU engines (wall clock) shared by the tests that need real processes: the
    overlapped DDP step's real lanes, the ping-pong between two engines. Started on first use."""
    from pipelib.runtime.cluster import Cluster

    c = Cluster(2, device="cpu", timeout=60)
    yield c
    c.stop()


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")  # not session: one sync Playwright at a time per test module
def chromium():
    """Debian's Chromium driven by Playwright (its own browser download is not used): skipped
    where it is missing, a failure under CI=true, where the browser checks are required."""
    problem = None
    if not os.path.exists(CHROMIUM):
        problem = f"{CHROMIUM} not found: apt-get install chromium"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            problem = "playwright missing: pip install -e '.[dev]'"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(problem + " (CI=true: the browser check is required)")
        pytest.skip(problem)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def one_thread():
    """Two OpenMP threads on two shared cores are up to 5x slower than one for small models."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_addoption(parser):
    parser.addoption("--durations-file", default=None, metavar="PATH",
                     help="write every test's setup, call and teardown time to PATH, slowest first "
                          "(what --durations=0 prints), whatever --durations shows on screen")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """`--durations-file`: every phase of every test that ran, kept (`make test` keeps it in
    _build/test-results/ beside the JUnit XML, for CI), while the screen shows the slowest few."""
    path = config.getoption("durations_file")
    if not path:
        return
    reports = [r for rs in terminalreporter.stats.values() for r in rs
               if getattr(r, "when", None) and hasattr(r, "duration")]
    reports.sort(key=lambda r: r.duration, reverse=True)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"# {len(reports)} phases, {sum(r.duration for r in reports):.1f} s in all "
                f"(pytest exit status {int(exitstatus)})\n")
        for r in reports:
            f.write(f"{r.duration:9.2f}s {r.when:<8} {r.nodeid}\n")
    terminalreporter.write_line(f"every test's durations: {os.path.abspath(path)}")


def pytest_sessionfinish(session, exitstatus):
    """The last check of every run: no controller, engine or watchdog is left (within 10 s)."""
    import time

    deadline = time.monotonic() + 10
    left = cluster_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = cluster_processes()
    if left:
        sys.stderr.write(f"\nFAILED: cluster processes left behind after the tests: {left}\n")
        session.exitstatus = 1
    else:
        sys.stderr.write("\nno cluster process left behind\n")


def pytest_collection_modifyitems(session, config, items):
    """The book's tests go last: the book is built from the chapters nbval just ran
    (notebooks/conftest.py keeps their outputs), so they must have run first. Under NCCL's
    matching rules on gloo (PIPELIB_P2P_MATCHING=nccl, `pipelib.runtime.matching`), the tests
    of gloo's own matching (a receive that reads the header first, MPI's receive-then-send
    pattern) are skipped, saying why."""
    items.sort(key=lambda item: item.get_closest_marker("book") is not None)
    from pipelib.runtime.matching import matching_for

    if matching_for("cpu") == "nccl":
        skip = pytest.mark.skip(reason="shows gloo's tag matching; NCCL's rules refuse or cannot check "
                                       "this pattern (tests/comm/test_matching.py shows what they do)")
        for item in items:
            if item.get_closest_marker("gloo_matching"):
                item.add_marker(skip)
