"""Llama 3.1/3.2 JSON calls (their chat templates render ``{"name": "f", "parameters": {...}}`` as the
whole assistant turn), with or without the ``<|python_tag|>`` that opens a call in ipython mode::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>
    {"name": "f", "parameters": {...}}; {"name": "g", "parameters": {...}}

After ``<|python_tag|>`` the JSON objects, separated by ``;`` or whitespace, are calls
(``arguments`` may stand for ``parameters``) and any that is not a valid call is a parse error; text
after them is content. Before it (or without it), as in vLLM's parser, a JSON object in the text is a
call when it has ``name`` and ``parameters`` (or ``arguments``), and a ``;`` after a call separates it
from the next; other braces are content (prose, LaTeX, JSON answers), except JSON that opens
``{"name":`` and does not decode: a broken call, reported. A ``<|python_tag|>`` inside a JSON object
that decodes is data (code that prints it). The turn ends at ``<|eom_id|>`` in ipython mode,
``<|eot_id|>`` otherwise; neither is content.
"""

from __future__ import annotations

import re
from typing import Any

from toolrl.parsers import ToolParser, parse_result
from toolrl.parsers.arguments import call_arguments, decode_json, json_end
from toolrl.schemas import ParseError, ParseResult, ToolCall

PYTHON_TAG = "<|python_tag|>"
_SEPARATOR = re.compile(r"(?:[\s;]|<\|python_tag\|>)*")  # between the calls of a call turn
_CALL_START = re.compile(r'\{\s*"name"\s*:')  # JSON that sets out to be a call
_AFTER_CALL = re.compile(r"(?:\s*;)?")  # the separator after a call, which is not content


def decode_llama3_call(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ValueError(f"tool call must be a JSON object with 'name' and 'parameters', got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool call is missing 'name' (a non-empty string)")
    key = "parameters" if "parameters" in obj else "arguments"
    if key not in obj:
        raise ValueError(f"tool call to '{name}' is missing 'parameters'")
    return ToolCall(name=name, arguments=call_arguments(obj[key], name))


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    end_of_call_tokens = ("<|eom_id|>", "<|eot_id|>")

    @property
    def stop_strings(self) -> list[str]:
        return ["<|eom_id|>"]  # ipython mode's end of a call turn; <|eot_id|> ends every turn

    def parse(self, text: str) -> ParseResult:
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        tag = self._prose(text, calls, errors, content)
        if tag != -1:
            content.append(text[self._call_turn(text, tag, calls, errors):])
        return parse_result(content, calls, errors, self.end_of_call_tokens)

    def _call_turn(self, text: str, tag: int, calls: list[ToolCall], errors: list[ParseError]) -> int:
        """Calls after the ``<|python_tag|>`` at ``tag`` (separated by ``;``, whitespace or more python
        tags); returns where they end (the rest is content)."""
        found = len(calls) + len(errors)
        pos = tag + len(PYTHON_TAG)
        while True:
            pos = _SEPARATOR.match(text, pos).end()  # type: ignore[union-attr]
            if not text.startswith("{", pos):
                break
            end = json_end(text, pos)
            raw = text[pos:end if end != -1 else len(text)]
            if end == -1:
                errors.append(ParseError(message="unterminated tool call: its JSON never closes", raw=raw))
                return len(text)
            try:
                calls.append(decode_llama3_call(decode_json(raw, "tool call")))
            except ValueError as exc:
                errors.append(ParseError(message=str(exc), raw=raw))
            pos = end
        if len(calls) + len(errors) == found:
            errors.append(ParseError(message=f"{PYTHON_TAG} must be followed by a JSON tool call "
                                             '{"name": ..., "parameters": {...}}', raw=text[tag:pos + 80]))
        return pos

    def _prose(self, text: str, calls: list[ToolCall], errors: list[ParseError], content: list[str]) -> int:
        """Calls among the JSON objects of ``text`` up to the ``<|python_tag|>`` that opens the call turn
        (one inside a JSON object that decodes is data); other braces are content. Returns where that
        tag is, or -1."""
        pos = 0
        tag = text.find(PYTHON_TAG)
        while (start := text.find("{", pos)) != -1 and not 0 <= tag < start:
            end = json_end(text, start)
            attempt = _CALL_START.match(text, start) is not None
            if end == -1:
                if attempt and tag == -1:  # a call cut short (a length stop): say so rather than leave it as text
                    content.append(text[pos:start])
                    errors.append(ParseError(message="unterminated tool call: its JSON never closes",
                                             raw=text[start:]))
                    pos = len(text)
                break
            try:
                obj = decode_json(text[start:end], "tool call")
            except ValueError as exc:
                obj, problem = None, str(exc)
            if start < tag < end:
                if obj is None:  # the tag in JSON that does not decode is a tag
                    break
                tag = text.find(PYTHON_TAG, end)
            if isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj):
                content.append(text[pos:start])
                try:
                    calls.append(decode_llama3_call(obj))
                except ValueError as exc:
                    errors.append(ParseError(message=str(exc), raw=text[start:end]))
                end = _AFTER_CALL.match(text, end).end()  # type: ignore[union-attr]
            elif obj is None and attempt:
                content.append(text[pos:start])
                errors.append(ParseError(message=problem, raw=text[start:end]))
            else:
                content.append(text[pos:end])
            pos = end
        content.append(text[pos:tag if tag != -1 else len(text)])
        return tag
