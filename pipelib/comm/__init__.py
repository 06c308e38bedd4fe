"""pipelib.comm: messages between ranks, the collectives built from them, and their cost model.

- `p2p`: `isend`, `irecv`, `send`, `recv`, `wait_all`, `sendrecv`: point-to-point messages with
  an explicit group, timed, traced and checked (the calls users make);
- `message`: one message on the wire: its header, the dtype table `DTYPES`, the `Handle`;
- `collectives`: broadcast, reduce, all-reduce (naive and ring), reduce-scatter, all-gather,
  all-to-all, written from point-to-point messages;
- `algorithms`: more of them, to choose from: the halving/doubling and the hierarchical
  all-reduce, the tree gather and scatter, the barrier;
- `ring`: the ring engine of the collectives, chunks cut into pipelined segment messages;
- `agreement`: `check_same`, every rank agrees on the collective before it runs;
- `alphabeta`: pure (no torch): the collectives' `NAMES`, exact bytes, alpha-beta times, the fit;
- `lab`: measurements: ping-pong, ring shift, collectives timed, the reduction rate, and
  chapter 05's small experiments (overlap, deadlock).

Chapters: point-to-point and the ping-pong lab in chapter 05 (`p2p` itself from chapter 04);
the collectives and the alpha-beta predictions in chapter 06; the pipelines of chapters 10-13
send their activations and gradients with `p2p`.

The runtime layer (DESIGN.md section 2), except `alphabeta`. Importing this package imports
nothing; each name below is imported from its module on first use.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "isend": "p2p",
    "irecv": "p2p",
    "send": "p2p",
    "recv": "p2p",
    "wait_all": "p2p",
    "P2POp": "p2p",
    "batch_isend_irecv": "p2p",
    "sendrecv": "p2p",
    "counters": "p2p",
    "reset_counters": "p2p",
    "post_send": "p2p",
    "post_recv": "p2p",
    "Handle": "message",
    "DTYPES": "message",
    "DTYPE_CODE": "message",
    "MessageMismatchError": "message",
    "broadcast": "collectives",
    "reduce": "collectives",
    "all_reduce_naive": "collectives",
    "all_reduce": "collectives",
    "reduce_scatter": "collectives",
    "all_gather": "collectives",
    "all_to_all": "collectives",
    "all_reduce_halving_doubling": "algorithms",
    "all_reduce_hierarchical": "algorithms",
    "gather_tree": "algorithms",
    "scatter_tree": "algorithms",
    "barrier": "algorithms",
    "SEGMENT_BYTES": "ring",
    "DEPTH": "ring",
    "check_same": "agreement",
    "CollectiveMismatchError": "agreement",
    "NAMES": "alphabeta",
    "OPS": "alphabeta",
    "chunk_sizes": "alphabeta",
    "expected_bytes": "alphabeta",
    "predicted_time": "alphabeta",
    "predict_collectives": "alphabeta",
    "message_times": "alphabeta",
    "fit_alpha_beta": "alphabeta",
    "compare": "alphabeta",
    "pingpong": "lab",
    "ring_shift": "lab",
    "measure_collective": "lab",
    "reduce_rate": "lab",
    "overlap_demo": "lab",
    "exchange": "lab",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
