"""pipelib.context_parallel: attention over a sequence split across ranks (chapter 17).

- `partition`: how the sequence is cut into shards: contiguous, zigzag, striped; work per rank
  under causal masking;
- `blockwise`: attention one key block at a time, the online-softmax merge and its backward;
- `ring`: ring attention, forward and backward, K/V and dK/dV passed round the ring with
  non-blocking messages that overlap compute;
- `allgather`: Llama 3's context parallelism, all-gather of K/V then local attention;
- `ulysses`: DeepSpeed-Ulysses, all-to-all from sequence shards to head shards and back;
- `step`: one forward and backward of any variant on a cluster, its single-process reference
  and the check;
- `costs`: the formulas: bytes per rank, overlap and the crossover shard length, memory per
  rank and the longest context (pure);
- `torch_ring`: torch's private ring-attention template beside pipelib's (a private API);
- `timing`: wall-clock step times on real CPU engines and the single-process reference of one
  rank's work (the benchmark's).

Chapter 17 uses all of it. The runtime layer, except `costs` (pure, no torch); `partition` and
`blockwise` use torch but no process group. Import each name from its module
(`from pipelib.context_parallel.ring import ring_attention`); importing the package imports nothing.
"""
