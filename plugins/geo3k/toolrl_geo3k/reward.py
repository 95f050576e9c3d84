"""The ``geo3k`` reward function: the final answer (last ``\\boxed{}``) against the ground truth."""

from __future__ import annotations

import re
from typing import Any

from toolrl.rewards import last_boxed

from toolrl_geo3k.grading import is_equivalent

# Reasoning in <think>...</think>, then a boxed final answer.
_FORMAT = re.compile(r"\s*<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def geo3k_score(
    solution_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.0
) -> float:
    """``(1 - format_score) * accuracy + format_score * format``.

    ``accuracy`` is 1.0 when the answer equals ``ground_truth`` under math-verify: the last ``\\boxed{}``
    of ``solution_str`` with ``use_boxed`` (no box, no credit), else the whole string. ``format`` is 1.0
    when the solution reasons inside ``<think>...</think>`` and then gives a boxed answer.
    """
    if not 0.0 <= format_score <= 1.0:
        raise ValueError(f"format_score must be between 0 and 1, got {format_score}")
    answer = last_boxed(solution_str) if use_boxed else solution_str
    accuracy = (
        1.0
        if answer is not None and ground_truth is not None and is_equivalent(answer, str(ground_truth))
        else 0.0
    )
    if format_score == 0.0:
        return accuracy
    well_formed = 1.0 if _FORMAT.fullmatch(solution_str) else 0.0
    return (1.0 - format_score) * accuracy + format_score * well_formed


class Geo3kReward:
    """Reward function ``geo3k`` (a :class:`toolrl.rewards.RewardFunction`). Options: ``use_boxed``
    (default True) and ``format_score`` (default 0.0, the weight of the format term)."""

    name = "geo3k"

    def __init__(self, use_boxed: bool = True, format_score: float = 0.0) -> None:
        if not 0.0 <= format_score <= 1.0:
            raise ValueError(f"geo3k reward: format_score must be between 0 and 1, got {format_score}")
        self.use_boxed = use_boxed
        self.format_score = format_score

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        if ground_truth is None:
            return 0.0
        return geo3k_score(
            response, str(ground_truth), use_boxed=self.use_boxed, format_score=self.format_score
        )
