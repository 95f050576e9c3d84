"""Inline tool tags inside one response (AReaL's TIR style): ``<calculator>1+2</calculator>`` or a
fenced ```` ```python ```` block. Generation stops at a closing marker, the call runs, its result is
appended inline (```` ```output ... ``` ````) and generation continues.

Options map markers to tools; there are none by default (the environment that uses the parser
configures the routes its tools need, as ``rollout.parser_options`` or its ``parser_options``)::

    tags:   {calculator: {tool: calculator, argument: expression}}
    fences: {python: {tool: code_interpreter, argument: code}}

Calls inside ``<think>`` run, unlike hermes calls (why: docs/rollouts.md, "tags"). A fence may be
written with CRLF line ends; its code is passed on with LF line ends.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from toolrl.parsers import ToolParser, parse_result
from toolrl.schemas import ParseError, ParseResult, ToolCall, ToolResponse


class TagRoute(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str
    argument: str


class TagOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tags: dict[str, TagRoute] = {}
    fences: dict[str, TagRoute] = {}


class TagParser(ToolParser):
    name = "tags"
    result_mode = "inline"

    def __init__(self, **options: Any) -> None:
        try:
            self.options = TagOptions.model_validate(options)
        except ValidationError as exc:
            raise ValueError(f"invalid options for parser 'tags': {exc}") from None
        # A pattern per route, each with the groups body and open (set when unterminated): the marker it
        # names in errors, its route, and whether it is a fence.
        self._routes: dict[re.Pattern[str], tuple[str, TagRoute, bool]] = {}
        for tag, route in self.options.tags.items():
            pattern = rf"<{re.escape(tag)}>(?P<body>.*?)(?:</{re.escape(tag)}>|(?P<open>\Z))"
            self._routes[re.compile(pattern, re.DOTALL)] = (tag, route, False)
        for lang, route in self.options.fences.items():
            pattern = rf"```{re.escape(lang)}[ \t]*\r?\n(?P<body>.*?)(?:(?:\r?\n)?```|(?P<open>\Z))"
            self._routes[re.compile(pattern, re.DOTALL)] = (lang, route, True)

    @property
    def stop_strings(self) -> list[str]:
        # "```\n" ends a fence without matching the opening "```python\n" (both also with CRLF).
        return [f"</{tag}>" for tag in self.options.tags] + (["```\n", "```\r\n"] if self.options.fences else [])

    def _matches(self, text: str) -> list[re.Match[str]]:
        found = [m for p in self._routes for m in p.finditer(text)]
        found.sort(key=lambda m: m.start())
        kept, end = [], -1
        for m in found:  # drop matches nested in an earlier one
            if m.start() >= end:
                kept.append(m)
                end = m.end()
        return kept

    def parse(self, text: str) -> ParseResult:
        calls, errors, content, pos = [], [], [], 0
        for m in self._matches(text):
            content.append(text[pos:m.start()])
            pos = m.end()
            marker, route, fence = self._routes[m.re]
            body = m["body"].replace("\r\n", "\n") if fence else m["body"]
            if m["open"] is not None:
                errors.append(ParseError(message=f"unterminated <{marker}> call", raw=m.group()))
            elif not body.strip():
                errors.append(ParseError(message=f"empty <{marker}> call", raw=m.group()))
            else:
                calls.append(ToolCall(name=route.tool, arguments={route.argument: body.strip("\r\n")}))
        content.append(text[pos:])
        return parse_result(content, calls, errors)

    def format_inline_result(self, response: ToolResponse) -> str:
        return f"\n```output\n{response.text}\n```\n"
