"""torch.distributed.pipelining's CSV schedules, read and written (chapter 12).

torch writes a schedule as one CSV row per rank, one cell per time slot: an action such as
`2F0`, an empty cell for an idle slot, and, once lowered, communication and FSDP actions
(`0SEND_F0`, `1RECV_B0`, `UNSHARD`, `REDUCE_GRAD`); DualPipeV writes a pair of overlapped
actions as `(0F7;7B3)OVERLAP_F_B`. `from_csv` keeps the compute actions only, in order, so a
schedule torch dumps loads here and can be validated, simulated and run.
"""
from __future__ import annotations

import csv
import io
import re

from pipelib.pipeline.schedules.ir import Action, Schedule, as_schedule, from_actions

_TORCH_LOWERING = re.compile(r"\d+(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)\d*")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")


def _parse_cell(cell: str) -> list[Action]:
    cell = cell.strip()
    if not cell or _TORCH_LOWERING.fullmatch(cell):
        return []  # an idle slot, or a comms/FSDP action torch adds when lowering a schedule
    if match := _OVERLAP.fullmatch(cell):
        return [Action.parse(sub) for sub in match.group(1).split(";")]  # run one after the other
    return [Action.parse(cell)]


def from_csv(text: str, *, num_microbatches: int | None = None, name: str = "csv") -> Schedule:
    """Parse torch.distributed.pipelining's CSV: row r is rank r, each cell an action or empty.

    Empty cells (torch's idle slots) and communication or FSDP actions (SEND_F, RECV_B, UNSHARD,
    REDUCE_GRAD, ...) are skipped; DualPipeV's `(0F7;7B3)OVERLAP_F_B` becomes 0F7 then 7B3.
    """
    rows = list(csv.reader(io.StringIO(text)))
    actions = []
    for r, row in enumerate(rows):
        try:
            actions.append(tuple(a for cell in row for a in _parse_cell(cell)))
        except ValueError as e:
            raise ValueError(f"CSV row {r} (rank {r}): {e}") from None
    return from_actions(tuple(actions), num_microbatches=num_microbatches, name=name)


def to_csv(schedule) -> str:
    """The schedule in torch's CSV format (`csv.writer` defaults, one row per rank, no idle cells)."""
    out = io.StringIO()
    writer = csv.writer(out)
    for acts in as_schedule(schedule).actions:
        writer.writerow([str(a) for a in acts])
    return out.getvalue()


def read_csv(path, **kw) -> Schedule:
    """`from_csv` of a file (torch's `_dump_csv` writes one); `kw` are from_csv's."""
    with open(path, newline="") as f:
        return from_csv(f.read(), **kw)


def write_csv(schedule, path) -> None:
    """`to_csv` into a file, which torch's `_load_csv` reads back."""
    with open(path, "w", newline="") as f:
        f.write(to_csv(schedule))
