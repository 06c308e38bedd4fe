"""pipelib.context_parallel: attention over a sequence split across ranks (chapter 17).

- `layouts`: one registry entry per shard layout (contiguous, zigzag, striped; pure);
- `partition`: how the sequence is cut into shards, from the layouts; work per rank under causal
  masking;
- `blockwise`: attention one key block at a time, the online-softmax merge and its backward;
- `ring`: ring attention, forward and backward, K/V and dK/dV passed round the ring with
  non-blocking messages that overlap compute;
- `allgather`: Llama 3's context parallelism, all-gather of K/V then local attention;
- `ulysses`: DeepSpeed-Ulysses, all-to-all from sequence shards to head shards and back;
- `variants`: one registry entry per variant (ring, allgather, ulysses): its function, exact
  bytes, predicted time and torch's twin;
- `step`: one forward and backward of any variant on a cluster (one measurement scope), its
  single-process reference and the check; the memory probe on a 1-axis "cp" mesh;
- `model_step`: context parallelism across a whole tiny GPT: global positions, permuted labels,
  the loss over the global token count, weight gradients all-reduced over the cp group; a
  training run equal to one process (a strategy core: plain torch.distributed);
- `apply`: the same composed by `pipelib.parallelize` (chapter 15): `apply_context_parallel` (ring
  attention in every block, global positions by a pre-hook), `shard_tokens`, `sync_context_grads`;
- `costs`: the formulas: bytes per rank, overlap and the crossover shard length, memory per
  rank and the longest context (pure);
- `torch_ring`: torch's private ring-attention template beside pipelib's (a private API);
- `timing`: wall-clock step times on real CPU engines and the single-process reference of one
  rank's work (the benchmark's).

Chapter 17 uses all of it. The runtime layer, except `costs` and `layouts` (pure, no torch); `partition` and
`blockwise` use torch but no process group. Import each name from its module
(`from pipelib.context_parallel.ring import ring_attention`); importing the package imports nothing.
"""
