"""pipelib.pipeline: pipeline parallelism, from schedules as data to one step on the cluster.

- `schedules/`: pure: actions, `Schedule`, generators (naive, GPipe, 1F1B, interleaved, zero
  bubble, ZB-V, DualPipeV), `validate`, tables, torch's CSV, and the registry (one
  `ScheduleInfo` per schedule: generator, chunks, I/W split, torch's class, closed form);
- `simulate`: pure: a schedule's predicted timeline, bubble and peak memory (`Costs`);
- `stage`: cutting a model into stages; `Stage` runs one slice's F, B, I and W;
- `shapes`: the shape handshake before a step (who receives which shape);
- `executor`: `execute`, the one executor: any validated schedule, on this rank's stages;
- `messages`: one step's messages: who receives what from whom, in which order (by tag, or
  by each sender's order under NCCL's rules);
- `step`: the step API: `check_step`, `train_step`, `run_train_step` (checked against `Recipe(...).first_step()`);
- `apply`: `apply_pipeline`, `parallelize`'s first step: this rank's stages, its step through the
  executor, the tied weight's sum (an `Applied` record);
- `gpt_stages`: the tiny GPT cut into stages between blocks, and the tied embedding's gradient
  summed (the cores `pipelib.parallelize` uses);
- `gpt`: the tiny GPT's pipeline step on the cluster (chapters 12-14's runner);
- `deepspeed_pipe`: DeepSpeed's pipeline engine (`PipelineModule`) on chapter 12's MLP without a
  launcher, beside the executor (chapter 19);
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
Import each name from its module (`from pipelib.pipeline.step import train_step`; the schedules'
names from `pipelib.pipeline.schedules`); importing the package imports nothing, so
`import pipelib.pipeline.schedules` never imports torch.
"""
