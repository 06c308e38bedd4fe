"""Can a schedule run? `validate` checks it, or raises a ValueError that prints it, marked.

Who sends what to whom follows from the actions (`action_messages`): the F of stage s sends
its output activation to the rank of stage s+1, the B or I of stage s sends the gradient of its
input to the rank of stage s-1; two stages on the same rank hand over locally and send nothing.
The checks, each public so that `pipelib.pipeline.simulate` runs the same ones:
`check_placement` (every action on its stage's rank, in range), `check_counts` (one forward and
one backward per (stage, microbatch), in order), `check_channels` (every receiver asks for its
messages in the order they are sent), and `deadlock_message` (who waits for what, when playing
the schedule gets stuck).

Introduced in chapter 10; chapter 12 meets the deadlocks, chapter 13 the message orders of V
schedules.
"""
from __future__ import annotations

from pipelib.pipeline.schedules.ir import (
    Action,
    Op,
    Schedule,
    ScheduleDeadlock,
    action_key,
    as_schedule,
    first_unmet,
    format_table,
    unit_step_order,
)

ORDERS = ("pair", "kind")


def action_messages(s: Schedule, rank: int, a: Action) -> list[tuple[str, int, tuple]]:
    """(direction, peer, message) of each message action `a` on `rank` sends or receives.

    direction is 'send' or 'recv'; a message is (kind, from_stage, microbatch): 'act' flows
    from the F of stage s to stage s+1, 'grad' from the B or I of stage s to stage s-1. A
    neighbour on the same rank sends nothing; W sends and receives nothing.
    """
    last, out = s.num_stages - 1, []
    if a.op is Op.F:
        if a.stage > 0 and s.stage_to_rank[a.stage - 1] != rank:
            out.append(("recv", s.stage_to_rank[a.stage - 1], ("act", a.stage - 1, a.microbatch)))
        if a.stage < last and s.stage_to_rank[a.stage + 1] != rank:
            out.append(("send", s.stage_to_rank[a.stage + 1], ("act", a.stage, a.microbatch)))
    elif a.op in (Op.B, Op.I):
        if a.stage < last and s.stage_to_rank[a.stage + 1] != rank:
            out.append(("recv", s.stage_to_rank[a.stage + 1], ("grad", a.stage + 1, a.microbatch)))
        if a.stage > 0 and s.stage_to_rank[a.stage - 1] != rank:
            out.append(("send", s.stage_to_rank[a.stage - 1], ("grad", a.stage, a.microbatch)))
    return out


def _where(s: Schedule, key: tuple) -> tuple[int, int] | None:
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            if action_key(a) == key:
                return r, step
    return None


def deadlock_message(s: Schedule, pos: list[int], what: str = "deadlocks") -> str:
    """Name every blocked rank, the action it waits on and what that action waits for.

    `pos[rank]` is the step each rank is stuck at (`unit_step_order`'s positions, or
    simulate's); the schedule's table follows, the stuck steps marked.
    """
    done = {action_key(a) for r, acts in enumerate(s.actions) for a in acts[: pos[r]]}
    lines = [f"schedule {s.name!r} {what}: no rank with work left can make progress"]
    marks = set()
    for r, acts in enumerate(s.actions):
        if pos[r] == len(acts):
            continue
        a = acts[pos[r]]
        st, ops, j = first_unmet(s, a, done)
        found = [(op, w) for op in ops if (w := _where(s, (st, op, j))) is not None]
        need = " or ".join(f"{st}{op.value}{j}" for op in ([found[0][0]] if found else ops))
        found = [w for _, w in found]
        where = (f"which rank {found[0][0]} has at its step {found[0][1]}, behind where it is "
                 f"stuck (step {pos[found[0][0]]})" if found else "which no rank ever runs")
        lines.append(f"  rank {r} waits at step {pos[r]} on {a}: it needs {need} "
                     f"(stage {st}, on rank {s.stage_to_rank[st]}), {where}")
        marks.add((r, pos[r]))
    lines.append("Reorder the actions so that each one's inputs are produced first.")
    return "\n".join(lines) + "\n\n" + format_table(s, marks=marks)


def _fail(s: Schedule, message: str, marks) -> None:
    raise ValueError(f"schedule {s.name!r}: {message}\n\n" + format_table(s, marks=set(marks)))


def check_placement(s: Schedule) -> None:
    """Every stage has a rank, and every action is in range and on its stage's rank."""
    if len(s.stage_to_rank) != s.num_stages or not all(0 <= r < s.num_ranks for r in s.stage_to_rank):
        raise ValueError(f"schedule {s.name!r}: stage_to_rank={s.stage_to_rank} must give a rank "
                         f"in 0..{s.num_ranks - 1} for each of the {s.num_stages} stages")
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            if not 0 <= a.stage < s.num_stages or not 0 <= a.microbatch < s.num_microbatches:
                _fail(s, f"rank {r} step {step}: {a} is out of range (stages 0..{s.num_stages - 1}, "
                         f"microbatches 0..{s.num_microbatches - 1})", [(r, step)])
            if s.stage_to_rank[a.stage] != r:
                _fail(s, f"rank {r} step {step}: {a} belongs to stage {a.stage}, which lives on "
                         f"rank {s.stage_to_rank[a.stage]}; move it there", [(r, step)])


