"""The transformers engine's KV kept beyond a step: a trajectory's between its turns, and one prompt's
prefill shared by the requests admitted with it.

With ``session_id`` (and ``n == 1``), the KV of a finished turn is kept; the next turn of the same
trajectory prefills only the tokens after the longest common prefix. Kept KV serves only the weights
and the adapter it was computed under: it is dropped when the weights change (an update through the
engine, or any in-place write of the module's parameters) and a turn of another adapter does not reuse
it. Admitted requests with the same prompt (a group's n trajectories) and the same kept KV (a tree
rollout's continuations, :meth:`SessionStore.clone`) are prefilled once (``share_prompts``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.engines.kv_batch import KeptKV
from toolrl.engines.scheduler import Request, Row


@dataclass
class Session:
    tokens: list[int]  # tokens whose KV is kept (prompt + generation minus the last, unfed, token)
    keys: list[torch.Tensor]  # per layer [1, kv_heads, len(tokens), head_dim]
    values: list[torch.Tensor]
    version: int
    experts: torch.Tensor | None = None  # [len(tokens), layers, top_k] uint8 on the device (record_routes)
    adapter: int = -1  # the adapter its KV was computed under (Request.adapter)


class SessionStore:
    """Kept sessions by id, least recently used dropped past ``limit``; ``enabled``: keep any.
    ``on_stale``: called when a take finds the module's parameters written since the last
    :meth:`invalidate` (it invalidates)."""

    def __init__(self, model: Any, enabled: bool, limit: int, on_stale: Callable[[], None]) -> None:
        self.model, self.enabled, self.limit, self._on_stale = model, enabled, limit, on_stale
        self._kept: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self.version = 0
        self._params = self._parameter_versions()

    def _parameter_versions(self) -> tuple[int, ...]:
        # Tensor._version counts in-place writes: an optimizer step on a shared module bumps it.
        return tuple(p._version for p in self.model.parameters())

    def invalidate(self) -> None:
        """New weights: nothing kept serves them."""
        self.clear()
        self.version += 1
        self._params = self._parameter_versions()

    def keeps(self, req: Request) -> bool:
        return req.session_id is not None and req.n == 1 and self.enabled

    def save(self, row: Row, kv: KeptKV) -> None:
        """Keep ``row``'s KV (of its real columns) for its trajectory's next turn."""
        tokens = row.req.prompt + row.tokens[:-1]
        if kv[0][0].shape[2] != len(tokens):
            return  # cannot happen unless the batch bookkeeping is broken; never store a wrong cache
        session = Session(tokens, *kv, self.version, torch.cat(row.experts) if row.experts else None, row.req.adapter)
        with self._lock:
            self._put([row.req.session_id], session)  # type: ignore[list-item]

    def _put(self, ids: Sequence[str], session: Session) -> None:
        """Under the lock."""
        for sid in ids:
            self._kept[sid] = session
            self._kept.move_to_end(sid)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def take(self, req: Request) -> Session | None:
        """The kept KV usable for ``req``, cut to its longest common prefix with the prompt (at least
        one prompt token is left to feed, since its logits start the generation)."""
        if not self.keeps(req):
            return None
        if self._parameter_versions() != self._params:
            self._on_stale()
        with self._lock:
            session = self._kept.pop(req.session_id, None)  # type: ignore[arg-type]
        if session is None or session.version != self.version or session.adapter != req.adapter:
            return None  # never a prefix computed under other weights, or another role's adapter
        limit = min(len(session.tokens), len(req.prompt) - 1)
        common = 0
        while common < limit and session.tokens[common] == req.prompt[common]:
            common += 1
        if common == 0:
            return None
        return Session(session.tokens[:common], [k[:, :, :common] for k in session.keys],
                       [v[:, :, :common] for v in session.values], session.version,
                       None if session.experts is None else session.experts[:common], session.adapter)

    def end(self, session_id: str) -> None:
        with self._lock:
            self._kept.pop(session_id, None)

    def clone(self, session_id: str, into: Sequence[str]) -> None:
        # The clones share the kept tensors (nothing writes them in place), so their first requests,
        # with one prompt, are prefilled once (prefill_sources).
        with self._lock:
            if (kept := self._kept.get(session_id)) is not None:
                self._put(into, kept)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


def prefill_sources(admitted: list[Request], reused: list[Session | None], share: bool) -> tuple[list[int], list[int]]:
    """Per admitted request, the prefill row it reads; and per row, the request prefilled there."""
    first: dict[tuple[Any, ...], int] = {}
    source: list[int] = []
    unique: list[int] = []
    for i, (req, kept) in enumerate(zip(admitted, reused)):
        # Image tokens are alike whatever the image: a prompt with images is keyed by them too; one on
        # kept KV, by that KV (cloned sessions share it: SessionStore.clone).
        kv = None if kept is None else (kept.keys[0].data_ptr(), len(kept.tokens))
        key = (tuple(req.prompt), tuple(i.png for i in req.images), kv, req.adapter) if share else None
        if key is not None and key in first:
            source.append(first[key])
            continue
        if key is not None:
            first[key] = len(unique)
        source.append(len(unique))
        unique.append(i)
    return source, unique
