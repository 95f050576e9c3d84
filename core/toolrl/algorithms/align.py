"""A teacher of another tokenizer scoring the student's text (on-policy distillation,
:mod:`toolrl.algorithms.distill`): the two token streams of the same text aligned by character offsets.

The trajectory is cut where its ``response_mask`` changes, each piece re-encoded by the teacher on its
own (a piece boundary is a token boundary in both streams), and in a sampled piece each student token
gets the teacher's log-prob mass of the characters it covers::

    lp_T(k) = Σ_j lp_T(j) · |[a_j, b_j) ∩ [s_k, e_k)| / (b_j − a_j)

What is exact (a piece's total), what is lost, and how special tokens are scored: docs/distillation.md,
"A teacher with another tokenizer".
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["char_ends", "pieces", "spread"]


@dataclass(frozen=True)
class MaskRun:
    """A run of the response's tokens with one mask value: ``start``/``end`` index the response,
    ``sampled`` its mask (1: the student sampled them)."""

    start: int
    end: int
    sampled: bool


def pieces(mask: Sequence[int]) -> list[MaskRun]:
    """The response's runs of equal ``mask`` values, in order."""
    out: list[MaskRun] = []
    for sampled, values in itertools.groupby(mask, key=bool):
        start = out[-1].end if out else 0
        out.append(MaskRun(start, start + len(list(values)), sampled))
    return out


def char_ends(tokenizer: object, ids: Sequence[int]) -> tuple[str, list[int]]:
    """``ids`` decoded, and where in that text each token ends: the longest prefix of the text that
    decoding the tokens up to it agrees with (a token that ends inside a multi-byte character ends
    before it)."""
    decode = tokenizer.decode  # type: ignore[attr-defined]
    text = decode(list(ids), clean_up_tokenization_spaces=False)
    ends = []
    last = 0
    for k in range(1, len(ids) + 1):
        prefix = decode(list(ids[:k]), clean_up_tokenization_spaces=False)
        last = max(last, len(os.path.commonprefix([prefix, text])))
        ends.append(last)
    if ends:
        ends[-1] = len(text)
    return text, ends


def spread(student_ends: Sequence[int], teacher_spans: Sequence[tuple[int, int]],
           teacher_logprobs: Sequence[float]) -> list[float]:
    """Each student token's share of the teacher tokens' log-probs by the characters it covers (module
    docstring): ``student_ends`` where each student token ends (it starts where the one before ends),
    ``teacher_spans`` each teacher token's ``[start, end)`` in the same text."""
    out = [0.0] * len(student_ends)
    k = 0
    for (a, b), lp in zip(teacher_spans, teacher_logprobs, strict=True):
        if b <= a:
            continue
        while k < len(student_ends) and student_ends[k] <= a:
            k += 1
        for j in range(k, len(student_ends)):
            s = student_ends[j - 1] if j else 0
            e = student_ends[j]
            overlap = min(b, e) - max(a, s)
            if overlap > 0:
                out[j] += lp * overlap / (b - a)
            if e >= b:
                break
    return out
