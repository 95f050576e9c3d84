"""Mistral's ``[TOOL_CALLS]`` call formats, both read by one parser:

- tokenizers before v11: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`` (one JSON list, or
  one object, holds the turn's calls);
- v11 and later: ``[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}`` (the name, then its JSON
  arguments; ``f{...}`` without ``[ARGS]`` too), the call's id after ``[CALL_ID]`` when the model
  writes one (``f[CALL_ID]a1b2c3d4e[ARGS]{...}``); v13 writes a space after ``[ARGS]``.

Each call is read on its own: a bad item of a pre-v11 list is its own error, the others still run.
A call keeps the id the model wrote (pre-v11 ``"id"``, v11 ``[CALL_ID]``): its result must name it.

A call's JSON ends where its brackets balance, so text after it is content. Reasoning
(``[THINK]...[/THINK]``) holds no calls, as in the hermes parser. The turn ends with ``</s>``.
"""

from __future__ import annotations

import json
import re

from toolrl.parsers import ToolParser, parse_result
from toolrl.parsers.arguments import call_arguments, decode_json, json_end, json_object
from toolrl.parsers.blocks import Block, Markers, outside_reasoning
from toolrl.schemas import ParseError, ParseResult, ToolCall

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
THINK = Markers(TOOL_CALLS, "", "[THINK]", "[/THINK]")
_MARKERS = re.compile(r"\[TOOL_CALLS\]|\[/?THINK\]")
_NAME = re.compile(r"[^\s\[{]*")
_SPACE = re.compile(r"\s*")


def _json_call(item: object, raw: str) -> ToolCall | ParseError:
    if not isinstance(item, dict):
        return ParseError(message=f"each tool call must be a JSON object with 'name' and 'arguments', "
                                  f"got {type(item).__name__}", raw=raw)
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return ParseError(message="tool call is missing 'name' (a non-empty string)", raw=raw)
    if "arguments" not in item:
        return ParseError(message=f"tool call to '{name}' is missing 'arguments'", raw=raw)
    try:
        arguments = call_arguments(item["arguments"], name)
    except ValueError as exc:
        return ParseError(message=str(exc), raw=raw)
    return ToolCall(name=name, arguments=arguments, id=item["id"] if isinstance(item.get("id"), str) else None)


class MistralParser(ToolParser):
    name = "mistral"
    end_of_call_tokens = ("</s>",)

    def parse(self, text: str) -> ParseResult:
        spans = [Block(m.start(), m.end(), m.group()) for m in _MARKERS.finditer(text)]
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        pos = 0
        for span in outside_reasoning(spans, len(text), THINK, (TOOL_CALLS,)):
            if span.start < pos:
                continue  # inside an earlier call's JSON
            content.append(text[pos:span.start])
            end, found = self._call(text, span.end)
            if isinstance(found, str):
                errors.append(ParseError(message=found, raw=text[span.start:end]))
            else:
                for item in found:
                    (errors if isinstance(item, ParseError) else calls).append(item)  # type: ignore[arg-type]
            pos = end
        content.append(text[pos:])
        return parse_result(content, calls, errors, self.end_of_call_tokens)

    def _call(self, text: str, pos: int) -> tuple[int, list[ToolCall | ParseError] | str]:
        """The calls (and errors of pre-v11 list items) after a ``[TOOL_CALLS]`` ending at ``pos``, and
        where they end; or the error."""
        start = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if start < len(text) and text[start] in "[{":  # pre-v11: JSON
            end = json_end(text, start)
            if end == -1:
                return len(text), f"unterminated tool call: the JSON after {TOOL_CALLS} never closes"
            try:
                value = decode_json(text[start:end], "tool call")
            except ValueError as exc:
                return end, str(exc)
            if not isinstance(value, list):
                return end, [_json_call(value, text[pos - len(TOOL_CALLS):end])]
            # Each item read on its own: a bad one is its own error, its raw text the item as JSON.
            return end, [_json_call(item, json.dumps(item, ensure_ascii=False)) for item in value]
        name_end = _NAME.match(text, pos).end()  # type: ignore[union-attr]
        name = text[pos:name_end]
        call_id = None
        if text.startswith(CALL_ID, name_end):
            id_start = name_end + len(CALL_ID)
            name_end = _NAME.match(text, id_start).end()  # type: ignore[union-attr]
            call_id = text[id_start:name_end] or None
        after_args = name_end + len(ARGS) if text.startswith(ARGS, name_end) else name_end
        args = _SPACE.match(text, after_args).end()  # type: ignore[union-attr]  # v13: "[ARGS] {"
        if not name or not text.startswith("{", args):
            stop = text.find(TOOL_CALLS, pos)
            end = stop if stop != -1 else len(text)
            return end, (f"tool call must read {TOOL_CALLS}NAME{ARGS}{{...}}, {TOOL_CALLS}NAME{CALL_ID}ID{ARGS}{{...}} "
                         f"or {TOOL_CALLS}[{{...}}]")
        end = json_end(text, args)
        if end == -1:
            return len(text), f"unterminated tool call to '{name}': its JSON arguments never close"
        try:
            arguments = json_object(text[args:end], f"arguments of tool call to '{name}'")
            return end, [ToolCall(name=name, arguments=arguments, id=call_id)]
        except ValueError as exc:
            return end, str(exc)
