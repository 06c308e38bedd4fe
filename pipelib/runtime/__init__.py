"""pipelib.runtime: the live cluster and what each of its ranks holds.

- `cluster`: `Cluster`, one ipyparallel engine per rank with torch.distributed on each;
- `engine`: what runs on the engines: each rank's start-up and `Cluster.run`'s wrappers;
- `rendezvous`: where a local cluster's ranks meet (a file, no TCP store), sockets on loopback;
  engines of mpiexec or srun meet at a TCP store on the controller's address;
- `launchers`: how engines start, one entry per launcher (local, mpi, slurm): what each needs,
  its environment, where its ranks come from (chapter 19);
- `args`: a cluster's arguments, checked before any process starts;
- `progress`: one line per start-up phase while a notebook waits for its cluster;
- `errors`: `RankError`, `RankDiedError`, `RankTimeoutError`: faults as errors naming the rank;
- `gather`: `wait_for_ranks`, how `Cluster.run` waits: deaths, errors and stalls become errors;
- `faults`: when a cluster can no longer be used (a torch.distributed group that timed out or
  lost a connection): every later call says so in one line, naming `cluster.restart()`;
- `registry`: the running clusters of this process, stopped at interpreter exit;
- `watchdog`: kills a cluster's processes when the kernel that owns it is killed;
- `spawn`: `run_spawned`, ranks without a launcher or a cluster (fresh gloo processes; the
  DeepSpeed twins and the Hugging Face checks);
- `device`: `DeviceSpec` and `Device`, one per rank (`current()`): sim, cpu or cuda;
- `place`: `to_rank_device`, what a runner makes put on the rank's device; `to_cpu`, results
  back to the notebook;
- `matching`: how point-to-point messages are matched, by tag (gloo) or by order (NCCL's rules,
  also on gloo when asked, so NCCL's hangs are errors on a laptop);
- `measured`: timing and memory on real devices: a compute op timed by the wall clock or CUDA
  events on its stream, memory from the CUDA allocator (`Span.allocated_peak`);
- `clocks`: the virtual clock (modelled, deterministic) and the wall clock;
- `memtrack`: `MemoryTracker`, bytes by category and saved activations, against a capacity;
- `beacon`: `Activity`, what a rank is doing, readable while it is stuck;
- `flight`: the collectives' flight recorder: which collective each rank waits in, so that ranks
  that disagree on which collective to call are an error within seconds (`DesyncError`);
- `px`: `%%px` cells: an engine error names its rank in one line, as `Cluster.run` does;
- `span`: `Device.measure()` and `Device.overrides()`: scoped, nestable measurement (a `Span`);
- `alternate`: `alternate_steps`, the one A/B timing loop (sides in turn, the slowest rank's time);
- `mesh`: `Mesh`, the process groups of a `Topology`, made once per engine (the one place
  that makes torch.distributed groups); strategies take one of its groups as an argument.

Chapters: the cluster from chapter 04 on (every chapter that runs on ranks); devices and
clocks in chapter 04; the memory tracker in chapters 10-13 (activation memory of each
schedule); the beacon in every error that names what a rank was doing (chapters 05, 06, 12);
the mesh from chapter 15 on (the one-strategy chapters use a 1-axis mesh, `Mesh.first`).

The runtime layer (DESIGN.md section 2): torch and process groups. Import each name from its
module (`from pipelib.runtime.device import current`); importing the package imports nothing.
"""
