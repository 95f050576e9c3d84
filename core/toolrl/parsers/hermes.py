"""The hermes format used by Qwen2.5/Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Unlike verl's parser: calls inside ``<think>`` are ignored, each call is parsed on its own, and an
unterminated or malformed call becomes a parse error instead of being dropped.

Where a call ends (a call whose JSON decodes: at the first tag outside its JSON strings; one whose
JSON does not: at its first ``</tool_call>``) and what is an error: docs/rollouts.md, "hermes". One
pass over the text: time is linear in its length whatever the number of calls, and decoding is
bounded in depth, number size and range (see :mod:`toolrl.parsers.bounded_json`).
"""

from __future__ import annotations

import json
import re

from toolrl.parsers import ToolParser
from toolrl.parsers.bounded_json import JSONLimitError, UnencodableJSON, loads
from toolrl.schemas import ParseResult, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
UNTERMINATED = f"unterminated tool call: missing {CLOSE}"
STRAY = f"stray {CLOSE} without an opening {OPEN}"
# The next tag and, after <tool_call>, the call's text up to the next tag outside a JSON string:
# plain characters, whole strings, and "<" that opens no tag. The reading stops before a tag, a quote
# that never closes, or a backslash outside a string (invalid JSON; it also keeps two readings of the
# same text from re-aligning on escapes). The reading always matches, so it never backtracks.
_NEXT = re.compile(r'<tool_call>(?:[^"<\\]+|"[^"\\]*(?:\\.[^"\\]*)*"|<(?!/?(?:tool_call|think)>))*'
                   r"|</?(?:tool_call|think)>", re.S)


class _ToolTags:
    """Where the next ``<tool_call>`` or ``</tool_call>`` starts, reading the text as plain text.
    Lookups come in increasing order and the found positions only move forward, so all of them
    together scan the text once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.open = self.close = -1

    def after(self, i: int) -> int:
        if self.open < i:
            self.open = self._find(OPEN, i)
        if self.close < i:
            self.close = self._find(CLOSE, i)
        return min(self.open, self.close)

    def _find(self, tag: str, i: int) -> int:
        found = self.text.find(tag, i)
        return found if found >= 0 else len(self.text)


def decode_hermes_call(body: str) -> tuple[ToolCall | str, bool]:
    """A call from the JSON between the tags, or the reason it is malformed; and whether the JSON
    decoded whole (then its strings are certain, and so is where it ends)."""
    if not body.strip():
        return 'empty tool call: expected {"name": ..., "arguments": {...}}', False
    try:
        obj = loads(body)
    except json.JSONDecodeError as exc:
        return f"invalid JSON in tool call: {exc.msg} (character {exc.pos})", False
    except JSONLimitError as exc:
        return f"invalid JSON in tool call: {exc}", isinstance(exc, UnencodableJSON)
    return _as_call(obj), True


def _as_call(obj: object) -> ToolCall | str:
    """The call a decoded JSON value holds, or why it holds none."""
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
        except json.JSONDecodeError:
            return f"arguments of tool call to '{name}' must be a JSON object, got a string"
        except JSONLimitError as exc:
            return f"invalid JSON in the arguments of tool call to '{name}': {exc}"
    if not isinstance(arguments, dict):
        return f"arguments of tool call to '{name}' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments, id=obj.get("id") if isinstance(obj.get("id"), str) else None)


def _call(text: str, start: int, stop: int, tool_tags: _ToolTags) -> tuple[int, ToolCall | str]:
    """Where the call opened at ``start`` ends, and the call or why it is malformed. ``stop`` is where
    its JSON reading ends."""
    body = start + len(OPEN)
    if text.startswith(CLOSE, stop):
        json_text = text[body:stop]
        outcome, decoded = decode_hermes_call(json_text)
        # JSON that decodes, or no tool-call tag inside (read as plain text it ends here too): done.
        if decoded or "<" not in json_text or tool_tags.after(body) == stop:
            return stop + len(CLOSE), outcome
    plain = tool_tags.after(body)  # where the call ends read as plain text
    if stop < plain and stop < len(text) and text[stop] == "<":  # a think tag outside JSON strings
        return stop, UNTERMINATED
    # Broken JSON: tags in it are plain text, so the call cannot reach past the next tool-call tag.
    if text.startswith(CLOSE, plain):
        return plain + len(CLOSE), decode_hermes_call(text[body:plain])[0]
    return plain, UNTERMINATED


class HermesParser(ToolParser):
    name = "hermes"

    def parse(self, text: str) -> ParseResult:
        calls: list[ToolCall] = []
        errors: list[dict[str, str]] = []  # validated as ParseErrors once, with the result
        content: list[str] = []
        pos = 0  # the content runs up to here
        thinking, first_think_tag = False, True
        tool_tags = _ToolTags(text)
        end = 0  # where the next tag is looked for
        while (m := _NEXT.search(text, end)) is not None:
            start, end = m.span()
            if text.startswith(OPEN, start):
                end, outcome = _call(text, start, end, tool_tags)
            else:
                tag = text[start:end]
                if tag != CLOSE:  # think tags stay in the content
                    if tag == THINK_CLOSE and first_think_tag:
                        # It closes a block the prompt opened: everything before it was reasoning.
                        calls, errors, content, pos = [], [], [], 0
                    thinking, first_think_tag = tag == THINK_OPEN, False
                    continue
                outcome = STRAY
            if not thinking:  # calls in reasoning are not calls, and stay in the content
                content.append(text[pos:start])
                pos = end
                if isinstance(outcome, ToolCall):
                    calls.append(outcome)
                else:
                    errors.append({"message": outcome, "raw": text[start:end]})
        content.append(text[pos:])
        return ParseResult.model_validate({"content": "".join(content).strip(), "calls": calls, "errors": errors})
