"""pipelib.gpucheck: `python -m pipelib gpu-check`, every strategy of the book on this machine's devices.

One command answers "does pipelib work here, and how fast against torch?": it starts the book's
`Cluster` on every GPU (NCCL; with ``--device cpu`` on `--world` CPU engines with gloo, as CI
runs it), then runs one row per check and prints one table (and writes it as JSON):

- every collective of chapter 06's registry (`pipelib.comm.registry`) against its twin, torch's
  built-in (NCCL's on GPUs, gloo's on CPUs): the same numbers, and both step times;
- the spine (chapter 15: `Recipe`, `Plan`, `trainer.train_plan`) under DDP (chapter 07), ZeRO-3
  (08), tensor parallelism with sequence parallelism (09), a 1F1B and a ZB-V pipeline (12-13),
  activation recomputation (14) and ring attention (17), each equal to one process
  (`Recipe.reference`) within the row's stated tolerance, with its step time beside torch's twin
  where pipelib has one (torch's DDP, FSDP2, DTensor, torch.distributed.pipelining) and the peak
  memory per rank: the CUDA allocator's on GPUs, pipelib's tracker on CPUs.

A failing row names what differs and by how much; a row that crashes fails with its error's
first line and the next row runs (on a cluster started afresh if the engines were involved).
The exit status is non-zero when any row fails.

- `rows`: the typed values: `Sizes`, `Context` (what a check runs with), `Measured` (what a
  check measured), `Row` (a check's outcome);
- `registry`: one `CheckInfo` per check, in table order (`CHECKS`); a collective's entry is made
  from the comm registry's;
- `collectives`: a collective and its twin on every rank: the difference, both times, memory;
- `spine`: one plan trained on every rank against one process, and its measured memory;
- `strategies`: the strategies' checks (the spine's run, then torch's twin raced beside it);
- `report`: the table and the JSON;
- `run`: the cluster, each check in turn, a crash kept to its row; `gpu_check` is the command.

Written for GPU machines (issue 26: CUDA and NCCL for real); no chapter calls it: a reader runs
it once on a new machine, before the chapters.
"""
