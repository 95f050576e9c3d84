"""Weights from the trainer to the engines, in buckets.

Every rank walks the model's state in the same order; a sharded (DTensor) entry is gathered with
``full_tensor()`` (a collective, so every rank takes part), rank 0 keeps it in the current bucket and
the others drop it at once. A full bucket (``bucket_mb``) is handed to the sinks and freed before the
next one fills, so no rank ever holds a second full copy of the model: the extra memory is one
bucket plus the tensor being gathered. Tied tensors are sent once, under their first name.

A sink is a callable ``(bucket, last)``: an engine in this process (:func:`engine_sink`), or one that
sends the bucket to rollout workers (:func:`ray_sink`), which may be generating meanwhile: they stage
the buckets (:class:`toolrl.engines.BucketStager`) and load them together on the last one, which carries the
weights' version.

Over a linked transport (:mod:`toolrl.transports`) no rank gathers: each sends what it owns
(:func:`owned_buckets`, :func:`send_owned`) and each engine takes every rank's link at once
(:func:`receive_into`), writing the rows in place.

What travels (:class:`SyncPlan`, decided once per run by :func:`sync_plan`): under LoRA, to an engine
that applies adapters itself, only the adapter tensors (:func:`prepare_engine` gives the engine the
same adapters first); with ``trainer.weight_sync: delta``, only the tensors written since the same
receivers' last completed sync (:class:`Delta`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from toolrl.config import Config, ConfigError, field_where
from toolrl.plugins.parts import lookup_part
from toolrl.training import lora
from toolrl.transports import ALIGN, Bucket, BucketHeader, Load, RowPiece, WeightReceiver, WeightSender

# (bucket, last) -> bytes the sink itself holds while the bucket is in flight (e.g. an object-store copy).
Sink = Callable[[Mapping[str, Any], bool], int]


@dataclass
class SyncStats:
    seconds: float = 0.0
    peak_bytes: int = 0  # most bytes held at once for the sync (bucket + tensor being gathered)
    buckets: int = 0
    bytes_sent: int = 0
    held: int = 0  # bytes of copies in the current bucket

    def as_metrics(self) -> dict[str, float]:
        return {"weight_sync_s": self.seconds, "weight_sync_peak_mb": self.peak_bytes / 2**20}


@dataclass(frozen=True)
class SyncPlan:
    """What a weight sync sends: ``adapters``: only the LoRA adapter tensors (else the engine's whole
    weights, LoRA merged in); ``delta``: only the tensors written since the receivers' last sync."""

    adapters: bool = False
    delta: bool = False


def sync_plan(config: Config, engine_cls: Any = None) -> SyncPlan:
    """The run's :class:`SyncPlan`: adapters alone under ``model.lora`` when the engine takes them
    (``RolloutEngine.loads_adapters``: the transformers and vLLM engines; any other gets merged
    weights), delta with ``trainer.weight_sync: delta``, which needs an engine that keeps what it is
    not sent (``RolloutEngine.partial_weight_updates``): otherwise a :class:`~toolrl.config.ConfigError`.
    ``engine_cls``: the configured engine's class (looked up by ``engine.name`` when not given)."""
    if engine_cls is None:
        engine_cls = lookup_part("rollout_engines", config.engine.name, field_where(config, "engine.name"))
    delta = config.trainer.weight_sync == "delta"
    if delta and not engine_cls.partial_weight_updates:
        raise ConfigError(f"{field_where(config, 'trainer.weight_sync')}: delta needs an engine that keeps the "
                          "weights it is not sent; "
                          f"the {config.engine.name} engine loads whole updates: use full")
    return SyncPlan(adapters=config.model.lora is not None and engine_cls.loads_adapters, delta=delta)


