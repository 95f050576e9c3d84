"""The ``scripted`` rollout engine: fixed model turns instead of a model, for environment and tool
authors (``engine: {name: scripted, options: {script: [...]}}``; docs/environments.md, "Driving an
environment with fixed calls").

Every trajectory replays the same ``script``: its n-th generation is the script's n-th text (the last
one repeats), tokenized with the model's tokenizer and closed with the end-of-turn token (a text that
ends at one of the parser's stop strings stops there instead, so inline calls run). The CLI,
config, tokenizer, chat template, parser, agent loop, tools, environment sessions and rewards around
it are the real ones, so what a session or tool does with those calls is what training would see. It
has no weights: ``toolrl rollout`` and ``toolrl eval`` run it; training refuses it (no logprobs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolrl.engines import Generation, ModelSource, RolloutEngine, SamplingParams


class ScriptedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    script: list[str] = Field(min_length=1, description="The model's text of each generation of a trajectory, "
                                                        "in order; the last repeats.")
    # Set by the core for every engine (engine.max_batch_size, model.device, model.dtype): nothing to use here.
    max_batch_size: int = 32
    device: str = "cpu"
    dtype: str = "float32"


class ScriptedEngine(RolloutEngine):
    name = "scripted"
    Options = ScriptedOptions

    def __init__(self, tokenizer: Any, script: Sequence[str]) -> None:
        self.tokenizer, self.script = tokenizer, list(script)
        self.turns: dict[str | None, int] = {}

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> ScriptedEngine:
        return cls(source.tokenizer, config["script"])

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Sequence[Any] = ()) -> list[Generation]:
        turn = self.turns.get(session_id, 0)
        self.turns[session_id] = turn + 1
        text = self.script[min(turn, len(self.script) - 1)]
        return [scripted_generation(self.tokenizer, text, params) for _ in range(n)]

    async def check_trainable(self) -> str | None:
        return "the scripted engine replays fixed text: it has no weights or logprobs to train"

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError("a scripted engine has no weights")

    def end_session(self, session_id: str) -> None:
        self.turns.pop(session_id, None)


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
