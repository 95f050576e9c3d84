"""The call format of DeepSeek-V3 and R1-0528 (the DeepSeek-V3 chat template renders it)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

One calls block holds every call of the turn; the arguments are JSON in a fenced block (one line or
several). Each call is read on its own: a malformed one is its own parse error and the calls around it
still run. A call's JSON is read with its strings, so a marker inside a string argument is data; a
call that does not read so ends at its first ``<｜tool▁call▁end｜>``. Calls inside ``<think>`` are
reasoning, as in the hermes parser.
"""

from __future__ import annotations

import re

from toolrl.parsers.arguments import json_object
from toolrl.parsers.blocks import BlockParser, Markers
from toolrl.schemas import ParseError, ToolCall

CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = Markers("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<think>", "</think>", data=CALL)
# One call: its type, the name line, and the arguments in a ```json fence.
_CALL = re.compile(r"(?P<type>[^\n<]*)<｜tool▁sep｜>(?P<name>[^\n]*)\n```json\n(?P<args>.*)\n```\s*\Z", re.S)
# The same call read as it is written, from its opening marker up to its JSON.
_HEAD = re.compile(r"<｜tool▁call▁begin｜>[^\n<]*<｜tool▁sep｜>[^\n]*\n```json\n\s*")
# Arguments up to the first marker outside their strings: plain characters, whole strings, and "<"
# that opens no marker. It stops before a marker or a quote that never closes; it always matches, so
# it never backtracks.
_ARGUMENTS = re.compile(r'(?:[^"<]+|"[^"\\]*(?:\\.[^"\\]*)*"|<(?!｜))*')


def call_end(text: str, start: int, stop: int) -> int:
    """Past the ``<｜tool▁call▁end｜>`` of the call opening at ``start`` when, before ``stop``, it reads
    as the format writes it, its end marker the first outside the JSON strings of its arguments; else -1."""
    head = _HEAD.match(text, start, stop)
    if head is None:
        return -1
    end = _ARGUMENTS.match(text, head.end(), stop).end()  # type: ignore[union-attr]
    if not text.startswith(CALL_END, end) or not text[head.end():end].rstrip().endswith("```"):
        return -1
    return end + len(CALL_END)


def decoded(raw: str) -> ToolCall | ParseError:
    """One call from its text, ``<｜tool▁call▁begin｜>`` to ``<｜tool▁call▁end｜>``, or its parse error."""
    if not raw.endswith(CALL_END):
        return ParseError(message=f"unterminated tool call: missing {CALL_END}", raw=raw)
    body = raw[len(CALL):-len(CALL_END)]
    try:
        m = _CALL.match(body)
        if m is None:
            raise ValueError(f"tool call must read function{SEP}NAME, then the arguments in a ```json fence")
        name = m["name"].strip()
        if m["type"].strip() != "function" or not name:
            head = body[:m.start("args")].strip()
            raise ValueError(f"tool call must read function{SEP}NAME, got {head[:80]!r}")
        return ToolCall(name=name, arguments=json_object(m["args"], f"arguments of tool call to '{name}'"))
    except ValueError as exc:
        return ParseError(message=str(exc), raw=raw)


class DeepSeekV3Parser(BlockParser):
    markers = MARKERS
    name = "deepseek_v3"
    end_of_call_tokens = ("<｜end▁of▁sentence｜>",)

    def data_end(self, text: str, pos: int) -> int:
        following = text.find(CALL, pos + len(CALL))
        return call_end(text, pos, following if following != -1 else len(text))

    def decode(self, body: str) -> list[ToolCall | ParseError]:
        """Every call in a calls block, each on its own; text between calls is an error of its own."""
        items: list[ToolCall | ParseError] = []
        pos = 0
        while (start := body.find(CALL, pos)) != -1:
            items += _stray_text(body[pos:start])
            following = body.find(CALL, start + len(CALL))
            stop = following if following != -1 else len(body)
            end = call_end(body, start, stop)
            if end == -1:  # not as the format writes it: the call ends at its first end marker
                close = body.find(CALL_END, start, stop)
                end = close + len(CALL_END) if close != -1 else stop
            items.append(decoded(body[start:end]))
            pos = end
        if not items:
            raise ValueError(f"empty tool calls block: no {CALL}")
        return items + _stray_text(body[pos:])


def _stray_text(gap: str) -> list[ParseError]:
    text = gap.strip()
    return [ParseError(message=f"unexpected text in the tool calls block: {text[:80]!r}", raw=text)] if text else []
