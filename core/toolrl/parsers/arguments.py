"""Argument values for the model-family parsers: JSON objects decoded within bounds, where a JSON value
ends inside longer text, and untyped text values (``<parameter=n>5</parameter>``) typed from the tool's
JSON Schema.

Typing follows the schema's types in the order null, integer, number, boolean, object, array, string
(the first that fits wins, as in vLLM's parsers, so both read ``["integer", "string"]`` alike); a value
that fits none stays the model's text and the tool's argument check reports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl.parsers.bounded_json import MAX_NUMBER_CHARS, JSONLimitError, loads

# A JSON string (or one that runs to the end) or a bracket: the extent of a value counts brackets outside strings.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[\[\]{}]', re.S)
_INTEGER = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
TYPE_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def decode_json(text: str, what: str) -> Any:
    """The JSON value in ``text``, or a :class:`ValueError` whose message is for the model."""
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON in {what}: {exc.msg} at position {exc.pos}") from None
    except JSONLimitError as exc:
        raise ValueError(f"invalid JSON in {what}: {exc}") from None


def json_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object (some models JSON-encode it once more as a string), else :class:`ValueError`."""
    value = decode_json(text, what)
    if isinstance(value, str):
        try:
            value = loads(value)
        except (json.JSONDecodeError, JSONLimitError):
            raise ValueError(f"{what} must be a JSON object, got a string") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def call_arguments(value: Any, name: str) -> dict[str, Any]:
    """The ``arguments`` of a decoded call object (a JSON-encoded object is decoded once)."""
    if isinstance(value, str):
        return json_object(value, f"arguments of tool call to '{name}'")
    if not isinstance(value, dict):
        raise ValueError(f"arguments of tool call to '{name}' must be a JSON object, got {type(value).__name__}")
    return value


def json_end(text: str, start: int) -> int:
    """Where the JSON object or array opening at ``start`` ends (brackets outside strings balance),
    or -1 when it runs to the end of the text. Linear in the length scanned."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        c = text[m.start()]
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return m.end()
    return -1


def schema_types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The JSON types a schema admits, in :data:`TYPE_ORDER`: ``type``, the types of ``enum`` values,
    and its ``anyOf``/``oneOf``/``allOf`` branches; a schema that names none admits a string."""
    types: set[str] = set()
    declared = schema.get("type")
    types.update([declared] if isinstance(declared, str) else [t for t in declared or () if isinstance(t, str)])
    for value in schema.get("enum") or ():
        types.add(_json_type(value))
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or ():
            if isinstance(branch, dict):
                types.update(schema_types(branch))
    return tuple(t for t in TYPE_ORDER if t in types) or ("string",)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "string")


def _as_type(text: str, kind: str) -> tuple[bool, Any]:
    """Whether ``text`` reads as a value of JSON type ``kind``, and that value."""
    stripped = text.strip()
    if kind == "null":
        return stripped.lower() == "null", None
    if kind == "boolean":
        lowered = stripped.lower()
        return lowered in ("true", "false", "1", "0"), lowered in ("true", "1")
    if kind in ("integer", "number"):
        pattern = _INTEGER if kind == "integer" else _NUMBER
        if len(stripped) > MAX_NUMBER_CHARS or not pattern.fullmatch(stripped):
            return False, None
        try:
            return True, loads(stripped)
        except JSONLimitError:  # out of a float's range (1e999): left as text, for the tool to reject
            return False, None
    try:
        value = loads(stripped)
    except (json.JSONDecodeError, JSONLimitError):
        return False, None
    return isinstance(value, dict if kind == "object" else list), value


def typed_text(text: str, schema: Mapping[str, Any]) -> Any:
    """``text`` as the first of the schema's types it reads as; the text itself when none fits."""
    return typed_as(text, schema_types(schema))


def typed_as(text: str, types: tuple[str, ...]) -> Any:
    for kind in types:
        if kind == "string":
            return text
        ok, value = _as_type(text, kind)
        if ok:
            return value
    return text


class ToolSchemas:
    """The parameter schemas of a route's tools, by tool name (plain dicts, as tools' schemas dump)."""

    def __init__(self, schemas: Sequence[Mapping[str, Any]] = ()) -> None:
        self._properties: dict[str, dict[str, Any]] = {}
        self._types: dict[tuple[str, str], tuple[str, ...]] = {}  # (tool, parameter): its types, worked out once
        for schema in schemas:
            function = schema.get("function", schema)
            parameters = function.get("parameters") or {}
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if isinstance(function.get("name"), str) and isinstance(properties, dict):
                self._properties[function["name"]] = properties
                for key, prop in properties.items():
                    if isinstance(prop, dict):
                        self._types[function["name"], key] = schema_types(prop)

    def properties(self, tool: str) -> dict[str, Any]:
        """``tool``'s parameter schemas by name (none for an unknown tool)."""
        return self._properties.get(tool, {})

    def typed(self, tool: str, key: str, text: str) -> Any:
        """A text value typed from its parameter's schema; unknown parameters keep their text."""
        types = self._types.get((tool, key))
        return typed_as(text, types) if types is not None else text
