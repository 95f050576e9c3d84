"""The transformers engine's KV: the running batch's, and the KV kept beyond a step.

:class:`KVBatch`: per-layer buffers ``[slots, kv_heads, capacity, head_dim]`` the engine owns; the live
rows are the first slots (the model runs on the view ``buf[:live]``) and a row joins or leaves by copying
its own KV. A boolean mask marks each row's real columns (padding sits left of a row, between a reused
prefix and the new tokens, and where a longer row joined after it). Keys are stored after RoPE with each
token's true position id, so padding changes no attention result, only the summation order.

:class:`SessionStore`: with ``session_id`` (and ``n == 1``) a finished turn's KV is kept, and the next
turn prefills only what follows the longest common prefix; it serves only the weights (any update, or
in-place write, empties the store) and the adapter it was computed under. Admitted requests with one
prompt (a group) or one kept KV (a tree's clones) are prefilled once (:func:`prefill_sources`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.engines.transformers.scheduler import Request, Row
from toolrl.trajectory import common_prefix

# Buffer columns to allocate for a number of needed ones (the step runner's rounding).
Capacity = Callable[[int], int]
# Per layer, a row's kept KV [1, kv_heads, tokens, head_dim]: its keys and its values.
KeptKV = tuple[list[torch.Tensor], list[torch.Tensor]]


class KVBatch:
    """The running rows and their KV buffers (touched only by the worker thread; module docstring)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.mask = torch.zeros(0, 0, dtype=torch.bool)  # [live rows, capacity]
        self.positions = torch.zeros(0, dtype=torch.long)  # [rows] next position id per row
        self.length = 0  # used columns

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @classmethod
    def prefill(cls, deltas: Sequence[list[int]], kept: Sequence[KeptKV | None], prefix: Sequence[int],
                capacity: int, device: torch.device) -> tuple[KVBatch, torch.Tensor, torch.Tensor]:
        """A batch for prefilling ``deltas`` (each row's new tokens) left-padded, each on the first
        ``prefix`` tokens of its ``kept`` KV: the batch, and the ids and positions [rows, new] to feed."""
        tc, dm, b = max(prefix), max(map(len, deltas)), len(deltas)
        batch = cls()
        batch.mask = torch.zeros(b, capacity, dtype=torch.bool, device=device)
        ids = torch.zeros(b, dm, dtype=torch.long, device=device)  # padding ids are masked out
        pos = torch.zeros(b, dm, dtype=torch.long, device=device)
        for i, (delta, p) in enumerate(zip(deltas, prefix)):
            batch.mask[i, tc - p : tc] = True
            batch.mask[i, tc + dm - len(delta) : tc + dm] = True
            ids[i, dm - len(delta) :] = torch.tensor(delta, device=device)
            pos[i, dm - len(delta) :] = torch.arange(p, p + len(delta), device=device)
        if tc:
            layers = range(len(next(kv for kv in kept if kv)[0]))
            batch.keys = [cls._place([kv[0][li] if kv else None for kv in kept], prefix, tc, capacity) for li in layers]
            batch.values = [cls._place([kv[1][li] if kv else None for kv in kept], prefix, tc, capacity) for li in layers]
            batch.length = tc
        return batch, ids, pos

    @staticmethod
    def _place(parts: list[torch.Tensor | None], prefix: Sequence[int], tc: int, capacity: int) -> torch.Tensor:
        """Stack per-row kept KV [1, heads, p, dim], right-aligned at column ``tc``."""
        like = next(t for t in parts if t is not None)
        out = like.new_zeros(len(parts), like.shape[1], capacity, like.shape[3])
        for i, (t, p) in enumerate(zip(parts, prefix)):
            if t is not None:
                out[i, :, tc - p : tc] = t[0, :, :p]
        return out

    def select(self, order: list[int]) -> None:
        """Make row i a copy of row ``order[i]`` (a prefilled prompt read by each of its samples)."""
        index = torch.tensor(order, device=self.mask.device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)

    def row_kv(self, i: int) -> KeptKV:
        """Row ``i``'s KV of its real columns, in order (copies: they do not pin the buffers)."""
        cols = self.mask[i, : self.length].nonzero()[:, 0]
        return [k[i : i + 1, :, cols] for k in self.keys], [v[i : i + 1, :, cols] for v in self.values]

    def keep(self, keep: list[int], capacity: Capacity) -> None:
        """Keep rows ``keep``, in order, and drop the others."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.__init__()
            return
        # The kept rows past the new end move into the freed slots before it: one row's KV each.
        live, kept, device = len(keep), set(keep), self.mask.device
        holes = [i for i in range(live) if i not in kept]
        movers = [i for i in keep if i >= live]
        order = list(range(live))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        if movers:
            dst, src = torch.tensor(holes, device=device), torch.tensor(movers, device=device)
            for buf in self.keys + self.values:
                buf[dst, :, : self.length] = buf[src, :, : self.length]
        idx = torch.tensor(order, device=device)
        self.rows = [self.rows[i] for i in order]
        self.mask = self.mask.index_select(0, idx)
        self.positions = self.positions.index_select(0, idx)
        self.compact(capacity)

    def compact(self, capacity: Capacity) -> None:
        """Drop padding columns when they waste a quarter of the cache: each row's real columns are
        gathered, in order, to the right end (keys keep their RoPE positions, so this is exact)."""
        used = self.mask[:, : self.length]
        real = int(used.sum(1).max())
        waste = self.length - real
        if waste < max(16, self.length // 4):
            return
        # A stable sort on the mask puts each row's padding first and its real columns last, in order.
        order = torch.sort(used.to(torch.int8), dim=1, stable=True).indices[:, waste:]
        columns = capacity(real + max(64, real // 2))
        mask = torch.zeros(len(self.rows), columns, dtype=torch.bool, device=self.mask.device)
        mask[:, :real] = used.gather(1, order)
        self.keys = [self._gather_columns(k, order, columns) for k in self.keys]
        self.values = [self._gather_columns(v, order, columns) for v in self.values]
        self.mask, self.length = mask, real

    @staticmethod
    def _gather_columns(buf: torch.Tensor, order: torch.Tensor, capacity: int) -> torch.Tensor:
        """The live rows' columns ``order`` [live, n] of ``buf``, first in a buffer with its slots."""
        (b, n), (slots, h, _, d) = order.shape, buf.shape
        out = buf.new_zeros(slots, h, capacity, d)
        out[:b, :, :n] = buf[:b].gather(2, order[:, None, :, None].expand(b, h, n, d))
        return out

    def merge(self, new: KVBatch, max_slots: int, capacity: Capacity) -> KVBatch:
        """The batch running after ``new``'s rows join: written into this one's next free slots,
        right-aligned at its write column (``new`` itself when this one is empty). A longer newcomer
        moves that column right instead: the running rows keep their KV where it is and a masked gap
        (``compact`` drops gaps once they waste a quarter)."""
        if not new.rows or not self.rows:
            return new if new.rows else self
        b1, b2, length = len(self.rows), len(new.rows), max(self.length, new.length)
        # Out of slots: double them (up to max_slots), so the next joiner finds its slot free.
        spare = min(2 * self.slots, max_slots)
        self.reserve(length, b1 + b2 if b1 + b2 <= self.slots else max(b1 + b2, spare), capacity)
        start = length - new.length
        # Masked columns keep what a former row left there: finite KV that gets exactly zero weight.
        for dst, src in zip(self.keys + self.values, new.keys + new.values):
            dst[b1 : b1 + b2, :, start:length] = src[:b2, :, : new.length]  # its live rows, not its spare slots
        mask = self.mask.new_zeros(b1 + b2, self.capacity)
        mask[:b1] = self.mask
        mask[b1:, start:length] = new.mask[:, : new.length]
        self.rows += new.rows
        self.mask, self.length = mask, length
        self.positions = torch.cat([self.positions, new.positions])
        self.compact(capacity)
        return self

    def reserve(self, needed: int, slots: int, capacity: Capacity) -> None:
        """Grow the buffers (doubling) so that ``needed`` columns and ``slots`` rows fit; the live rows'
        used columns are copied over."""
        if needed <= self.capacity and slots <= self.slots:
            return
        columns = self.capacity if needed <= self.capacity else capacity(max(needed + 64, 2 * self.capacity))
        slots = max(slots, self.slots)
        live, used = self.mask.shape[0], self.length
        mask = self.mask.new_zeros(live, columns)
        mask[:, :used] = self.mask[:, :used]
        self.mask = mask

        def grown(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros(slots, buf.shape[1], columns, buf.shape[3])
            out[:live, :, :used] = buf[:live, :, :used]
            return out

        self.keys = [grown(k) for k in self.keys]
        self.values = [grown(v) for v in self.values]


@dataclass
class Session:
    tokens: list[int]  # tokens whose KV is kept (prompt + generation minus the last, unfed, token)
    keys: list[torch.Tensor]  # per layer [1, kv_heads, len(tokens), head_dim]
    values: list[torch.Tensor]
    experts: torch.Tensor | None = None  # [len(tokens), layers, top_k] uint8 on the device (record_routes)
    adapter: str | None = None  # the adapter its KV was computed under (Request.adapter)


class SessionStore:
    """Kept sessions by id, least recently used dropped past ``limit``; ``enabled``: keep any.
    ``on_stale``: called when a take finds the module's parameters written since the last
    :meth:`invalidate` (it invalidates)."""

    def __init__(self, model: Any, enabled: bool, limit: int, on_stale: Callable[[], None]) -> None:
        self.model, self.enabled, self.limit, self._on_stale = model, enabled, limit, on_stale
        self._kept: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._params = self._parameter_versions()

    def _parameter_versions(self) -> tuple[int, ...]:
        # Tensor._version counts in-place writes: an optimizer step on a shared module bumps it.
        return tuple(p._version for p in self.model.parameters())

    def invalidate(self) -> None:  # new weights: nothing kept serves them
        self.clear()
        self._params = self._parameter_versions()

    def keeps(self, req: Request) -> bool:
        return req.session_id is not None and req.n == 1 and self.enabled

    def save(self, row: Row, batch: KVBatch, i: int) -> None:
        """Keep the KV of ``row`` (row ``i`` of ``batch``, done) for its trajectory's next turn."""
        if not self.keeps(row.req):
            return
        tokens, kv = row.req.prompt + row.tokens[:-1], batch.row_kv(i)
        if kv[0][0].shape[2] != len(tokens):
            return  # cannot happen unless the batch bookkeeping is broken; never store a wrong cache
        session = Session(tokens, *kv, torch.cat(row.experts) if row.experts else None, row.req.adapter)
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
        if session is None or session.adapter != req.adapter:
            return None  # never a prefix computed under another role's adapter
        common = common_prefix(session.tokens, req.prompt[:-1])
        if common == 0:
            return None
        return Session(session.tokens[:common], [k[:, :, :common] for k in session.keys],
                       [v[:, :, :common] for v in session.values],
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
    first: dict[Any, int] = {}
    source: list[int] = []
    unique: list[int] = []
    for i, (req, kept) in enumerate(zip(admitted, reused)):
        # Image tokens are alike whatever the image: a prompt with images is keyed by them too; one on
        # kept KV, by that KV (cloned sessions share it: SessionStore.clone). Unshared: a key of its own.
        kv = None if kept is None else (kept.keys[0].data_ptr(), len(kept.tokens))
        key = (tuple(req.prompt), tuple(img.png for img in req.images), kv, req.adapter) if share else i
        if key not in first:
            first[key] = len(unique)
            unique.append(i)
        source.append(first[key])
    return source, unique
