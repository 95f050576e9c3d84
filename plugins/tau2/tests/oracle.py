"""The oracle: a scripted engine that plays each τ² task's ground-truth actions (its evaluation
criteria) as hermes tool calls, one per turn, then answers with the information the task wants
communicated. It finds its task by the sample index in the trajectory id (``s<index>-g<group>-<k>``,
as :func:`toolrl.rollout.run_rollouts` names them; several mock tasks open alike); the tokenizer,
chat template, parser, rollout loop, tools and τ² evaluator around it are real."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolrl.engines import Generation, RolloutEngine, SamplingParams

# The one mock task whose criteria give no actions, only an env assertion (task_2 ends "completed"):
# its ground truth, read off that assertion.
FROM_ASSERTIONS = {"update_task_with_history_and_env_assertions": [
    ("update_task_status", {"task_id": "task_2", "status": "completed"})]}


def ground_truth(task: Any) -> list[tuple[str, dict[str, Any]]]:
    actions = [(a.name, dict(a.arguments)) for a in task.evaluation_criteria.actions or []]
    return actions or FROM_ASSERTIONS.get(task.id, [])


def answer(task: Any) -> str:
    info = task.evaluation_criteria.communicate_info or [] if task.evaluation_criteria else []
    return "<think>\n\n</think>\n\nDone. " + " ".join(info)


def call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


class OracleEngine(RolloutEngine):
    name = "tau2_oracle"

    def __init__(self, tokenizer: Any, tasks: Sequence[Any], altered: dict[str, list[str]] | None = None):
        """``tasks``: the split's tasks in sample order; ``altered``: scripts replacing the oracle's, by task id."""
        self.tokenizer, self.tasks = tokenizer, list(tasks)
        self.scripts = {t.id: [call(n, a) for n, a in ground_truth(t)] + [answer(t)] for t in tasks}
        self.scripts.update(altered or {})
        self.turns: dict[str, int] = {}

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None) -> list[Generation]:
        task = self.tasks[int(re.search(r"s(\d+)-g", session_id or "").group(1))]
        turn = self.turns[session_id] = self.turns.get(session_id, -1) + 1
        script = self.scripts[task.id]
        ids = self.tokenizer.encode(script[min(turn, len(script) - 1)], add_special_tokens=False)
        ids = ids[: params.max_new_tokens - 1] + [params.stop_token_ids[0]]
        return [Generation(list(ids), [-0.5] * len(ids), "stop", params.stop_token_ids[0]) for _ in range(n)]

    @classmethod
    def create(cls, source, config):
        raise NotImplementedError("built by the test itself")

    def update_weights(self, state_dict: Any) -> None:
        raise NotImplementedError("a script has no weights")
