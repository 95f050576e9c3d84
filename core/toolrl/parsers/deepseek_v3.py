"""The call format of DeepSeek-V3 and R1-0528 (the DeepSeek-V3 chat template renders it)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

One calls block holds every call of the turn; the arguments are JSON in a fenced block (one line or
several). Calls inside ``<think>`` are reasoning, as in the hermes parser.
"""

from __future__ import annotations

import re

from toolrl.parsers.arguments import json_object
from toolrl.parsers.blocks import BlockParser, Markers
from toolrl.schemas import ToolCall

MARKERS = Markers("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<think>", "</think>")
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
# One call: its type, the name line, and the arguments in a ```json fence.
_CALL = re.compile(r"(?P<type>[^\n<]*)<｜tool▁sep｜>(?P<name>[^\n]*)\n```json\n(?P<args>.*)\n```\s*\Z", re.S)


def decode_call(body: str) -> ToolCall:
    """One call from the text between ``<｜tool▁call▁begin｜>`` and ``<｜tool▁call▁end｜>``."""
    m = _CALL.match(body)
    if m is None:
        raise ValueError(f"tool call must read function{SEP}NAME, then the arguments in a ```json fence")
    name = m["name"].strip()
    if m["type"].strip() != "function" or not name:
        raise ValueError(f"tool call must read function{SEP}NAME, got {body[:m.start('args')].strip()[:80]!r}")
    return ToolCall(name=name, arguments=json_object(m["args"], f"arguments of tool call to '{name}'"))


class DeepSeekV3Parser(BlockParser):
    markers = MARKERS
    name = "deepseek_v3"
    end_of_call_tokens = ("<｜end▁of▁sentence｜>",)

    def decode(self, body: str) -> list[ToolCall]:
        """Every call in a calls block: ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` separated by whitespace."""
        calls = []
        pos = 0
        while pos < len(body):
            start = body.find(CALL, pos)
            gap = body[pos:start if start != -1 else len(body)]
            if gap.strip():
                raise ValueError(f"unexpected text in the tool calls block: {gap.strip()[:80]!r}")
            if start == -1:
                break
            end = body.find(CALL_END, start)
            if end == -1:
                raise ValueError(f"unterminated tool call: missing {CALL_END}")
            calls.append(decode_call(body[start + len(CALL):end]))
            pos = end + len(CALL_END)
        if not calls:
            raise ValueError(f"empty tool calls block: no {CALL}")
        return calls
