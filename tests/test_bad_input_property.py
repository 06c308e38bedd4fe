"""A property test over the public signatures of the pure layer (formulas, schedules, explorer,
memory, cost model; the planner has its own): every out-of-domain value of every size argument
is a ValueError or TypeError, and every value in the domain gives finite, non-negative numbers
or a ValueError; never another exception (ZeroDivisionError, IndexError, ...), a negative byte
count, a NaN, or a call that does not return (each call runs under a wall-clock limit). A seeded
generator draws the values (hypothesis is not installed here), so a failure replays exactly.
Issue 28; the fixed cases of the review are tests/test_bad_input.py.
"""
from __future__ import annotations

import dataclasses
import math
import random
import signal

import pytest

from pipelib.model import GPTConfig, MLPConfig

SEED = 28
DRAWS = 12               # in-domain draws per signature
LIMIT_S = 5.0            # per call, on a loaded 2-core machine
BAD_INTS = (0, -1, -64, 2.5, 4.0, "4", None, True, float("nan"), float("inf"))
BAD_COUNTS = (-1, -64, 2.5, "4", None, True, float("nan"))  # for arguments where 0 is allowed
NONE_IS_DEFAULT = {"num_chunks", "k"}  # None picks the documented default (v = 2, k = sqrt(n))
GPT = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=32)


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"did not return within {LIMIT_S} s")


