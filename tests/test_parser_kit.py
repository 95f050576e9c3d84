"""The parser conformance kit (toolrl.testing.parsers) over every built-in tool parser, each with its
model's own syntax; and the kit fails a parser that breaks each rule."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest
from toolrl.parsers.hermes import HermesParser
from toolrl.schemas import ParseResult, ToolCall
from toolrl.testing import parser_corpus as corpus
from toolrl.testing.parser_corpus import Call
from toolrl.testing.parsers import (
    ParserConformance,
    check_parser_corpus,
    check_parser_hostile,
    check_parser_linear_time,
)


def hermes(calls: Sequence[Call]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>"
                     for n, a in calls)


class TestHermes(ParserConformance):
    parser_name = "hermes"
    render = staticmethod(hermes)


class TestQwen3Coder(ParserConformance):
    parser_name = "qwen3_coder"
    render = staticmethod(lambda calls: "\n".join(corpus.qwen3_coder(n, a) for n, a in calls))


class TestLlama3Json(ParserConformance):
    parser_name = "llama3_json"
    render = staticmethod(lambda calls: "; ".join(corpus.llama3_json(n, a) for n, a in calls))


class TestMistral(ParserConformance):
    parser_name = "mistral"
    render = staticmethod(lambda calls: "".join(corpus.mistral(n, a) for n, a in calls))


class TestDeepSeekV3(ParserConformance):
    parser_name = "deepseek_v3"
    render = staticmethod(lambda calls: corpus.deepseek_v3(*calls))


class TestGlm45(ParserConformance):
    parser_name = "glm45"
    render = staticmethod(lambda calls: "\n".join(corpus.glm45(n, a) for n, a in calls))


class TestGptOss(ParserConformance):
    parser_name = "gpt_oss"
    render = staticmethod(lambda calls: "".join(corpus.gpt_oss(n, a) for n, a in calls))


class TestGemma(ParserConformance):
    parser_name = "gemma"
    render = staticmethod(lambda calls: "".join(corpus.gemma(n, a) for n, a in calls))


class TestTags(ParserConformance):
    """Inline tags carry one string argument: no corpus, the other checks with a route."""

    parser_name = "tags"
    parser_options = {"tags": {"calculator": {"tool": "calculator", "argument": "expression"}},
                      "fences": {"python": {"tool": "code_interpreter", "argument": "code"}}}


class Quadratic(HermesParser):
    """Parses the text before every opening tag again: right answers, quadratic time."""

    def parse(self, text: str) -> ParseResult:
        for match in re.finditer("<tool_call>", text):
            super().parse(text[: match.start()])
        return super().parse(text)


class Raising(HermesParser):
    def parse(self, text: str) -> ParseResult:
        if text.count("{") > 1000:
            raise RecursionError("maximum recursion depth exceeded")
        return super().parse(text)


class DropsProse(HermesParser):
    def parse(self, text: str) -> ParseResult:
        return ParseResult(calls=super().parse(text).calls)


class NotANumber(HermesParser):
    def parse(self, text: str) -> ParseResult:
        return ParseResult(calls=[ToolCall(name="f", arguments={"x": float("nan")})])


def test_the_kit_fails_a_parser_that_breaks_a_rule() -> None:
    with pytest.raises(AssertionError, match="not linear"):
        check_parser_linear_time(Quadratic(), hermes, small=20)
    with pytest.raises(AssertionError, match="parse raised RecursionError"):
        check_parser_hostile(Raising(), hermes)
    with pytest.raises(AssertionError, match="prose before a call is not content"):
        check_parser_corpus(DropsProse(), hermes)
    with pytest.raises(AssertionError, match="not strict JSON"):
        check_parser_hostile(NotANumber())
    with pytest.raises(AssertionError, match="corpus case 'single'"):
        check_parser_corpus(HermesParser(), lambda calls: "".join(corpus.mistral(n, a) for n, a in calls))
