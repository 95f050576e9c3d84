"""Agents (``register_agents``, ``rollout.agent``): programs that run an episode themselves (the OpenAI
Agents SDK, LangGraph, a lab's own loop) against an OpenAI-compatible endpoint of the episode's own
(:class:`Endpoint`, served by :mod:`toolrl.gateway`), which records their calls token-exact for training
(docs/agents.md). :meth:`Agent.run` returns the episode's reward, or None (a reward posted to
``endpoint.reward_url``, else the configured reward functions on the last answer, score it).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolrl.config import MAX_TIMEOUT_S

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts


class AgentTask(BaseModel):
    """What an episode is about: the data row's ``prompt`` messages, ``ground_truth`` and ``extra_info``
    (as ``TOOLRL_TASK`` holds it, JSON)."""

    model_config = ConfigDict(frozen=True)

    prompt: list[dict[str, Any]]
    ground_truth: Any = None
    extra_info: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    """One episode's endpoint: the gateway's OpenAI ``/v1`` for this episode, a key valid for it only,
    where to POST ``{"reward": x}`` (with ``"call_id"``: a step reward for that call; with ``"role"``:
    that role's reward), the model name to ask for, the run's roles (each a model name ``GET /v1/models``
    lists; empty: a run with no roles, ``model`` only), and the variables that point the clients of the
    other APIs served (a plugin's :class:`~toolrl.gateway.protocols.GatewayProtocol`) at it."""

    base_url: str
    api_key: str
    reward_url: str
    model: str
    roles: tuple[str, ...] = ()
    clients: Mapping[str, str] = field(default_factory=dict)

    def environ(self) -> dict[str, str]:
        """The endpoint as an agent program's environment variables (what OpenAI clients read, and others)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, **self.clients,
                "TOOLRL_REWARD_URL": self.reward_url, "TOOLRL_MODEL": self.model,
                **({"TOOLRL_ROLES": ",".join(self.roles)} if self.roles else {})}

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client of this endpoint. Clients share one TLS context: a default
        client loads the CA certificates when it is made (20-70 ms on the rollout's event loop, every
        episode; docs/benchmarks.md, "The gateway"), which a plain-HTTP endpoint never uses."""
        import openai

        kwargs.setdefault("http_client", openai.DefaultAsyncHttpxClient(verify=_tls_context()))
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class AgentFailure(RuntimeError):
    """An episode the agent could not finish: the program crashed, timed out or answered nonsense.
    Its trajectory is an infrastructure failure (masked) under ``failure: mask``, the default."""


class AgentOptions(BaseModel):
    """The options every agent takes (``rollout.agent``'s keys); a subclass's ``Options`` extends them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S, description="seconds an episode may take")
    # A program that crashes, times out or leaves its episode unscored: masked (not trained) or
    # trained as an error with the reward it got (0 unless one was posted).
    failure: Literal["mask", "train"] = "mask"
    model: str = Field("toolrl", min_length=1, description="the model name the endpoint serves (a run with roles "
                       "serves its roles: this one if it is a role, else the first is the endpoint's model)")


class Agent:
    """The base of every agent. ``Options`` (a pydantic model extending :class:`AgentOptions`) types
    ``rollout.agent``'s keys besides ``name``; ``build(options, context)`` makes one agent per run."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[AgentOptions]] = AgentOptions

    def __init__(self, options: AgentOptions) -> None:
        self.options = options

    @classmethod
    def build(cls, options: AgentOptions, context: Any) -> Agent:
        return cls(options)

    async def run(self, task: AgentTask, endpoint: Endpoint) -> float | None:
        """Run one episode against ``endpoint``; its reward, or None. Raise :class:`AgentFailure` (or
        anything) when the episode failed. Cancelled at ``timeout_s``. Runs on the agents' own event loop, a
        thread apart from the rollout's (:mod:`toolrl.gateway.agent_loop`)."""
        raise NotImplementedError

    def check_run(self, facts: RunFacts) -> list[str]:
        """The run check (raise ValueError; returns warning lines); a subclass extends it. The program keeps
        its own context and calls its own tools: a context policy is refused, configured tools reported unused."""
        rollout = facts.config.rollout
        if rollout.context is not None and rollout.context.name != "none":
            raise ValueError(f"rollout.context ({rollout.context.name}) edits toolrl's own loop; the agent program "
                             "keeps its own context: remove one of the two")
        if facts.config.tools.explicit:
            return ["tools: not used, the agent program calls its own tools (rollout.agent)"]
        return []
