"""pipelib.expert_parallel: mixture of experts, routed, dispatched and combined across ranks (chapter 16).

- `routing`: top-k softmax routing (k = 1 Switch, k = 2 GShard/Mixtral), capacity factor and
  minimum capacity, dropless routing; a typed `Routing` (experts, slots, gates, counts, dropped
  choices, the Switch loss) and GShard's dispatch and combine tensors (torch, no process group);
- `policies`: one registry entry per drop policy (lowest probability, latest position);
- `balance`: the Switch load-balancing loss, DeepSeek-V3's auxiliary-loss-free bias update, the
  max/mean imbalance;
- `experts`: one expert (the GPT's MLP), seeded per (layer, expert); which experts an ep rank holds;
- `dispatch`: counts exchanged first, then the dispatch and combine uneven all-to-alls (the
  registry's `all_to_all_uneven`, or its gloo twin) with their autograd;
- `padded`: GShard's padded dispatch (C slots per expert, one even all-to-all) and the one
  collective that makes every rank agree on C;
- `layer`: the `MoE` layer (router, experts, local or across an ep group) and its `MoESpec`;
- `gpt`: MoE layers put into the tiny GPT from outside, the loss with the Switch terms, the
  bias step on global counts, `apply_expert_parallel`;
- `timeline`: one forward with every module's compute on the trace beside the all-to-alls, and
  the share of the forward they take;
- `sizes`: parameters, optimizer-state bytes per rank and FLOPs per token of the MoE GPT beside a
  dense one (pure: no torch);
- `training`: EP x DP training on a mesh (gradients of experts and of the replicated rest
  reduced over their groups) and the one-process reference with the same routing.
- `pipelined`: DualPipeV (chapter 13) with an MoE layer in every stage on a pp x ep mesh: the
  executor runs the real all-to-alls inside its actions, its timeline `simulate`'s.

Chapter 16 uses all of it. The runtime layer: the strategy cores take their groups as arguments
(`dispatch`, `padded`, `gpt`, `training`, `timeline`,
`pipelined`); `routing`, `policies`, `balance`, `experts` and `layer` run
without a process group; `sizes` is pure. Import each name from its module
(`from pipelib.expert_parallel.routing import route`); importing the package imports nothing.
"""
