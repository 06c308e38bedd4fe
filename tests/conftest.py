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
    (notebooks/conftest.py keeps their outputs), so they must have run first."""
    items.sort(key=lambda item: item.get_closest_marker("book") is not None)