def prepare_engine(engine: Any, config: Config) -> None:
    """Under an adapter-only :class:`SyncPlan`: ``engine`` given the run's LoRA adapters by the trainer's
    own injection (:func:`toolrl.training.lora.apply_lora`: on its base model, or for vLLM on a skeleton
    that tells the adapter's names, shapes and config), so the adapter tensors the trainer sends load
    by name; the base weights stay untouched."""
    if sync_plan(config, type(engine)).adapters:
        engine.apply_adapters(functools.partial(lora.apply_lora, config=config.model.lora))


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
    """``(engine name, tensor, the model's own tensor or None)`` of what the plan sends, before delta:
    the adapters, or every engine weight (LoRA merged in: a merged tensor has no own tensor, so delta
    always sends it), each once (a tied second name, e.g. an LM head tied to the embeddings, is left
    out: it travels under the first); sharded tensors are left sharded. Also the storages of the
    model's unsharded tensors (a tensor sent from one of them is not a copy). One walk of the model's
    state per sync: ``keep_vars`` (FSDP2's pre-save hooks still put the sharded parameters back) with
    no detached copy of every entry, which costs tens of milliseconds on a LoRA model of 135M. With
    ``delta``, the ranks agree on what changed at once (:meth:`Delta.agree`)."""
    state = model.state_dict(keep_vars=True)
    if delta is not None:
        delta.agree(state)
    own = {v.data_ptr() for v in state.values() if not hasattr(v, "full_tensor")}
    seen: set[int] = set()
    tied = set()
    for name, value in state.items():
        if id(value) in seen:
            tied.add(name)
        seen.add(id(value))

    def entries() -> Iterator[tuple[str, Any, Any]]:
        if plan.adapters:
            found = ((n, t, t) for n, t in lora.iter_adapter_weights(model, state))
        elif not lora.lora_layers(model):
            found = ((n, t, t) for n, t in state.items())
        else:  # gathered (and merged) already
            found = ((n, t, state.get(n)) for n, t in lora.iter_engine_weights(model, state))
        return ((n, t, source) for n, t, source in found if n not in tied)

    return entries(), own


def _wanted(name: str, own: Any, delta: Delta | None) -> bool:
    return delta is None or own is None or delta.changed(name, own, agree=True)


# A sharded tensor of at most this many bytes is gathered together with others, up to GATHER_BATCH
# bytes in one all-gather: one collective per tensor costs a round trip each (420 adapters of a LoRA
# model), while a large tensor alone keeps the extra memory at one tensor.
GATHER_SMALL = 4 << 20
GATHER_BATCH = 16 << 20


def _gathered(entries: Iterable[tuple[str, Any, Any]], delta: Delta | None,
              stats: SyncStats) -> Iterator[tuple[str, Any]]:
    """``(name, whole tensor)`` of the entries delta wants, in their order, sharded ones gathered: small
    row-sharded ones of one mesh batched (:func:`gather_rows`), any other alone (``full_tensor()``).
    A collective: every rank walks the same entries."""
    batch: list[tuple[str, Any]] = []
    size = 0

    def flush() -> Iterator[tuple[str, Any]]:
        nonlocal batch, size
        if batch:
            whole = gather_rows([t for _, t in batch])
            stats.peak_bytes = max(stats.peak_bytes, stats.held + 2 * size)  # the gathered bytes and their copy
            yield from zip([n for n, _ in batch], whole, strict=True)
        batch, size = [], 0

    for name, tensor, source in entries:
        if not _wanted(name, source, delta):
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if _row_sharded(tensor) and nbytes <= GATHER_SMALL:
            if batch and (size + nbytes > GATHER_BATCH or tensor.device_mesh != batch[0][1].device_mesh):
                yield from flush()
            batch.append((name, tensor))
            size += nbytes
            continue
        yield from flush()
        yield name, _full(tensor)
    yield from flush()


def _full(tensor: Any) -> Any:
    """``tensor`` whole and detached (a sharded one gathered: a collective)."""
    if not hasattr(tensor, "full_tensor"):
        return tensor.detach()
    import torch

    with torch.no_grad():
        return tensor.full_tensor()


def gather_rows(tensors: Sequence[Any]) -> list[Any]:
    """Row-sharded ``DTensor`` s (FSDP2's ``Shard(0)``) of one 1-D mesh, whole on every rank, with one
    all-gather of their local rows packed as bytes (each rank's rows padded to the ``ceil(rows /
    ranks)`` every rank but the last holds); equal to ``full_tensor()`` of each, byte for byte."""
    import torch
    import torch.distributed as dist

    world = tensors[0].device_mesh.size()
    parts, spans = [], []
    for t in tensors:
        local = t.to_local().detach().contiguous().reshape(-1).view(torch.uint8)
        per = _rows_per_rank(t)
        row = math.prod(t.shape[1:]) * t.element_size()
        parts.append(local)
        if per * row > local.numel():
            parts.append(local.new_zeros(per * row - local.numel()))
        spans.append((per, row))
    mine = torch.cat(parts)
    out = mine.new_empty(world * mine.numel())
    # all_gather_single: all_gather_into_tensor's name from torch 2.13 on (the old one warns there).
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, mine, group=tensors[0].device_mesh.get_group())
    ranks = out.view(world, -1)
    whole, offset = [], 0
    for t, (per, row) in zip(tensors, spans, strict=True):
        rows = [ranks[r, offset:offset + max(0, min(per, t.shape[0] - r * per)) * row] for r in range(world)]
        whole.append(torch.cat(rows).view(t.dtype).view(tuple(t.shape)))
        offset += per * row
    return whole


