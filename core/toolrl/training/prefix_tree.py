"""The row layout of a prefix-shared (tree) micro-batch: token sequences that share a prefix hold it
once, each continuation after it.

The sequences are laid out as a trie in depth-first order. Each trie node is a *span* of consecutive
row positions; a span attends causally to itself and fully to its *context*, the rows of its
ancestors, so every token sees exactly the tokens of its own sequence before it, and its position id
is its index in that sequence: the hidden states equal those of the unshared layout, and the shared
rows receive the sum of the continuations' gradients, as the unshared copies did between them.

Sharing starts only where a set of sequences has at least ``min_shared`` tokens in common from the
first one: chat prompts all begin with the same few template tokens, and joining unrelated prompts
into one tree for those would cost more attention work than it saves. Below a shared root any common
prefix is shared, however short. With ``share=False`` every sequence is a span of its own (the
unshared packing). Sequences of different ``groups`` share nothing: under several LoRA adapters
(``model.adapters``) another adapter gives the same tokens another KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from toolrl.trajectory import common_prefix

# Fewest tokens a tree's root must hold; below this, sequences are packed one after another.
MIN_SHARED_TOKENS = 32


@dataclass
class Span:
    """Rows ``start:end`` of the packed row; they see ``context`` (ancestor rows, in order) and,
    causally, themselves."""

    start: int
    end: int
    context: list[int]


@dataclass
class TreeLayout:
    """``ids``/``positions`` of the packed row, its ``spans`` in row order, and per input sequence its
    ``paths`` (the row of each of its tokens)."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    paths: list[list[int]] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        """Whether any span sees context (the row is a tree, not a plain packing)."""
        return any(s.context for s in self.spans)


def layout(seqs: Sequence[Sequence[int]], share: bool = True, min_shared: int = MIN_SHARED_TOKENS,
           groups: Sequence[int] | None = None) -> TreeLayout:
    """The row layout of ``seqs`` (empty sequences get no rows); trees in the order of their first
    sequence, those of one of ``groups`` (each sequence's; None: one group) together, the groups in
    the order of their first sequence."""
    builder = _Builder(seqs)
    nonempty = [i for i, s in enumerate(builder.seqs) if len(s)]
    if share:
        by_group: dict[int, list[int]] = {}
        for i in nonempty:
            by_group.setdefault(0 if groups is None else groups[i], []).append(i)
        for part in by_group.values():
            builder.roots(part, 0, min_shared)
    else:
        for i in nonempty:
            builder.span([i], 0, len(builder.seqs[i]), [])
    return builder.out


def common_length(seqs: Sequence[np.ndarray], idx: Sequence[int], depth: int) -> int:
    """How many tokens from ``depth`` on all of ``seqs[idx]`` have in common."""
    first = seqs[idx[0]]
    common = max(min(len(seqs[i]) for i in idx) - depth, 0)
    for i in idx[1:]:
        common = common_prefix(first[depth:depth + common], seqs[i][depth:depth + common])
    return common


def split_by_token(seqs: Sequence[np.ndarray], idx: Sequence[int], depth: int) -> list[list[int]]:
    """``idx`` grouped by the token at ``depth`` (first-seen order); a sequence that ends at ``depth``
    is a group of its own."""
    groups: dict[object, list[int]] = {}
    for i in idx:
        key = int(seqs[i][depth]) if len(seqs[i]) > depth else ("end", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


class _Builder:
    def __init__(self, seqs: Sequence[Sequence[int]]) -> None:
        self.seqs = [np.asarray(s, dtype=np.int64) for s in seqs]
        self.out = TreeLayout(paths=[[] for _ in seqs])

    def span(self, idx: list[int], start: int, end: int, context: list[int]) -> list[int]:
        """Emit tokens ``start:end`` shared by ``seqs[idx]`` as one span; returns its rows."""
        out, a = self.out, len(self.out.ids)
        rows = list(range(a, a + end - start))
        out.ids.extend(self.seqs[idx[0]][start:end].tolist())
        out.positions.extend(range(start, end))
        out.spans.append(Span(a, a + end - start, context))
        for i in idx:
            out.paths[i].extend(rows)
        return rows

    def roots(self, idx: list[int], depth: int, min_shared: int) -> None:
        """Trees for ``idx``, which share their first ``depth`` tokens (too few to be worth sharing)."""
        for part in split_by_token(self.seqs, idx, depth):
            if len(part) == 1:
                self.span(part, 0, len(self.seqs[part[0]]), [])
                continue
            length = depth + common_length(self.seqs, part, depth)
            if length >= min_shared:
                self.grow(part, length, self.span(part, 0, length, []))
            else:
                self.roots(part, length, min_shared)

    def grow(self, idx: list[int], depth: int, context: list[int]) -> None:
        """The subtree below a node: ``idx`` share their first ``depth`` tokens, held at ``context``."""
        for part in split_by_token(self.seqs, [i for i in idx if len(self.seqs[i]) > depth], depth):
            length = depth + common_length(self.seqs, part, depth)
            rows = self.span(part, depth, length, context)
            if len(part) > 1:
                self.grow(part, length, context + rows)
