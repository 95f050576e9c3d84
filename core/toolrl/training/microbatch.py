"""Which trajectories each rank trains in which micro-step of a mini-batch.

Every rank receives the whole batch and computes the same plan from it, so no communication is
needed: the mini-batch is split across ranks balanced by token count, each rank's share is cut into
micro-batches (``micro_batch_size`` sequences, or filled up to ``max_tokens_per_micro_batch``
tokens), and a rank with fewer micro-batches than the busiest gets ``None`` steps, which the trainer
runs as zero-weight dummy steps: FSDP issues collectives in every forward and backward, so all ranks
must run the same number of them.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_across_ranks(indices: Sequence[int], lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """``indices`` dealt to ``world_size`` ranks, longest first to the rank with the fewest tokens so
    far (ties: lowest rank); each share keeps the original order."""
    if world_size == 1:
        return [list(indices)]
    loads = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (loads[r], r))
        shares[r].append(i)
        loads[r] += lengths[i]
    return [sorted(s) for s in shares]


def micro_batches(indices: Sequence[int], lengths: Sequence[int], micro_batch_size: int,
                  max_tokens: int | None = None) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size``; with ``max_tokens``, first-fit-decreasing bins of at
    most ``max_tokens`` tokens (a longer sequence gets a micro-batch of its own)."""
    if max_tokens is None:
        return [list(indices[a:a + micro_batch_size]) for a in range(0, len(indices), micro_batch_size)]
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        b = next((b for b, r in enumerate(room) if r >= lengths[i]), None)
        if b is None:
            bins.append([])
            room.append(max_tokens)
            b = len(bins) - 1
        bins[b].append(i)
        room[b] -= lengths[i]
    return [sorted(b) for b in bins]


def plan(indices: Sequence[int], lengths: Sequence[int], world_size: int, micro_batch_size: int,
         max_tokens: int | None = None) -> list[list[list[int] | None]]:
    """Per rank, the micro-batches of one mini-batch, padded with ``None`` (a dummy step) to the same count."""
    per_rank = [micro_batches(share, lengths, micro_batch_size, max_tokens)
                for share in split_across_ranks(indices, lengths, world_size)]
    steps = max(1, max(len(m) for m in per_rank))
    return [[*m, *([None] * (steps - len(m)))] for m in per_rank]
