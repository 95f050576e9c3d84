"""Which trajectories each rank trains in which micro-step of a mini-batch.

Every rank computes the same plan from the whole batch, so no communication is needed: the mini-batch is
split across ranks balanced by token count, each share cut into micro-batches (``micro_batch_size``
sequences, or up to ``max_tokens_per_micro_batch`` tokens), and a rank with fewer than the busiest gets
``None`` steps (zero-weight dummies: FSDP's collectives need every rank to run as many). With shared
prefixes the units are pieces of prefix trees, cut only between continuations, balanced by the tokens
they compute (shared ones once); trees never join sequences of different ``groups`` (adapters).
"""

from __future__ import annotations

from collections.abc import Sequence

from toolrl.training import prefix_tree
from toolrl.trajectory import common_prefix


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
        b = next((b for b, r in enumerate(room) if r >= lengths[i]), len(bins))  # none fits: a new bin
        if b == len(bins):
            bins.append([])
            room.append(max_tokens)
        bins[b].append(i)
        room[b] -= lengths[i]
    return [sorted(b) for b in bins]


def tree_pieces(indices: Sequence[int], seqs: Sequence[Sequence[int]], micro_batch_size: int,
                max_tokens: int | None = None, groups: Sequence[int] | None = None) -> list[tuple[list[int], int]]:
    """``indices`` as pieces of prefix trees, each with the tokens it computes: a tree's sequences in
    depth-first order, a new piece started where the next one would pass ``micro_batch_size``
    sequences (no ``max_tokens``) or ``max_tokens`` tokens. ``groups``: each sequence's (a tree holds one)."""
    tree = prefix_tree.layout([seqs[i] for i in indices],
                              groups=None if groups is None else [groups[i] for i in indices])
    members: dict[int, list[int]] = {}
    for k, path in enumerate(tree.paths):
        members.setdefault(path[0] if path else -1 - k, []).append(k)
    pieces: list[tuple[list[int], int]] = []
    for ks in members.values():
        ks.sort(key=lambda k: tree.paths[k][-1] if tree.paths[k] else -1)
        piece: list[int] = []
        cost = 0
        for k in ks:
            seq = seqs[indices[k]]
            added = len(seq) - (common_prefix(seqs[indices[piece[-1]]], seq) if piece else 0)
            full = len(piece) >= micro_batch_size if max_tokens is None else cost + added > max_tokens
            if piece and full:
                pieces.append((piece, cost))
                piece, cost, added = [], 0, len(seq)
            piece.append(k)
            cost += added
        pieces.append((piece, cost))
    return [([indices[k] for k in piece], cost) for piece, cost in pieces]


def plan(indices: Sequence[int], lengths: Sequence[int], world_size: int, micro_batch_size: int,
         max_tokens: int | None = None, seqs: Sequence[Sequence[int]] | None = None,
         groups: Sequence[int] | None = None) -> list[list[list[int] | None]]:
    """Per rank, the micro-batches of one mini-batch, padded with ``None`` (a dummy step) to the same
    count; with ``seqs`` (each trajectory's input tokens), of whole prefix-tree pieces, each tree of
    one of ``groups`` (each trajectory's; None: one group)."""
    if seqs is None:
        per_rank = [micro_batches(share, lengths, micro_batch_size, max_tokens)
                    for share in split_across_ranks(indices, lengths, world_size)]
    else:
        pieces = tree_pieces(indices, seqs, micro_batch_size, max_tokens, groups)
        costs = [cost for _, cost in pieces]
        sizes = costs if max_tokens is not None else [len(p) for p, _ in pieces]
        capacity = max_tokens if max_tokens is not None else micro_batch_size
        per_rank = [[sorted(i for b in bin_ for i in pieces[b][0]) for bin_ in micro_batches(share, sizes, 1, capacity)]
                    for share in split_across_ranks(range(len(pieces)), costs, world_size)]
    steps = max(1, max(len(m) for m in per_rank))
    return [[*m, *([None] * (steps - len(m)))] for m in per_rank]
