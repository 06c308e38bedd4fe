"""The strategy planner: choose dp, tp, pp, cp, a ZeRO stage, recomputation, the microbatch and
the schedule for a model on a machine, with memory and step time itemised (chapter 15).

    from pipelib.planner.search import explain, search
    from pipelib.planner.spec import GPT3_175B, Machine
    best = search(GPT3_175B, Machine(PROFILES["a100"]), 1024, 1536)
    print(explain(best[0]))

Pure (no torch): `spec` (the model and the machine), `strategy` (one strategy and its
checks), `memory` and `timing` (the book's formulas, at the scale of a real run), `book` (the
book's own fp32 runs on simulated devices, predicted), `search` (evaluate, search, explain),
`orders` (the order of the mesh axes on nodes: which axis crosses between nodes, measured from
a trace beside the planner), `published` (GPT-3 175B and Llama 3 405B as published, one
efficiency calibrated, the rest predicted).
"""
