"""A scripted rollout engine for tests of the agent loop: each trajectory (session) replays a list of
texts, one per generation call. It stands in for a model that *would* emit these calls; the loop,
the tokenizer, the chat template and the tools around it are all real."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from toolrl.engines import Generation, ModelSource, RolloutEngine, SamplingParams
from toolrl.testing.scripted_engine import scripted_generation


class ScriptedEngine(RolloutEngine):
    name = "scripted"

    def __init__(self, tokenizer: Any, scripts: Mapping[str, list[str]] | list[str], delay: float = 0.0):
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.delay = delay
        self.calls: list[tuple[str, list[int], float]] = []  # (session, prompt ids, time)
        self.images: list[list[Any]] = []  # the images each call was given
        self.ended: list[str] = []
        self._turn: dict[str, int] = {}

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> ScriptedEngine:
        return cls(source.tokenizer, config["scripts"])

    def _script(self, session: str) -> list[str]:
        if isinstance(self.scripts, list):
            return self.scripts
        for key, script in self.scripts.items():
            if key in session:
                return script
        raise KeyError(session)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Any = ()) -> list[Generation]:
        session = session_id or ""
        self.calls.append((session, list(prompt_ids), asyncio.get_running_loop().time()))
        self.images.append(list(images))
        if self.delay:
            await asyncio.sleep(self.delay)
        turn = self._turn.get(session, 0)
        self._turn[session] = turn + 1
        return [scripted_generation(self.tokenizer, self._script(session)[turn], params, logprob=-0.5)]

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError("scripted engines have no weights")

    def end_session(self, session_id: str) -> None:
        self.ended.append(session_id)
