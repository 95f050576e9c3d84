"""``json.loads`` with bounds, for text written by a model or a user.

The standard decoder recurses once per nesting level (``[[[...`` 1,000 deep raises RecursionError)
and converts integers with Python's 4,300-digit limit (ValueError past it). :func:`loads` checks
depth before decoding and length while decoding, rejects ``NaN``/``Infinity`` (not JSON), numbers
that overflow a float (``1e999`` would decode to ``inf``, which no JSON encoder can write back) and
lone surrogates (the escape ``"\\ud800"``, or the character in text decoded with ``surrogateescape``:
UTF-8 cannot encode it, so the tokenizer and the JSON traces would fail on it later), and raises only
:class:`json.JSONDecodeError` or :class:`JSONLimitError`. Both take time linear in the text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64
MAX_NUMBER_CHARS = 1000
_WHITESPACE = " \t\n\r"  # JSON's whitespace

# A JSON string (or one that runs to the end) or a bracket: depth counts brackets outside strings.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)|[\[\]{}]', re.S)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800-\udfff: half of a pair, or a lone one
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONLimitError(ValueError):
    """Valid-looking JSON beyond a bound (nesting depth, number length or range, a non-JSON constant)."""


class UnencodableJSON(JSONLimitError):
    """JSON that decodes whole to a string UTF-8 cannot encode (a lone surrogate)."""


def too_deep(text: str, max_depth: int) -> bool:
    """Whether brackets outside strings nest deeper than ``max_depth`` (stops at the first level past it)."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    depth = 0
    for m in _TOKEN.finditer(text):
        c = text[m.start()]
        if c in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _decoder(max_number_chars: int) -> json.JSONDecoder:
    def checked(s: str) -> str:
        if len(s) > max_number_chars:
            raise JSONLimitError(f"a number longer than {max_number_chars} characters")
        return s

    def parse_float(s: str) -> float:
        value = float(checked(s))
        if not math.isfinite(value):
            shown = s if len(s) <= 24 else s[:20] + "..."
            raise JSONLimitError(f"the number {shown} is out of range (not a finite number)")
        return value

    def constant(name: str) -> Any:
        raise JSONLimitError(f"{name} is not a JSON value")

    return json.JSONDecoder(parse_int=lambda s: int(checked(s)), parse_float=parse_float, parse_constant=constant)


_DEFAULT = _decoder(MAX_NUMBER_CHARS)


def loads(text: str, max_depth: int = MAX_DEPTH, max_number_chars: int = MAX_NUMBER_CHARS) -> Any:
    if too_deep(text, max_depth):
        raise JSONLimitError(f"nested deeper than {max_depth} levels")
    decoder = _DEFAULT if max_number_chars == MAX_NUMBER_CHARS else _decoder(max_number_chars)
    # JSONDecoder.decode, minus its two whitespace regex matches (a third of the cost on small calls).
    obj, end = decoder.raw_decode(text, len(text) - len(text.lstrip(_WHITESPACE)))
    rest = text[end:].lstrip(_WHITESPACE)
    if rest:
        raise json.JSONDecodeError("Extra data", text, len(text) - len(rest))
    if _may_hold_surrogates(text) and _has_lone_surrogate(obj):
        raise UnencodableJSON("a lone surrogate (\\ud800-\\udfff without its pair): not encodable as UTF-8")
    return obj


def _may_hold_surrogates(text: str) -> bool:
    """Whether ``text`` escapes a surrogate (a pair's half, or a lone one) or holds one: quick checks
    first, so text without either costs next to nothing."""
    return ("\\u" in text and _SURROGATE_ESCAPE.search(text) is not None) or (
        not text.isascii() and _SURROGATE.search(text) is not None)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (keys included) holds a surrogate (a decoded pair is one character
    outside the range); nesting is already bounded."""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False
