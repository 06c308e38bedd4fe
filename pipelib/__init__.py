"""pipelib: the small library behind the executable book on distributed training.

One subpackage per part of the book: `runtime` (the cluster, devices), `comm` (messages and
collectives), `data_parallel` (DDP, ZeRO, chapters 07-08), `tensor_parallel` (Megatron's split
and sequence parallelism, chapter 09), `pipeline` (schedules to steps, chapters 10-13),
`recompute` (activation recomputation, chapter 14), `context_parallel` (ring attention,
chapter 17), `hardware` (the machine measured), `viz` (figures); the single-process models and
the pure models of cost and memory sit at the top.
Two layers (DESIGN.md section 2): the pure layer (schedules, simulate, memory, costmodel,
trace, alphabeta, viz) starts no process and never imports torch.distributed; the runtime
layer uses torch and process groups.

Submodules are imported on first use, so `import pipelib` stays cheap on engines and in tests:
`pipelib.Cluster` is `pipelib.runtime.cluster.Cluster`. Every other name is imported from the
module that defines it (`from pipelib.comm.p2p import send`).
"""
from types import MappingProxyType

from pipelib._lazy import lazy

__version__ = "0.1.0"

API = MappingProxyType({"Cluster": "runtime.cluster"})
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
