"""The wire between an environment server (``toolrl env serve``) and the ``fleet`` session kind: one
WebSocket per trajectory (so every call of a trajectory reaches the server that holds its session),
each request a JSON :class:`CallRequest` answered by one :class:`CallReply`; ``GET /health`` says what the
server serves and how many sessions it holds (:class:`Health`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SESSION_PATH = "/session"
HEALTH_PATH = "/health"
MAX_MESSAGE = 100 * 2**20  # a reset or a trajectory to score may carry images


class CallRequest(BaseModel):
    """One call of the session contract (:mod:`toolrl.sessions`); the fields its ``op`` needs."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["reset", "step", "respond", "state_key", "score", "close"]
    trajectory_id: str = ""
    sample: dict[str, Any] | None = None
    call: dict[str, Any] | None = None
    message: str | None = None
    trajectory: dict[str, Any] | None = None


class CallReply(BaseModel):
    """The call's value, or its error; ``infrastructure``: the environment failed (its deadline missed,
    its backend gone), not the session's code."""

    model_config = ConfigDict(extra="forbid")

    value: Any = None
    error: str | None = None
    infrastructure: bool = False


class Health(BaseModel):
    """What a server serves: the environment (or session kind) it was started with, the session kind,
    each call's deadline there, how many sessions it holds at most and holds now."""

    model_config = ConfigDict(extra="forbid")

    served: str
    session: str
    timeout_s: float
    capacity: int = Field(gt=0)
    open: int = Field(ge=0)
    state_key: bool = Field(description="whether the kind keys its states (else no trajectory asks)")
