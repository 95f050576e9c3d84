"""A trainer rank's state as an in-memory copy: taken after every step (:func:`snapshot`), kept by the
controller in Ray's object store, and put back into a freshly built rank (:func:`restore`) when a
rank of its group died, so the group re-forms without going back to a checkpoint (docs/recovery.md).

The copy holds what a checkpoint holds (the rank's ``_state()``) and its torch RNG. A ``DTensor`` is
kept as its local piece and the dimension it is split on: a group of the same size loads each rank's
piece unchanged (bit for bit), one of another size (``shrink``) cuts its pieces out of the whole
tensors, as DCP does on load. ``torch`` is imported inside the functions.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Piece:
    """A sharded tensor's local piece: ``dim`` the dimension the whole tensor is split on (None: every
    rank holds all of it)."""

    local: Any
    dim: int | None


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a rank's ``_state()``) as plain CPU tensors and :class:`Piece` s, and the rank's RNG
    under ``"rng"``: to be serialized at once (a call's result) or copied, since tensors that own
    their storage are not copied here."""
    import torch

    return {"state": _copy(state), "rng": torch.get_rng_state()}


def _copy(value: Any) -> Any:
    import torch
    from torch.distributed.tensor import DTensor, Shard

    if isinstance(value, DTensor):
        placement = value.placements[0]
        dim = placement.dim if isinstance(placement, Shard) else None
        return Piece(_own(value.to_local()), dim)
    if isinstance(value, torch.Tensor):
        return _own(value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy(v) for v in value)
    return value


def needed(old_world_size: int, world_size: int, rank: int) -> list[int]:
    """The old ranks whose copies rank ``rank`` of a group of ``world_size`` needs: its own in a group
    of the same size, every one in another."""
    return [rank] if old_world_size == world_size else list(range(old_world_size))


@dataclass
class Stored:
    """A tensor as a numpy array (bf16 and other dtypes numpy lacks as same-size integers), which
    Ray writes into its object store with one copy and reads back without one."""

    array: Any
    dtype: str


def _own(tensor: Any) -> Stored:
    """``tensor`` on the CPU as :class:`Stored`, copied here only where that is needed: a GPU tensor,
    or a view of a larger storage. Otherwise the tensor's own memory: the copy is made once, when Ray
    serializes the call's result into its object store, before anything writes the tensor again
    (the group waits for the copies before its next step or load; a weight push meanwhile only reads)."""
    import torch

    tensor = tensor.detach().to("cpu")
    whole = tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    if not whole:
        tensor = tensor.clone()
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        tensor = tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int8)
    return Stored(tensor.numpy(), dtype)


def _tensor(value: Any) -> Any:
    """A :class:`Stored` as a tensor again (sharing the array's memory); anything else as it is."""
    import torch

    if not isinstance(value, Stored):
        return value
    with warnings.catch_warnings():  # arrays read from the object store are read-only: only read here
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(value.array)
    dtype = getattr(torch, value.dtype)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def restore(state: dict[str, Any], copies: Sequence[dict[str, Any] | None], rank: int) -> None:
    """Fill ``state`` (this rank's live ``_state()``) in place from ``copies`` (the old group's
    :func:`snapshot` s in rank order; None where :func:`needed` leaves one out), and set this rank's
    RNG. Same group size: this rank's own pieces, unchanged; another: each piece cut from the whole
    tensor."""
    import torch

    same = len(copies) > 1 and sum(c is not None for c in copies) == 1
    _fill(state, [_MISSING if c is None else c["state"] for c in copies], rank, "", same)
    rng = copies[rank] if rank < len(copies) and copies[rank] is not None else _first(copies)
    torch.set_rng_state(rng["rng"])


_MISSING = object()  # an old rank's copy that was not fetched (a value may be None itself)


def _first(old: Sequence[Any]) -> Any:
    return next(o for o in old if o is not _MISSING and o is not None)


def _fill(live: Any, old: Sequence[Any], rank: int, where: str, same: bool) -> Any:
    """``live`` with the value of ``old`` (one per old rank; ``_MISSING``: not fetched) put into it: tensors
    are copied into in place; anything else (the same on every rank) is returned for the caller to
    set. ``same``: the old group had this group's size, and only this rank's copy is here."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(live, dict):
        for k in live:
            if k not in _first(old):
                raise KeyError(f"the in-memory copy has no {where}{k}")
            live[k] = _fill(live[k], [o if o is _MISSING else o[k] for o in old], rank, f"{where}{k}.", same)
        return live
    if isinstance(live, list | tuple):
        return type(live)(_fill(v, [o if o is _MISSING else o[i] for o in old], rank, f"{where}{i}.", same)
                          for i, v in enumerate(live))
    if not isinstance(live, torch.Tensor):
        return next(o for o in old if o is not _MISSING)
    with torch.no_grad():
        if same:  # this rank's own piece (or the whole tensor every rank holds), unchanged
            own = old[rank]
            (live.to_local() if isinstance(live, DTensor) else live).copy_(
                _tensor(own.local if isinstance(own, Piece) else own))
        elif isinstance(live, DTensor):
            live.to_local().copy_(_local_piece(_whole(old), live))
        else:
            live.copy_(_whole(old))
    return live


def _whole(old: Sequence[Any]) -> Any:
    """The whole tensor from every old rank's piece (a plain tensor: every rank held all of it)."""
    import torch

    first = old[0]
    if not isinstance(first, Piece):
        return _tensor(first)
    if first.dim is None:
        return _tensor(first.local)
    return torch.cat([_tensor(p.local) for p in old], dim=first.dim)


def _local_piece(whole: Any, live: Any) -> Any:
    """The part of ``whole`` that ``live`` (a DTensor of this group) holds on this rank."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(whole.shape, live.device_mesh, live.placements)
    return whole[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
