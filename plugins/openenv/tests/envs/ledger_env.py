"""A real OpenEnv MCP tool environment for the tests, built with the ``openenv`` package: a ledger
with two tools (``deposit``, ``balance``) whose state is per session, and a third (``bonus``) in the
episodes reset with ``bonus=True``; the reward is 1.0 once the balance reaches the reset's ``target``
(the episode is then done), else 0.0.

Serve it with ``uvicorn ledger_env:app`` (128 sessions) or ``ledger_env:single`` (OpenEnv's default
capacity: one session).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State

MAX_SESSIONS = 128


class LedgerEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("ledger")
        self.balance_value = 0
        self.target = 10

        @mcp.tool()
        def deposit(amount: int) -> int:
            """Add amount to this session's balance; returns the new balance."""
            self.balance_value += amount
            return self.balance_value

        @mcp.tool()
        def balance() -> int:
            """This session's balance."""
            return self.balance_value

        def bonus() -> int:
            """Double this session's balance; returns the new balance."""
            self.balance_value *= 2
            return self.balance_value

        self.bonus_tool = bonus
        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, target: int = 10, bonus: bool = False,
              **kwargs: Any) -> Observation:
        self.balance_value, self.target = 0, int(target)
        if bonus:  # this episode offers one more tool
            self.mcp_server.add_tool(self.bonus_tool)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation(done=False, reward=None, metadata={"target": self.target})

    def _score(self, observation: Observation) -> Observation:
        reached = self.balance_value >= self.target
        observation.reward, observation.done = (1.0 if reached else 0.0), reached
        return observation

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._score(super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._score(await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(LedgerEnvironment, CallToolAction, CallToolObservation, env_name="ledger",
                 max_concurrent_envs=MAX_SESSIONS)
single = create_app(LedgerEnvironment, CallToolAction, CallToolObservation, env_name="ledger")
