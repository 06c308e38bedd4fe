"""Checkpoints: sharded, crash-safe, resharded by placement, resumed bit for bit (chapter 18).

Each rank saves its own pieces of the monolith's tensors (model and optimizer state), its step,
data position and random states; a manifest written last is the commit record; loading cuts
the pieces again for any layout, so a run saved on one mesh resumes on another.

- `errors`: one error type per thing that can be wrong with a checkpoint, naming the values;
- `files`: temp name, fsync, rename, checksum on the way; `torch.load(weights_only=True)`;
- `crc`: `file_crc32`, a file's CRC-32 on several threads (chunks combined as zlib's
  `crc32_combine`), so that the load's check costs less than the load;
- `pieces`: a rank's part of a whole tensor (tp split, ZeRO flat range): cut, put, coverage;
- `manifest`: the commit record, step directories, latest committed, pruning to the last k;
- `sharded`: save (each rank its file, rank 0 the manifest) and load (any layout) of pieces;
- `rng`: every random state of a rank (torch CPU, CUDA, Python, numpy);
- `state`: a parallelized model and its optimizer (DDP, ZeRO 0-3, TP, pipeline) as pieces;
- `training`: save and load one run's training state; what may not change across a resume;
- `resume`: the trainer's loop with checkpoint hooks, resumed from the latest committed step;
- `experts`: experts under their global ids with a placement record each, loaded at any ep degree;
- `dcp`: torch.distributed.checkpoint beside it: the same tensors, conversions both ways;
- `torchft_twin`: torchft's replicas beside the restart: a quorum per step, going on with fewer;
- `nonfinite`: a NaN or Inf on one rank: every rank agrees to skip the step (one flag reduced);
- `stalls`: a stalled rank named by gloo's `monitored_barrier`;
- `crashes`: a crash injected at every step of a save, and what the loader then finds;
- `interval`: how often to save: Young's and Daly's intervals, the share of time lost.
"""
