"""Loading the model a command or notebook names: the one place a `Backbone` is made from a name, and
the one cache of a loaded model (`shared_backbone`; `lazy_backbone` defers it until needed)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.memory import keep_freed_memory
from bcr_core.engine.models import DEFAULT_MODEL


def load_backbone(model: str = DEFAULT_MODEL, dtype: str = "auto") -> Backbone:
    """The model in `dtype` (a `--dtype` name), with freed memory kept in the process (repeated prefills
    reuse it)."""
    keep_freed_memory()
    return Backbone.load(model, dtype=dtype)


_SHARED: dict[tuple[str, str], Backbone] = {}  # the last model loaded in this process


def shared_backbone(model: str, dtype: str = "auto") -> Backbone:
    """The model, loaded once per process while callers (a grid's cells) keep asking for it; one model
    at a time, so asking for another (or another dtype) lets the previous one's memory go back."""
    if (model, dtype) not in _SHARED:
        _SHARED.clear()
        _SHARED[model, dtype] = load_backbone(model, dtype)
    return _SHARED[model, dtype]


def lazy_backbone(model: str = DEFAULT_MODEL, dtype: str = "auto") -> Callable[[], Backbone]:
    """`shared_backbone` for this model, called only when a model is needed (a notebook that reads
    committed records loads none)."""
    return partial(shared_backbone, model, dtype)
