"""Weights as rows, the one form every weight update of a model takes: ``(name, whole shape, first row,
rows)`` into an engine's :meth:`~toolrl.engines.RolloutEngine.load_weight_rows`, ended by its
:meth:`~toolrl.engines.RolloutEngine.finish_weight_rows`, inside its
:meth:`~toolrl.engines.RolloutEngine.updating_weights` (the caller's). A weight transport's buckets
(:mod:`toolrl.engines.receive`), the trainer's weights in its own process
(:mod:`toolrl.training.weight_sync`) and a whole state dict (:func:`whole`, :func:`load_rows`) all
arrive so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

# (weight name, whole shape, first row along dim 0, the rows)
Rows = tuple[str, tuple[int, ...], int, Any]


def whole(state_dict: Mapping[str, Any]) -> Iterator[Rows]:
    """Each tensor of ``state_dict`` as one piece of all its rows."""
    return ((name, tuple(t.shape), 0, t) for name, t in state_dict.items())


def load_rows(engines: Sequence[Any], rows: Iterable[Rows]) -> None:
    """``rows`` into every engine of ``engines``, then the update finished on each (the caller holds
    them in ``updating_weights``)."""
    for name, shape, start, piece in rows:
        for engine in engines:
            engine.load_weight_rows(name, shape, start, piece)
    for engine in engines:
        engine.finish_weight_rows()
