"""A rollout engine that replays scripted model turns (``engine.options.script``: one text per
generation call of a trajectory), for plugin tests that run ``toolrl rollout`` in a subprocess.

It stands in for a model primed to call a tool; the CLI, config, tokenizer, chat template, agent loop
and the plugin's tools around it are real. The core does not register it: a test puts a distribution
on ``PYTHONPATH`` whose ``toolrl`` entry point names this module (``scripted =
toolrl.testing.scripted_engine``), so that ``engine.name=scripted`` finds it.
"""

from __future__ import annotations

from toolrl import hookimpl
from toolrl.engines import Generation, RolloutEngine


class ScriptedEngine(RolloutEngine):
    name = "scripted"

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.turns = tokenizer, list(script), {}

    @classmethod
    def create(cls, source, config):
        return cls(source.tokenizer, config["script"])

    async def generate(self, prompt_ids, params, n=1, session_id=None, images=()):
        turn = self.turns.get(session_id, 0)
        self.turns[session_id] = turn + 1
        ids = self.tokenizer.encode(self.script[min(turn, len(self.script) - 1)], add_special_tokens=False)
        ids = ids + [params.stop_token_ids[0]]
        return [Generation(ids, [-1.0] * len(ids), "stop", params.stop_token_ids[0])]

    def update_weights(self, state_dict):
        raise NotImplementedError("a scripted engine has no weights")


@hookimpl
def register_rollout_engines(register):
    register(ScriptedEngine)
