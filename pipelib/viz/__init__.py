"""pipelib.viz: every figure of the book, drawn from measurements and events, never by hand.

- `hardware`: `roofline_figure`, `bandwidth_figure`: the machine measured (chapter 01);
- `timeline`: `timeline_figure`, `sweep_figure`, `memory_figure`, `speedup_figure`: figures of a
  `Trace`, measured or simulated (chapter 04 on; the pipelines of chapters 10-13);
- `comm`: ping-pong curves, time and bandwidth against tensor size, collectives replayed step
  by step from their messages (chapters 05 and 06);
- `recompute`: `recompute_memory_figure`, `tradeoff_figure`: memory over the compute done, per
  recomputation policy, and peak memory against extra compute (chapter 14);
- `ddp`: `bucket_sweep_figure`, `efficiency_figure`, `ranks_figure`, `ddp_timelines_figure`:
  step time against bucket size, communication efficiency against model size, 2 ranks against
  1, a DDP step's compute and communication lanes (chapter 07);
- `zero`: `zero_memory_figure`, `milestone_figure`, `loss_curves_figure`: bytes per rank of
  each ZeRO stage measured beside the formula, the per-GPU memory of each stage as the world
  grows, training losses side by side (chapter 08);
- `tensor_parallel`: `tp_split_figure`, `tp_collectives_figure`, `tp_link_share_figure`,
  `tp_memory_figure`: who holds which weights, every collective of a TP step from the trace,
  the communication share per link, activations kept per layer (chapter 09);
- `ring`: `work_figure`, `overlap_figure`, `context_figure`, `variants_figure`: causal work per
  rank, transfer hidden behind compute, the longest context per number of ranks, and ring,
  all-gather and Ulysses side by side (chapter 17);
- `mesh`: `mesh_figure`, `mesh_rows`, `axis_timeline_figure`, `orders_figure`,
  `rank_memory_figure`, `plans_figure`, `plans_explorer_figure`: ranks on the (dp, tp, pp, cp,
  ep) grid with every group on hover, communication coloured by mesh axis, what each order of
  the axes costs, memory per rank beside the planner's, the planner's best plans itemised, for
  one scenario or several behind a menu (chapter 15);
- `planner_widget`: `planner_widget()`, the planner behind dropdowns and sliders in JupyterLab:
  a model, a GPU, a number of GPUs and a batch give the ranking and its bars (chapter 15);
- `experts`: `dispatch_matrices`, `traffic_figure`, `load_figure`, `drop_rate_figure`: tokens
  each rank sends to each other rank per step read from the trace, animated; the load per
  expert over training under each balancing method; tokens dropped against the capacity factor
  (chapter 16);
- `faults`: `lost_time_figure`, `save_time_figure`, `lost_rank_figure`: the share of time lost
  against the checkpoint interval with Young's and Daly's optima, save time against the state's
  size, and a run that lost a rank for good (restarted on fewer, or torchft's replicas going
  on), its loss and who took part per step (chapter 18);
- `launch`: `tokenizer_figure`: characters per token and the embedding's share of the
  parameters, the character tokenizer beside BPE of growing vocabularies (chapter 19);
- `display`: `show(fig)`, a plotly figure that renders in JupyterLab and in the static book, and
  `show_source(obj)`, library code shown by reference (every chapter, from chapter 01); and what
  every figure shares: `time_unit`, the unit of every time axis (µs, ms or s, chosen from the
  span; or abstract units such as "units of F" for schedules costed in forward passes, with
  `Units` and `time_title`), `nice_cuts` and `plain_number` for readable slider stops,
  rounding to what an axis shows, the play button and slider of every animation (nothing
  autoplays: a figure shows its final state until the reader presses play).

The pure layer (DESIGN.md section 2): plotly and `pipelib.trace`, never torch nor the runtime.
Importing this package imports nothing; each name below is imported from its module on first
use (`pipelib.viz.timeline_figure`), and `API` says which module that is.
"""
from types import MappingProxyType

from pipelib._lazy import lazy

API = MappingProxyType({
    "roofline_figure": "hardware",
    "bandwidth_figure": "hardware",
    "timeline_figure": "timeline",
    "sweep_figure": "timeline",
    "memory_figure": "timeline",
    "speedup_figure": "timeline",
    "parse_label": "comm",
    "message_steps": "comm",
    "replay": "comm",
    "step_moves": "comm",
    "collective_animation": "comm",
    "pingpong_figure": "comm",
    "size_sweep_figure": "comm",
    "size_sweep_bandwidth_figure": "comm",
    "recompute_memory_figure": "recompute",
    "tradeoff_figure": "recompute",
    "bucket_sweep_figure": "ddp",
    "efficiency_figure": "ddp",
    "ranks_figure": "ddp",
    "ddp_timelines_figure": "ddp",
    "zero_memory_figure": "zero",
    "milestone_figure": "zero",
    "loss_curves_figure": "zero",
    "tp_split_figure": "tensor_parallel",
    "tp_collectives_figure": "tensor_parallel",
    "tp_link_share_figure": "tensor_parallel",
    "tp_memory_figure": "tensor_parallel",
    "work_figure": "ring",
    "overlap_figure": "ring",
    "context_figure": "ring",
    "variants_figure": "ring",
    "mesh_figure": "mesh",
    "mesh_rows": "mesh",
    "axis_timeline_figure": "mesh",
    "orders_figure": "mesh",
    "rank_memory_figure": "mesh",
    "plans_figure": "mesh",
    "plans_explorer_figure": "mesh",
    "dispatch_matrices": "experts",
    "traffic_figure": "experts",
    "load_figure": "experts",
    "drop_rate_figure": "experts",
    "lost_time_figure": "faults",
    "save_time_figure": "faults",
    "lost_rank_figure": "faults",
    "tokenizer_figure": "launch",
    "time_unit": "display",
    "Units": "display",
    "time_title": "display",
    "nice_cuts": "display",
    "plain_number": "display",
    "figure_bundle": "display",
    "show": "display",
    "show_source": "display",
})
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
