"""One trajectory's τ² session: a fresh domain environment set to the task's initial state, the
conversation as τ² messages (built from what the toolrl rollout does: tool calls, answers, user
turns), the simulated user, and τ²'s evaluation of the finished simulation."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict

from toolrl_tau2 import domain

# The user's first line when a user is simulated (τ²'s orchestrator opens with the agent's greeting;
# a toolrl prompt must end with a user turn, so the user opens).
USER_OPENING = "Hi!"

# τ²'s NL-assertion judge reads its model from module globals: judged evaluations take turns.
_JUDGE_LOCK = threading.Lock()


class Endpoint(BaseModel):
    """An OpenAI-compatible endpoint (``toolrl serve``, vLLM, ...), called through τ²'s litellm."""

    model_config = ConfigDict(extra="forbid")
    base_url: str
    model: str
    api_key: str = "EMPTY"
    temperature: float = 0.0

    def llm(self) -> tuple[str, dict[str, Any]]:
        """τ²'s (llm, llm_args): litellm's openai provider pointed at ``base_url``."""
        return f"openai/{self.model}", {"api_base": self.base_url, "api_key": self.api_key,
                                        "temperature": self.temperature, "num_retries": 0}


class Session:
    def __init__(self, domain_name: str, task_id: str, solo: bool, user: Endpoint | None,
                 judge: Endpoint | None, max_user_turns: int) -> None:
        from tau2.data_model.message import UserMessage

        index = domain.task_index(domain_name)
        if task_id not in index:
            raise ValueError(f"τ² domain {domain_name!r} has no task {task_id!r}")
        self.domain, self.task, self.solo, self.judge = domain_name, index[task_id], solo, judge
        self.env = domain.new_environment(domain_name, solo)
        state = self.task.initial_state
        self.history = domain.history(self.task)
        if state is not None:
            self.env.set_state(initialization_data=state.initialization_data,
                               initialization_actions=state.initialization_actions,
                               message_history=self.history)
        opening = USER_OPENING if user is not None else domain.opening(self.task, solo)
        # Solo mode has no user: τ² gives the ticket to the agent outside the conversation.
        self.messages: list[Any] = [] if solo else [UserMessage(role="user", content=opening)]
        self.termination: str | None = None
        self.user_turns_left = max_user_turns
        self.user = self.user_state = None
        if user is not None:
            from tau2.user.user_simulator import UserSimulator

            llm, args = user.llm()
            self.user = UserSimulator(instructions=self.task.user_scenario, llm=llm, llm_args=args)
            self.user_state = self.user.get_init_state([UserMessage(role="user", content=opening)])
        self.started = datetime.now(timezone.utc)

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run the agent's call on the environment; the call and its response join the conversation."""
        from tau2.data_model.message import AssistantMessage, ToolCall

        call = ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=name, arguments=arguments, requestor="assistant")
        response = self.env.get_response(call)
        self.messages += [AssistantMessage(role="assistant", content=None, tool_calls=[call]), response]
        return response.content or "", bool(response.error)

    async def reply(self, text: str) -> str | None:
        """The model answered ``text``: the simulated user's next turn, or None when the
        conversation is over (no user, the user stopped, or its turns ran out)."""
        from tau2.data_model.message import AssistantMessage

        answer = AssistantMessage(role="assistant", content=text)
        self.messages.append(answer)
        if self.user is None:
            self.termination = "agent_stop"
            return None
        if self.user_turns_left <= 0:
            self.termination = "max_steps"
            return None
        self.user_turns_left -= 1
        message, self.user_state = await asyncio.to_thread(self.user.generate_next_message, answer,
                                                           self.user_state)
        if self.user.is_stop(message) or message.is_tool_call():
            # A user that calls its own tools (telecom's device) is not simulated here: it ends the talk.
            self.termination = "user_stop"
            return None
        self.messages.append(message)
        return message.content or ""

    def evaluate(self) -> dict[str, float]:
        """τ²'s ``evaluate_simulation`` of the conversation: the reward, and its parts (DB,
        ENV_ASSERTION, ACTION, COMMUNICATE, NL_ASSERTION as the task's reward basis names them).
        NL assertions are judged only when a judge is configured; otherwise they are left out of the
        basis and ``nl_assertions_skipped`` is 1."""
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        task, skipped = self.task, 0.0
        criteria = task.evaluation_criteria
        if self.judge is None and criteria is not None and RewardType.NL_ASSERTION in criteria.reward_basis:
            basis = [b for b in criteria.reward_basis if b != RewardType.NL_ASSERTION]
            task = task.model_copy(update={"evaluation_criteria": criteria.model_copy(update={"reward_basis": basis})})
            skipped = 1.0
        now = datetime.now(timezone.utc)
        simulation = SimulationRun(
            id=uuid.uuid4().hex, task_id=task.id, timestamp=now.isoformat(), start_time=self.started.isoformat(),
            end_time=now.isoformat(), duration=(now - self.started).total_seconds(),
            termination_reason=TerminationReason(self.termination or "max_steps"),
            messages=[*self.history, *self.messages])
        if self.judge is None:
            info = evaluate_simulation(simulation, task, EvaluationType.ALL, self.solo, self.domain)
        else:
            info = self._judged(simulation, task)
        parts = {str(getattr(k, "value", k)): float(v) for k, v in (info.reward_breakdown or {}).items()}
        return {"reward": float(info.reward), **parts, "nl_assertions_skipped": skipped}

    def _judged(self, simulation: Any, task: Any) -> Any:
        from tau2.evaluator import evaluator_nl_assertions as nl
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        assert self.judge is not None
        model, args = self.judge.llm()
        with _JUDGE_LOCK:
            saved = nl.DEFAULT_LLM_NL_ASSERTIONS, nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS
            nl.DEFAULT_LLM_NL_ASSERTIONS, nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = model, args
            try:
                return evaluate_simulation(simulation, task, EvaluationType.ALL_WITH_NL_ASSERTIONS, self.solo,
                                           self.domain)
            finally:
                nl.DEFAULT_LLM_NL_ASSERTIONS, nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = saved
