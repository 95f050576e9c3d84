"""The ``bfcl`` environment session: one trajectory on one BFCL entry, driven by its category's episode
(:mod:`toolrl_bfcl.single_turn`, :mod:`toolrl_bfcl.multi_turn`) and scored by BFCL's own checker.

The score is ``{"reward": R, "verdict": V, ...}``: V is BFCL's verdict (1 correct, 0 not), what
``toolrl eval`` and the BFCL report count; R is V, or with ``reward: shaped`` the finer-grained
name/parameter/value match (:mod:`toolrl_bfcl.shaped`), a training signal only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import EnvironmentSession, Reset, SessionContext, StepResult
from toolrl.trajectory import Trajectory

from toolrl_bfcl import categories

Format = Literal["prompting", "native"]


class BfclSessionOptions(BaseModel):
    """``session_options`` (the ``bfcl`` environment writes them from its ``env_options``)."""

    model_config = ConfigDict(extra="forbid")
    format: Format = Field("prompting", description="prompting: BFCL's prompt, answers as [func(param=value)] "
                           "with its dotted names; native: the tools through the chat template, the family's "
                           "call format, OpenAI-safe names (as BFCL's function-calling path)")
    reward: Literal["verdict", "shaped"] = "verdict"
    max_steps: int = Field(20, gt=0, description="model turns within one user turn of a multi-turn entry "
                           "(BFCL's MAXIMUM_STEP_LIMIT): past it the entry is force-terminated, as BFCL does")


class Episode(Protocol):
    """One entry's run inside a session: what the session's methods do for its category."""

    async def reset(self) -> Reset: ...

    async def step(self, call: ToolCall) -> StepResult: ...

    async def respond(self, message: str) -> str | None: ...

    def verdict(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """BFCL's verdict (1.0 or 0.0) and the shaped reward's parts (empty where none applies)."""
        ...

    def close(self) -> None: ...


class BfclSession(EnvironmentSession):
    Options = BfclSessionOptions
    timeout = 60.0

    def __init__(self, options: BfclSessionOptions, context: SessionContext) -> None:
        super().__init__(options, context)
        self.episode: Episode | None = None

    async def reset(self, sample: Sample) -> Reset:
        truth = sample.ground_truth
        if not isinstance(truth, Mapping) or not isinstance(truth.get("id"), str):
            raise ValueError("a bfcl sample's ground truth is {'id': ENTRY_ID} (the bfcl environment makes them)")
        entry = categories.entry(truth["id"])
        category = categories.category_of(entry["id"])
        if categories.KINDS[category] == "multi_turn":
            from toolrl_bfcl.multi_turn import MultiTurnEpisode

            self.episode = MultiTurnEpisode(entry, category, self.options, self.context.trajectory_id)
        else:
            from toolrl_bfcl.single_turn import SingleTurnEpisode

            self.episode = SingleTurnEpisode(entry, category, self.options)
        return await self.episode.reset()

    async def step(self, call: ToolCall) -> StepResult:
        assert self.episode is not None, "step before reset"
        return await self.episode.step(call)

    async def respond(self, message: str) -> str | None:
        return None if self.episode is None else await self.episode.respond(message)

    async def score(self, trajectory: Trajectory) -> dict[str, Any] | None:
        if self.episode is None:
            return None
        verdict, parts = self.episode.verdict(trajectory)
        if self.options.reward == "shaped" and parts:
            from toolrl_bfcl.shaped import shaped_reward

            return {"reward": shaped_reward(parts), "verdict": verdict, **parts}
        return {"reward": verdict, "verdict": verdict, **parts}

    async def close(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None
