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
`blockwise` use torch but no process group. Importing this package imports nothing; each name below is imported from its module
on first use.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "LAYOUTS": "partition",
    "check_layout": "partition",
    "shard_pieces": "partition",
    "shard_positions": "partition",
    "split_sequence": "partition",
    "join_sequence": "partition",
    "visible_pairs": "partition",
    "work_per_rank": "partition",
    "imbalance": "partition",
    "merge_partials": "blockwise",
    "block_attention": "blockwise",
    "block_attention_backward": "blockwise",
    "attend_pieces": "blockwise",
    "attend_pieces_backward": "blockwise",
    "pieces_pairs": "blockwise",
    "attention_flops": "blockwise",
    "RingAttention": "ring",
    "ring_attention": "ring",
    "ring_bytes": "ring",
    "check_shards": "ring",
    "AllGatherAttention": "allgather",
    "allgather_attention": "allgather",
    "UlyssesAttention": "ulysses",
    "ulysses_attention": "ulysses",
    "VARIANTS": "step",
    "attention_inputs": "step",
    "attention_step": "step",
    "reference_attention": "step",
    "check_attention": "step",
    "prefix_group": "step",
    "memory_probe": "step",
    "tile_pieces": "partition",
    "score_bytes": "ring",
    "held": "ring",
    "variant_bytes": "costs",
    "crossover_shard_len": "costs",
    "ring_peak_bytes": "costs",
    "max_shard_len": "costs",
    "overlap_stats": "costs",
    "torch_ring_available": "torch_ring",
    "torch_ring_step": "torch_ring",
    "time_attention": "timing",
    "time_rank_alone": "timing",
    "rank_work": "timing",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
