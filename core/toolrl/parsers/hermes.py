"""The hermes format used by Qwen2.5/Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Unlike verl's parser: calls inside ``<think>`` are ignored, each call is parsed on its own, and an
unterminated or malformed call becomes a parse error instead of being dropped.
"""

from __future__ import annotations

import json
import re

from toolrl.parsers import ToolParser
from toolrl.schemas import ParseError, ParseResult, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TAG = re.compile(re.escape(OPEN) + "|" + re.escape(CLOSE))


def _call_spans(text: str) -> list[tuple[int, int]]:
    """Where tool calls stand (``<tool_call>`` to its ``</tool_call>`` or the end)."""
    spans, pos = [], 0
    while (start := text.find(OPEN, pos)) != -1:
        end = text.find(CLOSE, start)
        end = len(text) if end == -1 else end + len(CLOSE)
        spans.append((start, end))
        pos = end
    return spans


def strip_thinking(text: str) -> tuple[str, list[tuple[int, int]]]:
    """Blank out reasoning so calls in it are ignored; returns the text with ``<think>`` regions
    replaced by spaces (offsets preserved) and the regions. A ``</think>`` with no opening tag closes
    a reasoning block the prompt opened; an unclosed ``<think>`` runs to the end. Think tags inside a
    tool call's arguments (a string that happens to contain them) are data, not reasoning."""
    calls = _call_spans(text)

    def find(tag: str, pos: int) -> int:
        while (at := text.find(tag, pos)) != -1:
            if not any(a < at < b for a, b in calls):
                return at
            pos = at + 1
        return -1

    regions: list[tuple[int, int]] = []
    first_close = find(THINK_CLOSE, 0)
    first_open = find(THINK_OPEN, 0)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        regions.append((0, first_close + len(THINK_CLOSE)))
    pos = regions[-1][1] if regions else 0
    while (start := find(THINK_OPEN, pos)) != -1:
        end = text.find(THINK_CLOSE, start)
        end = len(text) if end == -1 else end + len(THINK_CLOSE)
        regions.append((start, end))
        pos = end
    masked = list(text)
    for a, b in regions:
        masked[a:b] = " " * (b - a)
    return "".join(masked), regions


def decode_call(body: str) -> ToolCall | str:
    """A call from the JSON between the tags, or the reason it is malformed."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"invalid JSON in tool call: {exc.msg} at position {exc.pos}"
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call is missing 'name' (a non-empty string)"
    if "arguments" not in obj:
        return f"tool call to '{name}' is missing 'arguments'"
    arguments = obj["arguments"]
    if isinstance(arguments, str):  # some models JSON-encode the arguments
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f"arguments of tool call to '{name}' must be a JSON object, got a string"
    if not isinstance(arguments, dict):
        return f"arguments of tool call to '{name}' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments, id=obj.get("id") if isinstance(obj.get("id"), str) else None)


class HermesParser(ToolParser):
    name = "hermes"

    def parse(self, text: str) -> ParseResult:
        masked, thinking = strip_thinking(text)
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content_spans: list[tuple[int, int]] = []
        pos = 0
        while True:
            m = _TAG.search(masked, pos)
            if m is None:
                content_spans.append((pos, len(text)))
                break
            content_spans.append((pos, m.start()))
            if m.group() == CLOSE:
                errors.append(ParseError(message=f"stray {CLOSE} without an opening {OPEN}", raw=CLOSE))
                pos = m.end()
                continue
            body_start = m.end()
            closes = [c.start() for c in re.finditer(re.escape(CLOSE), masked[body_start:])]
            next_open = masked.find(OPEN, body_start)
            # A close tag can occur inside a JSON string (code arguments): try each close before
            # the next opening tag, shortest first.
            candidates = [body_start + c for c in closes if next_open == -1 or body_start + c < next_open]
            if not candidates:
                raw = text[m.start(): next_open if next_open != -1 else len(text)]
                errors.append(ParseError(message=f"unterminated tool call: missing {CLOSE}", raw=raw))
                pos = next_open if next_open != -1 else len(text)
                if next_open == -1:
                    break
                continue
            decoded: ToolCall | str = ""
            end = candidates[0]
            for end in candidates:
                decoded = decode_call(text[body_start:end].strip())
                if isinstance(decoded, ToolCall):
                    break
            if not isinstance(decoded, ToolCall):
                end = candidates[0]
                decoded = decode_call(text[body_start:end].strip())
            if isinstance(decoded, ToolCall):
                calls.append(decoded)
            else:
                errors.append(ParseError(message=decoded, raw=text[m.start(): end + len(CLOSE)]))
            pos = end + len(CLOSE)
        content = "".join(text[a:b] for a, b in content_spans).strip()
        return ParseResult(content=content, calls=calls, errors=errors)
