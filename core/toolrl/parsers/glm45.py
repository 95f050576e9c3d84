"""The call format of GLM-4.5/4.6/4.7 (the GLM-4-MoE chat template renders it)::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

The name is the text before the first ``<arg_key>``; a value is the text between its tags, as is.
Values are untyped text (the template writes strings bare and everything else as JSON):
:meth:`bind_tools` gives the tools' schemas, which type them; without a schema a value stays text.
Calls inside ``<think>`` are reasoning, as in the hermes parser; markers inside an ``<arg_value>``
(to its first ``</arg_value>`` before the next ``<arg_value>``) are data. GLM ends a turn with calls at
``<|observation|>`` (where the tool results go), which is not the end of its assistant turn.
"""

from __future__ import annotations

from typing import Any

from toolrl.parsers.blocks import BlockParser, Markers
from toolrl.schemas import ToolCall

KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
MARKERS = Markers("<tool_call>", "</tool_call>", "<think>", "</think>", data=VALUE, data_close=VALUE_END)


class Glm45Parser(BlockParser):
    markers = MARKERS
    name = "glm45"
    end_of_call_tokens = ("<|observation|>",)

    @property
    def stop_strings(self) -> list[str]:
        return list(self.end_of_call_tokens)

    def decode(self, body: str) -> list[ToolCall]:
        """The one call in a ``<tool_call>`` block's body."""
        first = body.find(KEY)
        name = body[:first if first != -1 else len(body)].strip()
        if not name:
            raise ValueError("tool call is missing the function name after <tool_call>")
        if first == -1:
            return [ToolCall(name=name, arguments={})]
        arguments: dict[str, Any] = {}
        pos = first
        while pos < len(body):
            key_end = body.find(KEY_END, pos)
            value = body.find(VALUE, key_end) if key_end != -1 else -1
            value_end = body.find(VALUE_END, value) if value != -1 else -1
            if value_end == -1:
                raise ValueError(f"tool call to '{name}' has an <arg_key> without its </arg_key><arg_value>"
                                 f"...</arg_value>")
            key = body[pos + len(KEY):key_end].strip()
            between = body[key_end + len(KEY_END):value]
            if not key or between.strip():
                raise ValueError(f"tool call to '{name}' has a malformed argument near {body[pos:value][:80]!r}")
            if key in arguments:
                raise ValueError(f"tool call to '{name}' sets argument '{key}' twice")
            arguments[key] = self.schemas.typed(name, key, body[value + len(VALUE):value_end])
            pos = value_end + len(VALUE_END)
            rest = body.find(KEY, pos)
            gap = body[pos:rest if rest != -1 else len(body)]
            if gap.strip():
                raise ValueError(f"unexpected text in tool call to '{name}': {gap.strip()[:80]!r}")
            pos = rest if rest != -1 else len(body)
        return [ToolCall(name=name, arguments=arguments)]
