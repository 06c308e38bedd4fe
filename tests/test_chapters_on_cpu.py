"""Chapters 14 and 17 on real CPU engines: each notebook run under nbval, as CI runs every
chapter, with `PIPELIB_BOOK_DEVICE=cpu` (`pipelib.book_device`), so its `DEVICE` is "cpu"
and its clusters are real processes on the wall clock.

Every equality with one process, byte count and memory peak must hold there as on the simulated
device; the asserts that are facts of the simulation print that they are skipped. One test per
chapter, in a subprocess (its own kernel and engines), failing with the tail of nbval's output.
`--noconftest` keeps notebooks/conftest.py from saving this run's outputs as the book's copy of
the chapter (the book shows the simulated run). `make chapters DEVICE=cpu` runs every chapter so.

The two hold every kind of guard (`book_device.GUARANTEES`): 14 the bitwise ones and a tracker
capacity that must fire on every device, 17 timings taken on the wall clock. Chapters 07, 09 and
12 ran here too (about 75 s together) until CI's time reached its 20 minutes; their strategies
run on real CPU ranks in tests/test_library_use.py and tests/test_launch.py (DDP, DP x TP) and in
tests/test_gpu_check.py (TP with SP, 1F1B and ZB-V against one process).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelib.book_device import BOOK_DEVICE_ENV, GUARANTEES, WHY, book_device, holds_on, sim_only, simulated
from pipelib.runtime.device import DEVICE_KINDS

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ("14_recomputation", "17_ring_attention")
NBVAL = ("--nbval-lax", "--nbval-cell-timeout=600", "--nbval-sanitize-with=tests/nbval_sanitize.cfg")
TAIL = 6000          # characters of nbval's output in a failure
TIMEOUT_S = 1200     # one chapter: about a minute on 2 idle cores


@pytest.mark.cluster
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_on_cpu(chapter):
    notebook = ROOT / "notebooks" / f"{chapter}.ipynb"
    env = {**os.environ, BOOK_DEVICE_ENV: "cpu"}
    cmd = [sys.executable, "-m", "pytest", str(notebook.relative_to(ROOT)), *NBVAL,
           "-p", "no:cacheprovider", "--noconftest", "-q"]
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{chapter} with {BOOK_DEVICE_ENV}=cpu ran over {TIMEOUT_S} s:\n{out[-TAIL:]}")
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"{chapter} with {BOOK_DEVICE_ENV}=cpu failed under nbval:\n{out[-TAIL:]}"
    assert " passed" in out, out[-TAIL:]


def test_book_device_reads_the_environment(monkeypatch):
    monkeypatch.delenv(BOOK_DEVICE_ENV, raising=False)
    assert book_device("sim") == "sim"
    monkeypatch.setenv(BOOK_DEVICE_ENV, "cpu")
    assert book_device("sim") == "cpu"
    monkeypatch.setenv(BOOK_DEVICE_ENV, "")          # set but empty: the chapter's default
    assert book_device("sim") == "sim"


def test_book_device_names_a_wrong_value_and_the_kinds(monkeypatch):
    monkeypatch.setenv(BOOK_DEVICE_ENV, "gpu")
    with pytest.raises(ValueError, match=r"PIPELIB_BOOK_DEVICE='gpu'.*'sim', 'cpu', 'cuda'"):
        book_device("sim")
    monkeypatch.delenv(BOOK_DEVICE_ENV)
    with pytest.raises(ValueError, match=r"book_device\('tpu'\)"):
        book_device("tpu")


def test_sim_only_says_what_it_skips(capsys):
    assert sim_only("sim", "the virtual clock") is True
    assert capsys.readouterr().out == ""
    assert sim_only("cpu", "the virtual clock") is False
    out = capsys.readouterr().out
    assert "skipped on DEVICE='cpu'" in out and "the virtual clock" in out


def test_every_device_kind_says_what_it_guarantees():
    assert tuple(GUARANTEES) == DEVICE_KINDS
    assert all(g <= set(WHY) for g in GUARANTEES.values())
    assert [k for k in DEVICE_KINDS if simulated(k)] == [DEVICE_KINDS[0]] == ["sim"]


def test_holds_on_skips_gpu_only_facts_on_cuda(capsys):
    assert holds_on("cpu", "bitwise", "equal bits") and holds_on("cpu", "gloo rendezvous", "the deadlock")
    assert capsys.readouterr().out == ""
    assert not holds_on("cuda", "bitwise", "equal bits")
    out = capsys.readouterr().out
    assert "skipped on DEVICE='cuda'] equal bits: holds where the same ops give the same bits" in out
    with pytest.raises(ValueError, match="unknown guarantee 'exact'"):
        holds_on("cpu", "exact", "x")
    with pytest.raises(ValueError, match="'gpu' is not a device kind"):
        sim_only("gpu", "x")
