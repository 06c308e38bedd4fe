"""Lazy public names for a package: imported on first use.

Two packages have a face: the root (`pipelib.Cluster`, so `import pipelib` stays cheap on the
engines) and `pipelib.viz` (every figure function, which tests/viz/test_bundle.py walks). Each
lists its names in a read-only table, name -> the module that defines it, and imports nothing
until a name is used: `pipelib.viz.API["timeline_figure"] == "timeline"`. Every other package
is a folder of modules: import a name from the module that defines it.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping


def lazy(package: str, api: Mapping[str, str]):
    """`(__getattr__, __dir__)` for a package whose public names are imported on first use.

    A name of `api` comes from its module; any other attribute is tried as a submodule
    (`pipelib.viz.display`), so `import pipelib` then `pipelib.viz.show` works too."""

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
