"""One agent program's episode as the rollout runs it (toolrl.gateway.run: its own endpoint on a real
gateway over HTTP, the trajectory recorded), the model an engine that says a script in the Qwen 2.5 chat
format, on Qwen's real tokenizer."""

from __future__ import annotations

import json
from functools import cache

from toolrl.agents import Agent, AgentOptions
from toolrl.config import RolloutConfig
from toolrl.families import family_named
from toolrl.gateway.record import EpisodeRecord
from toolrl.gateway.run import AgentOutcome, run_agent_episode
from toolrl.gateway.server import Gateway
from toolrl.gateway.session import GatewaySession
from toolrl.model_sources import load_tokenizer, qwen_tokenizer_path
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.families import renderer_factory
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine

SAMPLE = Sample(prompt=[{"role": "user", "content": "2+3, then add 9?"}], ground_truth="14", index=0)
ADD = {"name": "add", "description": "Add two integers.", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}


@cache
def tokenizer():
    tok = load_tokenizer(qwen_tokenizer_path("qwen3"))
    tok.chat_template = family_named("qwen2_5").detection.templates[0].text()
    return tok


def hermes(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class InOrder(ScriptedEngine):
    """The script's texts in the order the calls come, whichever segment (session) each continues."""

    def text(self, session_id, prompt_ids):
        return self.script[min(len(self.calls), len(self.script) - 1)]


class Program(Agent):
    name = "program"

    def __init__(self, function):
        super().__init__(AgentOptions())
        self.function = function

    async def run(self, task, endpoint):
        return await self.function(task.model_dump(), endpoint)


async def episode(script, program, roles=()) -> tuple[InOrder, AgentOutcome]:
    """``program`` (an async function of (task, endpoint)) for one episode of SAMPLE: the engine (its
    ``calls``) and the outcome (its ``pieces``); ``roles``: the run's, each a model name served."""
    engine, gateway = InOrder(tokenizer(), script, logprob=-0.25), await Gateway().start()
    session = GatewaySession(EpisodeRecord("t0", 0, 0, SAMPLE.env, SAMPLE.ground_truth), engine,
                             renderer_factory(tokenizer(), "qwen2_5"), HermesParser(),
                             RolloutConfig(max_response_tokens=4096, max_new_tokens=512), 0,
                             roles[0] if roles else "toolrl", roles)
    try:
        return engine, await run_agent_episode(gateway, session, Program(program), SAMPLE, scored=False)
    finally:
        await gateway.close()


def generated(engine):
    return [ids for call in engine.calls for ids in call.generated]


def trained(pieces):
    return [t for p in pieces for t, m in zip(p.response_ids, p.response_mask) if m]
