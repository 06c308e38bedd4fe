"""The strategy planner: choose dp, tp, pp, cp, a ZeRO stage, recomputation, the microbatch and
the schedule for a model on a machine, with memory and step time itemised (chapter 15).

    from pipelib.planner import GPT3_175B, Machine, search, explain
    best = search(GPT3_175B, Machine(PROFILES["a100"]), 1024, 1536)
    print(explain(best[0]))

Pure (no torch): `spec` (the model and the machine), `layout` (one layout and its checks),
`memory` and `timing` (the book's formulas), `search` (evaluate, search, explain).
"""
from pipelib.planner.layout import Layout, check_layout
from pipelib.planner.search import Candidate, evaluate, explain, layouts, mfu, search
from pipelib.planner.spec import GPT3_175B, LLAMA3_70B, Machine, ModelSpec

__all__ = ["GPT3_175B", "LLAMA3_70B", "Candidate", "Layout", "Machine", "ModelSpec", "check_layout", "evaluate",
           "explain", "layouts", "mfu", "search"]
