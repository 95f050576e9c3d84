"""The ``scripted`` rollout engine: fixed model turns instead of a model, for environment and tool
authors (``engine: {name: scripted, options: {script: [...]}}``; docs/environments.md, "Driving an
environment with fixed calls"), and the one stand-in engine of tests (``toolrl.testing.ScriptedEngine``).

It has no weights: ``toolrl rollout`` and ``toolrl eval`` run it, training refuses it. In a test,
``ScriptedEngine(tokenizer, {"s0-": [...], "s1-": [...]})`` gives each trajectory the script of the first
key its session id contains; ``calls``, ``ended`` and ``cloned`` record what the loop asked. A stand-in
that chooses its text another way overrides :meth:`ScriptedEngine.text`; one that ends or scores its
tokens another way, :meth:`ScriptedEngine.generation`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from toolrl.engines import CoreEngineOptions, Generation, ModelSource, RolloutEngine, SamplingParams

_Texts = Annotated[list[str], Field(min_length=1)]


class ScriptedOptions(CoreEngineOptions):
    # The core's keys (batch size, device, dtype) are taken and unused: there is no model to run.
    script: _Texts | dict[str, _Texts] = Field(min_length=1, description="The model's text of each generation "
                                                     "of a trajectory, in order (the last repeats); or a mapping from "
                                                     "a piece of a session id to its trajectory's texts.")


@dataclass(frozen=True)
class ScriptedCall:
    """One ``generate`` call a :class:`ScriptedEngine` answered: its session, prompt and images, when it
    came (event-loop time), the token ids of each generation it returned and the adapter it named."""

    session_id: str | None
    prompt_ids: list[int]
    images: list[Any]
    at: float
    generated: list[list[int]]
    adapter: str | None = None


class ScriptedEngine(RolloutEngine):
    """Replays ``script`` (one list of texts for every trajectory, or a mapping from a piece of a
    session id to its trajectory's texts), one text per generation, each of ``n`` generations alike;
    every token gets ``logprob``; each call first waits ``delay_s`` (so concurrent trajectories
    interleave), then picks its text. With ``record`` (a test's engine), ``calls`` holds every call
    answered, in the order answered, ``ended`` every session ended and ``cloned`` every clone; the
    registered engine (a whole ``toolrl rollout``) keeps none."""

    name = "scripted"
    Options = ScriptedOptions

    def __init__(self, tokenizer: Any, script: Sequence[str] | Mapping[str, Sequence[str]], *,
                 logprob: float = -1.0, delay_s: float = 0.0, record: bool = True) -> None:
        self.tokenizer, self.logprob, self.delay_s, self.record = tokenizer, logprob, delay_s, record
        self.script = ({key: list(texts) for key, texts in script.items()} if isinstance(script, Mapping)
                       else list(script))
        self.turns: dict[str | None, int] = {}
        self.calls: list[ScriptedCall] = []
        self.ended: list[str] = []
        self.cloned: list[tuple[str, list[str]]] = []

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> ScriptedEngine:
        return cls(source.tokenizer, config["script"], record=False)

    def script_of(self, session_id: str | None) -> list[str]:
        """The texts of ``session_id``'s trajectory: the script, or the first whose key the id contains."""
        if not isinstance(self.script, dict):
            return self.script
        session = session_id or ""
        for key, texts in self.script.items():
            if key in session:
                return texts
        raise KeyError(f"no script for session {session_id!r} (keys: {sorted(self.script)})")

    def text(self, session_id: str | None, prompt_ids: list[int]) -> str:
        """The text this call generates: the session's next text (the last repeats)."""
        turn = self.turns.get(session_id, 0)
        self.turns[session_id] = turn + 1
        texts = self.script_of(session_id)
        return texts[min(turn, len(texts) - 1)]

    def generation(self, text: str, params: SamplingParams) -> Generation:
        """``text`` as a model would have generated it: :func:`scripted_generation` with ``logprob``."""
        return scripted_generation(self.tokenizer, text, params, self.logprob)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Sequence[Any] = (),
                       adapter: str | None = None) -> list[Generation]:
        at = asyncio.get_running_loop().time()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        text = self.text(session_id, list(prompt_ids))
        generations = [self.generation(text, params) for _ in range(n)]
        if self.record:
            self.calls.append(ScriptedCall(session_id, list(prompt_ids), list(images), at,
                                           [g.token_ids for g in generations], adapter))
        return generations

    async def check_trainable(self) -> str | None:
        return "the scripted engine replays fixed text: it has no weights or logprobs to train"

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError("a scripted engine has no weights")

    def end_session(self, session_id: str) -> None:
        self.turns.pop(session_id, None)
        if self.record:
            self.ended.append(session_id)

    def clone_session(self, session_id: str, into: Sequence[str]) -> None:
        for sid in into:
            self.turns[sid] = self.turns.get(session_id, 0)
        if self.record:
            self.cloned.append((session_id, list(into)))


def scripted_generation(tokenizer: Any, text: str, params: SamplingParams, logprob: float = -1.0) -> Generation:
    """``text`` as a model would have generated it under ``params``: a text ending at one of the parser's
    stop strings stops there (an inline call runs), one past ``max_new_tokens`` is cut, and the rest end
    with the end-of-turn token; every token gets ``logprob``."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    stop = next((s for s in params.stop_strings if text.endswith(s)), None)
    if stop is not None:
        finish, stopped = "stop_string", stop
    elif len(ids) >= params.max_new_tokens:
        ids, finish, stopped = ids[: params.max_new_tokens], "length", None
    else:
        ids, finish, stopped = ids + [params.stop_token_ids[0]], "stop", params.stop_token_ids[0]
    return Generation(ids, [logprob] * len(ids), finish, stopped)  # type: ignore[arg-type]
