"""The oracle: a scripted engine that plays each τ² task's ground-truth actions (its evaluation
criteria) as hermes tool calls, one per turn, then answers with the information the task wants
communicated. It finds its task by the sample index in the trajectory id (``s<index>-g<group>-<k>``,
as :func:`toolrl.rollout.run_rollouts` names them; several mock tasks open alike); the tokenizer,
chat template, parser, rollout loop, session and τ² evaluator around it are real.

:func:`reference` is what τ² itself gives the same play: its environment runs the actions, its
evaluator scores the simulation, with no toolrl code in between."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolrl.testing import ScriptedEngine


def ground_truth(task: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(a.name, dict(a.arguments)) for a in task.evaluation_criteria.actions or []]


def answer(task: Any) -> str:
    info = task.evaluation_criteria.communicate_info or [] if task.evaluation_criteria else []
    return "<think>\n\n</think>\n\nDone. " + " ".join(info)


def reference(domain_name: str, task: Any, solo: bool = False) -> float:
    """τ²'s own reward for the oracle's play of ``task``: the scenario as the user's opening (none
    solo), each action a τ² tool call on a fresh environment, the answer, the agent stopping; NL
    assertions left out of the basis (no judge)."""
    from datetime import datetime, timezone

    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from toolrl_tau2 import domain

    env, history = domain.new_environment(domain_name, solo), domain.history(task)
    if task.initial_state is not None:
        env.set_state(initialization_data=task.initial_state.initialization_data,
                      initialization_actions=task.initial_state.initialization_actions, message_history=history)
    messages = [] if solo else [UserMessage(role="user", content=domain.opening(task, solo))]
    for i, (name, arguments) in enumerate(ground_truth(task)):
        tool_call = ToolCall(id=f"gold_{i}", name=name, arguments=arguments, requestor="assistant")
        messages += [AssistantMessage(role="assistant", tool_calls=[tool_call]), env.get_response(tool_call)]
    messages.append(AssistantMessage(role="assistant", content=answer(task).split("</think>\n\n")[1]))
    criteria = task.evaluation_criteria
    basis = [b for b in criteria.reward_basis if b != RewardType.NL_ASSERTION]
    task = task.model_copy(update={"evaluation_criteria": criteria.model_copy(update={"reward_basis": basis})})
    now = datetime.now(timezone.utc).isoformat()
    simulation = SimulationRun(id="gold", task_id=task.id, timestamp=now, start_time=now, end_time=now, duration=0.0,
                               termination_reason=TerminationReason.AGENT_STOP, messages=[*history, *messages])
    return float(evaluate_simulation(simulation, task, EvaluationType.ALL, solo, domain_name).reward)


def call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


class OracleEngine(ScriptedEngine):
    def __init__(self, tokenizer: Any, tasks: Sequence[Any], altered: dict[str, list[str]] | None = None):
        """``tasks``: the split's tasks in sample order; ``altered``: scripts replacing the oracle's, by task id."""
        scripts = {t.id: [call(n, a) for n, a in ground_truth(t)] + [answer(t)] for t in tasks}
        super().__init__(tokenizer, {**scripts, **(altered or {})}, logprob=-0.5)
        self.tasks = list(tasks)

    def script_of(self, session_id: str | None) -> list[str]:
        task = self.tasks[int(re.search(r"s(\d+)-g", session_id or "").group(1))]
        return self.script[task.id]
