"""pipelib.pipeline: pipeline parallelism, from schedules as data to one step on the cluster.

- `schedules/`: pure: actions, `Schedule`, generators (naive, GPipe, 1F1B, interleaved, zero
  bubble, ZB-V, DualPipeV), `validate`, tables, torch's CSV, and the registry (one
  `ScheduleInfo` per schedule: generator, chunks, I/W split, torch's class, closed form);
- `simulate`: pure: a schedule's predicted timeline, bubble and peak memory (`Costs`);
- `stage`: cutting a model into stages; `Stage` runs one slice's F, B, I and W;
- `shapes`: the shape handshake before a step (who receives which shape);
- `executor`: `execute`, the one executor: any validated schedule, on this rank's stages;
- `step`: the step API: `check_step`, `train_step`, `run_train_step`, `monolith_step`;
- `gpt`: the tiny GPT as a pipeline: stages cut between blocks, the tied embedding's gradient;
- `blocking`: teaching foil: blocking sends and receives, which deadlock 1F1B (chapter 12);
- `paired`: 1F1B as picotron runs it, each send paired with the next receive in one
  `batch_isend_irecv`, and its virtual-clock step time (`predict_paired`) (chapter 12);
- `handwritten`: teaching foil: chapter 10's hand-written sharded model and orchestrator
  (naive and GPipe as loops), checked against `execute`;
- `torch_twin`: the same step through torch.distributed.pipelining with the same orders (13);
- `explorer`: the schedule explorer widget and its pure predictions (chapters 12, 13).

Chapters 10 (naive pipeline, hand-written), 11 (GPipe), 12 (1F1B, interleaved, deadlocks, the
explorer) and 13 (zero bubble, ZB-V, DualPipeV, against torch).

`schedules/` and `simulate` are the pure layer (no torch); the rest is the runtime layer.
Importing this package imports nothing; each name below is imported from its module on first
use (`import pipelib.pipeline.schedules` never imports torch). Two names are left out because
a module has them too: the functions `simulate.simulate` and `explorer.explorer`.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "Op": "schedules.ir", "Action": "schedules.ir", "Schedule": "schedules.ir",
    "ScheduleDeadlock": "schedules.ir", "as_schedule": "schedules.ir",
    "from_actions": "schedules.ir", "action_key": "schedules.ir", "dependencies": "schedules.ir",
    "first_unmet": "schedules.ir", "unit_step_order": "schedules.ir",
    "format_table": "schedules.ir",
    "validate": "schedules.validation", "ORDERS": "schedules.validation",
    "action_messages": "schedules.validation", "check_placement": "schedules.validation",
    "check_counts": "schedules.validation", "check_channels": "schedules.validation",
    "deadlock_message": "schedules.validation",
    "from_csv": "schedules.csv_io", "to_csv": "schedules.csv_io", "read_csv": "schedules.csv_io",
    "write_csv": "schedules.csv_io",
    "naive": "schedules.generators", "gpipe": "schedules.generators",
    "one_f_one_b": "schedules.generators", "interleaved_1f1b": "schedules.generators",
    "zero_bubble_h1": "schedules.zero_bubble", "interleaved_zero_bubble": "schedules.zero_bubble",
    "zbv": "schedules.zero_bubble", "dualpipe_v": "schedules.zero_bubble",
    "ScheduleInfo": "schedules.registry", "REGISTRY": "schedules.registry",
    "ALIASES": "schedules.registry", "GENERATORS": "schedules.registry",
    "schedule_info": "schedules.registry", "make_schedule": "schedules.registry",
    "Costs": "simulate", "SimResult": "simulate", "bubble_closed_form": "simulate",
    "layer_cost": "stage", "partition": "stage", "split_into_stages": "stage",
    "stage_modules": "stage", "stage_grads": "stage", "Stage": "stage",
    "exchange_shapes": "shapes", "cached_shapes": "shapes",
    "execute": "executor",
    "resolve_schedule": "step", "check_step": "step", "train_step": "step",
    "run_train_step": "step", "monolith_step": "step", "make_batch": "step",
    "timed_steps": "step", "Runner": "step", "prepare_step": "step",
    "PIPELINE_GPT": "gpt", "gpt_stages": "gpt", "tied_ranks": "gpt", "embedding_group": "gpt",
    "sum_tied_grads": "gpt", "make_tokens": "gpt", "check_gpt_step": "gpt",
    "gpt_train_step": "gpt", "run_gpt_train_step": "gpt", "gpt_monolith_step": "gpt",
    "check_blocking": "blocking", "execute_blocking": "blocking",
    "stage_input_shapes": "blocking", "train_step_blocking": "blocking",
    "ShardedMLP": "handwritten", "naive_step": "handwritten", "gpipe_step": "handwritten",
    "HAND_WRITTEN": "handwritten", "train": "handwritten", "run_train": "handwritten",
    "stage_flops": "handwritten", "stage_activation_bytes": "handwritten",
    "pipeline_trace": "handwritten",
    "TORCH_SCHEDULES": "torch_twin", "check_torch_step": "torch_twin",
    "prepare_torch_step": "torch_twin", "torch_train_step": "torch_twin",
    "run_torch_train_step": "torch_twin", "compare_step_times": "torch_twin",
    "run_compare_step_times": "torch_twin", "torch_pipeline_order": "torch_twin",
    "Setting": "explorer", "predict": "explorer", "summary_html": "explorer",
    "explorer_figures": "explorer", "explorer_sweep": "explorer", "measure": "explorer",
    "Measurement": "explorer", "Explorer": "explorer",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
