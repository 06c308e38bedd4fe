"""Pipeline schedules as data (chapters 10-13): pure, no torch, no process.

- `ir`: `Op`, `Action` (`2F0`, torch's format), `Schedule`, `as_schedule`, what each action
  waits for (`dependencies`) and the table (`format_table`);
- `validation`: `validate` and its checks, `deadlock_message`, the messages between ranks;
- `csv_io`: torch.distributed.pipelining's CSV (`from_csv`, `to_csv`, `read_csv`, `write_csv`);
- `build`: the pieces generators share (size checks, placements, the looped order);
- `generators`: `naive`, `gpipe`, `one_f_one_b`, `interleaved_1f1b`, `looped_bfs`,
  `llama3_interleaved` (Llama 3's tunable N microbatches per round);
- `zero_bubble`: `zero_bubble_h1`, `zero_bubble_h2`, `interleaved_zero_bubble`, `zbv`,
  `dualpipe_v`;
- `registry`: one `ScheduleInfo` per schedule (`REGISTRY`, `schedule_info`, `make_schedule`,
  `resolve_schedule`: a name or a Schedule to a Schedule),
  the only place where a schedule's name decides anything.

Idle slots are never written into a schedule: they are an output of `pipelib.pipeline.simulate`.

The names below are the ones callers import from the package (the pipeline's modules, the tests,
chapters 10-13); everything else is imported from its module.
"""
from pipelib.pipeline.schedules.csv_io import from_csv, read_csv, to_csv, write_csv
from pipelib.pipeline.schedules.generators import (
    gpipe,
    interleaved_1f1b,
    llama3_interleaved,
    looped_bfs,
    naive,
    one_f_one_b,
)
from pipelib.pipeline.schedules.ir import (
    Action,
    Op,
    Schedule,
    ScheduleDeadlock,
    action_key,
    as_schedule,
    dependencies,
    format_table,
)
from pipelib.pipeline.schedules.registry import (
    ALIASES,
    GENERATORS,
    REGISTRY,
    make_schedule,
    resolve_schedule,
    schedule_info,
)
from pipelib.pipeline.schedules.validation import (
    action_messages,
    check_channels,
    check_counts,
    check_placement,
    deadlock_message,
    validate,
)
from pipelib.pipeline.schedules.zero_bubble import (
    dualpipe_v,
    interleaved_zero_bubble,
    zbv,
    zero_bubble_h1,
    zero_bubble_h2,
)

__all__ = [
    "Op", "Action", "Schedule", "ScheduleDeadlock", "as_schedule", "action_key",
    "dependencies", "format_table",
    "validate", "action_messages", "check_placement", "check_counts", "check_channels",
    "deadlock_message",
    "from_csv", "to_csv", "read_csv", "write_csv",
    "naive", "gpipe", "one_f_one_b", "interleaved_1f1b", "looped_bfs",
    "llama3_interleaved",
    "zero_bubble_h1", "zero_bubble_h2", "interleaved_zero_bubble", "zbv", "dualpipe_v",
    "REGISTRY", "ALIASES", "GENERATORS", "schedule_info", "make_schedule", "resolve_schedule",
]
