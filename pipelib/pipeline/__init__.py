"""pipelib.pipeline"""
from pipelib._lazy import lazy

API: dict[str, str] = {}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
