"""Reward functions (``register_reward_functions``), constructed with their ``options`` and called once per
finished trajectory as ``reward(response, ground_truth, **info) -> float`` (``async def __call__`` for one
that waits; a sync one runs on the loop's thread and must be quick).

``response`` is the final answer (model tokens only). ``info``: ``full_response`` (every model turn
joined), ``model_text`` (each generation's text), ``sample``, ``tool_results``, ``parse_errors`` (a count),
``data_source`` and ``response_ids``. A rubric may return ``{part: value}``: each part is the reward term
``NAME.part`` (times the term's weight).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol, runtime_checkable

# Public: the answer the math reward reads, for plugins' rewards that read it the same way.
from toolrl.rewards.builtin import last_boxed

__all__ = ["RewardFunction", "last_boxed"]


@runtime_checkable
class RewardFunction(Protocol):
    name: str

    def __call__(self, response: str, ground_truth: Any, **info: Any
                 ) -> float | Mapping[str, float] | Awaitable[float | Mapping[str, float]]: ...
