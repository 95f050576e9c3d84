"""The XML call format of Qwen3-Coder and Qwen3.5/3.6 (their chat templates render it)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is the text between its tags, less one leading and one trailing newline (the template's
markup). Values are untyped text: :meth:`bind_tools` gives the tools' schemas, which type them
(``3`` for an integer parameter; a string parameter keeps ``"3"``); without a schema a value stays text.
Calls inside ``<think>`` are reasoning, as in the hermes parser. A parameter's value runs from its
``<parameter=NAME>`` to the first ``</parameter>`` before the next ``<parameter=``: markers inside it
(``<tool_call>`` in code) are data.
"""

from __future__ import annotations

from typing import Any

from toolrl.parsers.blocks import BlockParser, Markers
from toolrl.schemas import ToolCall

FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
MARKERS = Markers("<tool_call>", "</tool_call>", "<think>", "</think>",
                  data=PARAMETER, data_close=PARAMETER_END)


class Qwen3CoderParser(BlockParser):
    markers = MARKERS
    name = "qwen3_coder"
    end_of_call_tokens = ("<|im_end|>",)

    def decode(self, body: str) -> list[ToolCall]:
        """The one call in a ``<tool_call>`` block's body."""
        stripped = body.strip()
        if not stripped.startswith(FUNCTION):
            raise ValueError(f"tool call must start with {FUNCTION}NAME>")
        close = stripped.find(">")
        if close == -1:
            raise ValueError(f"unterminated {FUNCTION}: missing '>'")
        name = stripped[len(FUNCTION):close].strip()
        if not name:
            raise ValueError(f"tool call is missing the function name in {FUNCTION}NAME>")
        if not stripped.endswith(FUNCTION_END):
            raise ValueError(f"tool call to '{name}' is missing {FUNCTION_END}")
        return [ToolCall(name=name, arguments=self._parameters(name, stripped[close + 1:-len(FUNCTION_END)]))]

    def _parameters(self, name: str, text: str) -> dict[str, Any]:
        arguments: dict[str, Any] = {}
        pos = 0
        while True:
            start = text.find(PARAMETER, pos)
            gap = text[pos:start if start != -1 else len(text)]
            if gap.strip():
                raise ValueError(f"unexpected text in tool call to '{name}': {gap.strip()[:80]!r}")
            if start == -1:
                return arguments
            close = text.find(">", start)
            end = text.find(PARAMETER_END, close) if close != -1 else -1
            if end == -1 or text.find(PARAMETER, close, end) != -1:
                raise ValueError(f"unterminated {PARAMETER} in tool call to '{name}': missing {PARAMETER_END}")
            key = text[start + len(PARAMETER):close].strip()
            if not key:
                raise ValueError(f"a parameter of tool call to '{name}' has no name")
            if key in arguments:
                raise ValueError(f"tool call to '{name}' sets parameter '{key}' twice")
            value = text[close + 1:end].removeprefix("\n").removesuffix("\n")  # the template's markup
            arguments[key] = self.schemas.typed(name, key, value)
            pos = end + len(PARAMETER_END)
