"""pipelib.expert_parallel: mixture of experts, routed, dispatched and combined across ranks (chapter 16).

- `routing`: top-k softmax routing (k = 1 Switch, k = 2 GShard/Mixtral), capacity factor and
  minimum capacity, dropless routing; a typed `Routing` (experts, slots, gates, counts, dropped
  choices, the Switch loss) and GShard's dispatch and combine tensors (torch, no process group);
- `policies`: one registry entry per drop policy (lowest probability, latest position);
- `balance`: the Switch load-balancing loss, DeepSeek-V3's auxiliary-loss-free bias update, the
  max/mean imbalance.

Chapter 16 uses all of it. Import each name from its module
(`from pipelib.expert_parallel.routing import route`); importing the package imports nothing.
"""
