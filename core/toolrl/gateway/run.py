"""One episode of an agent program: open its endpoint on the gateway, run the program against it
(``timeout_s`` is a deadline), close the endpoint, and make the trajectory of what it did.

The rollout loop then scores the episode's pieces with its step rewards (posted with a call's id), the
program's reward (posted or returned) as the ``agent`` term, and the roles' rewards. A failed episode is
masked under ``failure: mask``, an ``error`` trained with the reward it got under ``train`` (docs/agents.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from toolrl.agents import Agent, AgentTask, Endpoint
from toolrl.gateway.server import Gateway
from toolrl.gateway.session import GatewaySession
from toolrl.rewards.scoring import RewardValueError, coerce_reward
from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory


@dataclass
class AgentOutcome:
    pieces: list[Trajectory]  # the trajectory, its last piece last
    step_rewards: list[float] = field(default_factory=list)
    terms: dict[str, float] = field(default_factory=dict)  # {"agent": reward} when the program gave one
    role_rewards: dict[str, float] = field(default_factory=dict)  # posted with a role


async def run_agent_episode(gateway: Gateway, session: GatewaySession, agent: Agent, sample: Sample,
                            scored: bool) -> AgentOutcome:
    """``agent``'s episode of ``sample`` on ``session``; ``scored``: reward functions may score it instead."""
    record, trajectory_id = session.record, session.record.key
    gateway.sessions[trajectory_id] = session
    url = gateway.url(trajectory_id)
    # The reward URL holds the episode's key: a program POSTs to it as it is, no header needed.
    endpoint = Endpoint(f"{url}/v1", session.api_key, f"{url}/reward?key={session.api_key}", session.model,
                        tuple(session.roles), gateway.environ(trajectory_id, session.api_key))
    task = AgentTask(prompt=[m.model_dump(mode="json", exclude_none=True) for m in sample.prompt],
                     ground_truth=sample.ground_truth, extra_info=sample.extra_info)
    failure, returned = None, None
    try:
        async with asyncio.timeout(agent.options.timeout_s):  # not wait_for, which can drop a cancellation on 3.11
            returned = await gateway.agents.run(agent.run(task, endpoint))
    except TimeoutError:
        failure = f"the agent ran past its {agent.options.timeout_s:g} s deadline"
    except Exception as exc:  # the program's failure is its episode's, never the run's
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        gateway.sessions.pop(trajectory_id, None)
        for segment in record.segments:
            session.engine.end_session(segment.traj.trajectory_id)
    reward = session.reward
    if returned is not None and failure is None:
        try:
            reward = coerce_reward(returned, "the agent's returned reward")
        except RewardValueError as exc:
            failure = str(exc)
    if failure is None and session.failures:
        failure = f"the engine failed a call: {session.failures[0]}"
    if failure is None and reward is None and not scored:
        failure = "the agent gave no reward (posted or returned) and no reward function is configured"
    pieces = record.pieces(("infra_error" if agent.options.failure == "mask" else "error") if failure is not None
                           else "max_response_tokens" if session.exhausted
                           else "length" if record.last_finish == "length" else "answered")
    if not pieces:  # not one model call: nothing to train, whatever the rule
        failure = failure or "the agent made no model call"
        prompt = session.renderers([]).prompt_ids([m.to_template() for m in sample.prompt])
        pieces = [Trajectory(trajectory_id=trajectory_id, sample_index=record.sample_index, group=record.group,
                             env=sample.env, prompt_ids=prompt, ground_truth=sample.ground_truth,
                             termination="infra_error", role=session.model if session.roles else None)]
    pieces[-1].error = failure
    return AgentOutcome(pieces, list(session.step_rewards.values()), {"agent": reward} if reward is not None else {},
                        dict(session.role_rewards))
