"""A weight transport's buckets into an engine: each bucket's pieces written as weight rows
(:mod:`toolrl.modeling.weight_rows`), every sender's link at once, between two decode steps."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolrl.transports import BucketHeader, Load, WeightReceiver


def engine_loader(engine: Any) -> Load:
    """A receiver's ``load``: each piece of a bucket written into ``engine`` as rows."""

    def load(header: BucketHeader, data: Any) -> None:
        for piece in header.pieces:
            engine.load_weight_rows(piece.name, piece.shape, piece.start, piece.view(data))

    return load


def receive_into(engine: Any, receivers: Sequence[WeightReceiver], version: int) -> int:
    """One weight update into ``engine`` from every sender's link at once (a thread each), held
    between two decode steps (:meth:`~toolrl.engines.RolloutEngine.updating_weights`) and labelled
    ``version``; returns the bytes received. A transport error in any link is raised once all have
    ended (each within its link's timeout)."""
    load = engine_loader(engine)
    with engine.updating_weights(version), ThreadPoolExecutor(max(1, len(receivers))) as pool:
        futures = [pool.submit(r.receive, load) for r in receivers]
        received = sum(f.result() for f in futures)
        engine.finish_weight_rows()
    return received
