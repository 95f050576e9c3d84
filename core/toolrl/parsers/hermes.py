"""The hermes format used by Qwen2.5/Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Unlike verl's parser: calls inside ``<think>`` are ignored, each call is parsed on its own, and an
unterminated or malformed call becomes a parse error instead of being dropped.

A call ends at the first tag that stands outside a JSON string, so ``<tool_call>``, ``</tool_call>``,
``<think>`` or ``</think>`` inside a string argument (code, XML) is data. Only when the JSON breaks
(a string that never closes, a backslash outside a string) does the call fall back to the tags as
plain text. One pass over the text: time is linear in its length whatever the number of calls, and
decoding is bounded in depth and number size (see :mod:`toolrl.parsers.bounded_json`).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from toolrl.parsers import ToolParser
from toolrl.parsers.bounded_json import JSONLimitError, loads
from toolrl.schemas import ParseError, ParseResult, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TAGS = re.compile(r"</?(?:tool_call|think)>")
# A call's text up to the next tag outside a JSON string: plain characters, whole strings, and "<"
# that opens no tag. It stops before a tag, a quote that never closes, or a backslash outside a
# string (invalid JSON; it also keeps two readings of the same text from re-aligning on escapes).
_UNTIL_TAG = re.compile(r'(?:[^"<\\]+|"[^"\\]*(?:\\.[^"\\]*)*"|<(?!/?(?:tool_call|think)>))*', re.S)


@dataclass(slots=True)
class _Span:
    """A tag or call found in the text: ``kind`` is a tag, ``"call"`` or ``"stray"``."""

    start: int
    end: int
    kind: str
    body_end: int = 0  # calls: where the JSON between the tags ends
    terminated: bool = True


def decode_call(body: str) -> ToolCall | str:
    """A call from the JSON between the tags, or the reason it is malformed."""
    try:
        obj = loads(body)
    except json.JSONDecodeError as exc:
        return f"invalid JSON in tool call: {exc.msg} at position {exc.pos}"
    except JSONLimitError as exc:
        return f"invalid JSON in tool call: {exc}"
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
            arguments = loads(arguments)
        except (json.JSONDecodeError, JSONLimitError):
            return f"arguments of tool call to '{name}' must be a JSON object, got a string"
    if not isinstance(arguments, dict):
        return f"arguments of tool call to '{name}' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments, id=obj.get("id") if isinstance(obj.get("id"), str) else None)


def _call_span(text: str, start: int, opens: list[int], closes: list[int]) -> _Span:
    """The call opened at ``start``: up to the first tag outside JSON strings, else (broken JSON)
    up to the first ``</tool_call>`` before the next ``<tool_call>`` as plain text."""
    body = start + len(OPEN)
    stop = _UNTIL_TAG.match(text, body).end()
    if stop == len(text):
        return _Span(start, stop, "call", stop, terminated=False)
    if text[stop] == "<":
        if text.startswith(CLOSE, stop):
            return _Span(start, stop + len(CLOSE), "call", stop)
        return _Span(start, stop, "call", stop, terminated=False)
    i, j = bisect_left(closes, body), bisect_right(opens, start)
    next_close = closes[i] if i < len(closes) else len(text)
    next_open = opens[j] if j < len(opens) else len(text)
    if next_close < next_open:
        return _Span(start, next_close + len(CLOSE), "call", next_close)
    return _Span(start, next_open, "call", next_open, terminated=False)


def _spans(text: str) -> list[_Span]:
    """Calls, stray ``</tool_call>`` and think tags in order; tags inside a call are its data."""
    found = [(m.start(), m.group()) for m in _TAGS.finditer(text)]
    opens = [p for p, tag in found if tag == OPEN]
    closes = [p for p, tag in found if tag == CLOSE]
    spans: list[_Span] = []
    cursor = 0
    for pos, tag in found:
        if pos < cursor:
            continue
        if tag == OPEN:
            spans.append(_call_span(text, pos, opens, closes))
        else:
            spans.append(_Span(pos, pos + len(tag), "stray" if tag == CLOSE else tag))
        cursor = spans[-1].end
    return spans


def _thinking(spans: list[_Span], length: int) -> list[tuple[int, int]]:
    """Reasoning regions: ``<think>`` to its ``</think>`` or the end. A ``</think>`` before any
    ``<think>`` closes a block the prompt opened, so everything before it is reasoning."""
    tags = [s for s in spans if s.kind in (THINK_OPEN, THINK_CLOSE)]
    regions: list[tuple[int, int]] = []
    k = 0
    if tags and tags[0].kind == THINK_CLOSE:
        regions.append((0, tags[0].end))
        k = 1
    while k < len(tags):
        if tags[k].kind == THINK_OPEN:
            start = tags[k].start
            while k < len(tags) and tags[k].kind != THINK_CLOSE:
                k += 1
            regions.append((start, tags[k].end if k < len(tags) else length))
        k += 1
    return regions


class HermesParser(ToolParser):
    name = "hermes"

    def parse(self, text: str) -> ParseResult:
        spans = _spans(text)
        regions = iter(_thinking(spans, len(text)))
        region = next(regions, None)
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        pos = 0
        for span in spans:
            while region is not None and region[1] <= span.start:
                region = next(regions, None)
            if span.kind not in ("call", "stray") or (region is not None and region[0] <= span.start):
                continue  # think tags stay in the content; calls in reasoning are not calls
            content.append(text[pos:span.start])
            pos = span.end
            raw = text[span.start:span.end]
            if span.kind == "stray":
                errors.append(ParseError(message=f"stray {CLOSE} without an opening {OPEN}", raw=raw))
            elif not span.terminated:
                errors.append(ParseError(message=f"unterminated tool call: missing {CLOSE}", raw=raw))
            else:
                decoded = decode_call(text[span.start + len(OPEN):span.body_end].strip())
                if isinstance(decoded, ToolCall):
                    calls.append(decoded)
                else:
                    errors.append(ParseError(message=decoded, raw=raw))
        content.append(text[pos:])
        return ParseResult(content="".join(content).strip(), calls=calls, errors=errors)
