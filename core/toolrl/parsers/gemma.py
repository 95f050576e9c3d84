"""Gemma 4's call format (its chat template renders it)::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,opts:{units:<|"|>metric<|"|>}}<tool_call|>

Arguments are objects of ``key:value`` pairs; strings sit between ``<|"|>`` marks, objects in ``{}``,
arrays in ``[]``, and numbers, booleans and ``null`` are bare. Gemma ends a turn with calls at
``<|tool_response>`` (where the tool results go). Reasoning (``<|channel>thought ...<channel|>``)
holds no calls, as in the hermes parser.

:meth:`bind_tools` gives the tools' schemas: a parameter typed there reads its value (quoted or bare)
as that type, as vLLM's Gemma parser does; without one a bare value reads as JSON (``3``, ``true``)
and otherwise stays text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from toolrl.parsers.arguments import typed_text
from toolrl.parsers.blocks import BlockParser, Markers
from toolrl.parsers.bounded_json import MAX_DEPTH, JSONLimitError, loads
from toolrl.schemas import ToolCall

MARKERS = Markers("<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>")
QUOTE = '<|"|>'
_SPACE = re.compile(r"[ \t\r\n]*")
_BARE = re.compile(r"[^,}\]]*")
_KEY = re.compile(r"[^:,{}\[\]<]*")


class _Reader:
    """A recursive-descent reader of one call's arguments, bounded in depth; each character is read once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"invalid arguments: {what} at position {self.pos}")

    def skip_space(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def value(self, schema: Mapping[str, Any] | None, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"invalid arguments: nested deeper than {MAX_DEPTH} levels")
        self.skip_space()
        text = self.text
        if text.startswith(QUOTE, self.pos):
            end = text.find(QUOTE, self.pos + len(QUOTE))
            if end == -1:
                raise self.fail("a string that never closes")
            raw = text[self.pos + len(QUOTE):end]
            self.pos = end + len(QUOTE)
            return typed_text(raw, schema) if schema is not None else raw
        if text.startswith("{", self.pos):
            return self.mapping(schema, depth)
        if text.startswith("[", self.pos):
            return self.sequence(schema, depth)
        start = self.pos
        self.pos = _BARE.match(text, start).end()  # type: ignore[union-attr]
        raw = text[start:self.pos].strip()
        if not raw or QUOTE in raw:
            raise self.fail("a missing or malformed value")
        if schema is not None:
            return typed_text(raw, schema)
        try:
            return loads(raw)
        except (json.JSONDecodeError, JSONLimitError):
            return raw

    def members(self, close: str) -> Iterator[None]:
        """Past the opening bracket at the cursor, stops at each comma-separated member (the cursor at
        it, past white space) until ``close``, which it reads."""
        self.pos += 1
        first = True
        while True:
            self.skip_space()
            if self.text.startswith(close, self.pos):
                self.pos += 1
                return
            if not first:
                if not self.text.startswith(",", self.pos):
                    raise self.fail(f"expected ',' or '{close}'")
                self.pos += 1
                self.skip_space()
            first = False
            yield

    def mapping(self, schema: Mapping[str, Any] | None, depth: int) -> dict[str, Any]:
        """``{key:value,...}`` from the ``{`` at the cursor through its ``}``."""
        properties = schema.get("properties") if schema is not None else None
        out: dict[str, Any] = {}
        for _ in self.members("}"):
            key = self.key()
            child = properties.get(key) if isinstance(properties, dict) else None
            out[key] = self.value(child if isinstance(child, dict) else None, depth + 1)
        return out

    def key(self) -> str:
        text = self.text
        if text.startswith(QUOTE, self.pos):
            end = text.find(QUOTE, self.pos + len(QUOTE))
            key, after = (text[self.pos + len(QUOTE):end], end + len(QUOTE)) if end != -1 else ("", -1)
        else:
            end = _KEY.match(text, self.pos).end()  # type: ignore[union-attr]
            key, after = text[self.pos:end].strip(), end
        if not key or after == -1 or not text.startswith(":", after):
            raise self.fail("expected key:value")
        self.pos = after + 1
        return key

    def sequence(self, schema: Mapping[str, Any] | None, depth: int) -> list[Any]:
        """``[value,...]`` from the ``[`` at the cursor through its ``]``."""
        items = schema.get("items") if schema is not None else None
        return [self.value(items if isinstance(items, dict) else None, depth + 1) for _ in self.members("]")]


class GemmaParser(BlockParser):
    markers = MARKERS
    name = "gemma"
    end_of_call_tokens = ("<|tool_response>",)

    @property
    def stop_strings(self) -> list[str]:
        return list(self.end_of_call_tokens)

    def decode(self, body: str) -> list[ToolCall]:
        """The one call in a ``<|tool_call>`` block's body: ``call:NAME{...}``."""
        stripped = body.strip()
        brace = stripped.find("{")
        if not stripped.startswith("call:") or brace == -1:
            raise ValueError("tool call must read call:NAME{key:value,...}")
        name = stripped[len("call:"):brace].strip()
        if not name:
            raise ValueError("tool call is missing the function name in call:NAME{...}")
        reader = _Reader(stripped)
        reader.pos = brace
        parameters = {"type": "object", "properties": self.schemas.properties(name)}
        arguments = reader.mapping(parameters, 1)
        if stripped[reader.pos:].strip():
            raise ValueError(f"unexpected text after the arguments of tool call to '{name}': "
                             f"{stripped[reader.pos:].strip()[:80]!r}")
        return [ToolCall(name=name, arguments=arguments)]