def bounded(call, *args, **kwargs):
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        return call(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def numbers(result):
    """Every number in a result: ints, floats, dataclass fields, dict values, sequences."""
    if isinstance(result, bool) or result is None or isinstance(result, str):
        return
    if isinstance(result, (int, float)):
        yield result
    elif dataclasses.is_dataclass(result):
        for f in dataclasses.fields(result):
            yield from numbers(getattr(result, f.name))
    elif isinstance(result, dict):
        for v in result.values():
            yield from numbers(v)
    elif isinstance(result, (list, tuple)):
        for v in result:
            yield from numbers(v)


def _pow2(rng, lo=0, hi=6):
    return 2 ** rng.randint(lo, hi)


def _signatures():
    """(name, function, {argument: (in-domain drawer, minimum)}, fixed keywords)."""
    from pipelib.context_parallel import costs
    from pipelib.context_parallel.partition import work_per_rank
    from pipelib.data_parallel import zero_formulas as zf
    from pipelib.data_parallel.efficiency import ddp_step_model
    from pipelib.memory import (gpt_activation_bytes, gpt_forward_flops, gpt_layer_activation_bytes,
                                mlp_activation_bytes, mlp_forward_flops)
    from pipelib.recompute.registry import predict_policy
    from pipelib.tensor_parallel import formulas as tp

    p2 = _pow2
    size = (p2, 1)
    return [
        ("zero_state_bytes", zf.zero_state_bytes,
         dict(psi=(lambda r: r.randint(0, 10**6) * 8, 0), world_size=(lambda r: r.randint(1, 8), 1),
              stage=(lambda r: r.randint(0, 3), 0)), {}),
        ("zero_comm_bytes", zf.zero_comm_bytes,
         dict(psi=(lambda r: r.randint(0, 10**6), 0), world_size=(lambda r: r.randint(1, 8), 1),
              stage=(lambda r: r.randint(0, 3), 0), accumulate=(lambda r: r.randint(1, 4), 1)), {}),
        ("padded_numel", lambda world_size: zf.padded_numel([10, 20, 7], world_size),
         dict(world_size=(lambda r: r.randint(1, 9), 1)), {}),
        ("milestone_table", zf.milestone_table,
         dict(psi=(lambda r: r.randint(0, 10**9), 0), world_size=(lambda r: r.randint(1, 64), 1)), {}),
        ("tp_layer_bytes", tp.tp_layer_bytes, dict(b=size, s=size, h=size, t=(lambda r: p2(r, 0, 3), 1)), {}),
        ("tp_step_counts", tp.tp_step_counts,
         dict(n_layer=(lambda r: r.randint(1, 12), 1), b=size, s=(lambda r: p2(r, 3, 6), 1), h=size,
              t=(lambda r: p2(r, 0, 3), 1)), {}),
        ("tp_layer_activation_bytes", tp.tp_layer_activation_bytes,
         dict(b=size, s=(lambda r: p2(r, 3, 6), 1), h=(lambda r: p2(r, 4, 8), 1), a=(lambda r: p2(r, 3, 4), 1),
              t=(lambda r: p2(r, 0, 3), 1)), {}),
        ("tp_activation_bytes", tp.tp_activation_bytes,
         dict(b=size, s=(lambda r: p2(r, 3, 6), 1), h=(lambda r: p2(r, 4, 8), 1), a=(lambda r: p2(r, 3, 4), 1),
              t=(lambda r: p2(r, 0, 3), 1)), {}),
        *[(f.__name__, f, dict(batch=size, heads=(lambda r: p2(r, 2, 3), 1), shard_len=size, head_dim=size,
                               itemsize=(lambda r: r.choice([1, 2, 4]), 1), n=(lambda r: p2(r, 0, 2), 1)), {})
          for f in (costs.ring_bytes, costs.allgather_bytes, costs.ulysses_bytes)],
        ("ring_memory", costs.ring_memory,
         dict(batch=size, heads=size, shard_len=(lambda r: p2(r, 1, 6), 1), head_dim=size,
              itemsize=(lambda r: r.choice([2, 4]), 1)), {}),
        ("max_shard_len", costs.max_shard_len,
         dict(capacity=(lambda r: r.randint(10**6, 10**12), 1), batch=size, heads=size, head_dim=size,
              itemsize=(lambda r: r.choice([2, 4]), 1), step=(lambda r: r.choice([2, 4, 64]), 1)), {}),
        ("crossover_shard_len", costs.crossover_shard_len,
         dict(batch=size, heads=size, head_dim=size, itemsize=(lambda r: r.choice([2, 4]), 1)),
         dict(flops=1e15, alpha=5e-6, beta=50e9)),
        ("work_per_rank", lambda seq_len, n: work_per_rank(seq_len, n, "zigzag"),
         dict(seq_len=(lambda r: 64 * r.randint(1, 4), 1), n=(lambda r: p2(r, 0, 3), 1)), {}),
        ("gpt_activation_bytes", lambda batch, seq, itemsize: gpt_activation_bytes(GPT, batch, seq, itemsize),
         dict(batch=size, seq=size, itemsize=(lambda r: r.choice([2, 4]), 1)), {}),
        ("gpt_layer_activation_bytes", lambda batch, seq: gpt_layer_activation_bytes(GPT, batch, seq),
         dict(batch=size, seq=size), {}),
        ("gpt_forward_flops", lambda batch, seq: gpt_forward_flops(GPT, batch, seq), dict(batch=size, seq=size), {}),
        ("mlp_activation_bytes", lambda batch: mlp_activation_bytes(MLPConfig(), batch), dict(batch=size), {}),
        ("mlp_forward_flops", lambda batch: mlp_forward_flops(MLPConfig(), batch), dict(batch=size), {}),
        ("predict_policy", lambda batch, seq, k: predict_policy(GPT, batch, seq, "every_k", k),
         dict(batch=size, seq=size, k=(lambda r: r.randint(1, 2), 1)), {}),
        ("ddp_step_model", lambda batch, n: ddp_step_model(GPT, batch, n, "h100"),
         dict(batch=size, n=(lambda r: r.randint(1, 16), 1)), {}),
        ("GPTConfig", lambda block_size, n_head: GPTConfig(block_size=block_size, n_head=n_head, n_embd=64),
         dict(block_size=size, n_head=(lambda r: p2(r, 0, 4), 1)), {}),
        ("MLPConfig", MLPConfig, dict(in_features=size, hidden=size, out_features=size, num_layers=size), {}),
    ]


def _schedule_signatures():
    from pipelib.pipeline.explorer import Setting, predict
    from pipelib.pipeline.schedules import REGISTRY, make_schedule

    out = []
    for name, info in REGISTRY.items():
        args = dict(p=(lambda r: r.randint(1, 6), 1), m=(lambda r: r.randint(1, 12), 1))
        if info.chunked:
            args["num_chunks"] = (lambda r: r.randint(1, 3), 1)
            out.append((f"make_schedule {name}", lambda p, m, num_chunks, n=name: make_schedule(n, p, m, num_chunks),
                        args, {}))
        else:
            out.append((f"make_schedule {name}", lambda p, m, n=name: make_schedule(n, p, m), args, {}))
    out.append(("predict", lambda p, m: predict(Setting("1f1b", p, m)),
                dict(p=(lambda r: r.randint(1, 6), 1), m=(lambda r: r.randint(1, 12), 1)), {}))
    return out


SIGNATURES = _signatures() + _schedule_signatures()


def _check(result):
    for x in numbers(result):
        assert math.isfinite(x) and x >= 0, f"{x!r} in {result!r:.300}"
    return result


@pytest.mark.parametrize("name,fn,args,fixed", SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_in_domain_values_give_finite_non_negative_numbers_or_a_value_error(name, fn, args, fixed):
    rng = random.Random(f"{SEED}-{name}")
    answered = 0
    for _ in range(DRAWS):
        kw = {**fixed, **{a: draw(rng) for a, (draw, _) in args.items()}}
        try:
            _check(bounded(fn, **kw))
            answered += 1
        except ValueError:
            pass  # a constraint across arguments (m vs p, heads vs t): refused with a ValueError
    assert answered, f"{name}: no draw in the domain was answered; the drawers are too narrow"


@pytest.mark.parametrize("name,fn,args,fixed", SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_every_out_of_domain_size_raises_value_or_type_error(name, fn, args, fixed):
    rng = random.Random(f"{SEED}-bad-{name}")
    for arg, (_, minimum) in args.items():
        bad_values = BAD_COUNTS if minimum == 0 else BAD_INTS
        for bad in bad_values:
            if bad is None and arg in NONE_IS_DEFAULT:
                continue
            kw = {**fixed, **{a: draw(rng) for a, (draw, _) in args.items()}, arg: bad}
            try:
                result = bounded(fn, **kw)
            except (ValueError, TypeError) as e:
                assert str(e), f"{name}({arg}={bad!r}): an empty message"
                continue
            raise AssertionError(f"{name}({arg}={bad!r}) returned {result!r:.200} instead of raising")


def test_the_simulator_refuses_negative_and_non_finite_costs():
    from pipelib.costmodel import Link, get_profile
    from pipelib.pipeline.explorer import Setting, predict

    for f in (0, -1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            bounded(predict, Setting(), f=f)
    profile = get_profile("toy-gpu")
    for flops, nbytes in ((-1, 0), (0, -1), (float("nan"), 0), (float("inf"), 0)):
        with pytest.raises(ValueError):
            profile.compute_time(flops, nbytes)
    for nbytes in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            profile.message_time(nbytes)
    for alpha, beta in ((-1e-6, 1e9), (0.0, 0.0), (float("nan"), 1e9), (0.0, float("nan")), (float("inf"), 1e9)):
        with pytest.raises(ValueError):
            Link("bad", alpha, beta)
    assert Link("ideal", 1e-6, float("inf")).time(10**9) == 1e-6  # chapter 11's ideal link: latency alone


def test_the_simulators_costs_refuse_negative_and_non_finite_seconds():
    from pipelib.pipeline.simulate import Costs

    for field in ("F", "B", "I", "W", "p2p", "all_to_all"):
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match=rf"Costs must be finite and >= 0.*'{field}'"):
                Costs(**{field: bad})
    with pytest.raises(ValueError, match=r"stage_factor"):
        Costs(stage_factor=(1.0, float("nan")))
