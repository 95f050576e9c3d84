"""The ``verifiers`` session through the environment-session conformance kit, on the tests' adder
environment (envs/vf_adder_env.py): its toolsets' tools handed out per task, a right answer after a
call scoring the whole rubric, a wrong one only the tool-use part, a call with bad arguments an error
result the model reads; trajectories side by side keep their own state (``calc_calls`` counts this
task's calls only). The toolsets run behind in-process MCP servers: there is no backend to take away."""

from __future__ import annotations

import json

from toolrl.config import load_config
from toolrl.data.sources import load_samples
from toolrl.schemas import ToolCall
from toolrl.testing import SessionConformance, SessionPlay

ADDER = {"env": "verifiers", "env_options": {"module": "vf_adder_env"}}
SAMPLES = load_samples(load_config(None, data=ADDER))  # What is 2 + 3? / 10 + 32? / 7 + 8?


def add(**arguments: object) -> ToolCall:
    return ToolCall(name="calc_add", arguments=arguments)


def written(*calls: ToolCall) -> str:
    """The calls as the model writes them (hermes, the session's parser)."""
    return "".join(f'<tool_call>\n{json.dumps({"name": c.name, "arguments": c.arguments})}\n</tool_call>' for c in calls)


def play(index: int, calls: list[ToolCall], answer: str, terms: dict[str, float]) -> SessionPlay:
    return SessionPlay(SAMPLES[index], calls, answers=[answer], model_text=[written(*calls), answer], terms=terms)


class TestAdder(SessionConformance):
    session_name = "verifiers"
    session_options = {"module": "vf_adder_env"}
    plays = [
        play(0, [add(a=2, b=3), ToolCall(name="calc_calls")], "The answer is 5",
             {"verifiers.correct": 0.75, "verifiers.used_tool": 0.25}),
        play(1, [add(a=10, b=32), ToolCall(name="define", arguments={"word": "sum"})], "The answer is 41",
             {"verifiers.correct": 0.0, "verifiers.used_tool": 0.25}),
        play(2, [add(a="seven")], "The answer is 15", {"verifiers.correct": 0.75, "verifiers.used_tool": 0.25}),
    ]
    no_backend = "its toolsets run behind in-process MCP servers, in the rollout worker's process"
