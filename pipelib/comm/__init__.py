"""pipelib.comm: messages between ranks, the collectives built from them, and their cost model.

- `p2p`: `isend`, `irecv`, `send`, `recv`, `wait_all`, `sendrecv`: point-to-point messages with
  an explicit group, timed, traced and checked (the calls users make);
- `message`: one message on the wire: its header, the dtype table `DTYPES`, the `Handle`;
- `ordered`: messages under NCCL's rules (matched by order, exchanges batched, receive-before-send
  pairs refused), which `p2p` posts through on cuda or when asked (`pipelib.runtime.matching`);
- `collectives`: broadcast, reduce, all-reduce (naive and ring), reduce-scatter, all-gather,
  all-to-all, written from point-to-point messages;
- `algorithms`: more of them, to choose from: the halving/doubling and the hierarchical
  all-reduce, the tree gather and scatter, the barrier;
- `uneven`: the uneven all-to-all (different row counts per pair, counts exchanged first), the
  dispatch and combine of mixture-of-experts layers (chapter 16);
- `ring`: the ring engine of the collectives, chunks cut into pipelined segment messages;
- `agreement`: `check_same`, every rank agrees on the collective before it runs;
- `registry`: pure (no torch): one `CollectiveInfo` per collective (implementation, built-in
  twin, exact bytes, alpha-beta time): the only place a collective's name is looked up;
- `twins`: each collective's torch.distributed built-in behind one call, the twin of the registry;
- `alphabeta`: pure (no torch): the collectives' `NAMES`, exact bytes, alpha-beta times, the fit;
- `lab`: measurements: ping-pong, ring shift, collectives timed, the reduction rate, and
  chapter 05's small experiments (overlap, deadlock).

Chapters: point-to-point and the ping-pong lab in chapter 05 (`p2p` itself from chapter 04);
the collectives and the alpha-beta predictions in chapter 06; the pipelines of chapters 10-13
send their activations and gradients with `p2p`.

The runtime layer (DESIGN.md section 2), except `alphabeta` (pure). Import each name from its
module (`from pipelib.comm.p2p import send`); importing the package imports nothing.
"""
