"""pipelib: the small library behind the executable book on distributed training.

Two layers (DESIGN.md section 2). The pure layer (schedules, simulate, memory, costmodel,
topology, viz, trace) starts no process and imports fast. The runtime layer (cluster, device,
comms, collectives, model, pipeline, ...) uses torch and process groups.

Submodules are imported on first use, so `import pipelib` stays cheap on engines and in tests.
"""
import importlib

__version__ = "0.1.0"

_LAZY = {"Cluster": "pipelib.runtime.cluster"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    try:
        return importlib.import_module(f"pipelib.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"pipelib.{name}":
            raise AttributeError(f"module 'pipelib' has no attribute {name!r}") from None
        raise
