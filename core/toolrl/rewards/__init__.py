"""Reward functions: score a finished trajectory.

A reward function is a class registered through ``register_reward_functions``; it is constructed with
its ``options`` from the config and called once per trajectory::

    reward(response, ground_truth, **info) -> float

or ``async def __call__`` for one that waits (awaited, and what a failure scores: the hookspec's
docstring); a sync reward is called on the loop's thread and must be quick.

``response`` is the model's final answer text (its last turn, model tokens only: tool outputs never
leak into it). ``info`` holds ``full_response`` (every model-generated turn joined), ``model_text``
(each generation's text, in order), ``sample``
(the :class:`toolrl.schemas.Sample`), ``tool_results`` (every :class:`toolrl.schemas.ToolResult`),
``parse_errors`` (count), ``data_source`` and ``response_ids`` (the model's own tokens, for
length- or token-level rewards).

A function that scores several named parts (a rubric) may return a mapping ``{part: value}``
instead of a number: each part becomes the reward term ``NAME.part`` (times the term's weight), and
the parts add up to its share of the reward.
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
