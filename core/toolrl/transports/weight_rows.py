"""What an engine takes: weights as rows (:meth:`~toolrl.engines.RolloutEngine.load_weight_rows`), the
one receiving contract. A weight transport's buckets (:func:`receive_into`), the trainer's weights in
its own process and a whole state dict (:func:`load_rows`) all arrive as ``(name, whole shape, first
row, rows)`` and end with :meth:`~toolrl.engines.RolloutEngine.finish_weight_rows`, inside
:meth:`~toolrl.engines.RolloutEngine.updating_weights` (the caller's). What the trainer sends is
:mod:`toolrl.training.weight_sync`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolrl.transports import BucketHeader, WeightReceiver

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


def receive_into(engine: Any, receivers: Sequence[WeightReceiver], version: int) -> int:
    """One weight update into ``engine`` from every sender's link at once (a thread each), held
    between two decode steps (:meth:`~toolrl.engines.RolloutEngine.updating_weights`) and labelled
    ``version``; returns the bytes received. A transport error in any link is raised once all have
    ended (each within its link's timeout)."""
    def load(header: BucketHeader, data: Any) -> None:  # each piece of a bucket into the engine, as rows
        for piece in header.pieces:
            engine.load_weight_rows(piece.name, piece.shape, piece.start, piece.view(data))

    with engine.updating_weights(version), ThreadPoolExecutor(max(1, len(receivers))) as pool:
        futures = [pool.submit(r.receive, load) for r in receivers]
        received = sum(f.result() for f in futures)
        engine.finish_weight_rows()
    return received
