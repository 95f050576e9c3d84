"""A finished toolrl trajectory as a verifiers ``Trace`` (the prompt, then each turn as an assistant
message with its tool calls, read back with the rollout's parser, and each call's result as a tool
message), for ``Task.score(trace)``, which runs the task's ``@vf.metric`` and ``@vf.reward`` functions
and its judges (the ``verifiers`` session's score: one part per reward, its score times its weight,
so the reward terms are ``verifiers.<reward>`` and their sum is ``trace.reward``, the rubric's own
total).
"""

from __future__ import annotations

import json
import re
from typing import Any

# The end-of-turn token the model stopped on stays in toolrl's turn texts (``<|im_end|>``, ``<|eot_id|>``,
# ``<end_of_turn>``, ``</s>``); verifiers reads messages as an OpenAI API returns them, without it.
_END_OF_TURN = re.compile(r"(?:<\|[A-Za-z_]+\|>|</s>|<end_of_turn>|<eos>)\s*$")


def _content(text: str) -> str:
    return _END_OF_TURN.sub("", text).rstrip()


def build_trace(task: Any, prompt: list[Any], model_text: list[str], response: str, tool_results: list[Any],
                parser: Any, state: Any) -> Any:
    """A verifiers Trace of one trajectory holding its ``state``: one branch of message nodes, the
    model's turns sampled."""
    import verifiers.v1 as vf

    messages: list[tuple[Any, bool]] = [(_vf_message(m.to_template()), False) for m in prompt]
    results = iter(tool_results)
    for turn, text in enumerate(model_text):
        parsed = parser.parse(_content(text))
        last = turn == len(model_text) - 1
        calls = [vf.ToolCall(id=f"call_{turn}_{i}", name=c.name, arguments=json.dumps(c.arguments))
                 for i, c in enumerate(parsed.calls)]
        messages.append((vf.AssistantMessage(content=_content(response if last else parsed.content) or None,
                                             tool_calls=calls or None), True))
        for call in calls:
            result = next(results, None)
            if result is None:  # the trajectory ended before the call ran (turn or token limit)
                break
            messages.append((vf.ToolMessage(tool_call_id=call.id, name=result.name,
                                            content=result.response.text), False))
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=vf.AgentInfo(config=vf.AgentConfig()), state=state)
    trace.nodes = [vf.MessageNode(parent=i - 1 if i else None, message=m, sampled=sampled)
                   for i, (m, sampled) in enumerate(messages)]
    trace.stop("completed")
    trace.ok = True
    return trace


def _vf_message(message: dict[str, Any]) -> Any:
    import verifiers.v1 as vf

    role = message["role"]
    content = message.get("content") or ""
    if role == "system":
        return vf.SystemMessage(content=content)
    if role == "user":
        return vf.UserMessage(content=content)
    if role == "tool":
        return vf.ToolMessage(tool_call_id=message.get("tool_call_id") or "", name=message.get("name"),
                              content=content)
    calls = [vf.ToolCall(id=c.get("id") or f"prompt_{i}", name=c["function"]["name"],
                         arguments=c["function"]["arguments"] if isinstance(c["function"]["arguments"], str)
                         else json.dumps(c["function"]["arguments"]))
             for i, c in enumerate(message.get("tool_calls") or [])]
    return vf.AssistantMessage(content=content or None, tool_calls=calls or None)
