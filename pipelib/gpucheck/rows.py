"""What a gpu-check runs with and what it reports, as frozen values.

`Sizes` are the problem sizes (small on CPUs, so that CI runs every row in seconds), `Context`
what each check receives (the cluster, the device kind, the world size, the sizes),
`Measured` what a check measured, and `Row` the outcome of one check: the measurement held
against the check's tolerance, or the one line of the error that stopped it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# where a row's memory comes from: its name in the table, and what it counts
MEMORY_SOURCES = (("allocator", "torch.cuda.max_memory_allocated() after reset_peak_memory_stats(): every "
                                "tensor the caching allocator handed out on the rank's GPU"),
                  ("tracker", "pipelib's memory tracker (pipelib.runtime.memtrack): parameters, buffers, "
                              "gradients, optimizer state and the activations autograd saves"))


@dataclass(frozen=True)
class Sizes:
    """How big each check is: elements per rank of a collective, timed steps per race, optimizer
    steps of each training run, and the GPT's width per rank (n_embd = width x ranks)."""

    numel: int
    race_steps: int
    train_steps: int
    width: int

    @classmethod
    def for_device(cls, kind: str) -> Sizes:
        """Small on CPUs (the CI run takes seconds), bigger on GPUs (times worth comparing)."""
        return cls(numel=1 << 22, race_steps=5, train_steps=3, width=32) if kind == "cuda" else \
            cls(numel=1 << 12, race_steps=2, train_steps=2, width=8)


@dataclass(frozen=True)
class Context:
    """What a check runs with: the live cluster (one engine per device), its device kind
    ("cuda" or "cpu"), its number of ranks and the sizes."""

    cluster: object
    device: str
    world: int
    sizes: Sizes


def backend_of(device: str) -> str:
    """The backend of torch.distributed under a cluster of `device`: NCCL on GPUs, gloo on CPUs."""
    return "nccl" if device == "cuda" else "gloo"


def memory_source_of(device: str) -> tuple[str, str]:
    """(name, what it counts) of where a row's memory comes from on `device`."""
    return MEMORY_SOURCES[0] if device == "cuda" else MEMORY_SOURCES[1]


@dataclass(frozen=True)
class Measured:
    """What one check measured. diff: the largest |difference| from what it is held against (None:
    nothing compared); worst: which tensor or rank it is; pipelib_s and torch_s: median seconds
    per step of pipelib's side and of torch's twin (None where there is none); memory: peak
    bytes per rank (None where the source does not see them); skipped: why the check did not
    run here (e.g. a collective that needs a power-of-two group); error: the one line of an
    error that stopped part of the check after the rest was measured; note: a remark for the
    table."""

    diff: float | None = None
    worst: str = ""
    pipelib_s: float | None = None
    torch_s: float | None = None
    memory: tuple[int, ...] | None = None
    skipped: str | None = None
    error: str | None = None  # what stopped part of it (torch's twin crashed): the row fails
    note: str = ""            # anything else the table should say (the cluster's start-up)


@dataclass(frozen=True)
class Row:
    """One check's outcome: its name, what it was held against, the tolerance, what it measured,
    how long it took, and why it failed (None when it passed or was skipped)."""

    name: str
    group: str
    against: str
    tolerance: float | None
    twin: str | None
    measured: Measured = field(default_factory=Measured)
    seconds: float = 0.0
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def status(self) -> str:
        return "FAIL" if self.failure else ("skip" if self.measured.skipped else "ok")

    def to_dict(self) -> dict:
        m = self.measured
        return {"name": self.name, "group": self.group, "against": self.against, "tolerance": self.tolerance,
                "diff": m.diff, "worst": m.worst or None, "status": self.status, "passed": self.passed,
                "failure": self.failure, "skipped": m.skipped, "note": m.note or None, "twin": self.twin,
                "pipelib_s": m.pipelib_s, "torch_s": m.torch_s,
                "memory_per_rank": list(m.memory) if m.memory is not None else None, "seconds": self.seconds}


def judged(row: Row) -> Row:
    """`row` with its failure filled in from its measurement: a difference above the tolerance
    names what differs and by how much; a missing difference where one was due is a failure."""
    m = row.measured
    if row.failure is not None or m.skipped is not None or (row.tolerance is None and m.error is None):
        return row
    if m.error is not None:
        failure = m.error
    elif m.diff is None:
        failure = "nothing was compared"
    elif not m.diff <= row.tolerance:  # NaN fails too
        failure = f"{m.worst or 'the result'} differs by {m.diff:.3g} > {row.tolerance:.0e}"
    else:
        return row
    return Row(row.name, row.group, row.against, row.tolerance, row.twin, m, row.seconds, failure)


def error_line(e: BaseException) -> str:
    """An error as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