def check_counts(s: Schedule) -> None:
    """One F and one backward (B, or I then W) per (stage, microbatch), F before B/I before W."""
    where: dict[tuple, list[tuple[int, int]]] = {}
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            where.setdefault(action_key(a), []).append((r, step))
    for st in range(s.num_stages):
        for j in range(s.num_microbatches):
            f, b, i, w = (where.get((st, op, j), []) for op in (Op.F, Op.B, Op.I, Op.W))
            what = f"stage {st} microbatch {j}"
            if len(f) != 1:
                _fail(s, f"{what} has {len(f)} forwards; it needs exactly one {st}F{j}", f)
            if len(b) + len(i) != 1 or len(w) != len(i):
                _fail(s, f"{what} has {len(b)} B, {len(i)} I and {len(w)} W; it needs exactly one "
                         f"backward: one {st}B{j}, or one {st}I{j} followed by one {st}W{j}", b + i + w)
            if (b or i)[0][1] < f[0][1]:
                _fail(s, f"{what} runs its backward before its forward {st}F{j}", (b or i) + f)
            if w and w[0][1] < i[0][1]:
                _fail(s, f"{what} runs {st}W{j} before {st}I{j}: W needs I's output gradient", w + i)


def _describe(msg: tuple) -> str:
    kind, stage, j = msg
    if kind == "act":
        return f"the activation of {stage}F{j} (for stage {stage + 1})"
    return f"the input gradient of stage {stage} microbatch {j} (for stage {stage - 1})"


def check_channels(s: Schedule, order: str) -> None:
    """Each receiver asks for messages in the order their sender sends them.

    With order="pair", all messages from one rank to another form one queue: point-to-point
    messages between two ranks are matched in the order they are posted (NCCL matches them in
    issue order, whatever the tag), so an executor that posts each receive just before the
    compute that needs it must find them in send order. With order="kind", activations and
    gradients form two queues (an executor that tags them apart, as gloo allows).
    """
    sent: dict[tuple, list] = {}
    recvd: dict[tuple, list] = {}
    for r, acts in enumerate(s.actions):
        for step, a in enumerate(acts):
            for direction, peer, msg in action_messages(s, r, a):
                ch = (r, peer) if direction == "send" else (peer, r)
                ch += (msg[0],) if order == "kind" else ()
                (sent if direction == "send" else recvd).setdefault(ch, []).append((msg, step))
    for ch in sorted(set(sent) | set(recvd)):
        (src, dst), out, inn = ch[:2], sent.get(ch, []), recvd.get(ch, [])
        for k in range(max(len(out), len(inn))):
            if k < len(out) and k < len(inn) and out[k][0] == inn[k][0]:
                continue
            said = f"sends {_describe(out[k][0])} at its step {out[k][1]}" if k < len(out) else "sends nothing more"
            asks = f"expects {_describe(inn[k][0])} at its step {inn[k][1]}" if k < len(inn) else "expects nothing more"
            marks = ([(src, out[k][1])] if k < len(out) else []) + ([(dst, inn[k][1])] if k < len(inn) else [])
            queue = "" if order == "pair" else f" {ch[2]}"
            _fail(s, f"{queue.strip() or 'messages'} from rank {src} to rank {dst} arrive out of order: as "
                     f"message #{k}, rank {src} {said}, but rank {dst} {asks}. Messages{queue} between "
                     f"two ranks are matched in the order they are posted (order={order!r}): reorder "
                     f"one of the two ranks", marks)


def validate(schedule, *, order: str = "pair", num_microbatches: int | None = None) -> Schedule:
    """Check a schedule can run, or raise a ValueError that prints it with the failing step marked.

    Checks, in order: every action on its stage's rank and in range; each (stage, microbatch)
    forwarded once and backwarded once (B, or I then W), F before B/I before W; for every pair
    of ranks the sender's send order equals the receiver's receive order (receives counted
    where their data is consumed; `order` says which messages share a queue, see
    `check_channels`); and that playing the schedule never gets stuck (a `ScheduleDeadlock`,
    naming who waits for what). Returns the schedule as a `Schedule`.

    V-shaped schedules (zbv, dualpipe_v) send activations and gradients over the same pair of
    ranks in different orders: they pass with order="kind" only, so their executor must keep
    the two kinds apart (tags) or post receives early in send order, as torch's lowering does.
    """
    if order not in ORDERS:
        raise ValueError(f"validate: order={order!r}; choose one of {ORDERS}")
    s = as_schedule(schedule, num_microbatches=num_microbatches)
    check_placement(s)
    check_counts(s)
    check_channels(s, order)
    _, pos = unit_step_order(s)
    if any(p < len(acts) for p, acts in zip(pos, s.actions)):
        raise ScheduleDeadlock(deadlock_message(s, pos))
    return s