def iter_buckets(model: Any, bucket_bytes: int, stats: SyncStats, *, keep: bool = True,
                 device: str = "cpu", plan: SyncPlan = SyncPlan(),
                 delta: Delta | None = None) -> Iterator[tuple[dict[str, Any], bool]]:
    """``model``'s weights as engines load them (parameters and persistent buffers under the base
    model's names, LoRA merged in; only the adapters, or only what changed, as ``plan`` and ``delta``
    say) as ``(bucket, last)``: buckets of at most ``bucket_bytes`` (a larger tensor travels alone), on
    ``device``, the final one marked. With ``keep=False`` (ranks other than the sender) gathered
    tensors are dropped and nothing is yielded."""
    bucket: dict[str, Any] = {}
    entries, own = _engine_entries(model, plan, delta)
    for name, tensor in _gathered(entries, delta, stats):
        moved = tensor.to(device)
        copied = moved.data_ptr() not in own
        nbytes = moved.numel() * moved.element_size()
        stats.peak_bytes = max(stats.peak_bytes, stats.held + (nbytes if copied else 0))
        if not keep:
            continue
        if bucket and stats.held + nbytes > bucket_bytes:
            yield bucket, False  # this tensor goes in the next one: not the last
            bucket, stats.held = {}, 0
        bucket[name] = moved
        stats.held += nbytes if copied else 0
        stats.bytes_sent += nbytes
    if bucket:
        yield bucket, True


def push(model: Any, sinks: Sequence[Sink], bucket_mb: float, *, send: bool = True, device: str = "cpu",
         plan: SyncPlan = SyncPlan(), delta: Delta | None = None) -> SyncStats:
    """Send ``model``'s weights (what ``plan`` and ``delta`` say) to every sink in buckets;
    ``send=False`` on ranks that only take part in the gathers. Each sink gets ``last=True`` with the
    final bucket (an empty one when nothing travels: delta, nothing written). The caller commits
    ``delta`` once every sink took the sync."""
    stats = SyncStats()
    t0 = time.perf_counter()
    ended = False
    for bucket, last in iter_buckets(model, int(bucket_mb * 2**20), stats, keep=send, device=device, plan=plan,
                                     delta=delta):
        for sink in sinks:
            stats.peak_bytes = max(stats.peak_bytes, stats.held + sink(bucket, last))
        stats.buckets += 1
        ended = last
        del bucket
    if send and not ended:
        for sink in sinks:
            sink({}, True)
    stats.seconds = time.perf_counter() - t0
    return stats


def engine_sink(engine: Any) -> Sink:
    """A sink into an engine in this process (:meth:`~toolrl.engines.RolloutEngine.update_weights_bucket`:
    a no-op copy for an engine sharing the trainer's module)."""

    def sink(bucket: Mapping[str, Any], last: bool) -> int:
        engine.update_weights_bucket(bucket, last)
        return 0

    return sink


def ray_sink(workers: Sequence[Any], dead: set[int], version: int | None = None,
             timeout_s: float | None = None) -> Sink:
    """A sink that puts each bucket in Ray's object store once and sends it to every live worker
    (:meth:`toolrl.roles.rollout_workers.RolloutWorker.update_weights_bucket`), waiting for all before the next
    bucket (``timeout_s`` at most: a worker still busy with it then is hung); the last one carries
    ``version``. A worker that dies or hangs is recorded in ``dead`` (by index) and skipped from then on;
    the controller has the rollout group replace it, and the replacement is sent the weights once up."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    def sink(bucket: Mapping[str, Any], last: bool) -> int:
        ref = ray.put(PackedBucket.pack(bucket))
        live = [i for i in range(len(workers)) if i not in dead]
        calls = [workers[i].update_weights_bucket.remote(ref, last, version if last else None) for i in live]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for i, call in zip(live, calls):
            try:
                ray.get(call, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except (RayActorError, GetTimeoutError):
                dead.add(i)
        del ref
        # The object store held one more copy of the bucket while it was in flight (and the small
        # tensors' packed copy on the way there).
        nbytes = [v.numel() * v.element_size() for v in bucket.values()]
        return sum(nbytes) + sum(n for n in nbytes if n <= PACK_SMALL)

    return sink


# A bucket's tensors of at most this many bytes travel through the object store packed into one byte
# tensor: Ray serialises each tensor of a dict as a buffer of its own, which for the 420 adapters of a
# LoRA model costs several times their bytes' copy. Larger ones travel as they are (no second copy).
PACK_SMALL = 1 << 20


@dataclass
class PackedBucket:
    """A bucket as it travels through Ray's object store: its small tensors packed into ``data`` (as
    ``header``, a :class:`BucketHeader` as JSON, says: pickling the model costs more than its bytes),
    the others in ``whole``."""

    header: str
    data: Any
    whole: dict[str, Any]

    @classmethod
    def pack(cls, bucket: Mapping[str, Any]) -> PackedBucket:
        import torch

        small = [(n, tuple(t.shape), 0, t) for n, t in bucket.items() if t.numel() * t.element_size() <= PACK_SMALL]
        packed = next(_packed(small, 1 << 62, SyncStats()), None)
        if packed is None:
            return cls(BucketHeader(pieces=[], nbytes=0).model_dump_json(), None, dict(bucket))
        data = torch.empty(packed.header.nbytes, dtype=torch.uint8)
        packed.fill(data)
        packed_names = {piece.name for piece in packed.header.pieces}
        return cls(packed.header.model_dump_json(), data, {n: t for n, t in bucket.items() if n not in packed_names})

    def tensors(self) -> dict[str, Any]:
        """The bucket's tensors by name (the small ones views into ``data``)."""
        pieces = BucketHeader.model_validate_json(self.header).pieces
        return {**{p.name: p.view(self.data) for p in pieces}, **self.whole}


