"""The ``tau2`` environment session: one trajectory on a fresh τ² domain environment (its own
database copy, set to the task's initial state), the conversation as τ² messages (built from what
the rollout does: tool calls, answers, user turns), the simulated user, and τ²'s evaluation of the
finished simulation as the score.

As τ²'s orchestrator runs a task: with a simulated user and no history, the agent greets first
(τ²'s default first agent message) and the user writes the first user message; the user has the
domain's user tools where the domain has them (their calls run on the same environment); a tool
call that τ² answers with an error is an error result.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from toolrl.schemas import Sample, ToolCall, ToolResponse
from toolrl.sessions import EnvironmentSession, Reset, SessionContext, StepResult
from toolrl.trajectory import Trajectory

from toolrl_tau2 import domain

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


class Tau2SessionOptions(BaseModel):
    """``session_options`` (the environments write them from ``env_options``)."""

    model_config = ConfigDict(extra="forbid")
    domain: str
    solo: bool = False
    user: Endpoint | None = None
    judge: Endpoint | None = None
    max_user_turns: int = Field(30, gt=0)

    @field_validator("domain")
    @classmethod
    def _known(cls, value: str) -> str:
        known = list(domain.DOMAINS)
        if value not in known:
            raise ValueError(f"unknown τ² domain {value!r} (known: {', '.join(known)})")
        return value


class Tau2Session(EnvironmentSession):
    """One τ² task per trajectory; the task is the sample's ground truth (its τ² task id)."""

    Options = Tau2SessionOptions
    timeout = 120.0  # an evaluation loads the domain's database twice; a user turn is a model call

    def __init__(self, options: Tau2SessionOptions, context: SessionContext) -> None:
        super().__init__(options, context)
        self.messages: list[Any] = []  # the conversation after the task's history, as τ² messages
        self.termination: str | None = None  # user_stop / max_steps once the user ended the talk
        self.user_turns_left = options.max_user_turns
        self.user: Any = None
        self.user_state: Any = None

    def reset(self, sample: Sample) -> Reset:
        """The task's environment (built in a thread: loading a database takes a while), its tools,
        and with a user the opening: τ²'s agent greeting and the user's first message."""
        o = self.options
        index = domain.task_index(o.domain)
        if str(sample.ground_truth) not in index:
            raise ValueError(f"τ² domain {o.domain!r} has no task {sample.ground_truth!r} (the sample's ground truth)")
        self.task = index[str(sample.ground_truth)]
        self.env = domain.new_environment(o.domain, o.solo)
        self.history = domain.history(self.task)
        state = self.task.initial_state
        if state is not None:
            self.env.set_state(initialization_data=state.initialization_data,
                               initialization_actions=state.initialization_actions, message_history=self.history)
        self.started = datetime.now(timezone.utc)
        tools = list(domain.tool_schemas(o.domain, o.solo))
        if o.user is not None:
            return Reset(tools=tools, messages=self._opening())
        if not o.solo:  # the prompt's opening (the scenario) is the user's first message
            from tau2.data_model.message import UserMessage

            self.messages.append(UserMessage(role="user", content=domain.opening(self.task, False)))
        return Reset(tools=tools)

    def _opening(self) -> list[dict[str, Any]]:
        from tau2.data_model.message import AssistantMessage
        from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
        from tau2.user.user_simulator import UserSimulator

        assert self.options.user is not None
        llm, args = self.options.user.llm()
        user_tools = self.env.get_user_tools() if self.env.user_tools is not None else None
        self.user = UserSimulator(tools=user_tools, instructions=str(self.task.user_scenario), llm=llm, llm_args=args)
        last = self.history[-1] if self.history else None
        if last is not None and not (isinstance(last, AssistantMessage) and not last.is_tool_call()):
            # The history hands the turn to the agent: the user speaks after its answer.
            self.user_state = self.user.get_init_state([m for m in self.history if _for_user(m)])
            return []
        greeting = [] if last is not None else [DEFAULT_FIRST_AGENT_MESSAGE.model_copy(deep=True)]
        self.messages += greeting
        self.user_state = self.user.get_init_state([m for m in self.history[:-1] if _for_user(m)])
        said = self._user_says(last or greeting[0])
        return [*domain.chat_messages(greeting), *([{"role": "user", "content": said}] if said is not None else [])]

    async def step(self, call: ToolCall) -> StepResult:
        """The agent's call on the environment (in-memory and quick: run here, one at a time); the
        call and its response join the conversation. τ²'s error answers are error results."""
        from tau2.data_model.message import AssistantMessage
        from tau2.data_model.message import ToolCall as Tau2Call

        tau2_call = Tau2Call(id=f"call_{uuid.uuid4().hex[:12]}", name=call.name, arguments=call.arguments,
                             requestor="assistant")
        response = self.env.get_response(tau2_call)
        self.messages += [AssistantMessage(role="assistant", content=None, tool_calls=[tau2_call]), response]
        text = response.content or ""
        return StepResult(response=ToolResponse.error(text) if response.error else ToolResponse(text=text))

    async def respond(self, message: str) -> str | None:
        """The model answered ``message``: the simulated user's next turn, or None when the
        conversation is over (no user, the user stopped, or its turns ran out)."""
        from tau2.data_model.message import AssistantMessage

        answer = AssistantMessage(role="assistant", content=message)
        self.messages.append(answer)
        if self.user is None:
            return None
        return await asyncio.to_thread(self._user_says, answer)

    def _user_says(self, message: Any) -> str | None:
        """The user's reply to ``message``; its own tool calls run on the environment and go back to
        it until it speaks (each a user turn). None: it stopped, or its turns ran out."""
        from tau2.data_model.message import MultiToolMessage
        from tau2.user.user_simulator import UserSimulator

        while True:
            if self.user_turns_left <= 0:
                self.termination = "max_steps"
                return None
            self.user_turns_left -= 1
            reply, self.user_state = self.user.generate_next_message(message, self.user_state)
            self.messages.append(reply)
            if not reply.is_tool_call():
                break
            results = [self.env.get_response(c) for c in reply.tool_calls]
            self.messages += results
            message = results[0] if len(results) == 1 else MultiToolMessage(role="tool", tool_messages=results)
        if UserSimulator.is_stop(reply):
            self.termination = "user_stop"
            return None
        return reply.content or ""

    def score(self, trajectory: Trajectory) -> dict[str, float]:
        """τ²'s ``evaluate_simulation`` of the conversation: the reward, and its parts (DB,
        ENV_ASSERTION, ACTION, COMMUNICATE, NL_ASSERTION as the task's reward basis names them).
        NL assertions are judged only when a judge is configured; otherwise they are left out of the
        basis and ``nl_assertions_skipped`` is 1."""
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        task, skipped = self.task, 0.0
        criteria = task.evaluation_criteria
        if self.options.judge is None and criteria is not None and RewardType.NL_ASSERTION in criteria.reward_basis:
            basis = [b for b in criteria.reward_basis if b != RewardType.NL_ASSERTION]
            task = task.model_copy(update={"evaluation_criteria": criteria.model_copy(update={"reward_basis": basis})})
            skipped = 1.0
        ended = {"answered": "agent_stop", "error": "agent_error"}.get(trajectory.termination, "max_steps")
        now = datetime.now(timezone.utc)
        simulation = SimulationRun(
            id=uuid.uuid4().hex, task_id=task.id, timestamp=now.isoformat(), start_time=self.started.isoformat(),
            end_time=now.isoformat(), duration=(now - self.started).total_seconds(),
            termination_reason=TerminationReason(self.termination or ended),
            messages=[*self.history, *self.messages])
        if self.options.judge is None:
            info = evaluate_simulation(simulation, task, EvaluationType.ALL, self.options.solo, self.options.domain)
        else:
            info = self._judged(simulation, task)
        parts = {str(getattr(k, "value", k)): float(v) for k, v in (info.reward_breakdown or {}).items()}
        return {"reward": float(info.reward), **parts, "nl_assertions_skipped": skipped}

    def _judged(self, simulation: Any, task: Any) -> Any:
        from tau2.evaluator import evaluator_nl_assertions as nl
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        assert self.options.judge is not None
        model, args = self.options.judge.llm()
        with _JUDGE_LOCK:
            saved = nl.DEFAULT_LLM_NL_ASSERTIONS, nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS
            nl.DEFAULT_LLM_NL_ASSERTIONS, nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = model, args
            try:
                return evaluate_simulation(simulation, task, EvaluationType.ALL_WITH_NL_ASSERTIONS,
                                           self.options.solo, self.options.domain)
            finally:
                nl.DEFAULT_LLM_NL_ASSERTIONS, nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = saved


def _for_user(message: Any) -> bool:
    """A history message the user simulator keeps (τ²'s rule)."""
    from tau2.user.base import is_valid_user_history_message

    return is_valid_user_history_message(message)
