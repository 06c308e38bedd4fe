"""pipelib.hardware: the machine measured: FLOP/s, memory and file bandwidth, links, the roofline.

- `machine`: `machine_info` (what this machine is), `cpu_sharing` (who else wants its cores) and
  `best_time`, the timer every measurement uses;
- `compute`: `measure_matmul`, `measure_softmax`, `measure_attention`: FLOP/s, as `MeasuredOp`s;
- `bandwidth`: `measure_stream` (STREAM's copy, add, triad) and `read_bandwidth_curve` (caches, RAM);
- `storage`: `file_read_bandwidth`: write, read from the page cache, read after eviction;
- `network`: `http_roundtrip` on loopback, and `pingpong_times` between two engines with
  `summarize_pingpong`, the alpha-beta link they define;
- `roofline`: `Roofline` and `MeasuredOp` (pure): which limit binds;
- `published`: `PUBLISHED` figures of GPUs and links with their sources, `comparison_markdown` (pure).

Every number a chapter states about "this machine" comes from here, measured live; published
figures of GPUs and interconnects sit beside them in `PUBLISHED`, each with its datasheet. The
same functions measure a GPU when given `device="cuda"` (they synchronise before reading the
clock). The figures are in `pipelib.viz.hardware`.

Conventions (say them, or the numbers mean nothing):

- throughput is the *best* of several repeats: a shared laptop's noise only ever slows a run down;
- a matmul of (m, k) @ (k, n) does 2 m k n FLOPs (`costmodel.matmul_flops`);
- bytes are the *compulsory* traffic, each input read once and each output written once, as
  STREAM counts them (McCalpin 1995: copy moves 2 words per element, triad 3). A written-out
  attention also writes and reads its T x T score matrix, and that is counted;
- the roofline (Williams, Waterman and Patterson 2009): an op of intensity I = FLOPs / byte can
  at best reach min(peak, bandwidth * I) FLOP/s. Here the roof is built from *measured* peak
  and bandwidth, not from a datasheet.

Chapters: all of it in chapter 01; the ping-pong returns in chapter 05 (`pipelib.comm.lab`), which
fits the alpha-beta model. Import each name from its module
(`from pipelib.hardware.machine import best_time`); importing the package imports nothing.
"""
