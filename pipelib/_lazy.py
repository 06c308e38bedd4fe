"""Lazy public names for pipelib's subpackages.

A subpackage's `__init__` lists its public API as a dict, name -> the module that defines it,
and imports nothing until a name is used. So `import pipelib.pipeline.schedules` (pure) never
pulls in the executor, and `pipelib.pipeline.Stage` still says where `Stage` lives:
`pipelib.pipeline.API["Stage"] == "stage"`.
"""
from __future__ import annotations

import importlib


def lazy(package: str, api: dict[str, str]):
    """`(__getattr__, __dir__)` for a package whose public names are imported on first use."""

    def __getattr__(name: str):
        if name in api:
            return getattr(importlib.import_module(f"{package}.{api[name]}"), name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{package}.{name}":
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
            raise

    def __dir__():
        return sorted(set(api) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
