"""The ``tau2`` tool: one toolrl tool per τ² domain tool, all of one trajectory on one fresh τ²
environment (a :class:`~toolrl_tau2.session.Session`, keyed by the trajectory), scored by τ²'s own
evaluator.

A tool-config entry stands for the whole domain::

    - class_name: tau2
      tau2: {domain: airline, solo: false, user: {base_url: ..., model: ...}, judge: null}

Each trajectory's ``create_kwargs`` carry its ``task_id``. The domain's first tool (its "lead")
answers for the session: it replies with the simulated user's turns (``respond``) and returns τ²'s
reward with its parts (``calc_reward``); the other tools only run calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from toolrl.config import format_errors
from toolrl.tools import SharedResources, Tool, ToolConfigError, trajectory_of

from toolrl_tau2.session import Endpoint, Session


class Tau2Section(BaseModel):
    """The entry's ``tau2:`` block."""

    model_config = ConfigDict(extra="forbid")
    domain: str
    solo: bool = False
    user: Endpoint | None = None
    judge: Endpoint | None = None
    max_user_turns: int = Field(30, gt=0)


class Sessions(SharedResources[Session]):
    """The live sessions of one domain's tools, by trajectory; shared by the tools of one entry."""

    def __init__(self, section: Tau2Section, lead: str) -> None:
        super().__init__(what="τ² session")
        self.section, self.lead = section, lead

    def start(self, task_id: str) -> Awaitable[Session]:
        """A new session for ``task_id``, built in a thread (loading a domain's database takes a while)."""
        s = self.section
        return asyncio.to_thread(Session, s.domain, task_id, s.solo, s.user, s.judge, s.max_user_turns)


class Tau2Tool(Tool):
    """One τ² domain tool; its schema is τ²'s OpenAI schema of that tool."""

    default_timeout = 60.0

    def __init__(self, config: Mapping[str, Any] | None, tool_schema: Mapping[str, Any], sessions: Sessions) -> None:
        super().__init__(config, tool_schema)
        self.sessions = sessions

    @classmethod
    async def from_config(cls, config: Mapping[str, Any], tool_schema: Mapping | None,
                          section: Mapping[str, Any]) -> list[Tool]:
        from toolrl_tau2 import domain

        try:
            block = Tau2Section.model_validate(section.get("tau2", {}))
        except ValidationError as exc:
            raise ToolConfigError(f"invalid config for tool tau2: {format_errors(exc, 'tau2')}") from None
        if block.domain not in domain.registry().get_domains():
            raise ToolConfigError(f"tau2.domain: unknown τ² domain {block.domain!r} "
                                  f"(known: {', '.join(domain.registry().get_domains())})")
        schemas = domain.tool_schemas(block.domain, block.solo)
        sessions = Sessions(block, schemas[0]["function"]["name"])
        return [cls(config, schema, sessions) for schema in schemas]

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        if "task_id" not in create_kwargs:
            raise ValueError("tau2 tools need create_kwargs.task_id (the sample's τ² task)")
        task_id = str(create_kwargs["task_id"])
        instance_id = instance_id or f"{task_id}:{self.name}"
        # The trajectory's first tool builds its session; the others wait for that same one.
        await self.sessions.acquire(trajectory_of(instance_id), instance_id, lambda: self.sessions.start(task_id))
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any) -> tuple[str, float, dict]:
        session = self.sessions.get(trajectory_of(instance_id))
        text, error = session.call(self.name, arguments)
        return text, 0.0, {"tau2_error": error}

    async def respond(self, instance_id: str, message: str) -> str | None:
        if self.name != self.sessions.lead:
            return None
        return await self.sessions.get(trajectory_of(instance_id)).reply(message)

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float | dict[str, float]:
        if self.name != self.sessions.lead:
            return 0.0
        session = self.sessions.get(trajectory_of(instance_id))
        return await asyncio.to_thread(session.evaluate)

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        await self.sessions.release(trajectory_of(instance_id), instance_id)
