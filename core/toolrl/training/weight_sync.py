"""What the trainer sends in a weight sync; what an engine takes is :mod:`toolrl.transports.weight_rows`.

Every rank sends over its own link the rows it owns (:func:`send_owned`): of a tensor sharded by rows its
shard, read in place; any other whole by one rank, round-robin. In the trainer's own process the rows go
straight into the engines there (:func:`push_local`). What travels (:class:`SyncPlan`) and why:
docs/weights.md.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.config import Config
from toolrl.modeling.adapters import adapter_of, apply_adapters, apply_lora, lora_layers
from toolrl.training import lora
from toolrl.transports import ALIGN, Bucket, BucketHeader, RowPiece, WeightSender
from toolrl.transports.weight_rows import Rows, load_rows


@dataclass
class SyncStats:
    seconds: float = 0.0
    peak_bytes: int = 0  # most bytes held at once for the sync (bucket buffers, or a merged copy)
    bytes_sent: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {"weight_sync_s": self.seconds, "weight_sync_peak_mb": self.peak_bytes / 2**20}


@dataclass(frozen=True)
class SyncPlan:
    """What a weight sync sends: ``adapters``: only the LoRA adapter tensors (else the engine's whole
    weights, LoRA merged in); ``delta``: only the tensors written since the receivers' last sync;
    ``policies``: under ``model.adapters``, the trained adapters' names, whole adapters only when
    changed (``delta`` then set)."""

    adapters: bool = False
    delta: bool = False
    policies: tuple[str, ...] = ()


def prepare_engine(engine: Any, config: Config, plan: SyncPlan) -> None:
    """Under an adapter-only ``plan``: ``engine`` given the run's adapters by the trainer's own injection
    (:mod:`toolrl.modeling.adapters`), so the adapter tensors the trainer sends load by name."""
    if plan.adapters and config.model.adapters is not None:
        engine.apply_adapters(functools.partial(apply_adapters, adapters=config.model.adapters))
    elif plan.adapters:
        engine.apply_adapters(functools.partial(apply_lora, config=config.model.lora))


@dataclass
class Delta:
    """Delta sync's memory for one set of receivers: per weight (or rows of it), the storage and
    version counter (``Tensor._version``, which every in-place write bumps: an optimizer step, a
    checkpoint load) of the tensor last sent. One not written since is not sent again. :meth:`commit`
    once every receiver took the sync; new receivers (or a failed sync: :meth:`reset`) get everything."""

    sent: dict[str, tuple[int, int]] = field(default_factory=dict)
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)
    agreed: dict[str, bool] = field(default_factory=dict)  # this sync's answers for sharded tensors (:meth:`agree`)

    def changed(self, name: str, tensor: Any, agree: bool = False) -> bool:
        """Whether ``tensor`` (weight ``name``) was written since it was sent. A DTensor counts its own
        writes (its local shard's counter does not move); with ``agree`` every rank of its mesh takes
        the same answer, as the gather that follows needs (decided by :meth:`agree` for the sync)."""
        if agree and name in self.agreed:
            return self.agreed.pop(name)
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        mark = (local.data_ptr(), tensor._version)
        self.pending[name] = mark
        return self.sent.get(name) != mark

    def agree(self, state: Mapping[str, Any]) -> None:
        """Every rank of each sharded tensor's mesh takes the same :meth:`changed` answer for it: one
        all-reduce per mesh for the whole sync (a collective: every rank calls it with the same state),
        not one per tensor."""
        import torch
        import torch.distributed as dist

        meshes: dict[int, tuple[Any, list[str]]] = {}
        for name, tensor in state.items():
            if hasattr(tensor, "device_mesh") and tensor.device_mesh.size() > 1:
                meshes.setdefault(id(tensor.device_mesh), (tensor.device_mesh, []))[1].append(name)
        self.agreed = {}
        for mesh, names in meshes.values():
            device = state[names[0]].to_local().device
            flags = torch.tensor([int(self.changed(n, state[n])) for n in names], device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=mesh.get_group())
            self.agreed.update(zip(names, map(bool, flags.tolist()), strict=True))

    def commit(self) -> None:
        self.sent.update(self.pending)
        self.pending = {}

    def reset(self) -> None:
        self.sent, self.pending = {}, {}


def _engine_entries(model: Any, plan: SyncPlan,
                    delta: Delta | None = None) -> tuple[Iterator[tuple[str, Any, Any]], set[int]]:
    """``(engine name, tensor, the model's own tensor or None)`` of what the plan sends, before delta,
    each once (a tied second name travels under the first; a merged tensor has no own tensor, so delta
    always sends it), and the storages of the model's unsharded tensors. One walk of the model's state per
    sync (``keep_vars``: a detached copy of every entry costs tens of milliseconds at 135M)."""
    state = model.state_dict(keep_vars=True)
    if delta is not None:
        delta.agree(state)
    own = {v.data_ptr() for v in state.values() if not hasattr(v, "full_tensor")}
    first = {id(value): name for name, value in reversed(state.items())}  # each tensor's first name
    tied = set(state) - set(first.values())
    found: Iterator[tuple[str, Any, Any]]
    if plan.policies:
        found = _changed_policies(model, state, plan.policies, delta)
    elif plan.adapters:
        found = ((n, t, t) for n, t in lora.iter_adapter_weights(model, state))
    elif not lora_layers(model):
        found = ((n, t, t) for n, t in state.items())
    else:  # gathered (and merged) already
        found = ((n, t, state.get(n)) for n, t in lora.iter_engine_weights(model, state))
    return ((n, t, source) for n, t, source in found if n not in tied), own


def _changed_policies(model: Any, state: Mapping[str, Any], policies: Sequence[str],
                      delta: Delta | None) -> Iterator[tuple[str, Any, None]]:
    """The tensors of each adapter of ``policies`` one of whose tensors ``delta`` saw written since the
    last sync (every one without ``delta``), whole: an engine loads an adapter by name. Decided here,
    so none has an own tensor for delta to ask about again."""
    tensors = list(lora.iter_adapter_weights(model, state, policies))
    changed = {adapter_of(n) for n, t in tensors if delta is None or delta.changed(n, t)}
    return ((n, t, None) for n, t in tensors if adapter_of(n) in changed)


def _full(tensor: Any) -> Any:
    """``tensor`` whole and detached (a sharded one gathered: a collective)."""
    if not hasattr(tensor, "full_tensor"):
        return tensor.detach()
    import torch

    with torch.no_grad():
        return tensor.full_tensor()


def _owned_weights(model: Any, rank: int, world_size: int, plan: SyncPlan = SyncPlan(),
                   delta: Delta | None = None, stats: SyncStats | None = None) -> Iterator[Rows]:
    """``(name, whole shape, first row, rows)`` of every engine weight this rank sends (module docstring);
    gathering a sharded tensor is a collective, so every rank walks every tensor. ``stats``: the largest
    copy made as the peak."""
    whole = 0
    entries, own = _engine_entries(model, plan, delta)
    for name, tensor, source in entries:
        if _row_sharded(tensor):
            local = tensor.to_local()
            if local.numel() and (delta is None or delta.changed(name, tensor)):
                per = -(-tensor.shape[0] // tensor.device_mesh.size())  # torch.chunk's rows per rank
                yield name, tuple(tensor.shape), tensor.device_mesh.get_local_rank() * per, local.detach()
            continue
        mine = whole % world_size == rank
        whole += 1
        if delta is not None and source is not None and not delta.changed(name, source, agree=True):
            continue
        tensor = _full(tensor)  # a sharded one: every rank takes part, in the same order
        if stats is not None and tensor.data_ptr() not in own:
            stats.peak_bytes = max(stats.peak_bytes, tensor.numel() * tensor.element_size())
        if mine:
            yield name, tuple(tensor.shape), 0, tensor


def _row_sharded(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(tensor, DTensor) and tensor.device_mesh.ndim == 1 and tuple(tensor.placements) == (Shard(0),)


def owned_buckets(model: Any, rank: int, world_size: int, bucket_bytes: int, stats: SyncStats,
                  plan: SyncPlan = SyncPlan(), delta: Delta | None = None) -> Iterator[Bucket]:
    """The weights rank ``rank`` sends (:func:`_owned_weights`) as packed buckets of at most
    ``bucket_bytes`` (a larger piece travels alone); each bucket's ``fill`` copies its pieces into the
    transport's buffer."""
    return _packed(_owned_weights(model, rank, world_size, plan, delta), bucket_bytes, stats)


def _packed(weights: Iterable[Rows], bucket_bytes: int,
            stats: SyncStats) -> Iterator[Bucket]:
    """``(name, whole shape, first row, rows)`` pieces packed into buckets of at most ``bucket_bytes``;
    ``stats``: the bytes sent and, as the peak, the transport's two buffers of the largest bucket."""
    pieces: list[RowPiece] = []
    tensors: list[Any] = []
    size = 0

    def bucket() -> Bucket:
        stats.peak_bytes = max(stats.peak_bytes, 2 * size)
        return Bucket(BucketHeader(pieces=list(pieces), nbytes=size), functools.partial(_pack, list(pieces), list(tensors)))

    for name, shape, start, rows in weights:
        nbytes = rows.numel() * rows.element_size()
        if pieces and size + nbytes > bucket_bytes:
            yield bucket()
            pieces, tensors, size = [], [], 0
        pieces.append(RowPiece(name=name, shape=shape, dtype=str(rows.dtype).removeprefix("torch."), start=start,
                            rows=rows.shape[0] if rows.dim() else 1, offset=size, nbytes=nbytes))
        tensors.append(rows)
        size = -(-(size + nbytes) // ALIGN) * ALIGN
        stats.bytes_sent += nbytes
    if pieces:
        yield bucket()


def _pack(pieces: Sequence[Any], tensors: Sequence[Any], buffer: Any) -> None:
    for piece, tensor in zip(pieces, tensors, strict=True):
        import torch

        buffer[piece.offset:piece.offset + piece.nbytes].copy_(tensor.contiguous().reshape(-1).view(torch.uint8))


def send_owned(model: Any, sender: WeightSender, rank: int, world_size: int, bucket_mb: float,
               plan: SyncPlan = SyncPlan(), delta: Delta | None = None) -> SyncStats:
    """This rank's share of the weights (what ``plan`` and ``delta`` say) over ``sender``'s link. Peak
    memory: the transport's two bucket buffers (plus gathered tensors, under merged LoRA). The caller
    commits ``delta`` once every receiver took the sync."""
    stats = SyncStats()
    t0 = time.perf_counter()
    sender.send(owned_buckets(model, rank, world_size, int(bucket_mb * 2**20), stats, plan, delta))
    stats.seconds = time.perf_counter() - t0
    return stats


def send_engine_weights(engine: Any, sender: WeightSender, bucket_mb: float) -> SyncStats:
    """A live engine's weights (:meth:`~toolrl.engines.RolloutEngine.weight_tensors`, each tensor once)
    over ``sender``'s link, to a new engine in place of the trainer's; the caller holds the engine's
    weights still meanwhile (``updating_weights``)."""
    stats = SyncStats()
    t0 = time.perf_counter()
    seen: set[tuple[Any, ...]] = set()
    whole = []
    for name, tensor in engine.weight_tensors().items():
        same = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)  # a tied tensor under a second name
        if tensor.numel() == 0 or same not in seen:
            seen.add(same)
            whole.append((name, tuple(tensor.shape), 0, tensor))
    sender.send(_packed(whole, int(bucket_mb * 2**20), stats))
    stats.seconds = time.perf_counter() - t0
    return stats


def push_local(model: Any, engines: Sequence[Any], plan: SyncPlan = SyncPlan(), delta: Delta | None = None) -> SyncStats:
    """The weights (what ``plan`` and ``delta`` say) as rows straight into ``engines``, in this process
    (one rank: no link, no bucket; an engine sharing the trainer's module copies nothing), held by the
    caller in ``updating_weights``. The caller commits ``delta``."""
    stats = SyncStats()
    t0 = time.perf_counter()

    def counted() -> Iterator[Rows]:
        for rows in _owned_weights(model, 0, 1, plan, delta, stats):
            stats.bytes_sent += rows[3].numel() * rows[3].element_size()
            yield rows

    load_rows(engines, counted())
    stats.seconds = time.perf_counter() - t0
    return stats
