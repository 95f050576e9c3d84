"""The ``callable`` agent: ``async def run(task: dict, client: openai.AsyncOpenAI) -> float | None``,
imported by ``package.module:function`` and run in the rollout's process, one call per episode.

``task`` is the data row (``prompt``, ``ground_truth``, ``extra_info``); ``client`` talks to the
episode's endpoint; a returned number is the episode's reward. The function may also take a third
argument, the :class:`~toolrl.agents.Endpoint` (its ``reward_url`` for step rewards).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from toolrl.agents import Agent, AgentOptions, AgentTask, Endpoint
from toolrl.plugins.registry import import_reference

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts


class CallableOptions(AgentOptions):
    callable: str = Field(description="package.module:function")

    @field_validator("callable")
    @classmethod
    def _reference(cls, value: str) -> str:
        module, _, attr = value.partition(":")
        if not module or not attr:
            raise ValueError(f"{value!r} is not package.module:function")
        return value


def load_function(reference: str) -> Any:
    """The async function ``package.module:function`` names; ValueError saying what is wrong."""
    try:
        obj = import_reference(reference)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {reference!r}: {type(exc).__name__}: {exc}") from None
    if not inspect.iscoroutinefunction(obj):
        raise ValueError(f"{reference!r} is not an async function (async def run(task, client))")
    return obj


class CallableAgent(Agent):
    name = "callable"
    Options = CallableOptions

    @functools.cached_property
    def function(self) -> Any:
        return load_function(self.options.callable)  # type: ignore[attr-defined]

    async def run(self, task: AgentTask, endpoint: Endpoint) -> float | None:
        takes_endpoint = len(inspect.signature(self.function).parameters) >= 3
        async with endpoint.client() as client:
            args = (task.model_dump(mode="json"), client, endpoint)
            return await self.function(*args if takes_endpoint else args[:2])

    def check_run(self, facts: RunFacts) -> list[str]:
        _ = self.function  # it imports, and is an async function
        return super().check_run(facts)