# ----------------------------------------------------------------- over a linked transport


def _owned_weights(model: Any, rank: int, world_size: int, plan: SyncPlan = SyncPlan(),
                   delta: Delta | None = None) -> Iterator[tuple[str, tuple[int, ...], int, Any]]:
    """``(name, whole shape, first row, rows)`` of every engine weight this rank sends over its link
    (what ``plan`` and ``delta`` say): of a tensor sharded by rows (FSDP2's ``Shard(0)``) the rows it
    holds, read in place; any other (replicated, or under LoRA merged with its adapters: gathered by
    every rank, a collective) whole by one rank, round-robin. Tied tensors are sent once."""
    whole = 0
    entries, _ = _engine_entries(model, plan, delta)
    for name, tensor, source in entries:
        if _row_sharded(tensor):
            local = tensor.to_local()
            if local.numel() and (delta is None or delta.changed(name, tensor)):
                per = _rows_per_rank(tensor)
                yield name, tuple(tensor.shape), tensor.device_mesh.get_local_rank() * per, local.detach()
            continue
        mine = whole % world_size == rank
        whole += 1
        if not _wanted(name, source, delta):
            continue
        tensor = _full(tensor)  # a sharded one: every rank takes part, in the same order
        if mine:
            yield name, tuple(tensor.shape), 0, tensor


def _rows_per_rank(tensor: Any) -> int:
    """Rows of a row-sharded ``DTensor`` each rank holds (the last may hold fewer): ``torch.chunk``'s split."""
    return -(-tensor.shape[0] // tensor.device_mesh.size())


def _row_sharded(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(tensor, DTensor) and tensor.device_mesh.ndim == 1 and tuple(tensor.placements) == (Shard(0),)


def owned_buckets(model: Any, rank: int, world_size: int, bucket_bytes: int, stats: SyncStats,
                  plan: SyncPlan = SyncPlan(), delta: Delta | None = None) -> Iterator[Bucket]:
    """The weights rank ``rank`` sends (:func:`_owned_weights`) as packed buckets of at most
    ``bucket_bytes`` (a larger piece travels alone); each bucket's ``fill`` copies its pieces into the
    transport's buffer."""
    return _packed(_owned_weights(model, rank, world_size, plan, delta), bucket_bytes, stats)


def _packed(weights: Iterable[tuple[str, tuple[int, ...], int, Any]], bucket_bytes: int,
            stats: SyncStats) -> Iterator[Bucket]:
    """``(name, whole shape, first row, rows)`` pieces packed into buckets of at most ``bucket_bytes``."""
    pieces: list[RowPiece] = []
    tensors: list[Any] = []
    size = 0

    def bucket() -> Bucket:
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
    largest = 0

    def counted(buckets: Iterator[Bucket]) -> Iterator[Bucket]:
        nonlocal largest
        for b in buckets:
            largest = max(largest, b.header.nbytes)
            stats.buckets += 1
            yield b

    sender.send(counted(owned_buckets(model, rank, world_size, int(bucket_mb * 2**20), stats, plan, delta)))
    stats.peak_bytes = 2 * largest
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


def engine_loader(engine: Any) -> Load:
    """A receiver's ``load``: each piece written into ``engine`` (:meth:`~toolrl.engines.RolloutEngine.load_weight_rows`)."""

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
