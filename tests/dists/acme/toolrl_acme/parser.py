"""Acme's calls: ``<<call name="f">>{json arguments}<</call>>``, anywhere in the text."""

from __future__ import annotations

import json
import re

from toolrl.parsers import ToolParser
from toolrl.schemas import ParseError, ParseResult, ToolCall

CALL = re.compile(r'<<call name="([^"<>]*)">>(.*?)<</call>>', re.DOTALL)


class AcmeParser(ToolParser):
    name = "acme"

    def parse(self, text: str) -> ParseResult:
        calls, errors = [], []
        for match in CALL.finditer(text):
            name, raw = match.group(1), match.group(2).strip() or "{}"
            try:
                arguments = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                errors.append(ParseError(message=f"call {name!r}: the arguments are not JSON ({exc})", raw=match.group(0)))
                continue
            if not isinstance(arguments, dict):
                errors.append(ParseError(message=f"call {name!r}: the arguments are not a JSON object", raw=match.group(0)))
                continue
            calls.append(ToolCall(name=name, arguments=arguments))
        return ParseResult(content=CALL.sub("", text).strip(), calls=calls, errors=errors)
