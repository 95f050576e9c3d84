"""Issue 36: the holes hostile inputs still found in the tool-call parsers and ``toolrl parse``.

The rule: a parser's failure is one call's error and never another call's loss. Each case below is a
malformed or tricky call next to valid ones; the valid calls must come back whole and the bad one as
its own parse error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _dists import run_toolrl
from toolrl.parsers import ToolParser
from toolrl.plugins import get_plugins
from toolrl.testing.parser_corpus import TOOLS


def parser(family: str) -> ToolParser:
    p = get_plugins().load_part("tool_parsers", family)()
    p.bind_tools(TOOLS)
    return p


def one_error_line(out: Any, exit_code: int, *fragments: str) -> None:
    assert out.returncode == exit_code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- JSON that decodes to what UTF-8 cannot hold ----------------------------------------------------

LONE = '"\\ud800"'  # JSON text: a high surrogate without its low half
PAIR = '"\\ud83d\\ude00"'  # a pair: one character (U+1F600)


@pytest.mark.parametrize("where", ["value", "key", "name"])
def test_a_lone_surrogate_escape_is_that_calls_error(where: str) -> None:
    bad = {"value": '{"name": "f", "arguments": {"x": ' + LONE + "}}",
           "key": '{"name": "f", "arguments": {' + LONE + ": 1}}",
           "name": '{"name": ' + LONE + ', "arguments": {}}'}[where]
    good = '{"name": "g", "arguments": {"y": ' + PAIR + ', "z": "\\\\ud800"}}'  # an escaped backslash: text
    out = parser("hermes").parse(f"<tool_call>{bad}</tool_call><tool_call>{good}</tool_call>")
    assert [(c.name, c.arguments) for c in out.calls] == [("g", {"y": "\U0001f600", "z": "\\ud800"})]
    assert len(out.errors) == 1 and "lone surrogate" in out.errors[0].message
    json.dumps(out.model_dump(), ensure_ascii=False).encode("utf-8")  # what traces write


# -- toolrl parse ---------------------------------------------------------------------------------


def test_deeply_nested_options_are_one_error_line() -> None:
    deep = "[" * 20_000 + "]" * 20_000
    one_error_line(run_toolrl("parse", "--options", deep, "-", stdin=""), 2, "--options", "nested deeper")
