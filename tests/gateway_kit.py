"""What the gateway tests share: a tool, a task, an engine that says a script, an agent that is a Python
function, and a rollout context whose route runs it."""

from __future__ import annotations

import json

from family_tokenizers import family_tokenizer
from toolrl.agents import Agent, AgentOptions
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.families import family_named
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.renderers.families import renderer_factory
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
SAMPLE = Sample(prompt=[{"role": "user", "content": "2+3, then add 9?"}], ground_truth="14", index=0)


def hermes(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptEngine(ScriptedEngine):
    """Says the next text of ``script`` at every generation, whatever the session (an agent's calls come
    from several, or from none when it asks for n > 1)."""

    def text(self, session_id, prompt_ids):
        done = len(self.generated)
        return self.script[min(done, len(self.script) - 1)]

    @property
    def generated(self) -> list[list[int]]:
        return [ids for call in self.calls for ids in call.generated]

    @property
    def prompts(self) -> list[list[int]]:
        return [call.prompt_ids for call in self.calls]


class Program(Agent):
    """An agent whose program is a Python function of (task, endpoint), for tests."""

    name = "program"

    def __init__(self, function, **options):
        super().__init__(AgentOptions(**options))
        self.function = function

    async def run(self, task, endpoint):
        return await self.function(task.model_dump(), endpoint)


async def episode(script, program, family="qwen2_5", setting=None, sample=SAMPLE, **options):
    """One episode of ``program`` (an async function of (task, endpoint), or an Agent) on ``sample`` whose
    model says ``script``, in ``family``'s format: (tokenizer, context, pieces). ``setting``:
    :func:`context`'s keywords (rewards, delay, rollout settings); ``options``: the agent's."""
    tok = family_tokenizer(family)
    agent = program if isinstance(program, Agent) else Program(program, **options)
    ctx = context(tok, family, script, agent, **(setting or {}))
    try:
        pieces = await run_trajectory_pieces(ctx, sample, 0, "t0", 0)
    finally:
        await ctx.close()
    return tok, ctx, pieces


def context(tokenizer, family, script, agent, rewards=(), delay=0.0, **rollout):
    parser = build_part("tool_parsers", family_named(family).parser if family else "hermes", {}, BuildContext("p"))
    return RolloutContext(engine=ScriptEngine(tokenizer, script, logprob=-0.25, delay_s=delay),
                          renderer_factory=renderer_factory(tokenizer, family),
                          config=RolloutConfig(**{"max_response_tokens": 4096, "max_new_tokens": 512, **rollout}),
                          routes={None: Route({}, 4, parser, list(rewards), RewardConfig(), agent=agent)})


async def post(url, body=None, key=None, content=None):
    """POST ``body`` as JSON (or raw ``content``) with the episode's ``key``; (status, JSON answer)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(url, json=body if content is None else None, data=content,
                                                          headers=headers) as answer:
        return answer.status, await answer.json(content_type=None)


def trained(pieces):
    """The trained tokens of every piece, in order."""
    return [t for p in pieces for t, m in zip(p.response_ids, p.response_mask) if m]
