"""What the rollouts run with: each environment's :class:`Route` (its tools, parser, rewards, turn
limit, session, context policy or agent program) and the :class:`RolloutContext` that holds them with
the engine, the renderers (one per tool set) and the gateway agent programs call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.agents import Agent
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.context import ContextPolicy
from toolrl.engines import RolloutEngine
from toolrl.gateway.server import Gateway
from toolrl.parsers import ToolParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.schemas import Sample
from toolrl.sessions import SessionKind
from toolrl.tools import Tool

MAX_RENDERERS = 256  # tool sets whose renderer is kept


@dataclass
class Route:
    """What a sample's environment selects (a data row's ``extra_info.env``): its tools, parser, rewards, turn
    limit and environment session kind. ``RolloutContext.routes`` maps environment names to routes;
    ``None`` is the route of samples that name no environment."""

    tools: dict[str, Tool]
    max_turns: int
    parser: ToolParser
    reward_functions: list[tuple[str, float, Any]]  # (name, weight, callable)
    reward_config: RewardConfig
    session: SessionKind | None = None
    context: ContextPolicy | None = None  # None: no edits and no cap but the engine's
    agent: Agent | None = None  # a program runs each episode through the gateway (toolrl.gateway)


@dataclass
class RolloutContext:
    engine: RolloutEngine
    renderer_factory: Callable[[Sequence[dict[str, Any]]], ChatRenderer]  # by tool schemas; cached per tool set
    config: RolloutConfig
    routes: dict[str | None, Route]
    # Ask each session for every turn's state key (toolrl.rollout.turns): only a turn-level estimator (one
    # whose ``reads`` hold them, e.g. gigpo) reads them; False: the observation's key stands in, no session call.
    state_keys: bool = True
    # The run's roles (Config.roles): the model names the gateway serves, the roles a session may give its
    # turns; empty: a run with no roles. ``adapters``: model.adapters, each role sampled with its adapter.
    roles: tuple[str, ...] = ()
    adapters: bool = False
    _renderers: dict[str, ChatRenderer] = field(default_factory=dict)
    _gateway: asyncio.Future[Gateway] | None = None  # its start, begun by the first agent episode

    def route_for(self, sample: Sample) -> Route:
        if sample.env in self.routes:
            return self.routes[sample.env]
        if sample.env is not None:
            raise KeyError(f"sample's environment {sample.env!r} is not configured "
                           f"(configured: {', '.join(str(n) for n in self.routes if n is not None) or 'none'})")
        if None not in self.routes:
            raise KeyError("the sample names no environment (extra_info.env) and the config mixes several")
        return self.routes[None]

    def renderer(self, route: Route, tools: dict[str, Tool] | None = None) -> ChatRenderer:
        """The renderer of ``tools`` (default: the route's; a session may hand out others per
        trajectory), cached by their schemas: what the template renders."""
        tools = route.tools if tools is None else tools
        # Inline-tag parsers describe their markers in the prompt; schemas are for chat-mode tools.
        schemas = [t.tool_schema.model_dump(exclude_none=True) for t in tools.values()] \
            if route.parser.result_mode == "chat" else []
        if route.context is not None and route.parser.result_mode == "chat":
            schemas += route.context.tool_schemas()  # fold's branch tool
        return self.schema_renderer(schemas)

    def schema_renderer(self, schemas: Sequence[dict[str, Any]]) -> ChatRenderer:
        """The renderer of these tool schemas (cached: what the template renders)."""
        key = json.dumps(list(schemas), sort_keys=True)
        if key not in self._renderers:
            if len(self._renderers) >= MAX_RENDERERS:  # tools that change per episode: keep the newest
                del self._renderers[next(iter(self._renderers))]
            self._renderers[key] = self.renderer_factory(list(schemas))
        return self._renderers[key]

    async def gateway(self) -> Gateway:
        """This context's gateway (toolrl.gateway), started on first use: once, however many episodes of a
        group ask for it together."""
        if self._gateway is None:
            self._gateway = asyncio.ensure_future(Gateway().start())
        return await self._gateway

    async def close(self) -> None:
        if self._gateway is not None:
            gateway, self._gateway = self._gateway, None
            await (await gateway).close()
